//! `env` and `env_passthrough` grants: the exact environment a server gets
//! of the config (values written in it, and names of Moat's own variables
//! passed through when set). What a variable name may be, how the grant is
//! read against Moat's environment when a launch is planned, how it lies
//! over a launcher's base and under Moat's own variables, and how a sandbox
//! report says it, for both launchers. The native launcher's base (`PATH`,
//! `HOME`, ...) is its own (`native::env`); a wasm server has none.

use std::collections::BTreeMap;

/// A server's environment grant, as configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvGrant {
    /// `env`: variables and their values, exactly as written.
    pub values: BTreeMap<String, String>,
    /// `env_passthrough`: names of Moat's environment variables passed
    /// through when set (the value is never written anywhere).
    pub passthrough: Vec<String>,
}

/// Why a variable name cannot be granted.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("an empty name is not a variable name")]
    Empty,
    #[error("{0:?} is not a variable name: it holds `=` or NUL")]
    Reserved(String),
}

/// Checks that `name` can name an environment variable: not empty, and
/// without `=` or NUL (which would split or cut the `NAME=value` entry).
pub fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        Err(NameError::Empty)
    } else if name.contains(['=', '\0']) {
        Err(NameError::Reserved(name.to_owned()))
    } else {
        Ok(())
    }
}

impl EnvGrant {
    /// Nothing granted.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty() && self.passthrough.is_empty()
    }

    /// Every granted name, `env`'s then `env_passthrough`'s (for identity
    /// and reports: names, never values).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.values
            .keys()
            .chain(self.passthrough.iter())
            .map(String::as_str)
    }

    /// The grant applied: `env` values, plus each `env_passthrough` name
    /// set in Moat's environment now (a value written in `env` wins), each
    /// name once, in name order.
    pub fn resolve(&self) -> Vec<(String, String)> {
        self.resolve_with(|name| std::env::var(name).ok())
    }

    /// [`Self::resolve`] against `lookup` instead of Moat's environment.
    pub fn resolve_with(&self, lookup: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
        let mut vars = self.values.clone();
        for name in &self.passthrough {
            if let Some(value) = lookup(name) {
                vars.entry(name.clone()).or_insert(value);
            }
        }
        vars.into_iter().collect()
    }

    /// The `env_passthrough` names not set in Moat's environment now: the
    /// server starts without them.
    pub fn unset(&self) -> Vec<&str> {
        self.passthrough
            .iter()
            .filter(|name| std::env::var_os(name).is_none())
            .map(String::as_str)
            .collect()
    }
}

/// The whole environment, each name once: a launcher's `base`, then the
/// resolved grant (`configured`) over it, then `moat`'s own variables (the
/// egress proxy's, a learn run's scratch), which nothing overrides.
pub fn merge(
    base: Vec<(String, String)>,
    configured: &[(String, String)],
    moat: &[(String, String)],
) -> Vec<(String, String)> {
    let mut vars: BTreeMap<String, String> = base.into_iter().collect();
    for (name, value) in configured.iter().chain(moat) {
        vars.insert(name.clone(), value.clone());
    }
    vars.into_iter().collect()
}

/// One line for the sandbox report (`moat inspect`, the evidence): the
/// base a launcher gives (values: it holds nothing secret) and what the
/// config adds (names only).
pub fn describe(base: &[(String, String)], configured: &[(String, String)]) -> String {
    let base: Vec<String> = base
        .iter()
        .filter(|(name, _)| !configured.iter().any(|(c, _)| c == name))
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    let configured: Vec<&str> = configured.iter().map(|(name, _)| name.as_str()).collect();
    let given = match (base.is_empty(), configured.is_empty()) {
        (true, true) => "empty".to_owned(),
        (false, true) => base.join(" "),
        (true, false) => format!("the config's {}", configured.join(", ")),
        (false, false) => format!(
            "{}, and the config's {}",
            base.join(" "),
            configured.join(", ")
        ),
    };
    format!("environment: {given}; nothing else of Moat's environment")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn names_with_equals_or_nul_are_refused() {
        assert_eq!(check_name("GITHUB_TOKEN"), Ok(()));
        assert_eq!(check_name(""), Err(NameError::Empty));
        assert_eq!(
            check_name("A=B"),
            Err(NameError::Reserved("A=B".to_owned()))
        );
        assert_eq!(
            check_name("A\0"),
            Err(NameError::Reserved("A\0".to_owned()))
        );
    }

    #[test]
    fn a_written_value_wins_over_a_passed_through_one_and_unset_names_are_left_out() {
        let grant = EnvGrant {
            values: [("MODE".to_owned(), "ro".to_owned())].into(),
            passthrough: vec!["MODE".into(), "TOKEN".into(), "UNSET".into()],
        };
        let resolved = grant.resolve_with(|name| match name {
            "MODE" => Some("rw".to_owned()),
            "TOKEN" => Some("t".to_owned()),
            _ => None,
        });
        assert_eq!(resolved, pairs(&[("MODE", "ro"), ("TOKEN", "t")]));
        assert_eq!(
            grant.names().collect::<Vec<_>>(),
            ["MODE", "MODE", "TOKEN", "UNSET"]
        );
    }

    #[test]
    fn the_config_overrides_the_base_and_moat_overrides_both() {
        let merged = merge(
            pairs(&[("LANG", "C.UTF-8"), ("HOME", "/tmp")]),
            &pairs(&[("LANG", "de_DE.UTF-8"), ("HTTP_PROXY", "http://evil")]),
            &pairs(&[("HTTP_PROXY", "http://127.0.0.1:1")]),
        );
        assert_eq!(
            merged,
            pairs(&[
                ("HOME", "/tmp"),
                ("HTTP_PROXY", "http://127.0.0.1:1"),
                ("LANG", "de_DE.UTF-8"),
            ])
        );
    }

    #[test]
    fn the_description_names_the_configured_variables_never_their_values() {
        let configured = pairs(&[("TOKEN", "secret-value")]);
        let line = describe(&pairs(&[("LANG", "C.UTF-8"), ("TOKEN", "x")]), &configured);
        assert_eq!(
            line,
            "environment: LANG=C.UTF-8, and the config's TOKEN; nothing else of Moat's environment"
        );
        assert_eq!(
            describe(&[], &configured),
            "environment: the config's TOKEN; nothing else of Moat's environment"
        );
        assert_eq!(
            describe(&[], &[]),
            "environment: empty; nothing else of Moat's environment"
        );
    }
}

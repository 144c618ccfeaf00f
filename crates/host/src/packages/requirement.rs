//! One package to install as its installer takes it: a registry name, its
//! extras (Python) and the version asked for, each checked so that nothing
//! that could be a path, a URL or an option reaches an installer.

use super::recognise::arguments;
use super::{Ecosystem, PackageError};

/// One package to install: a registry name, its extras (Python) and the
/// version asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Requirement {
    pub(super) name: String,
    pub(super) extras: Vec<String>,
    pub(super) version: Option<String>,
}

impl Requirement {
    /// As the ecosystem's installer takes it.
    pub(super) fn render(&self, ecosystem: Ecosystem) -> String {
        requirement_text(ecosystem, &self.name, &self.extras, self.version.as_deref())
    }
}

/// `name`, its extras and `version` as the installer takes them:
/// `name@version` (npm), `name[a,b]==version` or `name[a,b]>=range` (pip).
pub(super) fn requirement_text(
    ecosystem: Ecosystem,
    name: &str,
    extras: &[String],
    version: Option<&str>,
) -> String {
    match ecosystem {
        Ecosystem::Npm => match version {
            Some(version) => format!("{name}@{version}"),
            None => name.to_owned(),
        },
        Ecosystem::Python => {
            let extras = if extras.is_empty() {
                String::new()
            } else {
                format!("[{}]", extras.join(","))
            };
            match version {
                Some(v) if v.starts_with(['=', '<', '>', '~', '!']) => {
                    format!("{name}{extras}{v}")
                }
                Some(v) => format!("{name}{extras}=={v}"),
                None => format!("{name}{extras}"),
            }
        }
    }
}

/// `spec` as a registry requirement, or why it is not one.
pub(super) fn requirement(
    ecosystem: Ecosystem,
    launcher: &str,
    spec: &str,
) -> Result<Requirement, PackageError> {
    let (name, version) = split_spec(ecosystem, spec);
    let (name, extras) = match (ecosystem, name.split_once('[')) {
        (Ecosystem::Python, Some((name, extras))) => {
            let extras = extras.strip_suffix(']').ok_or_else(|| {
                arguments(
                    launcher,
                    format!("{spec:?}: its extras are not closed with `]`"),
                )
            })?;
            let extras: Vec<String> = extras.split(',').map(|e| e.trim().to_owned()).collect();
            if let Some(bad) = extras.iter().find(|e| !valid_name(Ecosystem::Python, e)) {
                return Err(arguments(
                    launcher,
                    format!("{spec:?}: {bad:?} is not an extra's name"),
                ));
            }
            (name.trim().to_owned(), extras)
        }
        _ => (name, Vec::new()),
    };
    if !valid_name(ecosystem, &name) {
        return Err(arguments(
            launcher,
            format!(
                "{spec:?} is not a registry package name (paths, URLs and git sources are not installed by Moat)"
            ),
        ));
    }
    if let Some(version) = version.as_deref().filter(|v| !valid_version(v)) {
        return Err(arguments(
            launcher,
            format!("{version:?} is not a version (URLs and markers are not installed by Moat)"),
        ));
    }
    Ok(Requirement {
        name,
        extras,
        version,
    })
}

/// Whether `name` is a registry package name: npm's `[@scope/]name`
/// (lower case, digits, `-._~`), or a Python distribution name (PEP 508:
/// letters, digits, `-._`, alphanumeric at both ends). Nothing that could
/// be a path, a URL or an option.
fn valid_name(ecosystem: Ecosystem, name: &str) -> bool {
    let part = |p: &str, extra: &str| {
        !p.is_empty()
            && !p.starts_with(['.', '-', '_'])
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
    };
    match ecosystem {
        Ecosystem::Npm => {
            let lower = name.chars().all(|c| !c.is_ascii_uppercase());
            let unscoped = match name.strip_prefix('@') {
                Some(scoped) => match scoped.split_once('/') {
                    Some((scope, rest)) if part(scope, "-._~") => rest,
                    _ => return false,
                },
                None => name,
            };
            lower && name.len() <= 214 && part(unscoped, "-._~")
        }
        Ecosystem::Python => {
            part(name, "-._") && !name.ends_with(['.', '-', '_']) && name.len() <= 200
        }
    }
}

/// Whether `version` is a version or range in either ecosystem's syntax:
/// digits, letters, `.*+!<>=~^,-` and `|` or spaces between npm ranges;
/// never `@`, `/`, `:` or `;` (a URL, a path or an environment marker).
fn valid_version(version: &str) -> bool {
    !version.is_empty()
        && version.len() <= 100
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".*+!<>=~^,-| ".contains(c))
}

/// `name@version` (npm; a scope's `@` is not a separator), or for Python
/// `name@version`, `name==version` and other PEP 440 specifiers.
pub(super) fn split_spec(ecosystem: Ecosystem, spec: &str) -> (String, Option<String>) {
    let at = match ecosystem {
        Ecosystem::Npm => spec.get(1..).and_then(|s| s.find('@')).map(|i| i + 1),
        Ecosystem::Python => spec.find('@'),
    };
    if let Some(at) = at {
        let version = &spec[at + 1..];
        return (
            spec[..at].to_owned(),
            (!version.is_empty() && version != "latest").then(|| version.to_owned()),
        );
    }
    if ecosystem == Ecosystem::Python
        && let Some(i) = spec.find(['=', '<', '>', '~', '!'])
    {
        return (
            spec[..i].trim().to_owned(),
            Some(spec[i..].trim().to_owned()),
        );
    }
    (spec.to_owned(), None)
}

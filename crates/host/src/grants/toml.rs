//! Grants written back as `moat.toml` lines: the one rendering that
//! `moat import`, `moat learn`, Wassette policies and the sandbox's hints
//! share. Every string is a one-line TOML basic string ([`string`]), so a
//! path or a name from outside cannot start a line of its own.

use std::path::Path;

use super::{DirMode, EnvGrant};

/// `value` as a one-line TOML basic string: quotes and backslashes escaped,
/// and every control character as `\uXXXX` (or `\n`, `\t`), so nothing in
/// it can start a line of its own or reach a terminal raw.
pub fn string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if crate::text::is_unsafe_on_terminal(c) => {
                out.push_str(&format!("\\u{:04X}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `name` as a TOML key: bare when it can be, quoted otherwise.
pub fn key(name: &str) -> String {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        name.to_owned()
    } else {
        string(name)
    }
}

/// A path as a TOML string.
pub fn path(path: &Path) -> String {
    string(&path.display().to_string())
}

/// One `[[servers.SERVER.dirs]]` table, a line a key (no newline at the
/// end); `guest` only where it is written (a wasm server's).
pub fn dir_entry(server: &str, host: &Path, guest: Option<&str>, mode: DirMode) -> String {
    let guest = guest.map_or_else(String::new, |g| format!("guest = {}\n", string(g)));
    format!(
        "[[servers.{}.dirs]]\nhost = {}\n{guest}mode = \"{mode}\"",
        key(server),
        path(host)
    )
}

/// The same entry on one line, for a sentence that quotes it:
/// `[[servers.S.dirs]] host = "/p" mode = "rw"`.
pub fn dir_entry_inline(server: &str, host: &Path, mode: DirMode) -> String {
    format!(
        "[[servers.{}.dirs]] host = {} mode = \"{mode}\"",
        key(server),
        path(host)
    )
}

/// A list of TOML strings (a `net = [...]` or `env_passthrough = [...]`
/// value).
pub fn net_list<S: AsRef<str>>(entries: &[S]) -> String {
    let quoted: Vec<String> = entries.iter().map(|e| string(e.as_ref())).collect();
    format!("[{}]", quoted.join(", "))
}

/// A server's `env = { ... }` and `env_passthrough = [...]` lines, each
/// ending in a newline; nothing for a key with nothing granted.
pub fn env_lines(grant: &EnvGrant) -> String {
    let mut out = String::new();
    if !grant.values.is_empty() {
        let pairs: Vec<String> = grant
            .values
            .iter()
            .map(|(name, value)| format!("{} = {}", key(name), string(value)))
            .collect();
        out.push_str(&format!("env = {{ {} }}\n", pairs.join(", ")));
    }
    if !grant.passthrough.is_empty() {
        out.push_str(&format!(
            "env_passthrough = {}\n",
            net_list(&grant.passthrough)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_one_line_and_round_trip() {
        for text in [
            "plain",
            "quote \" and \\ backslash",
            "line\n[servers.evil]\ncommand = \"sh\"",
            "esc \u{1b}[31m bell \u{7} tab\t zw\u{200B} rtl\u{202E}",
        ] {
            let quoted = string(text);
            assert!(!quoted.chars().any(|c| c.is_control()), "{quoted}");
            let parsed: ::toml::Table = ::toml::from_str(&format!("v = {quoted}")).unwrap();
            assert_eq!(parsed["v"].as_str(), Some(text));
        }
    }

    #[test]
    fn a_dir_entry_parses_back_to_the_same_grant() {
        let host = Path::new("/srv/notes \"x\"\n[servers.evil]");
        let text = dir_entry("my server", host, Some("/notes"), DirMode::Rw);
        let parsed: ::toml::Table = ::toml::from_str(&text).unwrap();
        let entry = &parsed["servers"]["my server"]["dirs"][0];
        assert_eq!(entry["host"].as_str(), Some(host.to_str().unwrap()));
        assert_eq!(entry["guest"].as_str(), Some("/notes"));
        assert_eq!(entry["mode"].as_str(), Some("rw"));
        assert_eq!(
            dir_entry_inline("notes", Path::new("/srv/vault"), DirMode::Ro),
            "[[servers.notes.dirs]] host = \"/srv/vault\" mode = \"ro\""
        );
        let parsed: ::toml::Table =
            ::toml::from_str(&format!("net = {}", net_list(&["a:1", "b\"c:2"]))).unwrap();
        assert_eq!(parsed["net"][1].as_str(), Some("b\"c:2"));
    }

    #[test]
    fn env_lines_parse_back_to_the_same_grant() {
        let grant = EnvGrant {
            values: [
                ("LOG_LEVEL".to_owned(), "debug".to_owned()),
                ("odd name".to_owned(), "a\"b\n[servers.evil]".to_owned()),
            ]
            .into(),
            passthrough: vec!["GITHUB_TOKEN".to_owned()],
        };
        let text = env_lines(&grant);
        assert_eq!(text.lines().count(), 2, "{text}");
        let parsed: ::toml::Table = ::toml::from_str(&text).unwrap();
        let values: std::collections::BTreeMap<String, String> =
            parsed["env"].clone().try_into().unwrap();
        assert_eq!(values, grant.values);
        assert_eq!(parsed["env_passthrough"][0].as_str(), Some("GITHUB_TOKEN"));
        assert_eq!(env_lines(&EnvGrant::default()), "");
    }
}

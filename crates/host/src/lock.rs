//! The lock file, `moat.lock`: what `moat lock` approved for each server: its
//! digests, execution identity and evidence, and the canonical definition of
//! every tool with its pin. Human-readable TOML, written byte-identically
//! when nothing changed (sorted maps, sorted tools, canonical JSON).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::identity::Digest;

/// The version of the lock format this build writes and reads.
pub const LOCK_VERSION: u32 = 1;

/// Errors reading or writing a lock file.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("reading lock {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error(
        "lock {path} has version {found}; this moat reads version {LOCK_VERSION}: run `moat lock`"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("writing lock {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A whole `moat.lock`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    pub version: u32,
    #[serde(default)]
    pub servers: BTreeMap<String, LockedServer>,
}

/// What was approved for one server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedServer {
    /// `wasm`, `native` or `remote`.
    pub kind: String,
    /// The evidence class at lock time.
    pub evidence: String,
    /// The digest of the component or executable (empty for a remote
    /// server, whose identity is its endpoint).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    /// The execution identity: kind, digest, argv, cwd, environment names
    /// and measured files, hashed together.
    pub identity: String,
    /// Extra measured files or directories and their digests.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub measured: BTreeMap<String, String>,
    /// Every `dirs` grant, by host path, with the inode `moat lock` opened
    /// there: under the lock a grant that now opens another inode (the
    /// directory was replaced, or swapped for a link) is refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub grants: BTreeMap<String, u64>,
    /// Every tool the server listed, by name.
    #[serde(default)]
    pub tools: Vec<LockedTool>,
}

/// One tool's pinned definition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedTool {
    pub name: String,
    /// sha256 over the server's identity and the canonical definition.
    pub sha256: String,
    /// Canonical JSON: name, description, inputSchema, outputSchema.
    pub definition: String,
    /// Untrusted-metadata findings (control characters, escapes, zero-width).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
}

impl Lock {
    /// `moat.lock` beside the config file.
    pub fn path_for(config: &Path) -> PathBuf {
        config.with_file_name("moat.lock")
    }

    /// Reads the lock at `path`; `Ok(None)` when there is none.
    pub fn load(path: &Path) -> Result<Option<Self>, LockError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(LockError::Read {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        Self::parse(path, &text).map(Some)
    }

    /// Validates `text` as the lock found at `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, LockError> {
        let lock: Self = toml::from_str(text).map_err(|error| {
            let (line, column) = error
                .span()
                .map_or((1, 1), |span| crate::config::line_column(text, span.start));
            LockError::Invalid {
                path: path.to_owned(),
                line,
                column,
                message: error.message().to_owned(),
            }
        })?;
        if lock.version != LOCK_VERSION {
            return Err(LockError::Version {
                path: path.to_owned(),
                found: lock.version,
            });
        }
        Ok(lock)
    }

    /// The file's text: a header, then sorted TOML.
    pub fn to_text(&self) -> String {
        let body = toml::to_string(self).unwrap_or_default();
        format!(
            "# moat.lock: what `moat lock` approved: each server's digests and identity,\n# and the definition of every tool it may expose. Regenerate with `moat lock`.\n\n{body}"
        )
    }

    /// Writes the lock to `path` (through a temporary file and a rename).
    pub fn write(&self, path: &Path) -> Result<(), LockError> {
        let tmp = path.with_extension(format!("lock.tmp{}", std::process::id()));
        std::fs::write(&tmp, self.to_text())
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|source| LockError::Write {
                path: path.to_owned(),
                source,
            })
    }
}

/// JSON with object keys sorted at every level and no insignificant space.
pub fn canonical_json(value: &serde_json::Value) -> String {
    fn write(value: &serde_json::Value, out: &mut String) {
        match value {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::String(key.clone()).to_string());
                    out.push(':');
                    write(&map[key], out);
                }
                out.push('}');
            }
            serde_json::Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// A tool's canonical definition: name, description, inputSchema and
/// outputSchema (null when absent), as canonical JSON.
pub fn canonical_tool(tool: &rmcp::model::Tool) -> String {
    let value = serde_json::to_value(tool).unwrap_or_default();
    let field = |name: &str| value.get(name).cloned().unwrap_or(serde_json::Value::Null);
    canonical_json(&serde_json::json!({
        "name": field("name"),
        "description": field("description"),
        "inputSchema": field("inputSchema"),
        "outputSchema": field("outputSchema"),
    }))
}

/// A tool's pin: bound to the server's identity, so the same definition
/// served by other bytes is a different pin.
pub fn tool_pin(identity: &Digest, canonical_definition: &str) -> Digest {
    Digest::of(format!("{identity}\n{canonical_definition}").as_bytes())
}

/// What a server's execution identity is made of.
#[derive(Clone, Debug)]
pub struct IdentityParts<'a> {
    pub kind: &'a str,
    pub sha256: Option<Digest>,
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env_names: Vec<String>,
    pub measured: BTreeMap<String, String>,
}

/// The execution identity digest: (kind, digest, argv, cwd, environment
/// names, measured files) as canonical JSON, hashed. It keys reuse; a
/// display name never does.
pub fn execution_identity(parts: &IdentityParts<'_>) -> Digest {
    let mut env_names = parts.env_names.clone();
    env_names.sort();
    env_names.dedup();
    let value = serde_json::json!({
        "kind": parts.kind,
        "sha256": parts.sha256.map(|d| d.to_string()),
        "argv": parts.argv,
        "cwd": parts.cwd,
        "env": env_names,
        "measured": parts.measured,
    });
    Digest::of(canonical_json(&value).as_bytes())
}

/// Findings about untrusted text meant for people and models: control
/// characters (other than newline and tab), ANSI escapes, zero-width and
/// bidirectional-override characters.
pub fn metadata_flags(text: &str) -> Vec<String> {
    let mut flags = Vec::new();
    if text.contains('\u{1b}') {
        flags.push("ansi-escape".to_owned());
    }
    if text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t' && c != '\u{1b}')
    {
        flags.push("control-characters".to_owned());
    }
    if text.chars().any(|c| {
        matches!(c, '\u{200B}'..='\u{200F}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}' | '\u{00AD}')
    }) {
        flags.push("zero-width-characters".to_owned());
    }
    if text
        .chars()
        .any(|c| matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'))
    {
        flags.push("bidi-controls".to_owned());
    }
    flags
}

/// `text` made safe for a terminal: every flagged character replaced by a
/// visible escape such as `\u{1b}`.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            let flagged = (c.is_control() && c != '\n' && c != '\t')
                || matches!(c, '\u{200B}'..='\u{200F}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}' | '\u{00AD}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
            if flagged {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let value = serde_json::json!({"b": 1, "a": {"d": [3, {"z": 1, "y": 2}], "c": null}});
        assert_eq!(
            canonical_json(&value),
            r#"{"a":{"c":null,"d":[3,{"y":2,"z":1}]},"b":1}"#
        );
    }

    #[test]
    fn tool_pins_bind_the_server_identity() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        assert_ne!(tool_pin(&a, "{}"), tool_pin(&b, "{}"));
        assert_eq!(tool_pin(&a, "{}"), tool_pin(&a, "{}"));
    }

    #[test]
    fn identity_ignores_env_order_but_not_argv() {
        let parts = |argv: Vec<&str>, env: Vec<&str>| IdentityParts {
            kind: "native",
            sha256: Some(Digest::of(b"x")),
            argv: argv.into_iter().map(String::from).collect(),
            cwd: Some("/".into()),
            env_names: env.into_iter().map(String::from).collect(),
            measured: BTreeMap::new(),
        };
        assert_eq!(
            execution_identity(&parts(vec!["a", "b"], vec!["X", "Y"])),
            execution_identity(&parts(vec!["a", "b"], vec!["Y", "X"]))
        );
        assert_ne!(
            execution_identity(&parts(vec!["a", "b"], vec![])),
            execution_identity(&parts(vec!["b", "a"], vec![]))
        );
    }

    #[test]
    fn metadata_flags_and_printable() {
        assert!(metadata_flags("plain text\nwith lines\tand tabs").is_empty());
        assert_eq!(
            metadata_flags("red \u{1b}[31m bell \u{7} zw\u{200B} rtl\u{202E}"),
            [
                "ansi-escape",
                "control-characters",
                "zero-width-characters",
                "bidi-controls"
            ]
        );
        assert_eq!(printable("a\u{1b}[31mb\u{200B}"), "a\\u{1b}[31mb\\u{200b}");
    }

    #[test]
    fn lock_round_trips_byte_identically() {
        let mut lock = Lock {
            version: LOCK_VERSION,
            servers: BTreeMap::new(),
        };
        lock.servers.insert(
            "s".into(),
            LockedServer {
                kind: "wasm".into(),
                evidence: "wasm-measured".into(),
                sha256: Digest::of(b"x").to_string(),
                identity: Digest::of(b"y").to_string(),
                measured: BTreeMap::new(),
                grants: BTreeMap::from([("/srv/data".into(), 42)]),
                tools: vec![LockedTool {
                    name: "t".into(),
                    sha256: Digest::of(b"z").to_string(),
                    definition: r#"{"description":"say \"hi\"","name":"t"}"#.into(),
                    flags: vec![],
                }],
            },
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("moat.lock");
        lock.write(&path).unwrap();
        let first = std::fs::read(&path).unwrap();
        let loaded = Lock::load(&path).unwrap().unwrap();
        assert_eq!(loaded, lock);
        loaded.write(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), first);
    }

    #[test]
    fn a_bad_lock_names_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("moat.lock");
        std::fs::write(&path, "version = 1\n[servers.s]\nkind = 3\n").unwrap();
        match Lock::load(&path) {
            Err(LockError::Invalid { line, .. }) => assert_eq!(line, 3),
            other => panic!("{other:?}"),
        }
        std::fs::write(&path, "version = 9\n").unwrap();
        assert!(matches!(
            Lock::load(&path),
            Err(LockError::Version { found: 9, .. })
        ));
        assert!(Lock::load(&dir.path().join("none")).unwrap().is_none());
    }
}

//! Wassette policies: `moat import policy.yaml --component X.wasm` turns a
//! Wassette (policy-mcp) `policy.yaml` into a `moat.toml` entry that runs
//! the component with the same grants, pinned by the component's digest.
//!
//! | Wassette | Moat |
//! | --- | --- |
//! | `storage.allow: {uri: "fs:///p", access: [read]}` | `[[dirs]] host = guest = "/p", mode = "ro"` (the guest sees the same path, as in Wassette) |
//! | `access: [read, write]` (or `[write]`) | `mode = "rw"` |
//! | `network.allow: {host: "h"}` | `net = ["https://h"]` (wasi:http to `h` on 443; `h:port` keeps its port) |
//! | `environment.allow: {key: "K"}` | `env_passthrough = ["K"]` |
//!
//! Anything else (another permission kind, a storage URI that is not an
//! absolute `fs://` path, a network entry without a host) is refused with
//! its place in the file: a grant is never silently dropped or widened.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::grants::DirMode;
use crate::grants::toml::string as toml_string;
use crate::identity::Digest;
use crate::importer::server_name;

/// Why a policy could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a Wassette policy: {detail}")]
    Format { path: PathBuf, detail: String },
    #[error("{path}: {at}: {detail}")]
    Unsupported {
        path: PathBuf,
        at: String,
        detail: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Policy {
    version: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(rename = "$schema", default)]
    _schema: Option<String>,
    #[serde(default)]
    permissions: BTreeMap<String, serde_norway::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Section<T> {
    #[serde(default = "Vec::new")]
    allow: Vec<T>,
    #[serde(default = "Vec::new")]
    deny: Vec<serde_norway::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Storage {
    uri: String,
    access: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Network {
    host: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Environment {
    key: String,
}

/// Reads the policy at `policy` and writes a `[servers.NAME]` entry for the
/// component at `component` (named from its file stem), pinned by its
/// digest.
pub fn import(policy: &Path, component: &Path) -> Result<String, PolicyError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| PolicyError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let text = read(policy)?;
    let bytes = read(component)?;
    let format = |detail: String| PolicyError::Format {
        path: policy.to_owned(),
        detail,
    };
    let unsupported = |at: &str, detail: String| PolicyError::Unsupported {
        path: policy.to_owned(),
        at: at.to_owned(),
        detail,
    };
    let parsed: Policy = serde_norway::from_slice(&text).map_err(|e| format(e.to_string()))?;
    if parsed.version != "1.0" {
        return Err(unsupported(
            "version",
            format!("version {:?} (Moat reads version \"1.0\")", parsed.version),
        ));
    }
    let mut dirs = Vec::new();
    let mut net = Vec::new();
    let mut env = Vec::new();
    for (kind, value) in &parsed.permissions {
        let section = |v: &serde_norway::Value| v.clone();
        match kind.as_str() {
            "storage" => {
                let s: Section<Storage> = serde_norway::from_value(section(value))
                    .map_err(|e| unsupported("permissions.storage", e.to_string()))?;
                refuse_deny(&s.deny, "permissions.storage", &unsupported)?;
                for (i, grant) in s.allow.iter().enumerate() {
                    let at = format!("permissions.storage.allow[{i}]");
                    let path = grant
                        .uri
                        .strip_prefix("fs://")
                        .filter(|p| p.starts_with('/'))
                        .ok_or_else(|| {
                            unsupported(
                                &at,
                                format!(
                                    "uri {:?} is not an absolute fs:// path (fs:///dir)",
                                    grant.uri
                                ),
                            )
                        })?;
                    let mut read = false;
                    let mut write = false;
                    for access in &grant.access {
                        match access.as_str() {
                            "read" => read = true,
                            "write" => write = true,
                            other => {
                                return Err(unsupported(
                                    &at,
                                    format!("access {other:?} (read and write are known)"),
                                ));
                            }
                        }
                    }
                    if !read && !write {
                        return Err(unsupported(&at, "no access listed".into()));
                    }
                    dirs.push((path.to_owned(), DirMode::of(write)));
                }
            }
            "network" => {
                let s: Section<Network> = serde_norway::from_value(section(value))
                    .map_err(|e| unsupported("permissions.network", e.to_string()))?;
                refuse_deny(&s.deny, "permissions.network", &unsupported)?;
                for (i, grant) in s.allow.iter().enumerate() {
                    let at = format!("permissions.network.allow[{i}]");
                    let entry = format!("https://{}", grant.host);
                    match crate::grants::HttpGrant::parse(&entry) {
                        Some(Ok(_)) => net.push(entry),
                        _ => {
                            return Err(unsupported(
                                &at,
                                format!("host {:?} is not a host name or address", grant.host),
                            ));
                        }
                    }
                }
            }
            "environment" => {
                let s: Section<Environment> = serde_norway::from_value(section(value))
                    .map_err(|e| unsupported("permissions.environment", e.to_string()))?;
                refuse_deny(&s.deny, "permissions.environment", &unsupported)?;
                env.extend(s.allow.into_iter().map(|e| e.key));
            }
            other => {
                return Err(unsupported(
                    &format!("permissions.{other}"),
                    "not imported (storage, network and environment are)".into(),
                ));
            }
        }
    }
    let stem = component
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "component".into());
    let name = server_name(&stem);
    let absolute = std::path::absolute(component).unwrap_or_else(|_| component.to_owned());
    let mut out = String::new();
    if let Some(description) = &parsed.description {
        let _ = writeln!(out, "# {}", description.replace(['\n', '\r'], " "));
    }
    let _ = writeln!(out, "# from the Wassette policy {}", policy.display());
    let _ = writeln!(out, "[servers.{name}]");
    let _ = writeln!(
        out,
        "wasm = {}",
        toml_string(&absolute.display().to_string())
    );
    let _ = writeln!(
        out,
        "sha256 = {}",
        toml_string(&Digest::of(&bytes).to_string())
    );
    out.push_str(&crate::grants::toml::env_lines(&crate::grants::EnvGrant {
        values: Default::default(),
        passthrough: env,
    }));
    if !net.is_empty() {
        let _ = writeln!(out, "net = {}", crate::grants::toml::net_list(&net));
    }
    for (path, mode) in &dirs {
        let entry = crate::grants::toml::dir_entry(&name, Path::new(path), Some(path), *mode);
        let _ = writeln!(out, "\n{entry}");
    }
    Ok(out)
}

/// Deny lists narrow an allow list in Wassette; Moat has no such rule, so
/// a policy with one is refused rather than imported wider than written.
fn refuse_deny(
    deny: &[serde_norway::Value],
    at: &str,
    unsupported: &dyn Fn(&str, String) -> PolicyError,
) -> Result<(), PolicyError> {
    if deny.is_empty() {
        Ok(())
    } else {
        Err(unsupported(
            &format!("{at}.deny"),
            "deny lists are not imported: grant only what is allowed".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import_text(policy: &str) -> Result<String, PolicyError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, policy).unwrap();
        let component = dir.path().join("my tool.wasm");
        std::fs::write(&component, b"\0asm").unwrap();
        import(&path, &component)
    }

    #[test]
    fn storage_network_and_environment_become_grants() {
        let toml = import_text(
            "version: \"1.0\"\ndescription: \"A test\"\npermissions:\n  storage:\n    allow:\n      - uri: \"fs:///data\"\n        access: [\"read\"]\n      - uri: \"fs:///scratch\"\n        access: [\"read\", \"write\"]\n  network:\n    allow:\n      - host: \"api.github.com\"\n      - host: \"127.0.0.1:8080\"\n  environment:\n    allow:\n      - key: \"GITHUB_TOKEN\"\n",
        )
        .unwrap();
        let config = crate::config::Config::parse(Path::new("/x/moat.toml"), &toml).unwrap();
        let spec = &config.servers["my-tool"];
        assert_eq!(spec.sha256, Some(Digest::of(b"\0asm")));
        assert_eq!(spec.env.passthrough, ["GITHUB_TOKEN"]);
        assert_eq!(
            spec.http()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["https://api.github.com:443", "https://127.0.0.1:8080"]
        );
        let dirs: Vec<(String, String, crate::grants::DirMode)> = spec
            .dirs
            .iter()
            .map(|d| (d.host.display().to_string(), d.guest.clone(), d.mode))
            .collect();
        assert_eq!(
            dirs,
            [
                ("/data".into(), "/data".into(), crate::grants::DirMode::Ro),
                (
                    "/scratch".into(),
                    "/scratch".into(),
                    crate::grants::DirMode::Rw
                ),
            ]
        );
    }

    #[test]
    fn what_cannot_be_carried_over_is_refused_by_its_place() {
        let cases = [
            ("version: \"2.0\"\n", "version: version \"2.0\""),
            (
                "version: \"1.0\"\npermissions:\n  resources:\n    limits: {}\n",
                "permissions.resources: not imported",
            ),
            (
                "version: \"1.0\"\npermissions:\n  storage:\n    allow:\n      - uri: \"fs://relative\"\n        access: [\"read\"]\n",
                "permissions.storage.allow[0]: uri \"fs://relative\" is not an absolute fs:// path",
            ),
            (
                "version: \"1.0\"\npermissions:\n  storage:\n    allow:\n      - uri: \"fs:///d\"\n        access: [\"execute\"]\n",
                "permissions.storage.allow[0]: access \"execute\"",
            ),
            (
                "version: \"1.0\"\npermissions:\n  network:\n    allow:\n      - host: \"a b\"\n",
                "permissions.network.allow[0]: host \"a b\"",
            ),
            (
                "version: \"1.0\"\npermissions:\n  network:\n    deny:\n      - host: \"x\"\n",
                "permissions.network.deny: deny lists are not imported",
            ),
        ];
        for (policy, expected) in cases {
            let error = import_text(policy).unwrap_err().to_string();
            assert!(error.contains(expected), "{policy}: {error}");
        }
        let error = import_text("{not yaml").unwrap_err().to_string();
        assert!(error.contains("not a Wassette policy"), "{error}");
    }
}

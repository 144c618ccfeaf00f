//! Import: turns a Claude Desktop `claude_desktop_config.json`
//! (`mcpServers`) or a VS Code `.vscode/mcp.json` (`servers`) into
//! `moat.toml` entries, measuring each command's digest at import, and says
//! what it could not carry over; and `moat add`'s one server, from its
//! command line, written to moat.toml ([`add_to_config`]).

mod add;
mod entry;
mod infer;
mod local;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

pub use add::{AddError, Added, add_to_config};
use entry::import_entry;
pub use infer::{
    Inferred, WRITERS, infer_env_grants, infer_grants, is_writer, looks_secret, script_package,
};
pub use local::{LocalModule, local_module};

/// Errors reading a client config.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a client config: {detail}")]
    Format { path: String, detail: String },
}

#[derive(Deserialize)]
struct ClientConfig {
    #[serde(rename = "mcpServers")]
    mcp_servers: Option<BTreeMap<String, Entry>>,
    servers: Option<BTreeMap<String, Entry>>,
}

#[derive(Deserialize)]
struct Entry {
    #[serde(rename = "type")]
    kind: Option<String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    url: Option<String>,
    cwd: Option<String>,
    #[serde(rename = "envFile")]
    env_file: Option<String>,
}

/// The result of an import: TOML text and what was not carried over.
#[derive(Debug, Default)]
pub struct Imported {
    /// `[servers.NAME]` entries, ready to append to a moat.toml.
    pub toml: String,
    /// One line per server or setting that was not carried over.
    pub skipped: Vec<String>,
}

/// A valid Moat server name for `name`: invalid characters become `-`, `__`
/// collapses, at most 32 characters.
pub fn server_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    while out.contains("__") {
        out = out.replace("__", "_");
    }
    out.truncate(32);
    if out.is_empty() {
        "server".to_owned()
    } else {
        out
    }
}

/// Imports the client config at `path`. Commands are resolved on `path_var`
/// and hashed; a command that cannot be found is imported unpinned, and
/// said. Package launchers (`npx -y PKG`, `uvx PKG`, ...) are installed into
/// `store` (see [`crate::packages`]) and imported as the installed program;
/// with no store they are imported as configured, and said.
pub fn import(
    path: &Path,
    path_var: Option<&std::ffi::OsStr>,
    store: Option<&Path>,
) -> Result<Imported, ImportError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ImportError::Read {
        path: shown.clone(),
        source,
    })?;
    let config: ClientConfig = serde_json::from_str(&text).map_err(|e| ImportError::Format {
        path: shown.clone(),
        detail: e.to_string(),
    })?;
    let entries = match (config.mcp_servers, config.servers) {
        (Some(servers), _) | (None, Some(servers)) => servers,
        (None, None) => {
            return Err(ImportError::Format {
                path: shown,
                detail: "neither `mcpServers` (Claude Desktop) nor `servers` (VS Code) is present"
                    .into(),
            });
        }
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let mut imported = Imported::default();
    let mut used = std::collections::BTreeSet::new();
    for (original, entry) in entries {
        let mut name = server_name(&original);
        while !used.insert(name.clone()) {
            name = server_name(&format!("{name}-2"));
        }
        if entry.command.is_none() {
            let what = match (&entry.url, entry.kind.as_deref()) {
                (Some(url), _) => format!("a remote server at {url}"),
                (None, Some(kind)) => format!("a server of type {kind:?} without a command"),
                (None, None) => "an entry without a command".to_owned(),
            };
            imported.skipped.push(format!(
                "`{original}`: {what}: not carried over (remote servers are not supported yet)"
            ));
            continue;
        }
        if original != name {
            imported
                .skipped
                .push(format!("`{original}`: renamed to `{name}`"));
        }
        import_entry(
            &mut imported,
            &name,
            &original,
            &entry,
            base,
            path_var,
            store,
        );
    }
    Ok(imported)
}

/// One server for `moat add`: `command args` as a client config would list
/// it, imported like [`import`] does, under `name` (default: derived from
/// the package or the command).
pub fn add(
    name: Option<&str>,
    command: &str,
    args: &[String],
    base: &Path,
    path_var: Option<&std::ffi::OsStr>,
    store: Option<&Path>,
) -> (String, Imported) {
    let derived = match crate::packages::recognise(command, args) {
        Some(Ok(request)) => {
            let last = request.name.rsplit('/').next().unwrap_or(&request.name);
            let last = last.split('.').next().unwrap_or(last);
            ["mcp-server-", "server-", "mcp-"]
                .iter()
                .find_map(|prefix| last.strip_prefix(prefix))
                .unwrap_or(last)
                .to_owned()
        }
        _ => command.rsplit('/').next().unwrap_or(command).to_owned(),
    };
    let name = server_name(name.unwrap_or(&derived));
    let entry = Entry {
        kind: None,
        command: Some(command.to_owned()),
        args: args.to_vec(),
        env: BTreeMap::new(),
        url: None,
        cwd: None,
        env_file: None,
    };
    let mut imported = Imported::default();
    import_entry(&mut imported, &name, &name, &entry, base, path_var, store);
    (name, imported)
}

#[cfg(test)]
mod tests;

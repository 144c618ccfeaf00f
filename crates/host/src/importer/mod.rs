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
    // Names first, in the config's order; then the installs, several at a
    // time (each mostly waits on a registry); then the entries, written in
    // the config's order with their notes, as if each had been done alone.
    let mut steps = Vec::new();
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
            steps.push(Step::Skip(format!(
                "`{original}`: {what}: not carried over (remote servers are not supported yet)"
            )));
            continue;
        }
        steps.push(Step::Import {
            name,
            original,
            entry,
        });
    }
    let done = at_once(steps, INSTALLED_AT_ONCE, |step| match step {
        Step::Import {
            name,
            original,
            entry,
        } => {
            let prepared = Box::new(entry::prepare(&original, &entry, base, path_var, store));
            Done::Import {
                name,
                original,
                entry,
                prepared,
            }
        }
        Step::Skip(note) => Done::Skip(note),
    });
    let mut imported = Imported::default();
    for done in done {
        match done {
            Done::Skip(note) => imported.skipped.push(note),
            Done::Import {
                name,
                original,
                entry,
                prepared,
            } => {
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
                    *prepared,
                );
            }
        }
    }
    Ok(imported)
}

/// How many of a config's packages `moat import` installs at once. An
/// install mostly waits on its registry; four at a time took a real
/// config of nine npm and PyPI servers from 57 s to 32 s, and npm's and
/// pip's caches are safe to share between them.
const INSTALLED_AT_ONCE: usize = 4;

/// One entry of a client config, named, before its install.
enum Step {
    Import {
        name: String,
        original: String,
        entry: Entry,
    },
    /// Not carried over, with the note that says so.
    Skip(String),
}

/// A [`Step`] after its install.
enum Done {
    Import {
        name: String,
        original: String,
        entry: Entry,
        /// Boxed: a package record is large beside a note.
        prepared: Box<entry::Prepared>,
    },
    Skip(String),
}

/// `f` applied to every one of `items` on at most `threads` threads at a
/// time; the results in the items' order.
fn at_once<T: Send, R: Send>(items: Vec<T>, threads: usize, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    use std::sync::{Mutex, PoisonError};
    let threads = threads.clamp(1, items.len().max(1));
    let queue = Mutex::new(items.into_iter().enumerate());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
                    let Some((index, item)) = next else { break };
                    let result = f(item);
                    results
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((index, result));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(PoisonError::into_inner);
    results.sort_by_key(|(index, _)| *index);
    results.into_iter().map(|(_, result)| result).collect()
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
    let prepared = entry::prepare(&name, &entry, base, path_var, store);
    import_entry(
        &mut imported,
        &name,
        &name,
        &entry,
        base,
        path_var,
        prepared,
    );
    (name, imported)
}

#[cfg(test)]
mod tests;

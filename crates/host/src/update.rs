//! `moat update`: a server's package moved to its newest (or a given)
//! version: installed, the server's entry moved to the install
//! ([`crate::packages::respec`]), started to list its tools, the tools compared with
//! what is pinned, and, when asked, moat.toml and moat.lock re-pinned
//! ([`crate::packages::repin_config`], [`crate::relock::repin`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::{Config, ConfigError};
use crate::host::ConnectError;
use crate::lock::{Lock, LockError, LockedTool};
use crate::packages::{PackageError, RepinError};
use crate::relock::RelockError;
use crate::setup::SetupError;

/// Why a server's package could not be updated.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// Reading the config, or finding the server in it.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The server was not installed by Moat.
    #[error(
        "server `{server}` was not installed by Moat (its entry has no [servers.{server}.package]): nothing to update; `moat add -- npx -y PKG` installs one"
    )]
    NotInstalled { server: String },
    /// The install the entry names is not inside a store.
    #[error("{}: not inside a store", store.display())]
    NotInStore { store: PathBuf },
    /// The install task ended without an answer.
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
    /// Installing the new version.
    #[error(transparent)]
    Package(#[from] PackageError),
    /// The entry's arguments no longer start with the package's entry.
    #[error(
        "server `{server}`: its args no longer start with the package's entry {entry_args:?}; re-add it with `moat add`"
    )]
    Respec {
        server: String,
        entry_args: Vec<String>,
    },
    /// Building the host that measures.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// Reading the lock.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// Starting the installed version to list the tools it had.
    #[error("listing the tools of {package} {version}")]
    ListOld {
        package: String,
        version: String,
        #[source]
        source: Box<ConnectError>,
    },
    /// Starting the new version to list its tools.
    #[error("starting {package} {version} to list its tools")]
    ListNew {
        package: String,
        version: String,
        #[source]
        source: Box<ConnectError>,
    },
    /// Reading moat.toml to re-pin it.
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Re-pinning the server's entry in moat.toml.
    #[error(transparent)]
    Repin(#[from] RepinError),
    /// Writing moat.toml.
    #[error("writing {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Re-pinning the server in moat.lock.
    #[error(transparent)]
    Relock(#[from] RelockError),
}

/// What [`update`] tells as it goes.
#[derive(Debug)]
pub enum Event<'a> {
    /// The version asked for is installed: `package` moves from `from` to
    /// `to`, with the same lockfile when `same`.
    Installed {
        package: &'a str,
        from: &'a str,
        to: &'a str,
        same: bool,
    },
    /// The new version's tools against those pinned (or listed by the
    /// version installed): `changes` is empty when nothing changed.
    Tools {
        changes: &'a [ToolChange],
        count: usize,
    },
    /// moat.toml (at `path`) was re-pinned.
    ConfigRepinned { path: &'a Path },
}

/// How [`update`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Updated {
    /// Same install, same lock entry: nothing to re-pin.
    Nothing,
    /// Re-pinning was not asked for: moat.toml and moat.lock are unchanged.
    NotRepinned,
    /// moat.toml was re-pinned, and moat.lock (at this path) when there is
    /// one.
    Repinned { lock: Option<PathBuf> },
}

/// One tool added, removed or changed between two listings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChange {
    Added(String),
    Changed(String),
    Removed(String),
}

impl std::fmt::Display for ToolChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Added(name) => write!(f, "+ {name} (new)"),
            Self::Changed(name) => write!(f, "~ {name} (definition changed)"),
            Self::Removed(name) => write!(f, "- {name} (removed)"),
        }
    }
}

/// `moat update`: installs the newest (or `version`) of `server`'s package
/// into its store, lists the new version's tools against what is pinned,
/// and re-pins the server in moat.toml and moat.lock only when `repin`.
pub async fn update(
    config_path: &Path,
    server: &str,
    version: Option<&str>,
    repin: bool,
    mut on_event: impl FnMut(Event<'_>),
) -> Result<Updated, UpdateError> {
    let config = Config::load(config_path)?;
    let spec = config.server(server)?;
    let record = spec
        .package()
        .cloned()
        .ok_or_else(|| UpdateError::NotInstalled {
            server: server.to_owned(),
        })?;
    let store = record
        .store
        .parent()
        .ok_or_else(|| UpdateError::NotInStore {
            store: record.store.clone(),
        })?;
    let path_var = std::env::var_os("PATH");
    let request = record.request();
    let installed = tokio::task::spawn_blocking({
        let store = store.to_owned();
        let version = version.map(str::to_owned);
        // `moat update` is the asking: it always resolves anew.
        move || {
            crate::packages::install(
                &store,
                &request,
                version.as_deref(),
                path_var.as_deref(),
                false,
            )
        }
    })
    .await??;
    let new_spec =
        crate::packages::respec(spec, &installed).ok_or_else(|| UpdateError::Respec {
            server: server.to_owned(),
            entry_args: record.entry_args.clone(),
        })?;
    let same = installed.record.lockfile_sha256 == record.lockfile_sha256;
    on_event(Event::Installed {
        package: &record.name,
        from: &record.version,
        to: &installed.record.version,
        same,
    });
    let host = crate::setup::new_host(config_path)?;
    let lock_path = Lock::path_for(config_path);
    let lock = Lock::load(&lock_path)?;
    let before: Vec<LockedTool> = match lock.as_ref().and_then(|l| l.servers.get(server)) {
        Some(locked) => locked.tools.clone(),
        None if record.store.is_dir() => {
            host.measure(spec)
                .await
                .map_err(|source| UpdateError::ListOld {
                    package: record.name.clone(),
                    version: record.version.clone(),
                    source: Box::new(source),
                })?
                .tools
        }
        None => Vec::new(),
    };
    let after = host
        .measure(&new_spec)
        .await
        .map_err(|source| UpdateError::ListNew {
            package: record.name.clone(),
            version: installed.record.version.clone(),
            source: Box::new(source),
        })?;
    on_event(Event::Tools {
        changes: &tool_diff(&before, &after.tools),
        count: after.tools.len(),
    });
    if same
        && lock
            .as_ref()
            .is_none_or(|l| l.servers.get(server) == Some(&after))
    {
        return Ok(Updated::Nothing);
    }
    if !repin {
        return Ok(Updated::NotRepinned);
    }
    let text = std::fs::read_to_string(config_path).map_err(|source| UpdateError::Read {
        path: config_path.to_owned(),
        source,
    })?;
    let repinned = crate::packages::repin_config(config_path, &text, server, &new_spec)?;
    std::fs::write(config_path, repinned).map_err(|source| UpdateError::Write {
        path: config_path.to_owned(),
        source,
    })?;
    on_event(Event::ConfigRepinned { path: config_path });
    let Some(lock) = lock else {
        return Ok(Updated::Repinned { lock: None });
    };
    crate::relock::repin(&host, config_path, server, lock, &lock_path).await?;
    Ok(Updated::Repinned {
        lock: Some(lock_path),
    })
}

/// Every tool added, removed or changed between two listings: added and
/// changed ones in name order, then the removed ones.
fn tool_diff(before: &[LockedTool], after: &[LockedTool]) -> Vec<ToolChange> {
    let by_name = |tools: &[LockedTool]| -> BTreeMap<String, String> {
        tools
            .iter()
            .map(|t| (t.name.clone(), t.definition.clone()))
            .collect()
    };
    let (before, after) = (by_name(before), by_name(after));
    let mut out = Vec::new();
    for (name, definition) in &after {
        match before.get(name) {
            None => out.push(ToolChange::Added(name.clone())),
            Some(old) if old != definition => out.push(ToolChange::Changed(name.clone())),
            Some(_) => {}
        }
    }
    for name in before.keys().filter(|n| !after.contains_key(*n)) {
        out.push(ToolChange::Removed(name.clone()));
    }
    out
}

//! The procedures that rewrite moat.lock: `moat lock` ([`relock`]: measure
//! every server into a new lock that keeps the old one's revocations,
//! leaving revoked servers unstarted), re-pinning one server (`moat
//! update`, [`repin`]) and the kill switch (`moat revoke`, [`revoke`]).
//! Every lock they write has metadata that names another server flagged
//! first. This is the one part of [`crate::lock`] above the host: it starts
//! servers to measure them.

use std::path::{Path, PathBuf};

use futures::StreamExt as _;

use crate::config::{Config, ConfigError};
use crate::host::{ConnectError, Host};
use crate::lock::{LOCK_VERSION, Lock, LockError, LockedServer};
use crate::revoke::{Revocation, Target, TargetError};
use crate::setup::SetupError;

/// How many servers `moat lock` measures at once. Measuring one is mostly
/// waiting: on an interpreter loading its modules, on a handshake, on a
/// listing. Four at a time took a real config of nine npm and PyPI servers
/// from 28 s to 14 s on two cores; each still has its whole
/// `request_timeout_ms` for each request, and more at once would only add
/// processes contending for the same cores.
const MEASURED_AT_ONCE: usize = 4;

/// Why moat.lock could not be rewritten.
#[derive(Debug, thiserror::Error)]
pub enum RelockError {
    /// Reading the config.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Building the host that measures.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// Reading or writing the lock.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The lock to replace cannot be read, and lists revocations that
    /// would be lost.
    #[error(
        "{source}: it lists revocations, which `moat lock` keeps: fix the file (or move it away) first"
    )]
    KeepsRevocations {
        #[source]
        source: LockError,
    },
    /// Measuring a server to re-pin it.
    #[error(transparent)]
    Measure(Box<ConnectError>),
    /// What `moat revoke` was given is not a server, tool or digest.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// There is no lock to record a revocation in.
    #[error("no {}: revocations are kept in the lock; run `moat lock` first", path.display())]
    NoLock { path: PathBuf },
    /// The server to revoke is neither configured nor locked.
    #[error("no server `{server}` in {} or {}", config.display(), lock.display())]
    UnknownServer {
        server: String,
        config: PathBuf,
        lock: PathBuf,
    },
}

impl From<ConnectError> for RelockError {
    fn from(error: ConnectError) -> Self {
        Self::Measure(Box::new(error))
    }
}

/// What [`relock`] tells as it goes.
#[derive(Debug)]
pub enum Event<'a> {
    /// The lock it replaces could not be read; it lists no revocations, so
    /// it is replaced.
    Replacing {
        path: &'a Path,
        error: &'a LockError,
    },
    /// A revoked server, not started; the entry it had (if any) is kept.
    Skipped {
        server: &'a str,
        revocation: &'a Revocation,
    },
    /// A server is being measured.
    Measuring { server: &'a str },
    /// A server was measured.
    Measured {
        server: &'a str,
        locked: &'a LockedServer,
    },
    /// A server could not be measured; the entry it had (if any) is kept,
    /// and the error is in [`Relocked::failures`].
    Failed { server: &'a str },
}

/// A tool, prompt or resource whose metadata is flagged as untrusted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flagged {
    pub server: String,
    /// `tool`, `prompt` or `resource`.
    pub kind: &'static str,
    pub name: String,
    pub flags: Vec<String>,
}

/// What [`relock`] made, not yet written.
#[derive(Debug)]
pub struct Relocked {
    /// The new lock.
    pub lock: Lock,
    /// Where it goes: beside the config.
    pub path: PathBuf,
    /// The servers configured.
    pub servers: usize,
    /// Entries with untrusted metadata, cross-server references included.
    pub flagged: Vec<Flagged>,
    /// The servers that could not be measured, each keeping the entry it
    /// had, if any.
    pub failures: Vec<(String, ConnectError)>,
}

/// Whether writing changed the lock file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    Created,
    Updated,
    Unchanged,
}

impl Written {
    /// One word: created, updated or unchanged.
    pub fn word(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Updated => "updated",
            Self::Unchanged => "unchanged",
        }
    }
}

impl Relocked {
    /// Writes the lock to [`Relocked::path`].
    pub fn write(&self) -> Result<Written, LockError> {
        write(&self.lock, &self.path)
    }
}

/// `moat lock`: measures every server of the config at `config_path` into
/// a new lock that keeps the old lock's revocations. A revoked server is
/// not started, and keeps its entry; so does a server that fails (every
/// server is measured, the failures are returned together). Metadata that
/// names another server is flagged. Nothing is written: see
/// [`Relocked::write`].
pub async fn relock(
    config_path: &Path,
    mut on_event: impl FnMut(Event<'_>),
) -> Result<Relocked, RelockError> {
    let config = Config::load(config_path)?;
    let host = crate::setup::new_host(config_path)?;
    let path = Lock::path_for(config_path);
    let previous = previous(&path, &mut on_event)?;
    let revoked = previous.revocations();
    let mut lock = Lock {
        version: LOCK_VERSION,
        revoked: previous.revoked.clone(),
        ..Lock::default()
    };
    // Started in config order, at most MEASURED_AT_ONCE at a time, and
    // taken back in config order: the events and the lock read as if each
    // server had been measured alone.
    let on_event = std::cell::RefCell::new(on_event);
    let host = &host;
    let mut measured = futures::stream::iter(&config.servers)
        .map(|(name, spec)| {
            let revocation = revoked.of_name(name, None);
            if revocation.is_none() {
                (on_event.borrow_mut())(Event::Measuring { server: name });
            }
            async move {
                match revocation {
                    Some(revocation) => (name, Err(revocation)),
                    None => (name, Ok(host.measure(spec).await)),
                }
            }
        })
        .buffered(MEASURED_AT_ONCE);
    let mut failures = Vec::new();
    while let Some((name, outcome)) = measured.next().await {
        let mut on_event = on_event.borrow_mut();
        match outcome {
            Err(revocation) => {
                on_event(Event::Skipped {
                    server: name,
                    revocation,
                });
                if let Some(old) = previous.servers.get(name) {
                    lock.servers.insert(name.clone(), old.clone());
                }
            }
            Ok(Ok(locked)) => {
                on_event(Event::Measured {
                    server: name,
                    locked: &locked,
                });
                lock.servers.insert(name.clone(), locked);
            }
            Ok(Err(error)) => {
                on_event(Event::Failed { server: name });
                if let Some(old) = previous.servers.get(name) {
                    lock.servers.insert(name.clone(), old.clone());
                }
                failures.push((name.clone(), error));
            }
        }
    }
    let flagged = flag(&mut lock);
    Ok(Relocked {
        lock,
        path,
        servers: config.servers.len(),
        flagged,
        failures,
    })
}

/// Re-pins `server` in `lock` (to be written at `path`): measured as the
/// config at `config_path` now reads, so the lock holds the grants' inodes
/// and identity of exactly that entry, on `host`.
pub async fn repin(
    host: &Host,
    config_path: &Path,
    server: &str,
    mut lock: Lock,
    path: &Path,
) -> Result<Written, RelockError> {
    let config = Config::load(config_path)?;
    let locked = host.measure(config.server(server)?).await?;
    lock.servers.insert(server.to_owned(), locked);
    flag(&mut lock);
    Ok(write(&lock, path)?)
}

/// What [`revoke`] found.
#[derive(Debug)]
pub enum Revoking {
    /// The target was revoked already, by this entry: nothing to write.
    Already(Revocation),
    /// The lock with the new revocation appended, not yet written.
    New {
        revocation: Revocation,
        lock: Lock,
        path: PathBuf,
    },
}

impl Revoking {
    /// Writes the lock with the new revocation (nothing when it was
    /// revoked already).
    pub fn write(&self) -> Result<(), LockError> {
        match self {
            Self::Already(_) => Ok(()),
            Self::New { lock, path, .. } => lock.write(path),
        }
    }
}

/// `moat revoke`: the revocation of `target` (`SERVER`, `SERVER__TOOL` or
/// `sha256:DIGEST`) appended to the lock beside `config_path`, which must
/// exist. A server or tool must name a server configured or locked.
pub fn revoke(config_path: &Path, target: &str, reason: &str) -> Result<Revoking, RelockError> {
    let parsed: Target = target.parse()?;
    let path = Lock::path_for(config_path);
    let mut lock = Lock::load(&path)?.ok_or_else(|| RelockError::NoLock { path: path.clone() })?;
    let server = match &parsed {
        Target::Server(server) | Target::Tool { server, .. } => Some(server),
        Target::Digest(_) => None,
    };
    if let Some(server) = server {
        let config = Config::load(config_path)?;
        if !config.servers.contains_key(server) && !lock.servers.contains_key(server) {
            return Err(RelockError::UnknownServer {
                server: server.clone(),
                config: config_path.to_owned(),
                lock: path,
            });
        }
    }
    let revoked = lock.revocations();
    if let Some((_, earlier)) = revoked.iter().find(|(t, _)| *t == parsed) {
        return Ok(Revoking::Already(earlier.clone()));
    }
    let revocation = crate::revoke::revocation(&parsed, reason);
    lock.revoked.push(revocation.clone());
    Ok(Revoking::New {
        revocation,
        lock,
        path,
    })
}

/// The lock `moat lock` replaces, for the revocations it must keep. One that
/// cannot be read is only an event, unless it holds revocations: those are
/// never dropped silently.
fn previous(path: &Path, on_event: &mut impl FnMut(Event<'_>)) -> Result<Lock, RelockError> {
    match Lock::load(path) {
        Ok(lock) => Ok(lock.unwrap_or_default()),
        Err(error) => {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if text.contains("[[revoked]]") {
                return Err(RelockError::KeepsRevocations { source: error });
            }
            on_event(Event::Replacing {
                path,
                error: &error,
            });
            Ok(Lock::default())
        }
    }
}

/// Flags metadata that names another server (see
/// [`crate::lock::flag_cross_server_references`]), and returns every entry with
/// a flag of any kind.
fn flag(lock: &mut Lock) -> Vec<Flagged> {
    crate::lock::flag_cross_server_references(lock);
    let mut flagged = Vec::new();
    for (server, locked) in &lock.servers {
        let items = [
            ("tool", &locked.tools),
            ("prompt", &locked.prompts),
            ("resource", &locked.resources),
        ];
        for (kind, entries) in items {
            for entry in entries.iter().filter(|e| !e.flags.is_empty()) {
                flagged.push(Flagged {
                    server: server.clone(),
                    kind,
                    name: entry.name.clone(),
                    flags: entry.flags.clone(),
                });
            }
        }
    }
    flagged
}

/// Writes `lock` to `path`, and says whether that changed the file.
fn write(lock: &Lock, path: &Path) -> Result<Written, LockError> {
    let before = std::fs::read(path).ok();
    lock.write(path)?;
    Ok(match before {
        Some(before) if before == lock.to_text().as_bytes() => Written::Unchanged,
        Some(_) => Written::Updated,
        None => Written::Created,
    })
}

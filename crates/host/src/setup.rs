//! What a command runs on, built from a config path: the [`Host`] (its wasm
//! engine as the config's `[wasm]` sets it), the paths no grant may overlap
//! (the cache, the config, the lock beside it and, when serving with an
//! audit log, the log, its anchor and the audit key), the lock it enforces,
//! and the [`Gateway`] `moat serve` runs with its audit log.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::audit::{AuditError, AuditLog};
use crate::config::{Config, ConfigError};
use crate::gateway::Gateway;
use crate::host::ConnectError;
use crate::lock::{Lock, LockError};
use crate::{Host, LaunchError, Session};

/// Why the host or gateway for a config could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// Reading the config, or finding a server in it.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Reading the lock beside the config.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// Building the wasm engine.
    #[error(transparent)]
    Engine(#[from] LaunchError),
    /// A lock is required (`--locked`) and there is none.
    #[error("--locked: {} does not exist; run `moat lock` to create it", path.display())]
    NotLocked { path: PathBuf },
    /// Nowhere to keep the audit key.
    #[error("no directory for the audit key: set MOAT_STATE_DIR (or XDG_STATE_HOME, or HOME)")]
    NoAuditKeyDir,
    /// Opening the audit log or its key.
    #[error(transparent)]
    Audit(#[from] AuditError),
    /// Connecting to a server.
    #[error(transparent)]
    Connect(Box<ConnectError>),
    /// Reading the claim signing key.
    #[error(transparent)]
    Claim(#[from] crate::claim::ClaimError),
    /// `--claims audit` without an audit log.
    #[error(
        "--claims audit: claims go into the audit log, and there is none: give --audit FILE, or --claims DIR"
    )]
    ClaimsWithoutAudit,
}

impl From<ConnectError> for SetupError {
    fn from(error: ConnectError) -> Self {
        Self::Connect(Box::new(error))
    }
}

/// A host with the default cache that refuses grants overlapping the
/// cache, `config_path` or the lock beside it. Its wasm engine meters and
/// allocates as the config's `[wasm]` says; a config yet to be written
/// (`moat add` makes it) has the defaults.
pub fn new_host(config_path: &Path) -> Result<Host, SetupError> {
    let (metering, allocator) = if config_path.exists() {
        let config = Config::load(config_path)?;
        (config.wasm.metering, crate::wasm::Allocator::of(&config))
    } else {
        Default::default()
    };
    let mut host = Host::with_options(Host::default_cache_dir(), metering.into(), allocator)?;
    for (what, path) in config_paths(config_path) {
        host = host.protect(what, path);
    }
    Ok(host)
}

/// A host for `config_path` (see [`new_host`]), enforcing moat.lock when it
/// exists beside the config, and requiring it when `locked`. Every name the
/// lock pins that the gateway could not expose is handed to `warn` (it is
/// refused nowhere).
pub fn host_for(
    config_path: &Path,
    locked: bool,
    mut warn: impl FnMut(&dyn std::error::Error),
) -> Result<Host, SetupError> {
    let mut host = new_host(config_path)?;
    let lock_path = Lock::path_for(config_path);
    match Lock::load(&lock_path)? {
        Some(lock) => {
            for problem in crate::gateway::check_lock_names(&lock) {
                warn(&problem);
            }
            host = host.with_lock(lock, lock_path);
        }
        None if locked => return Err(SetupError::NotLocked { path: lock_path }),
        None => {}
    }
    Ok(host)
}

/// A session with `server` of the config at `config_path`, on a host from
/// [`host_for`].
pub async fn connect(
    config_path: &Path,
    server: &str,
    locked: bool,
    warn: impl FnMut(&dyn std::error::Error),
) -> Result<Session, SetupError> {
    let config = Config::load(config_path)?;
    let spec = config.server(server)?;
    Ok(host_for(config_path, locked, warn)?.connect(spec).await?)
}

/// The gateway `moat serve` runs, on a host from [`host_for`] that also
/// refuses grants overlapping the audit log, its anchor, the audit and
/// claim keys and the claims directory, signing a claim of each session
/// when `claims` says where (see [`claims`]), with exposed names checked
/// before serving: from the lock when there is one, otherwise by starting
/// each server once. A pass-through variable that is unset here is not set
/// for the server either: that is logged once, before a server fails for
/// want of it.
pub async fn gateway_for(
    config_path: &Path,
    locked: bool,
    audit: Option<&Path>,
    claims: Option<crate::claim::Place>,
    warn: impl FnMut(&dyn std::error::Error),
) -> Result<Gateway, SetupError> {
    let config = Config::load(config_path)?;
    let claims = claims
        .map(|place| self::claims(place, audit.is_some()))
        .transpose()?;
    for (name, spec) in &config.servers {
        for var in spec.env.unset() {
            tracing::warn!(
                "server `{name}`: env_passthrough names {var}, which is not set in Moat's environment: the server starts without it"
            );
        }
    }
    let mut host = host_for(config_path, locked, warn)?;
    if let Some(audit) = audit {
        for (what, path) in audit_paths(audit)? {
            host = host.protect(what, path);
        }
    }
    if let Some(claims) = &claims {
        // The key signs for Moat: no server may read it. Claims in a
        // directory: no server may remove or replace one.
        if let Some(dir) = claims.key.path().parent() {
            host = host.protect(crate::grants::CLAIM_KEY, dir.to_owned());
        }
        if let crate::claim::Place::Dir(dir) = &claims.place {
            host = host.protect(
                crate::grants::CLAIMS,
                std::path::absolute(dir).unwrap_or(dir.clone()),
            );
        }
    }
    let pinned = host.is_locked();
    let gateway = Gateway::new(host, config, open_audit(audit)?);
    if let Some(claims) = claims {
        gateway.sign_claims(claims);
    }
    if !pinned {
        gateway.check_names().await;
    }
    Ok(gateway)
}

/// The launch host `moat node` runs for the config at `config_path`: its
/// lock is required (a node launches only what it has pinned), its
/// statements are signed with Moat's claim key (made when missing), which
/// no server it launches may reach.
pub fn node_for(
    config_path: &Path,
    warn: impl FnMut(&dyn std::error::Error),
) -> Result<crate::node::launch::Node, SetupError> {
    let config = Config::load(config_path)?;
    let lock_path = Lock::path_for(config_path);
    let lock = Lock::load(&lock_path)?.ok_or(SetupError::NotLocked {
        path: lock_path.clone(),
    })?;
    let key_dir = audit_key_dir()?;
    let key = crate::claim::SigningKey::in_dir(&key_dir, true)?;
    let host = host_for(config_path, true, warn)?.protect(crate::grants::CLAIM_KEY, key_dir);
    Ok(crate::node::launch::Node::new(
        config,
        lock,
        host,
        Arc::new(key),
    ))
}

/// What `moat serve --claims PLACE` signs with: the claim signing key
/// beside the audit key (made when missing), and where claims go (into the
/// audit log only when there is one, `audited`).
pub fn claims(
    place: crate::claim::Place,
    audited: bool,
) -> Result<crate::claim::Claims, SetupError> {
    if matches!(place, crate::claim::Place::AuditLog) && !audited {
        return Err(SetupError::ClaimsWithoutAudit);
    }
    if let crate::claim::Place::Dir(dir) = &place {
        std::fs::create_dir_all(dir).map_err(|source| crate::claim::ClaimError::Io {
            path: dir.clone(),
            operation: "making the claims directory",
            source,
        })?;
    }
    let key = crate::claim::SigningKey::in_dir(&audit_key_dir()?, true)?;
    Ok(crate::claim::Claims {
        key: Arc::new(key),
        place,
    })
}

/// Where the audit key lives (see [`crate::audit::default_key_dir`]).
pub fn audit_key_dir() -> Result<PathBuf, SetupError> {
    crate::audit::default_key_dir().ok_or(SetupError::NoAuditKeyDir)
}

/// The audit log at `audit`, when there is one, under the user's audit key
/// (made when missing).
fn open_audit(audit: Option<&Path>) -> Result<Option<Arc<AuditLog>>, SetupError> {
    let Some(path) = audit else {
        return Ok(None);
    };
    let key = crate::audit::key_in(&audit_key_dir()?, true)?;
    Ok(Some(Arc::new(AuditLog::open(path, key)?)))
}

/// What no grant may overlap for a config (beside the cache, which the
/// host protects itself): the config and the lock beside it.
fn config_paths(config_path: &Path) -> [(&'static str, PathBuf); 2] {
    [
        ("config", config_path.to_owned()),
        ("lock", Lock::path_for(config_path)),
    ]
}

/// What no grant may overlap when serving with the audit log `audit`: the
/// log, its anchor and the directory of the audit key.
fn audit_paths(audit: &Path) -> Result<[(&'static str, PathBuf); 3], SetupError> {
    Ok([
        ("audit log", audit.to_owned()),
        ("audit anchor", crate::audit::anchor_path(audit)),
        (crate::grants::AUDIT_KEY, audit_key_dir()?),
    ])
}

//! What may be launched, and under which lock: the [`Host`] holds the wasm
//! engine, the lock and its revocations, the paths no grant may reach, and
//! the kill switch; it turns a spec into a connected [`Session`] (refusing
//! what the lock does not approve), measures servers for `moat lock`
//! ([`measure`]) and watches one for `moat learn` ([`learn`]).

mod error;
mod learn;
mod locked;
mod measure;

pub use error::ConnectError;
pub use learn::Learned;
use locked::{pin_grants, pin_oci, revoked_before_launch};

use crate::session::{Handshake, Session, SessionError};

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{ServerKind, ServerSpec};
use crate::identity::{Digest, Expectation};
use crate::launch::{LaunchError, ServerTransport};
use crate::lock::{Lock, LockedServer};
use crate::revoke::Revoked;
use crate::transport::Shared;
use crate::wasm::WasmEngine;

/// One instance a host started: its server, and its transport's state
/// (gone once every part of the instance has ended).
pub(crate) type Started = (String, std::sync::Weak<Shared>);

/// Launches servers. One per process: it holds the wasm engine and cache.
#[derive(Clone)]
pub struct Host {
    pub(crate) wasm: WasmEngine,
    pub(crate) lock: Option<(Arc<Lock>, PathBuf)>,
    /// What no grant may overlap: the cache, the lock, and what the caller
    /// adds with [`Host::protect`] (the config, the audit log).
    #[cfg(unix)]
    pub(crate) protected: Vec<crate::grants::Protected>,
    /// Connects attempted through this host (and its clones): each starts
    /// one instance.
    pub(crate) launches: Arc<std::sync::atomic::AtomicU64>,
    /// Every instance started, by server, for [`Host::running`].
    pub(crate) started: Arc<std::sync::Mutex<Vec<Started>>>,
    /// The kill switch, checked at every launch under the lock (and by the
    /// gateway on every call).
    pub(crate) revoked: Arc<std::sync::RwLock<Arc<Revoked>>>,
    /// What native servers' egress proxies share (see
    /// [`Host::with_egress`]).
    #[cfg(unix)]
    pub(crate) egress: crate::egress::Shares,
    /// The pins of the lock in force, compiled once per server and shared
    /// by every session of it. A new lock starts a new cache.
    pub(crate) pins: Arc<PinCache>,
    /// Compiles of a lock entry's pins by this host (and its clones).
    pub(crate) pin_compiles: Arc<std::sync::atomic::AtomicU64>,
}

/// A server's pins, compiled (or refused) once for the lock in force: the
/// schemas of every pinned tool, which each session of the server had
/// compiled again for itself before.
type SharedPins =
    Arc<tokio::sync::OnceCell<Result<Arc<crate::policy::Pins>, crate::policy::PolicyError>>>;

/// The compiled pins of one lock, by server.
#[derive(Default)]
pub(crate) struct PinCache {
    servers: std::sync::Mutex<std::collections::HashMap<String, SharedPins>>,
}

impl PinCache {
    fn server(&self, server: &str) -> SharedPins {
        self.servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(server.to_owned())
            .or_default()
            .clone()
    }
}

impl Host {
    /// How many instances this host (and its clones) has started.
    pub fn launches(&self) -> u64 {
        self.launches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many times this host (and its clones) compiled a server's pins
    /// (its pinned tools' schemas): once per server and lock, however many
    /// sessions it serves.
    pub fn pin_compiles(&self) -> u64 {
        self.pin_compiles.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many instances of `server` this host (and its clones) started
    /// that still run: a task of their transport (the instance or process
    /// itself, its pipes) is alive.
    pub fn running(&self, server: &str) -> usize {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        started.retain(|(_, shared)| shared.strong_count() > 0);
        started
            .iter()
            .filter(|(name, shared)| {
                name == server
                    && shared
                        .upgrade()
                        .is_some_and(|shared| shared.tracker().live() > 0)
            })
            .count()
    }

    /// Records an instance for [`Host::running`], forgetting those gone.
    pub(crate) fn track(&self, server: &str, session: &Session) {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        started.retain(|(_, shared)| shared.strong_count() > 0);
        started.push((server.to_owned(), Arc::downgrade(session.shared())));
    }

    /// A host caching compiled components in `cache_dir`, when given.
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Self, LaunchError> {
        Self::with_metering(cache_dir, crate::wasm::Metering::default())
    }

    /// A host whose wasm engine bounds guests' CPU by `metering`.
    pub fn with_metering(
        cache_dir: Option<PathBuf>,
        metering: crate::wasm::Metering,
    ) -> Result<Self, LaunchError> {
        Self::with_options(cache_dir, metering, crate::wasm::Allocator::default())
    }

    /// A host whose wasm engine bounds CPU by `metering` and allocates
    /// instances with `allocator`.
    pub fn with_options(
        cache_dir: Option<PathBuf>,
        metering: crate::wasm::Metering,
        allocator: crate::wasm::Allocator,
    ) -> Result<Self, LaunchError> {
        let mut host = Self {
            wasm: WasmEngine::with_options(cache_dir.clone(), metering, allocator)?,
            lock: None,
            #[cfg(unix)]
            protected: Vec::new(),
            launches: Arc::default(),
            started: Arc::default(),
            revoked: Arc::default(),
            #[cfg(unix)]
            egress: crate::egress::Shares::default(),
            pins: Arc::default(),
            pin_compiles: Arc::default(),
        };
        if let Some(dir) = cache_dir {
            host = host.protect(crate::grants::CACHE, dir);
        }
        Ok(host)
    }

    /// The revocations in force: the lock's `[[revoked]]` when it was
    /// enforced, or what [`Host::set_revoked`] put in force since. Shared by
    /// every clone of this host.
    pub fn revoked(&self) -> Arc<Revoked> {
        self.revoked
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Puts `revoked` in force for this host and all its clones (moat.lock
    /// read again while serving), from the next launch on. Returns the
    /// revocations it replaces.
    pub fn set_revoked(&self, revoked: Revoked) -> Arc<Revoked> {
        std::mem::replace(
            &mut *self.revoked.write().unwrap_or_else(|e| e.into_inner()),
            Arc::new(revoked),
        )
    }

    /// Enforces `lock` (read from `path`) on every connect: digests, the
    /// execution identity, grant inodes and tool pins.
    pub fn with_lock(mut self, lock: Lock, path: PathBuf) -> Self {
        self = self.protect("lock", path.clone());
        self.revoked = Arc::new(std::sync::RwLock::new(Arc::new(lock.revocations())));
        self.lock = Some((Arc::new(lock), path));
        self.pins = Arc::default();
        self
    }

    /// A clone of this host enforcing `lock` (or none) instead: moat.lock
    /// read again while serving. It shares the engine, its cache, the launch
    /// counts and the revocations in force (which the caller updates).
    pub fn relocked(&self, lock: Option<(Lock, PathBuf)>) -> Self {
        let mut host = self.clone();
        host.lock = lock.map(|(lock, path)| (Arc::new(lock), path));
        host.pins = Arc::default();
        host
    }

    /// The lock this host enforces, when there is one.
    pub fn lock(&self) -> Option<&Lock> {
        self.lock.as_ref().map(|(lock, _)| &**lock)
    }

    /// Refuses, at every launch, a `dirs` grant that overlaps `path` (the
    /// same path, or one inside the other). `what` names it in the error.
    pub fn protect(mut self, what: &'static str, path: PathBuf) -> Self {
        #[cfg(unix)]
        self.protected.push(crate::grants::Protected { what, path });
        #[cfg(not(unix))]
        let _ = (what, path);
        self
    }

    /// This host, launching native servers whose egress proxies draw from
    /// `egress` (a gateway's and a session's pools) beside each server's
    /// own bound. A clone shares everything else.
    #[cfg(unix)]
    pub fn with_egress(&self, egress: crate::egress::Shares) -> Self {
        Self {
            egress,
            ..self.clone()
        }
    }

    /// The pools native servers' egress proxies draw from.
    #[cfg(unix)]
    pub fn egress(&self) -> &crate::egress::Shares {
        &self.egress
    }

    /// The default cache directory (see [`crate::dirs::cache`]).
    pub fn default_cache_dir() -> Option<PathBuf> {
        crate::dirs::cache()
    }

    /// The lock entry for `server`, when a lock is enforced.
    pub fn locked(&self, server: &str) -> Option<&LockedServer> {
        self.lock
            .as_ref()
            .and_then(|(lock, _)| lock.servers.get(server))
    }

    /// Whether a lock is enforced.
    pub fn is_locked(&self) -> bool {
        self.lock.is_some()
    }

    /// The wasm engine.
    pub fn wasm(&self) -> &WasmEngine {
        &self.wasm
    }

    /// A transport for `spec`, not yet connected. Refuses a server that has
    /// no pinned digest unless `allow_unmeasured` is set.
    pub fn transport(&self, spec: &ServerSpec) -> Result<ServerTransport, LaunchError> {
        if matches!(
            spec.kind,
            ServerKind::Remote { .. } | ServerKind::Node { .. }
        ) {
            // Nothing here runs a remote server, so there are no bytes to
            // measure; its config requires sandbox = "best-effort". A
            // server on a node is measured there: its revision pins it.
            return self.transport_expecting(spec, Expectation::Unpinned);
        }
        let expected = spec.expectation().ok_or_else(|| LaunchError::Unmeasured {
            server: spec.name.clone(),
        })?;
        self.transport_expecting(spec, expected)
    }

    /// A transport for `spec` whose bytes must meet `expected`.
    pub fn transport_expecting(
        &self,
        spec: &ServerSpec,
        expected: Expectation,
    ) -> Result<ServerTransport, LaunchError> {
        #[cfg(unix)]
        let readable = match &spec.kind {
            ServerKind::Native { measure, .. } => measure.as_slice(),
            _ => &[],
        };
        crate::grants::check_protected(&spec.name, &spec.dirs, readable, &self.protected)?;
        if let Some(package) = spec.package().filter(|p| !p.store.is_dir()) {
            return Err(LaunchError::PackageMissing {
                server: spec.name.clone(),
                package: package.name.clone(),
                version: package.version.clone(),
                store: package.store.clone(),
            });
        }
        let planned = crate::launch::plan(
            &self.wasm,
            spec,
            expected,
            #[cfg(unix)]
            None,
            #[cfg(unix)]
            self.egress.clone(),
            &self.protected,
        )?;
        Ok(planned.transport(&spec.name, spec.limits.clone()))
    }

    /// Launches `spec` and completes the handshake.
    pub async fn connect(&self, spec: &ServerSpec) -> Result<Session, ConnectError> {
        self.connect_with(spec, Handshake::Auto).await
    }

    /// Launches with `launch` and completes `handshake`. A server whose
    /// answer to `server/discover` cannot be read (a revision's draft
    /// shape: Toolbox 1.12 answers without `ttlMs` and `cacheScope`) is
    /// launched again and spoken to with `initialize`, under `Auto`.
    pub(crate) async fn connect_falling_back(
        &self,
        server: &str,
        launch: impl Fn() -> Result<ServerTransport, LaunchError>,
        handshake: Handshake,
    ) -> Result<Session, ConnectError> {
        match Session::connect(launch()?, handshake).await {
            Err(SessionError::DiscoverUnreadable { detail, .. })
                if handshake == Handshake::Auto =>
            {
                tracing::warn!(
                    %server,
                    %detail,
                    "its answer to server/discover could not be read; starting it again with initialize"
                );
                Ok(Session::connect(launch()?, Handshake::Initialize).await?)
            }
            other => Ok(other?),
        }
    }

    /// Launches `spec` and completes the given handshake. With a lock, the
    /// bytes must be the locked bytes, the identity the locked identity, and
    /// the session exposes pinned tools only.
    pub async fn connect_with(
        &self,
        spec: &ServerSpec,
        handshake: Handshake,
    ) -> Result<Session, ConnectError> {
        self.launches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some((lock, lock_path)) = &self.lock else {
            let mut session = self
                .connect_falling_back(&spec.name, || self.transport(spec), handshake)
                .await?;
            self.track(&spec.name, &session);
            session.execution = session.execution_identity(spec);
            return Ok(session);
        };
        let lock_name = lock_path.display().to_string();
        let locked = lock
            .servers
            .get(&spec.name)
            .ok_or_else(|| ConnectError::NotLocked {
                server: spec.name.clone(),
                lock: lock_name.clone(),
            })?
            .clone();
        if let Some(revocation) = revoked_before_launch(&self.revoked(), &spec.name, &locked) {
            return Err(ConnectError::Revoked {
                server: spec.name.clone(),
                subject: format!("server `{}`", spec.name),
                revocation,
            });
        }
        // The pinned schemas compile on a blocking thread while the server
        // starts and shakes hands (jsonschema's check of every schema
        // against its meta-schema is most of it), instead of after, and
        // once for every session of the server under this lock. They are
        // compiled for the locked identity, which the server's must equal
        // before they are used.
        let pins = async {
            let identity: Digest = locked.identity.parse().ok()?;
            let cell = self.pins.server(&spec.name);
            // Only the session that compiles copies the entry.
            let compile = || {
                let (entry, compiles) = (locked.clone(), self.pin_compiles.clone());
                tokio::task::spawn_blocking(move || {
                    compiles.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    crate::policy::Pins::from_locked(&entry, identity).map(Arc::new)
                })
            };
            // A compile that panicked is not kept: the session compiles
            // again itself, where the panic is its own.
            cell.get_or_try_init(compile).await.ok().cloned()
        };
        let pinned = if matches!(
            spec.kind,
            ServerKind::Remote { .. } | ServerKind::Node { .. }
        ) {
            // No bytes to pin here: the locked identity (the endpoint; for
            // a node, its address, the profile, the revision and the digest
            // the node says runs) and the tool pins are checked below.
            None
        } else {
            let digest: Digest = locked.sha256.parse().map_err(|e| ConnectError::BadLock {
                server: spec.name.clone(),
                lock: lock_name.clone(),
                detail: format!("sha256: {e}"),
            })?;
            if let Some(pin) = spec.sha256
                && pin != digest
            {
                return Err(ConnectError::LockConflict {
                    server: spec.name.clone(),
                    config: pin.to_string(),
                    locked: digest.to_string(),
                });
            }
            let spec = pin_grants(spec, &locked).map_err(|path| ConnectError::GrantNotLocked {
                server: spec.name.clone(),
                path,
                lock: lock_name.clone(),
            })?;
            let spec = pin_oci(spec, &locked, &lock_name).map_err(|e| *e)?;
            Some((spec, digest))
        };
        let connecting = self.connect_falling_back(
            &spec.name,
            || match &pinned {
                None => self.transport(spec),
                Some((spec, digest)) => {
                    self.transport_expecting(spec, Expectation::Pinned(*digest))
                }
            },
            handshake,
        );
        let (connected, pins) = tokio::join!(connecting, pins);
        let mut session = connected?;
        self.track(&spec.name, &session);
        session.execution = session.execution_identity(spec);
        let checked = match session.execution {
            None => Err(ConnectError::from(SessionError::Protocol {
                server: spec.name.clone(),
                operation: "pin check".into(),
                detail: "the server reported no identity".into(),
            })),
            Some(live) if live.to_string() != locked.identity => {
                Err(ConnectError::IdentityChanged {
                    server: spec.name.clone(),
                    locked: locked.identity.clone(),
                    live: live.to_string(),
                })
            }
            Some(live) => session
                .enforce(&locked, live, pins)
                .await
                .map_err(Into::into),
        };
        if let Err(error) = checked {
            let _ = session.close_quietly().await;
            return Err(error);
        }
        Ok(session)
    }
}

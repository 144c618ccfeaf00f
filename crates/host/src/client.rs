//! Client: a connected session with one server over the one transport, with
//! errors that say what failed. A transport fault (limit, exit, framing)
//! always wins over the generic "transport closed" rmcp would report.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientRequest, GetPromptRequestParams, GetPromptResult,
    JsonObject, ProgressNotificationParam, ProtocolVersion, ReadResourceRequestParams,
    ReadResourceResult, Request, Resource, ServerResult, Tool,
};
use rmcp::service::PeerRequestOptions;
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceError};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{ServerKind, ServerSpec, WasmSource};
use crate::identity::{Digest, Expectation};
use crate::launch::{LaunchError, ServerTransport};
use crate::lock::{
    IdentityParts, Lock, LockedServer, LockedTool, canonical_tool, execution_identity, tool_pin,
};
use crate::policy::{Pins, ToolReport, ToolStatus};
use crate::revoke::Revoked;
use crate::transport::{Fault, Shared};
use crate::wasm::WasmEngine;

/// What a server answered a `tools/call` with: 2026-07-28 adds two
/// answers besides a result.
#[derive(Debug)]
pub enum CallAnswer {
    /// The result.
    Complete(CallToolResult),
    /// The server needs the caller's input first: the caller answers the
    /// requests and calls again with [`Retry`].
    InputRequired(rmcp::model::InputRequiredResult),
    /// The server made a task of the call: `tasks/get` follows it.
    Task(rmcp::model::CreateTaskResult),
}

/// What a call again after [`CallAnswer::InputRequired`] carries back to
/// the server: the caller's answers and the state the server asked to get
/// back, as they are.
#[derive(Clone, Debug, Default)]
pub struct Retry {
    pub input_responses: Option<rmcp::model::InputResponses>,
    pub request_state: Option<String>,
}

/// Which handshake the client uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Handshake {
    /// `server/discover` (2026-07-28), falling back to `initialize` for
    /// servers that report they are legacy.
    #[default]
    Auto,
    /// Only `initialize` (revisions up to 2025-11-25).
    Initialize,
    /// Only `server/discover` (2026-07-28).
    Discover,
}

impl Handshake {
    fn mode(self) -> ClientLifecycleMode {
        match self {
            Self::Initialize => ClientLifecycleMode::Initialize,
            Self::Discover => ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
            Self::Auto => ClientLifecycleMode::Auto {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                legacy_version: Some(ProtocolVersion::V_2025_11_25),
            },
        }
    }
}

/// Errors of a client session, naming the server and the operation.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The kill switch: moat.lock's `[[revoked]]` names the server, the
    /// tool or a digest the server runs.
    #[error("{subject} is refused: {revocation}")]
    Revoked {
        server: String,
        /// `server `x`` or `tool `t` on server `x``.
        subject: String,
        /// What was revoked, by whom, when and why.
        revocation: String,
    },
    #[error("{operation} on server `{server}` failed: {fault}")]
    Fault {
        server: String,
        operation: String,
        fault: Fault,
    },
    #[error("{operation} on server `{server}`: the server answered with error {code}: {message}")]
    Server {
        server: String,
        operation: String,
        code: i32,
        message: String,
    },
    #[error("{operation} on server `{server}` failed: {detail}")]
    Protocol {
        server: String,
        operation: String,
        detail: String,
    },
    #[error(
        "{operation} on server `{server}` failed: {fault}. The native sandbox may be the cause: the server may read only what `moat inspect {server}` lists{denied}. Run `moat learn {server}` to see the files and addresses it uses, and grant them with `dirs` and `net`"
    )]
    Sandboxed {
        server: String,
        /// `handshake`, or the request that was in flight.
        operation: String,
        fault: Fault,
        /// Paths the server's stderr names beside a denial, as ": it was
        /// denied A, B".
        denied: String,
    },
    #[error(
        "{operation} on server `{server}` failed: {fault}. It tried to reach the network ({hosts}), which the native sandbox refuses to what `net` does not list: a server that downloads code or data when it starts (an `npm install`, `pip install` or model download at first use) needs it installed ahead of time (`moat add`), or the host granted (`net = [\"HOST:443\"]`; `moat learn {server}` shows where it connects)"
    )]
    NetworkRefused {
        server: String,
        /// `handshake`, or the request that was in flight.
        operation: String,
        fault: Fault,
        /// The hosts its stderr names beside a failed lookup or
        /// connection, or "a host its stderr does not name".
        hosts: String,
    },
    #[error(
        "handshake on server `{server}` failed: its answer to server/discover is not a discover result Moat can read ({detail})"
    )]
    DiscoverUnreadable { server: String, detail: String },
    #[error(transparent)]
    Lock(#[from] crate::lock::LockError),
    #[cfg(unix)]
    #[error(transparent)]
    Learn(#[from] crate::native::learn::LearnError),
    #[error("server `{server}` is not in {lock}: run `moat lock` to approve it")]
    NotLocked { server: String, lock: String },
    #[error(
        "server `{server}`: grant {path} is not in {lock} (added since `moat lock`, or the lock predates grant pins): run `moat lock` to approve it"
    )]
    GrantNotLocked {
        server: String,
        path: String,
        lock: String,
    },
    #[error("server `{server}`: {lock} is damaged: {detail}")]
    BadLock {
        server: String,
        lock: String,
        detail: String,
    },
    #[error(
        "server `{server}`: the config pins sha256 {config} but the lock approved {locked}: run `moat lock` after checking which is right"
    )]
    LockConflict {
        server: String,
        config: String,
        locked: String,
    },
    #[error(
        "server `{server}`: the config names {config} but the lock approved {locked}: run `moat lock` to approve the config's"
    )]
    OciLockConflict {
        server: String,
        config: String,
        locked: String,
    },
    #[error(
        "server `{server}`: its execution identity changed since the lock (locked {locked}, now {live}): argv, cwd, environment names or measured files differ; run `moat lock` to approve"
    )]
    IdentityChanged {
        server: String,
        locked: String,
        live: String,
    },
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    #[error(
        "server `{server}` crashed again after {restarts} restarts in this session; giving up: {fault}"
    )]
    GaveUp {
        server: String,
        restarts: u32,
        fault: Fault,
    },
    #[error(
        "{kind} `{name}` on server `{server}` is unavailable: {status} since `moat lock` (run `moat lock` to approve it)"
    )]
    NotPinned {
        server: String,
        kind: &'static str,
        name: String,
        status: &'static str,
    },
    #[error("tool `{tool}` on server `{server}`: the call was cancelled")]
    Cancelled { server: String, tool: String },
    /// The server answered with a request for input (a multi round-trip
    /// request, or a task waiting for input) that this caller cannot answer.
    #[error(
        "tool `{tool}` on server `{server}` asks the caller for input, which this caller cannot give (an agent on 2026-07-28 can)"
    )]
    InputRequired { server: String, tool: String },
    /// A server a session still ran when moat.lock was read again and no
    /// longer matched it: that session stops it and refuses it from then on.
    #[error(
        "server `{server}` is refused in this session: moat.lock was reloaded and no longer matches what this session runs ({detail}); a new session runs what the lock pins now"
    )]
    Stale { server: String, detail: String },
    /// A call in flight when a revocation of what it calls came into force,
    /// cancelled when the drain timeout passed.
    #[error("tool `{tool}` on server `{server}`: the call was cancelled in flight: {refusal}")]
    CancelledByRevocation {
        server: String,
        tool: String,
        refusal: String,
    },
    /// A server of `moat serve` that failed to start, asked for again
    /// before its next try is due: the reason of the last failure.
    #[error("server `{server}` could not start: {reason} (Moat tries it again in {retry_in_s} s)")]
    NotStarted {
        server: String,
        reason: String,
        retry_in_s: u64,
    },
    #[error("tool `{tool}` on server `{server}` is unavailable: {reason}")]
    ToolUnavailable {
        server: String,
        tool: String,
        reason: String,
    },
    #[error(
        "tool `{tool}` on server `{server}`: invalid params {violation} (not sent to the server)"
    )]
    InvalidArguments {
        server: String,
        tool: String,
        violation: crate::policy::SchemaViolation,
    },
    #[error(
        "tool `{tool}` on server `{server}`: structuredContent violates the pinned outputSchema {violation}; the result was withheld"
    )]
    InvalidOutput {
        server: String,
        tool: String,
        violation: crate::policy::SchemaViolation,
    },
}

impl ClientError {
    /// The transport fault behind this error, if one caused it.
    pub fn fault(&self) -> Option<&Fault> {
        match self {
            Self::Fault { fault, .. } => Some(fault),
            _ => None,
        }
    }
}

/// One instance a host started: its server, and its transport's state
/// (gone once every part of the instance has ended).
type Started = (String, std::sync::Weak<Shared>);

/// Launches servers. One per process: it holds the wasm engine and cache.
#[derive(Clone)]
pub struct Host {
    wasm: WasmEngine,
    lock: Option<(Arc<Lock>, PathBuf)>,
    /// What no grant may overlap: the cache, the lock, and what the caller
    /// adds with [`Host::protect`] (the config, the audit log).
    #[cfg(unix)]
    protected: Vec<crate::grants::Protected>,
    /// Connects attempted through this host (and its clones): each starts
    /// one instance.
    launches: Arc<std::sync::atomic::AtomicU64>,
    /// Every instance started, by server, for [`Host::running`].
    started: Arc<std::sync::Mutex<Vec<Started>>>,
    /// The kill switch, checked at every launch under the lock (and by the
    /// gateway on every call).
    revoked: Arc<std::sync::RwLock<Arc<Revoked>>>,
    /// What native servers' egress proxies share (see
    /// [`Host::with_egress`]).
    #[cfg(unix)]
    egress: crate::egress::Shares,
}

/// What a `moat learn` run found: the grants it proposes, how the run
/// ended, and each tool call it made with what came of it.
#[derive(Debug)]
pub struct Learned {
    pub proposal: crate::native::learn::Proposal,
    pub outcome: Result<(), ClientError>,
    pub calls: Vec<(String, Result<CallToolResult, ClientError>)>,
}

impl Host {
    /// How many instances this host (and its clones) has started.
    pub fn launches(&self) -> u64 {
        self.launches.load(std::sync::atomic::Ordering::Relaxed)
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
    fn track(&self, server: &str, session: &Session) {
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
        self
    }

    /// A clone of this host enforcing `lock` (or none) instead: moat.lock
    /// read again while serving. It shares the engine, its cache, the launch
    /// counts and the revocations in force (which the caller updates).
    pub fn relocked(&self, lock: Option<(Lock, PathBuf)>) -> Self {
        let mut host = self.clone();
        host.lock = lock.map(|(lock, path)| (Arc::new(lock), path));
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
        if matches!(spec.kind, ServerKind::Remote { .. }) {
            // Nothing here runs a remote server, so there are no bytes to
            // measure; its config requires sandbox = "best-effort".
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
        if let Some(package) = spec.package.as_ref().filter(|p| !p.store.is_dir()) {
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

    /// `moat learn`: runs the native server `spec` once, watched, able to
    /// read everything and reach the network but to write only its private
    /// /tmp, its `rw` dirs and `writable` (the user's `--write`
    /// directories), completes the handshake and lists its tools (and its
    /// prompts and resources, where it has them), closes it, and proposes
    /// the grants that would let it do the same under the sandbox. The run's
    /// own outcome comes back beside the proposal: a server that fails even
    /// so still shows what it tried to use. A `writable` directory that is
    /// a system directory, the home directory (or holds it) or overlaps
    /// Moat's own files is refused before anything runs.
    #[cfg(unix)]
    pub async fn learn(
        &self,
        spec: &ServerSpec,
        writable: &[PathBuf],
        calls: &[(String, Option<JsonObject>)],
    ) -> Result<Learned, ClientError> {
        let ServerKind::Native { cwd, measure, .. } = &spec.kind else {
            return Err(ClientError::Protocol {
                server: spec.name.clone(),
                operation: "learn".into(),
                detail: "moat learn runs native servers only (wasm and remote servers have no files or sockets of the host to learn)".into(),
            });
        };
        let expected = spec.expectation().ok_or_else(|| LaunchError::Unmeasured {
            server: spec.name.clone(),
        })?;
        let home = std::env::var_os("HOME")
            .filter(|home| !home.is_empty())
            .map(|home| std::fs::canonicalize(&home).unwrap_or_else(|_| PathBuf::from(home)));
        let mut run = crate::native::learn::Run::default();
        for path in writable {
            let real = std::fs::canonicalize(path).map_err(|source| {
                crate::native::learn::LearnError::Writable {
                    path: path.clone(),
                    source,
                }
            })?;
            if let Some(why) = crate::native::learn::refusal(&real, true, home.as_deref()) {
                return Err(crate::native::learn::LearnError::Refused { path: real, why }.into());
            }
            run.writable.push(real);
        }
        let as_grants: Vec<crate::grants::DirGrant> = run
            .writable
            .iter()
            .map(|host| crate::grants::DirGrant {
                host: host.clone(),
                guest: host.display().to_string(),
                mode: crate::grants::DirMode::Rw,
                inode: None,
            })
            .collect();
        crate::grants::check_protected(&spec.name, &as_grants, &[], &self.protected)
            .map_err(LaunchError::from)?;
        let observed = run.observed.clone();
        let planned = crate::launch::plan(
            &self.wasm,
            spec,
            expected,
            Some(run),
            self.egress.clone(),
            &self.protected,
        )?;
        let executable = match &planned {
            crate::launch::Planned::Native(launch) => launch.resolved.target.clone(),
            _ => {
                return Err(ClientError::Protocol {
                    server: spec.name.clone(),
                    operation: "learn".into(),
                    detail: "a native server planned another launcher".into(),
                });
            }
        };
        let transport = planned.transport(&spec.name, spec.limits.clone());
        let mut called = Vec::new();
        let outcome = async {
            let session = Session::connect(transport, Handshake::Auto).await?;
            let listed = session.live_tools().await.map(drop);
            // The calls the user asked for, in order: what they open and
            // write is watched as start-up is.
            if listed.is_ok() {
                for (tool, arguments) in calls {
                    let result = session.call_tool(tool, arguments.clone()).await;
                    called.push((tool.clone(), result));
                }
            }
            let closed = session.close().await;
            listed.and(closed)
        }
        .await;
        let mut observed = observed.lock().unwrap_or_else(|e| e.into_inner()).clone();
        observed.settle();
        let package_paths = spec
            .environment()
            .iter()
            .filter(|(name, _)| name == "PYTHONPATH" || name == "NODE_PATH")
            .flat_map(|(_, value)| {
                value
                    .split(':')
                    .filter(|p| !p.is_empty())
                    .filter_map(|p| std::fs::canonicalize(cwd.join(p)).ok())
                    .collect::<Vec<_>>()
            })
            .collect();
        let proposal = crate::native::learn::propose(
            &observed,
            &crate::native::learn::Granted {
                executable: &executable,
                measure,
                dirs: &spec.dirs,
                package_paths,
                protected: self.protected.iter().map(|p| p.path.clone()).collect(),
                roots: crate::sandbox::implicit_roots(
                    &executable,
                    None,
                    &crate::grants::Kept::from_env(&self.protected),
                )
                .granted,
                home,
            },
        );
        Ok(Learned {
            proposal,
            outcome,
            calls: called,
        })
    }

    /// Launches `spec` and completes the handshake.
    pub async fn connect(&self, spec: &ServerSpec) -> Result<Session, ClientError> {
        self.connect_with(spec, Handshake::Auto).await
    }

    /// Launches with `launch` and completes `handshake`. A server whose
    /// answer to `server/discover` cannot be read (a revision's draft
    /// shape: Toolbox 1.12 answers without `ttlMs` and `cacheScope`) is
    /// launched again and spoken to with `initialize`, under `Auto`.
    async fn connect_falling_back(
        &self,
        server: &str,
        launch: impl Fn() -> Result<ServerTransport, LaunchError>,
        handshake: Handshake,
    ) -> Result<Session, ClientError> {
        match Session::connect(launch()?, handshake).await {
            Err(ClientError::DiscoverUnreadable { detail, .. }) if handshake == Handshake::Auto => {
                tracing::warn!(
                    %server,
                    %detail,
                    "its answer to server/discover could not be read; starting it again with initialize"
                );
                Session::connect(launch()?, Handshake::Initialize).await
            }
            other => other,
        }
    }

    /// Launches `spec` and completes the given handshake. With a lock, the
    /// bytes must be the locked bytes, the identity the locked identity, and
    /// the session exposes pinned tools only.
    pub async fn connect_with(
        &self,
        spec: &ServerSpec,
        handshake: Handshake,
    ) -> Result<Session, ClientError> {
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
            .ok_or_else(|| ClientError::NotLocked {
                server: spec.name.clone(),
                lock: lock_name.clone(),
            })?
            .clone();
        if let Some(revocation) = revoked_before_launch(&self.revoked(), &spec.name, &locked) {
            return Err(ClientError::Revoked {
                server: spec.name.clone(),
                subject: format!("server `{}`", spec.name),
                revocation,
            });
        }
        let pinned = if matches!(spec.kind, ServerKind::Remote { .. }) {
            // No bytes to pin: the locked identity (the endpoint) and the
            // tool pins are checked below.
            None
        } else {
            let digest: Digest = locked.sha256.parse().map_err(|e| ClientError::BadLock {
                server: spec.name.clone(),
                lock: lock_name.clone(),
                detail: format!("sha256: {e}"),
            })?;
            if let Some(pin) = spec.sha256
                && pin != digest
            {
                return Err(ClientError::LockConflict {
                    server: spec.name.clone(),
                    config: pin.to_string(),
                    locked: digest.to_string(),
                });
            }
            let spec = pin_grants(spec, &locked).map_err(|path| ClientError::GrantNotLocked {
                server: spec.name.clone(),
                path,
                lock: lock_name.clone(),
            })?;
            let spec = pin_oci(spec, &locked, &lock_name).map_err(|e| *e)?;
            Some((spec, digest))
        };
        let mut session = self
            .connect_falling_back(
                &spec.name,
                || match &pinned {
                    None => self.transport(spec),
                    Some((spec, digest)) => {
                        self.transport_expecting(spec, Expectation::Pinned(*digest))
                    }
                },
                handshake,
            )
            .await?;
        self.track(&spec.name, &session);
        session.execution = session.execution_identity(spec);
        if let Err(error) = session.enforce(&locked).await {
            let _ = session.close_quietly().await;
            return Err(error);
        }
        Ok(session)
    }

    /// Starts `spec`, measures it and returns what `moat lock` records: its
    /// digests, identity, evidence and every tool's pinned definition. A
    /// digest pinned in the config must still match.
    pub async fn measure(&self, spec: &ServerSpec) -> Result<LockedServer, ClientError> {
        let expected = spec.sha256.map_or(Expectation::Record, Expectation::Pinned);
        // The grants as they are now: recorded, and pinned for this very
        // launch, so what is recorded is what the server was given.
        let mut spec = spec.clone();
        let mut grants = std::collections::BTreeMap::new();
        #[cfg(unix)]
        for dir in &mut spec.dirs {
            let opened = crate::grants::open(&spec.name, dir).map_err(LaunchError::from)?;
            dir.inode = Some(opened.inode);
            grants.insert(dir.host.display().to_string(), opened.inode);
        }
        let spec = &spec;
        let session = self
            .connect_falling_back(
                &spec.name,
                || self.transport_expecting(spec, expected),
                Handshake::Auto,
            )
            .await?;
        let listed = async {
            let tools = session.list_tools().await?;
            let prompts = if session.offers_prompts() {
                session.list_prompts().await?
            } else {
                Vec::new()
            };
            let resources = if session.offers_resources() {
                session.list_resources().await?
            } else {
                Vec::new()
            };
            Ok::<_, ClientError>((tools, prompts, resources))
        }
        .await;
        let identity = session.identity();
        session.close().await?;
        let (tools, prompts, resources) = listed?;
        let identity = identity.ok_or_else(|| ClientError::Protocol {
            server: spec.name.clone(),
            operation: "measure".into(),
            detail: "the server reported no identity".into(),
        })?;
        let digest = match identity.digest {
            Some(digest) => digest.to_string(),
            // A remote server has no bytes here; its identity is its endpoint.
            None if identity.evidence == crate::identity::Evidence::Remote => String::new(),
            None => {
                return Err(ClientError::Protocol {
                    server: spec.name.clone(),
                    operation: "measure".into(),
                    detail: "the server's bytes were not measured".into(),
                });
            }
        };
        let parts = identity_parts(spec, &identity);
        let execution = execution_identity(&parts);
        let pin = |name: String, definition: String| LockedTool {
            sha256: tool_pin(&execution, &definition).to_string(),
            flags: crate::lock::definition_flags(&definition),
            name,
            definition,
        };
        let sorted = |mut items: Vec<LockedTool>| {
            items.sort_by(|a, b| a.name.cmp(&b.name));
            items
        };
        let locked_tools = sorted(
            tools
                .iter()
                .map(|tool| pin(tool.name.to_string(), canonical_tool(tool)))
                .collect(),
        );
        let prompts = sorted(
            prompts
                .iter()
                .map(|p| pin(p.name.clone(), crate::lock::canonical_listing(p)))
                .collect(),
        );
        let resources = sorted(
            resources
                .iter()
                .map(|r| pin(r.uri.clone(), crate::lock::canonical_listing(r)))
                .collect(),
        );
        Ok(LockedServer {
            kind: parts.kind.to_owned(),
            evidence: identity.evidence.to_string(),
            sha256: digest,
            identity: execution.to_string(),
            measured: parts.measured.clone(),
            grants,
            tools: locked_tools,
            prompts,
            resources,
            package: spec
                .package
                .as_ref()
                .map(|record| crate::lock::LockedPackage {
                    ecosystem: record.ecosystem.to_string(),
                    name: record.name.clone(),
                    version: record.version.clone(),
                    lockfile_sha256: record.lockfile_sha256.clone(),
                    sha256: parts
                        .measured
                        .get(&record.store.display().to_string())
                        .cloned()
                        .unwrap_or_default(),
                }),
            oci: identity.oci.as_ref().map(|origin| crate::lock::LockedOci {
                reference: origin.reference.clone(),
                manifest: origin.manifest.to_string(),
                layer: origin.layer.to_string(),
            }),
        })
    }
}

/// `spec` with each grant pinned to the inode the lock recorded for it. A
/// grant the lock does not list was added since `moat lock`: its path is
/// the error.
/// The revocation that forbids launching `server` as `locked` pins it: of
/// its name, of its digest or of its OCI manifest. (Its tools' revocations
/// are the gateway's to enforce, per call.)
fn revoked_before_launch(revoked: &Revoked, server: &str, locked: &LockedServer) -> Option<String> {
    revoked
        .of_name(server, None)
        .or_else(|| revoked.of_digests(&locked.digests()))
        .map(crate::revoke::describe)
}

fn pin_grants(spec: &ServerSpec, locked: &LockedServer) -> Result<ServerSpec, String> {
    let mut spec = spec.clone();
    crate::grants::fs::pin(&mut spec.dirs, &locked.grants)
        .map_err(|host| host.display().to_string())?;
    Ok(spec)
}

/// `spec` with its OCI reference pinned to the manifest the lock approved:
/// a tag is not looked up again under the lock. A reference other than the
/// locked one is a conflict, and so is a digest other than the locked one.
fn pin_oci(
    mut spec: ServerSpec,
    locked: &LockedServer,
    lock_name: &str,
) -> Result<ServerSpec, Box<ClientError>> {
    let ServerKind::Wasm {
        source: WasmSource::Oci { reference, .. },
        ..
    } = &mut spec.kind
    else {
        return Ok(spec);
    };
    let Some(approved) = &locked.oci else {
        return Err(Box::new(ClientError::BadLock {
            server: spec.name.clone(),
            lock: lock_name.to_owned(),
            detail: format!(
                "the config names {reference}, and the lock records no OCI artifact for it: run `moat lock`"
            ),
        }));
    };
    let manifest: Digest = approved.manifest.parse().map_err(|e| {
        Box::new(ClientError::BadLock {
            server: spec.name.clone(),
            lock: lock_name.to_owned(),
            detail: format!("oci.manifest: {e}"),
        })
    })?;
    if reference.to_string() != approved.reference
        || reference.digest.is_some_and(|digest| digest != manifest)
    {
        return Err(Box::new(ClientError::OciLockConflict {
            server: spec.name.clone(),
            config: reference.to_string(),
            locked: format!("{} (manifest sha256:{manifest})", approved.reference),
        }));
    }
    *reference = reference.with_digest(manifest);
    Ok(spec)
}

/// The parts of a server's execution identity, from its spec and what the
/// launcher measured. Environment names are the configured ones (values and
/// pass-through names alike), whether or not a pass-through is set.
fn identity_parts<'a>(
    spec: &ServerSpec,
    identity: &crate::instance::Identity,
) -> IdentityParts<'a> {
    let (kind, argv0, cwd) = match &spec.kind {
        ServerKind::Wasm { .. } => ("wasm", spec.name.clone(), None),
        ServerKind::Native { command, cwd, .. } => {
            ("native", command.clone(), Some(cwd.display().to_string()))
        }
        ServerKind::Remote { url, .. } => ("remote", url.clone(), None),
    };
    let mut argv = vec![argv0];
    argv.extend(spec.args.iter().cloned());
    let mut env_names: Vec<String> = spec.env.keys().cloned().collect();
    env_names.extend(spec.env_passthrough.iter().cloned());
    if let ServerKind::Remote {
        bearer_token_env: Some(var),
        ..
    } = &spec.kind
    {
        env_names.push(var.clone()); // the name, never the token
    }
    IdentityParts {
        kind,
        sha256: identity.digest,
        argv,
        cwd,
        env_names,
        measured: identity
            .measured
            .iter()
            .map(|(path, digest)| (path.display().to_string(), digest.to_string()))
            .collect(),
    }
}

/// A request a server made of its client on its own, in a revision before
/// 2026-07-28 (`elicitation/create`, `sampling/createMessage`): given to the
/// call in flight that takes it, whose agent answers.
#[derive(Debug)]
pub struct ServerAsk {
    /// What the server asked, as a 2026-07-28 request for input would carry it.
    pub request: rmcp::model::InputRequest,
    /// The agent's answer (an `ElicitResult`, a `CreateMessageResult`), or
    /// the error the server gets.
    pub answer: tokio::sync::oneshot::Sender<Result<serde_json::Value, rmcp::ErrorData>>,
}

/// The calls in flight that take a server's own requests. A server before
/// 2026-07-28 names no call in its requests, so the earliest call still
/// waiting gets it.
type Askers = Arc<std::sync::Mutex<Vec<mpsc::UnboundedSender<ServerAsk>>>>;

/// How many notifications a slow reader of [`Session::notices`] may fall
/// behind before it misses some (it is told how many it missed).
const NOTICES_BUFFERED: usize = 64;

/// A notification as [`Session::notices`] hands it out: shared, so that
/// the channel's slots, allocated with every server instance, are a
/// pointer each rather than a whole notification.
pub type Notice = Arc<rmcp::model::ServerNotification>;

/// Receives what the server sends the client on its own: progress not
/// routed to a call, its own requests for input, and notifications not
/// routed to a subscription. (Routed progress and word that the tool list
/// changed are caught by the transport, in order.)
struct ClientSide {
    progress: mpsc::UnboundedSender<ProgressNotificationParam>,
    askers: Askers,
    notices: tokio::sync::broadcast::Sender<Notice>,
    shared: Arc<Shared>,
}

impl ClientSide {
    /// Gives `request` to the earliest call in flight that takes it, and
    /// waits for its answer with the server's deadlines held.
    async fn ask(
        &self,
        request: rmcp::model::InputRequest,
        method: &str,
    ) -> Result<serde_json::Value, rmcp::ErrorData> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let mut unsent = Some(ServerAsk { request, answer });
        {
            let mut askers = self.askers.lock().unwrap_or_else(|e| e.into_inner());
            askers.retain(|asker| !asker.is_closed());
            for asker in askers.iter() {
                let Some(ask) = unsent.take() else { break };
                // A call that ended meanwhile hands it back.
                unsent = asker.send(ask).err().map(|returned| returned.0);
            }
        }
        let taken = unsent.is_none();
        if !taken {
            return Err(rmcp::ErrorData::invalid_request(
                format!(
                    "{method} from server `{}` came while no call was in flight: Moat passes a server's requests to the agent of the call they belong to",
                    self.shared.server()
                ),
                None,
            ));
        }
        let _waiting = self.shared.asking_agent();
        answered.await.unwrap_or_else(|_| {
            Err(rmcp::ErrorData::internal_error(
                format!("the call that {method} belonged to ended before the agent answered"),
                None,
            ))
        })
    }
}

/// Where one call's progress notifications go.
pub type ProgressSender = mpsc::UnboundedSender<ProgressNotificationParam>;

/// The session's tap on its transport (see [`crate::transport::Tap`]):
/// sees each message from the server in order, before rmcp and before any
/// later message, so a call's progress is delivered before the answer that
/// follows it and word that the tool list changed never races the answer
/// after it.
#[derive(Debug)]
struct ServerTap {
    /// Progress by token, for the calls in flight that asked for it.
    progress_routes: std::sync::Mutex<HashMap<rmcp::model::ProgressToken, ProgressSender>>,
    /// Set by `notifications/tools/list_changed`, cleared when read.
    tools_changed: std::sync::atomic::AtomicBool,
    /// Counts each `notifications/tools/list_changed`.
    tools_changed_events: tokio::sync::watch::Sender<u64>,
}

impl Default for ServerTap {
    fn default() -> Self {
        Self {
            progress_routes: std::sync::Mutex::default(),
            tools_changed: std::sync::atomic::AtomicBool::new(false),
            tools_changed_events: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl ServerTap {
    fn routes(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<rmcp::model::ProgressToken, ProgressSender>> {
        self.progress_routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

impl crate::transport::Tap for ServerTap {
    fn on_message(
        &self,
        message: &rmcp::model::ServerJsonRpcMessage,
        book: &crate::transport::Book,
    ) -> crate::transport::Pass {
        use crate::transport::Pass;
        use rmcp::model::{GetMeta, ServerJsonRpcMessage, ServerNotification};
        let ServerJsonRpcMessage::Notification(notification) = message else {
            return Pass::On;
        };
        match &notification.notification {
            ServerNotification::ToolListChangedNotification(_) => {
                self.tools_changed
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                self.tools_changed_events.send_modify(|n| *n += 1);
                Pass::On
            }
            // A `subscriptions/listen` stream the server acknowledged (its
            // `_meta` names the request) stays open until either side ends
            // it: the per-request deadline no longer applies to it.
            ServerNotification::SubscriptionsAcknowledgedNotification(_) => {
                if let Some(id) = notification.notification.get_meta().subscription_id() {
                    book.lift_deadline(
                        &id,
                        <rmcp::model::SubscriptionsListenRequestMethod as rmcp::model::ConstString>::VALUE,
                    );
                }
                Pass::On
            }
            ServerNotification::ProgressNotification(progress) => {
                let route = self.routes().get(&progress.params.progress_token).cloned();
                match route {
                    Some(route) => {
                        let _ = route.send(progress.params.clone());
                        Pass::Taken
                    }
                    None => Pass::On,
                }
            }
            _ => Pass::On,
        }
    }
}

impl ClientHandler for ClientSide {
    /// Moat takes tasks from every server: it hands a task on to an agent
    /// that takes tasks, and follows it to its end for one that does not.
    /// It takes elicitation and sampling from servers before 2026-07-28 and
    /// passes them to the agent of the call (see [`ServerAsk`]).
    #[allow(
        deprecated,
        reason = "servers before 2026-07-28 sample through their client"
    )]
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut config = rmcp::model::ClientConfig::default();
        config.capabilities = rmcp::model::ClientCapabilities::builder()
            .enable_tasks()
            .enable_elicitation()
            .enable_sampling()
            .build();
        config
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.progress.send(params);
    }

    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        let asked =
            rmcp::model::InputRequest::Elicitation(rmcp::model::ElicitRequest::new(request));
        let answer = self.ask(asked, "elicitation/create").await?;
        serde_json::from_value(answer).map_err(|e| {
            rmcp::ErrorData::internal_error(
                format!(
                    "the agent's answer to elicitation/create is not an elicitation result: {e}"
                ),
                None,
            )
        })
    }

    #[allow(
        deprecated,
        reason = "servers before 2026-07-28 sample through their client"
    )]
    async fn create_message(
        &self,
        params: rmcp::model::CreateMessageRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, rmcp::ErrorData> {
        let asked = rmcp::model::InputRequest::CreateMessage(
            rmcp::model::CreateMessageRequest::new(params),
        );
        let answer = self.ask(asked, "sampling/createMessage").await?;
        serde_json::from_value(answer).map_err(|e| {
            rmcp::ErrorData::internal_error(
                format!("the agent's answer to sampling/createMessage is not a message: {e}"),
                None,
            )
        })
    }

    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.notices.send(Arc::new(
            rmcp::model::ServerNotification::ResourceUpdatedNotification(
                rmcp::model::ResourceUpdatedNotification::new(params),
            ),
        ));
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.notices.send(Arc::new(
            rmcp::model::ServerNotification::ResourceListChangedNotification(Default::default()),
        ));
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.notices.send(Arc::new(
            rmcp::model::ServerNotification::PromptListChangedNotification(Default::default()),
        ));
    }
}

/// One subscription at one server: see [`Session::listen`].
pub enum Listening {
    /// A `subscriptions/listen` stream (2026-07-28).
    Stream(Box<rmcp::service::Subscription>),
    /// `resources/subscribe` at an older server, and what it sends on its own.
    Notices {
        /// Weak: a subscription never keeps a closing session in use.
        session: std::sync::Weak<Session>,
        filter: rmcp::model::SubscriptionFilter,
        notices: tokio::sync::broadcast::Receiver<Notice>,
    },
}

impl Listening {
    /// The next notification for this subscription; `None` once the server
    /// or the stream has ended.
    pub async fn next(&mut self) -> Option<rmcp::model::ServerNotification> {
        use rmcp::model::ServerNotification as N;
        match self {
            Self::Stream(stream) => stream.next().await.ok().flatten(),
            Self::Notices {
                filter, notices, ..
            } => loop {
                let notice = match notices.recv().await {
                    Ok(notice) => notice,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(
                            missed,
                            "a subscription fell behind its server's notifications"
                        );
                        continue;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                };
                let wanted = match notice.as_ref() {
                    N::PromptListChangedNotification(_) => {
                        filter.prompts_list_changed == Some(true)
                    }
                    N::ResourceListChangedNotification(_) => {
                        filter.resources_list_changed == Some(true)
                    }
                    N::ResourceUpdatedNotification(updated) => filter
                        .resource_subscriptions
                        .as_ref()
                        .is_some_and(|uris| uris.contains(&updated.params.uri)),
                    _ => false,
                };
                if wanted {
                    return Some(Arc::unwrap_or_clone(notice));
                }
            },
        }
    }

    /// Ends the subscription at the server.
    pub async fn cancel(self) {
        match self {
            Self::Stream(mut stream) => {
                let _ = stream.cancel().await;
            }
            Self::Notices {
                session, filter, ..
            } => {
                let Some(session) = session.upgrade() else {
                    return;
                };
                for uri in filter.resource_subscriptions.iter().flatten() {
                    session.unsubscribe_resource(uri).await;
                }
            }
        }
    }
}

/// A live session with one server.
pub struct Session {
    service: RunningService<RoleClient, ClientSide>,
    shared: Arc<Shared>,
    tap: Arc<ServerTap>,
    progress: Option<mpsc::UnboundedReceiver<ProgressNotificationParam>>,
    askers: Askers,
    notices: tokio::sync::broadcast::Sender<Notice>,
    /// Resources subscribed at a server before 2026-07-28, with how many
    /// of this session's subscriptions hold each.
    subscribed: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
    pins: Option<PinState>,
    prompt_pins: Option<ListingState>,
    resource_pins: Option<ListingState>,
    /// The execution identity of the server as its spec launched it,
    /// computed once at connect by [`Host::connect_with`].
    execution: Option<Digest>,
}

/// Pins being enforced on a session, and the latest check of the live tools.
struct PinState {
    pins: Pins,
    reports: tokio::sync::Mutex<Vec<ToolReport>>,
}

/// Prompt or resource pins being enforced, and which of them the latest
/// listing found as pinned.
struct ListingState {
    pins: crate::policy::ListingPins,
    available: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// The native launch `spec` describes: its command resolved on PATH, and,
/// for `moat learn`, where the watched run records what it sees.
/// How long a failed handshake waits for the transport to learn why (a
/// server that exited is known a moment after the send that failed).
const HANDSHAKE_SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// Whether the server ran under the native filesystem sandbox.
fn sandboxed(shared: &Shared) -> bool {
    shared
        .identity()
        .is_some_and(|identity| identity.sandbox.kernel_filesystem)
}

/// A server that died during the handshake under the sandbox: when its
/// stderr shows a denial (`Permission denied`, `EACCES`, `Operation not
/// permitted`, `Read-only file system`, a missing module), the error says
/// the sandbox may be why, with the paths its stderr names beside it.
/// Without a denial the sandbox is not blamed: the error is the server's
/// own exit, with its stderr.
fn sandbox_hint(
    server: String,
    operation: &str,
    fault: Fault,
    granted: &[(PathBuf, bool)],
) -> ClientError {
    let operation = operation.to_owned();
    let (Fault::Exited { stderr_tail, .. } | Fault::Crashed { stderr_tail, .. }) = &fault else {
        return ClientError::Fault {
            server,
            operation,
            fault,
        };
    };
    if stderr_tail.lines().any(is_network_failure) {
        let hosts = hosts_in(stderr_tail);
        return ClientError::NetworkRefused {
            server,
            operation,
            fault,
            hosts: if hosts.is_empty() {
                "a host its stderr does not name".to_owned()
            } else {
                hosts.join(", ")
            },
        };
    }
    if !stderr_tail.lines().any(is_denial) {
        return ClientError::Fault {
            server,
            operation,
            fault,
        };
    }
    let denied = denied_paths(stderr_tail);
    // Each path: under a read-only grant (to write it, that grant wants
    // `rw`), under the server's private /tmp, or outside every grant.
    let mut read_only: Vec<&PathBuf> = Vec::new();
    let mut private_tmp: Vec<&str> = Vec::new();
    let mut outside: Vec<String> = Vec::new();
    for path in &denied {
        let under = granted
            .iter()
            .filter(|(dir, _)| Path::new(path).starts_with(dir))
            .max_by_key(|(dir, _)| dir.as_os_str().len());
        match under {
            Some((dir, false)) => {
                if !read_only.contains(&dir) {
                    read_only.push(dir);
                }
            }
            Some((_, true)) => {}
            None if Path::new(path).starts_with("/tmp") => private_tmp.push(path),
            None => outside.push(path.clone()),
        }
    }
    let grants = probable_grants(&outside);
    let mut said = match (denied.is_empty(), grants.is_empty()) {
        (true, _) => String::new(),
        (false, true) => format!("; its stderr names {} beside a denial", denied.join(", ")),
        (false, false) => format!(
            "; its stderr names {} beside a denial, so the grant probably missing is {}",
            denied.join(", "),
            grants
                .iter()
                .map(|g| crate::grants::toml::dir_entry_inline(
                    &server,
                    Path::new(g),
                    crate::grants::DirMode::Ro
                ))
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    };
    for dir in read_only {
        said.push_str(&format!(
            "; {} is granted read-only: if the server is to write there, change that entry to `{}`",
            dir.display(),
            crate::grants::toml::dir_entry_inline(&server, dir, crate::grants::DirMode::Rw)
        ));
    }
    if !private_tmp.is_empty() {
        said.push_str(&format!(
            "; {} is under /tmp, which is the server's own (private and empty): a host path there is seen only when granted",
            private_tmp.join(", ")
        ));
    }
    ClientError::Sandboxed {
        denied: said,
        server,
        operation,
        fault,
    }
}

/// A refusal by the native sandbox, as the server's own words showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeenRefusal {
    /// `network` (a name that did not resolve, a network unreachable) or
    /// `filesystem` (a path named beside a denial).
    pub kind: &'static str,
    /// What was refused: the hosts, or the paths placed against the grants.
    pub subject: String,
}

impl SeenRefusal {
    /// What a failed start showed: `None` unless `error` is the sandbox's.
    pub(crate) fn of(error: &ClientError) -> Option<Self> {
        match error {
            ClientError::NetworkRefused { hosts, .. } => Some(Self {
                kind: "network",
                subject: hosts.clone(),
            }),
            ClientError::Sandboxed { denied, .. } if !denied.is_empty() => Some(Self {
                kind: "filesystem",
                subject: denied.trim_start_matches("; ").to_owned(),
            }),
            _ => None,
        }
    }

    /// The one line Moat adds to a tool's error that shows this refusal.
    pub(crate) fn line(&self, server: &str) -> String {
        match self.kind {
            "network" => format!(
                "moat: the server tried to reach the network ({}), which the native sandbox refuses to what `net` does not list: a server that downloads code or data at run time (an `npm install` or `pip install` at first use) needs it installed ahead of time (`moat add`), or the host granted in `net`; `moat learn {server} --call TOOL ARGS` shows where a call connects",
                self.subject
            ),
            _ => format!(
                "moat: the native sandbox may be the cause: the server may read only what `moat inspect {server}` lists; {}; `moat learn {server} --call TOOL ARGS` shows what a call uses",
                self.subject
            ),
        }
    }
}

/// What a tool's error text shows the native sandbox refusing: the
/// network it reached for (the hosts named), or paths named beside a
/// denial (placed against `granted` as at start). `None` when the text
/// shows neither, or names no path beside a denial.
pub(crate) fn refusal_seen(
    server: &str,
    text: &str,
    granted: &[(PathBuf, bool)],
) -> Option<SeenRefusal> {
    let fault = Fault::Exited {
        server: server.to_owned(),
        code: 0,
        stderr_tail: text.to_owned(),
    };
    SeenRefusal::of(&sandbox_hint(
        server.to_owned(),
        "tools/call",
        fault,
        granted,
    ))
}

/// The grants that would open `denied` paths: the package an existing file
/// belongs to (the nearest directory with `package.json`,
/// `pyproject.toml` or `setup.py`), else its directory; an existing
/// directory itself. Paths that do not exist suggest nothing.
fn probable_grants(denied: &[String]) -> Vec<String> {
    let mut grants: Vec<String> = Vec::new();
    for path in denied {
        let path = Path::new(path);
        let grant = if path.is_dir() {
            path.to_owned()
        } else if path.is_file() {
            crate::grants::fs::package_root(path)
        } else {
            continue;
        };
        let grant = grant.display().to_string();
        if !grants.contains(&grant) {
            grants.push(grant);
        }
    }
    grants
}

/// Absolute paths on stderr lines that report a denial, at most eight.
/// What a line of stderr says when the sandbox may have refused something.
const DENIALS: [&str; 9] = [
    "Permission denied",
    "permission denied",
    "EACCES",
    "Operation not permitted",
    "EPERM",
    "Read-only file system",
    "EROFS",
    "No module named",
    "Cannot find module",
];

/// What a line of stderr says when a name did not resolve or a network
/// was unreachable: inside the sandbox, the server reached for the network
/// beyond its grants.
const NETWORK_FAILURES: [&str; 10] = [
    "EAI_AGAIN",
    "ENOTFOUND",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Could not resolve host",
    "getaddrinfo failed",
    "ENETUNREACH",
    "Network is unreachable",
    "nodename nor servname",
    "NameResolutionError",
];

fn is_network_failure(line: &str) -> bool {
    NETWORK_FAILURES.iter().any(|d| line.contains(d))
}

/// The host names on stderr lines that report a network failure: in a
/// URL, or right after `ENOTFOUND`, `EAI_AGAIN` or `host:`; at most four.
fn hosts_in(stderr: &str) -> Vec<String> {
    let mut hosts: Vec<String> = Vec::new();
    for line in stderr.lines().filter(|l| is_network_failure(l)) {
        let words: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || "'\"`,;()[]<>".contains(c))
            .filter(|w| !w.is_empty())
            .collect();
        for (at, word) in words.iter().enumerate() {
            let candidate = if let Some((_, rest)) = word.split_once("://") {
                rest
            } else if at > 0 && ["ENOTFOUND", "EAI_AGAIN", "host:"].contains(&words[at - 1]) {
                word
            } else {
                continue;
            };
            let authority = candidate.split(['/', '?', '#']).next().unwrap_or_default();
            let host = authority
                .rsplit_once(':')
                .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
                .map_or(authority, |(host, _)| host)
                .trim_end_matches(['.', ':'])
                .to_ascii_lowercase();
            let valid = !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
            if valid && !hosts.contains(&host) {
                hosts.push(host);
            }
        }
    }
    hosts.truncate(4);
    hosts
}

/// A missing file: a denial when the path it names exists on the host (in
/// a root of its own, a server does not see what it was not granted).
const MISSING: [&str; 2] = ["No such file or directory", "ENOENT"];

/// The absolute paths a line of stderr names.
fn paths_in(line: &str) -> impl Iterator<Item = &str> {
    line.split(|c: char| c.is_whitespace() || "'\"`,;()[]".contains(c))
        .map(|word| word.trim_end_matches([':', '.']))
        .filter(|path| path.starts_with('/') && path.len() > 1)
}

/// Whether a line of stderr shows something the sandbox may have refused.
fn is_denial(line: &str) -> bool {
    DENIALS.iter().any(|d| line.contains(d))
        || (MISSING.iter().any(|m| line.contains(m))
            && paths_in(line).any(|path| Path::new(path).exists()))
}

fn denied_paths(stderr: &str) -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    for line in stderr.lines().filter(|l| is_denial(l)) {
        for path in paths_in(line) {
            if !paths.iter().any(|p| p == path) {
                paths.push(path.to_owned());
            }
        }
    }
    paths.truncate(8);
    paths
}

impl Session {
    /// Connects `transport` (launching the server) and performs `handshake`.
    /// If this future is dropped part-way, the server is stopped and every
    /// task of the transport ends.
    pub async fn connect(
        transport: ServerTransport,
        handshake: Handshake,
    ) -> Result<Self, ClientError> {
        let shared = transport.shared().clone();
        let server = shared.server().to_owned();
        let tap = Arc::new(ServerTap::default());
        transport.set_tap(tap.clone());
        let connected = transport.connect().await?;
        let (progress_tx, progress) = mpsc::unbounded_channel();
        let askers = Askers::default();
        let (notices, _) = tokio::sync::broadcast::channel(NOTICES_BUFFERED);
        let client = ClientSide {
            progress: progress_tx,
            askers: askers.clone(),
            notices: notices.clone(),
            shared: shared.clone(),
        };
        match client
            .serve_with_lifecycle(connected, handshake.mode())
            .await
        {
            Ok(service) => Ok(Self {
                service,
                shared,
                tap,
                progress: Some(progress),
                askers,
                notices,
                subscribed: Default::default(),
                pins: None,
                prompt_pins: None,
                resource_pins: None,
                execution: None,
            }),
            Err(error) => Err(match shared.settled_fault(HANDSHAKE_SETTLE).await {
                Some(fault) if sandboxed(&shared) => sandbox_hint(
                    server,
                    "handshake",
                    fault,
                    &shared
                        .identity()
                        .map(|identity| identity.sandbox.granted)
                        .unwrap_or_default(),
                ),
                Some(fault) => ClientError::Fault {
                    server,
                    operation: "handshake".into(),
                    fault,
                },
                None if matches!(
                    &error,
                    rmcp::service::ClientInitializeError::ExpectedInitResult(Some(
                        rmcp::model::ServerResult::CustomResult(_)
                    ))
                ) =>
                {
                    ClientError::DiscoverUnreadable {
                        server,
                        detail: error.to_string(),
                    }
                }
                None => ClientError::Protocol {
                    server,
                    operation: "handshake".into(),
                    detail: error.to_string(),
                },
            }),
        }
    }

    /// The server's name.
    pub fn server(&self) -> &str {
        self.shared.server()
    }

    /// State shared with the transport, for the crate's own bookkeeping
    /// (a weak handle to learn when the session is gone).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// What was measured about the server, once launched: its digests,
    /// evidence and sandbox report.
    pub fn identity(&self) -> Option<crate::instance::Identity> {
        self.shared.identity()
    }

    /// The fault that ended the session, if one did.
    pub fn fault(&self) -> Option<Fault> {
        self.shared.fault()
    }

    /// The launcher's counters (fuel, memory; zero before launch).
    pub fn metrics(&self) -> Arc<crate::instance::Metrics> {
        self.shared.metrics()
    }

    /// The server's stderr, a bounded rolling buffer.
    pub fn stderr(&self) -> &crate::transport::StderrBuffer {
        self.shared.stderr()
    }

    /// The tasks and instances of the server's transport.
    pub fn tracker(&self) -> &Arc<crate::instance::Tracker> {
        self.shared.tracker()
    }

    /// Requests sent to the server so far.
    pub fn requests_sent(&self) -> u64 {
        self.shared.requests_sent()
    }

    /// Counts each `notifications/tools/list_changed` from the server, for
    /// whoever must pass the news on (after re-checking the pins). Ends
    /// when the session is gone.
    pub fn tools_changed_events(&self) -> tokio::sync::watch::Receiver<u64> {
        self.tap.tools_changed_events.subscribe()
    }

    /// Whether the server announced `notifications/tools/list_changed`
    /// since the last look; clears the flag. Set before any later message
    /// is delivered, so an answer that follows the notification never
    /// races it.
    fn take_tools_changed(&self) -> bool {
        self.tap
            .tools_changed
            .swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// Progress notifications the server sends, in order. Taken once.
    pub fn take_progress(&mut self) -> Option<mpsc::UnboundedReceiver<ProgressNotificationParam>> {
        self.progress.take()
    }

    /// The server's own requests for input (before 2026-07-28) while the
    /// receiver lives: a call in flight takes them, the earliest first.
    pub fn asks(&self) -> mpsc::UnboundedReceiver<ServerAsk> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.askers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(sender);
        receiver
    }

    /// Notifications the server sends outside any `subscriptions/listen`
    /// stream, as servers before 2026-07-28 do: a subscribed resource's
    /// updates, and changes to its prompt and resource lists.
    pub fn notices(&self) -> tokio::sync::broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    /// Whether the server speaks 2026-07-28 or later (else it was met
    /// with `initialize`, and speaks a revision without requests for input,
    /// tasks or `subscriptions/listen`).
    pub fn is_current(&self) -> bool {
        self.service
            .peer_info()
            .is_some_and(|info| info.protocol_version >= ProtocolVersion::V_2026_07_28)
    }

    /// The protocol revision agreed in the handshake.
    pub fn protocol_version(&self) -> Option<String> {
        self.service
            .peer_info()
            .map(|info| info.protocol_version.to_string())
    }

    fn error(&self, operation: &str, error: ServiceError) -> ClientError {
        let server = self.server().to_owned();
        if let Some(fault) = self.shared.fault() {
            // A server that died of a refusal mid-call is told so as at
            // its start: the agent's error carries the same line.
            if sandboxed(&self.shared) {
                let granted = self
                    .shared
                    .identity()
                    .map(|identity| identity.sandbox.granted)
                    .unwrap_or_default();
                return sandbox_hint(server, operation, fault, &granted);
            }
            return ClientError::Fault {
                server,
                operation: operation.to_owned(),
                fault,
            };
        }
        match error {
            ServiceError::McpError(data) => ClientError::Server {
                server,
                operation: operation.to_owned(),
                code: data.code.0,
                message: data.message.into_owned(),
            },
            other => ClientError::Protocol {
                server,
                operation: operation.to_owned(),
                detail: other.to_string(),
            },
        }
    }

    /// Checks the running server against its lock entry: the execution
    /// identity must be the locked one; then the live tools are compared with
    /// the pins, which this session enforces from now on.
    async fn enforce(&mut self, locked: &LockedServer) -> Result<(), ClientError> {
        let live = self.execution.ok_or_else(|| ClientError::Protocol {
            server: self.server().to_owned(),
            operation: "pin check".into(),
            detail: "the server reported no identity".into(),
        })?;
        if live.to_string() != locked.identity {
            return Err(ClientError::IdentityChanged {
                server: self.server().to_owned(),
                locked: locked.identity.clone(),
                live: live.to_string(),
            });
        }
        let pins = Pins::from_locked(locked, live)?;
        // What is listed now supersedes any earlier announcement.
        self.take_tools_changed();
        let tools = self.live_tools().await?;
        let reports = pins.evaluate(&tools);
        for report in &reports {
            if !matches!(report.status, ToolStatus::Pinned { .. }) {
                tracing::warn!(server = %self.server(), tool = %report.name, status = report.status.word(), "tool not as pinned; unavailable");
            }
        }
        self.pins = Some(PinState {
            pins,
            reports: tokio::sync::Mutex::new(reports),
        });
        self.prompt_pins = Some(ListingState {
            pins: crate::policy::ListingPins::from_locked("prompt", &locked.prompts, live),
            available: Default::default(),
        });
        self.resource_pins = Some(ListingState {
            pins: crate::policy::ListingPins::from_locked("resource", &locked.resources, live),
            available: Default::default(),
        });
        // The first check, so a get or read before any listing is judged.
        if self.offers_prompts() {
            self.list_prompts().await?;
        }
        if self.offers_resources() {
            self.list_resources().await?;
        }
        Ok(())
    }

    /// Whether the server said it has prompts.
    pub fn offers_prompts(&self) -> bool {
        self.service
            .peer_info()
            .is_some_and(|info| info.capabilities.prompts.is_some())
    }

    /// Whether the server said it has resources.
    pub fn offers_resources(&self) -> bool {
        self.service
            .peer_info()
            .is_some_and(|info| info.capabilities.resources.is_some())
    }

    /// Under a lock, `live` (name, item) pairs judged against `state`: the
    /// pinned definitions of those as pinned. Without one, `live` as it is.
    /// A pinned definition that does not parse is named in the error.
    fn as_pinned<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        state: Option<&ListingState>,
        live: Vec<(String, T)>,
    ) -> Result<Vec<T>, String> {
        let Some(state) = state else {
            return Ok(live.into_iter().map(|(_, item)| item).collect());
        };
        let canonical: Vec<(String, String)> = live
            .iter()
            .map(|(name, item)| (name.clone(), crate::lock::canonical_listing(item)))
            .collect();
        let (served, others) = state.pins.evaluate(&canonical);
        for report in &others {
            tracing::warn!(server = %self.server(), kind = state.pins.kind(), name = %report.name, status = report.status.word(), "not as pinned; unavailable");
        }
        *state.available.lock().unwrap_or_else(|e| e.into_inner()) =
            served.iter().map(|(name, _)| name.clone()).collect();
        served
            .into_iter()
            .map(|(name, definition)| {
                serde_json::from_str(&definition).map_err(|e| {
                    format!(
                        "{} `{name}`: the definition does not parse: {e}",
                        state.pins.kind()
                    )
                })
            })
            .collect()
    }

    fn bad_lock(&self, detail: String) -> ClientError {
        ClientError::BadLock {
            server: self.server().to_owned(),
            lock: "the lock".into(),
            detail,
        }
    }

    /// Under a lock, the refusal of `name` unless the latest listing found
    /// it as pinned.
    fn unpinned(&self, state: Option<&ListingState>, name: &str) -> Option<ClientError> {
        let state = state?;
        if state
            .available
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
        {
            return None;
        }
        Some(ClientError::NotPinned {
            server: self.server().to_owned(),
            kind: state.pins.kind(),
            name: name.to_owned(),
            status: "not listed as pinned",
        })
    }

    async fn live_tools(&self) -> Result<Vec<Tool>, ClientError> {
        self.service
            .list_all_tools()
            .await
            .map_err(|e| self.error("tools/list", e))
    }

    /// The latest check of live tools against the pins, re-checked when the
    /// server announced `notifications/tools/list_changed`. `None` without a
    /// lock.
    pub async fn tool_reports(&self) -> Result<Option<Vec<ToolReport>>, ClientError> {
        let Some(state) = &self.pins else {
            return Ok(None);
        };
        let mut reports = state.reports.lock().await;
        if self.take_tools_changed() {
            let live = self.live_tools().await?;
            *reports = state.pins.evaluate(&live);
        }
        Ok(Some(reports.clone()))
    }

    /// The execution identity computed when [`Host::connect_with`] launched
    /// this session's server: what the lock and the audit log name.
    pub fn launched_identity(&self) -> Option<Digest> {
        self.execution
    }

    /// The execution identity of this session's server as `spec` (another
    /// server's, say) would describe it: what keys reuse of a running
    /// server.
    pub fn execution_identity(&self, spec: &ServerSpec) -> Option<Digest> {
        self.shared
            .identity()
            .map(|identity| execution_identity(&identity_parts(spec, &identity)))
    }

    /// The tools to expose. Without a lock, what the server lists; with one,
    /// the pinned definitions of the tools that are as pinned (never the
    /// server's own words).
    pub async fn list_tools(&self) -> Result<Vec<Tool>, ClientError> {
        match (&self.pins, self.tool_reports().await?) {
            (Some(state), Some(reports)) => Ok(state.pins.exposed(&reports)),
            _ => self.live_tools().await,
        }
    }

    /// Closes without reporting errors (used on a failed pin check).
    async fn close_quietly(self) -> Result<(), ClientError> {
        self.close().await
    }

    /// Calls tool `name` with `arguments`.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallToolResult, ClientError> {
        self.call_tool_with(name, arguments, None, CancellationToken::new(), None)
            .await
    }

    /// With a lock: the tool must be as pinned and the arguments must fit
    /// its pinned input schema, or the call is refused before it is sent.
    async fn check_call(
        &self,
        name: &str,
        arguments: &Option<JsonObject>,
    ) -> Result<(), ClientError> {
        let (Some(state), Some(reports)) = (&self.pins, self.tool_reports().await?) else {
            return Ok(());
        };
        let status = reports.iter().find(|r| r.name == name).map(|r| &r.status);
        let reason = match status {
            Some(ToolStatus::Pinned { .. }) => None,
            Some(ToolStatus::Drifted { locked, live }) => Some(format!(
                "its definition drifted from the lock (locked {locked}, live {live})"
            )),
            Some(ToolStatus::New { .. }) | None => Some("it is not in the lock".to_owned()),
            Some(ToolStatus::Missing { .. }) => Some("the server no longer lists it".to_owned()),
        };
        if let Some(reason) = reason {
            return Err(ClientError::ToolUnavailable {
                server: self.server().to_owned(),
                tool: name.to_owned(),
                reason,
            });
        }
        let value = serde_json::Value::Object(arguments.clone().unwrap_or_default());
        state
            .pins
            .check_arguments(name, &value)
            .map_err(|violation| ClientError::InvalidArguments {
                server: self.server().to_owned(),
                tool: name.to_owned(),
                violation,
            })
    }

    /// Calls tool `name`, sending its progress notifications to `progress`
    /// and cancelling it on the server (`notifications/cancelled`) when
    /// `cancel` fires.
    pub async fn call_tool_with(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        progress: Option<ProgressSender>,
        cancel: CancellationToken,
        traceparent: Option<String>,
    ) -> Result<CallToolResult, ClientError> {
        let answer = self
            .call_tool_answer(
                name,
                arguments,
                progress,
                cancel.clone(),
                traceparent,
                Retry::default(),
            )
            .await?;
        match answer {
            CallAnswer::Complete(result) => Ok(result),
            CallAnswer::Task(created) => self.finish_task(name, &created.task, &cancel).await,
            CallAnswer::InputRequired(_) => Err(ClientError::InputRequired {
                server: self.server().to_owned(),
                tool: name.to_owned(),
            }),
        }
    }

    /// Calls tool `name` once and returns what the server answered: a
    /// result, a request for input (a multi round-trip request, answered by
    /// calling again with `retry`), or a task it made of the call.
    pub async fn call_tool_answer(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        progress: Option<ProgressSender>,
        cancel: CancellationToken,
        traceparent: Option<String>,
        retry: Retry,
    ) -> Result<CallAnswer, ClientError> {
        use rmcp::model::RequestParamsMeta;
        self.check_call(name, &arguments).await?;
        let operation = format!("tools/call `{name}`");
        let mut params = CallToolRequestParams::new(name.to_owned());
        if let Some(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        params.input_responses = retry.input_responses;
        params.request_state = retry.request_state;
        if let Some(traceparent) = traceparent {
            params.set_traceparent(&traceparent);
        }
        let mut handle = self
            .service
            .send_cancellable_request(
                ClientRequest::CallToolRequest(Request::new(params)),
                PeerRequestOptions::no_options(),
            )
            .await
            .map_err(|e| self.error(&operation, e))?;
        let token = handle.progress_token.clone();
        if let Some(progress) = progress {
            self.tap.routes().insert(token.clone(), progress);
        }
        let outcome = tokio::select! {
            response = &mut handle.rx => Some(response),
            () = cancel.cancelled() => None,
        };
        self.tap.routes().remove(&token);
        let response = match outcome {
            Some(Ok(response)) => response.map_err(|e| self.error(&operation, e))?,
            Some(Err(_)) => return Err(self.error(&operation, ServiceError::TransportClosed)),
            None => {
                let _ = handle.cancel(Some("cancelled by the client".into())).await;
                return Err(ClientError::Cancelled {
                    server: self.server().to_owned(),
                    tool: name.to_owned(),
                });
            }
        };
        match response {
            ServerResult::CallToolResult(result) => match self.check_output(name, &result) {
                Some(withheld) => Err(withheld),
                None => Ok(CallAnswer::Complete(result)),
            },
            ServerResult::InputRequiredResult(asked) => Ok(CallAnswer::InputRequired(asked)),
            ServerResult::CreateTaskResult(created) => Ok(CallAnswer::Task(created)),
            _ => Err(self.error(&operation, ServiceError::UnexpectedResponse)),
        }
    }

    /// A result's structured content against the tool's pinned output
    /// schema, when a lock pins it: the error that withholds it.
    fn check_output(&self, name: &str, result: &CallToolResult) -> Option<ClientError> {
        let (state, structured) = (self.pins.as_ref()?, result.structured_content.as_ref()?);
        let violation = state.pins.check_output(name, structured).err()?;
        Some(ClientError::InvalidOutput {
            server: self.server().to_owned(),
            tool: name.to_owned(),
            violation,
        })
    }

    /// `tasks/get` for task `task_id` of tool `tool` (the call that made
    /// it): a completed task's result is checked as a call's result is.
    pub async fn get_task(
        &self,
        tool: &str,
        task_id: &str,
    ) -> Result<rmcp::model::GetTaskResult, ClientError> {
        let operation = format!("tasks/get `{task_id}`");
        let found = self
            .service
            .get_task(rmcp::model::GetTaskParams::new(task_id))
            .await
            .map_err(|e| self.error(&operation, e))?;
        if let rmcp::model::TaskPayload::Completed { result } = &found.task.payload {
            let result: CallToolResult =
                serde_json::from_value(serde_json::Value::Object(result.clone())).map_err(|e| {
                    ClientError::Protocol {
                        server: self.server().to_owned(),
                        operation: operation.clone(),
                        detail: format!("the completed task's result is not a tool's result: {e}"),
                    }
                })?;
            if let Some(withheld) = self.check_output(tool, &result) {
                return Err(withheld);
            }
        }
        Ok(found)
    }

    /// Opens a subscription for `filter`: at a 2026-07-28 server a
    /// `subscriptions/listen` stream (a server that does not take them
    /// answers with an error); at an older one, `resources/subscribe` for
    /// each resource in it (once per resource however many subscriptions
    /// of this session name it) and the notifications the server sends on
    /// its own, filtered as the stream's would be.
    pub async fn listen(
        self: &Arc<Self>,
        filter: rmcp::model::SubscriptionFilter,
    ) -> Result<Listening, ClientError> {
        if self.is_current() {
            let stream = self
                .service
                .peer()
                .listen(filter)
                .await
                .map_err(|e| self.error("subscriptions/listen", e))?;
            return Ok(Listening::Stream(Box::new(stream)));
        }
        let notices = self.notices();
        let uris = filter.resource_subscriptions.clone().unwrap_or_default();
        for (at, uri) in uris.iter().enumerate() {
            if let Err(error) = self.subscribe_resource(uri).await {
                for done in &uris[..at] {
                    self.unsubscribe_resource(done).await;
                }
                return Err(error);
            }
        }
        Ok(Listening::Notices {
            session: Arc::downgrade(self),
            filter,
            notices,
        })
    }

    /// `resources/subscribe` for `uri`, unless this session holds it already.
    #[allow(deprecated, reason = "servers before 2026-07-28 subscribe this way")]
    async fn subscribe_resource(&self, uri: &str) -> Result<(), ClientError> {
        let first = {
            let mut held = self.subscribed.lock().unwrap_or_else(|e| e.into_inner());
            let count = held.entry(uri.to_owned()).or_insert(0);
            *count += 1;
            *count == 1
        };
        if !first {
            return Ok(());
        }
        let subscribed = self
            .service
            .peer()
            .subscribe(rmcp::model::SubscribeRequestParams::new(uri))
            .await;
        if let Err(error) = subscribed {
            self.release(uri);
            return Err(self.error(&format!("resources/subscribe {uri}"), error));
        }
        Ok(())
    }

    /// Lets go of one hold on `uri`; returns whether it was the last.
    fn release(&self, uri: &str) -> bool {
        let mut held = self.subscribed.lock().unwrap_or_else(|e| e.into_inner());
        let Some(count) = held.get_mut(uri) else {
            return false;
        };
        *count -= 1;
        let last = *count == 0;
        if last {
            held.remove(uri);
        }
        last
    }

    /// `resources/unsubscribe` for `uri` once no subscription of this
    /// session holds it.
    #[allow(deprecated, reason = "servers before 2026-07-28 subscribe this way")]
    async fn unsubscribe_resource(&self, uri: &str) {
        if !self.release(uri) {
            return;
        }
        let unsubscribed = self
            .service
            .peer()
            .unsubscribe(rmcp::model::UnsubscribeRequestParams::new(uri))
            .await;
        if let Err(error) = unsubscribed {
            tracing::debug!(server = %self.server(), %uri, %error, "resources/unsubscribe");
        }
    }

    /// `tasks/update`: the agent's answers to what task `task_id` asked.
    pub async fn update_task(
        &self,
        task_id: &str,
        input_responses: rmcp::model::InputResponses,
    ) -> Result<(), ClientError> {
        self.service
            .update_task(rmcp::model::UpdateTaskParams::new(task_id, input_responses))
            .await
            .map_err(|e| self.error(&format!("tasks/update `{task_id}`"), e))
    }

    /// `tasks/cancel`: asks the server to stop task `task_id`.
    pub async fn cancel_task(&self, task_id: &str) -> Result<(), ClientError> {
        self.service
            .cancel_task(rmcp::model::CancelTaskParams::new(task_id))
            .await
            .map_err(|e| self.error(&format!("tasks/cancel `{task_id}`"), e))
    }

    /// Polls task `task` (made of a call to `tool`) until it ends, for a
    /// caller that cannot take a task: its result, or the error it failed
    /// with. A task that asks for input is cancelled, as nobody can answer
    /// it; so is one whose caller cancels.
    pub async fn finish_task(
        &self,
        tool: &str,
        task: &rmcp::model::Task,
        cancel: &CancellationToken,
    ) -> Result<CallToolResult, ClientError> {
        use rmcp::model::TaskPayload;
        // The server's hint, kept between 10 ms and a second.
        let interval =
            std::time::Duration::from_millis(task.poll_interval_ms.unwrap_or(100).clamp(10, 1_000));
        loop {
            let found = self.get_task(tool, &task.task_id).await?;
            match found.task.payload {
                TaskPayload::Working => {}
                TaskPayload::Completed { result } => {
                    return serde_json::from_value(serde_json::Value::Object(result)).map_err(
                        |e| ClientError::Protocol {
                            server: self.server().to_owned(),
                            operation: format!("tasks/get `{}`", task.task_id),
                            detail: format!(
                                "the completed task's result is not a tool's result: {e}"
                            ),
                        },
                    );
                }
                TaskPayload::Failed { error } => {
                    return Err(ClientError::Server {
                        server: self.server().to_owned(),
                        operation: format!("task `{}` of tools/call `{tool}`", task.task_id),
                        code: error.get("code").and_then(|c| c.as_i64()).unwrap_or(-32603) as i32,
                        message: error
                            .get("message")
                            .and_then(|m| m.as_str())
                            .unwrap_or("the task failed")
                            .to_owned(),
                    });
                }
                TaskPayload::Cancelled => {
                    return Err(ClientError::Cancelled {
                        server: self.server().to_owned(),
                        tool: tool.to_owned(),
                    });
                }
                TaskPayload::InputRequired { .. } => {
                    let _ = self.cancel_task(&task.task_id).await;
                    return Err(ClientError::InputRequired {
                        server: self.server().to_owned(),
                        tool: tool.to_owned(),
                    });
                }
                _ => {}
            }
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = cancel.cancelled() => {
                    let _ = self.cancel_task(&task.task_id).await;
                    return Err(ClientError::Cancelled {
                        server: self.server().to_owned(),
                        tool: tool.to_owned(),
                    });
                }
            }
        }
    }

    /// Sends request `method` with `params` exactly as given, with no check:
    /// how the fuzzer sends what a typed request cannot carry. The answer is
    /// returned as JSON.
    pub async fn request_raw(
        &self,
        method: &str,
        params: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, ClientError> {
        let request = ClientRequest::CustomRequest(rmcp::model::CustomRequest::new(method, params));
        let result = self
            .service
            .send_request(request)
            .await
            .map_err(|e| self.error(method, e))?;
        serde_json::to_value(result).map_err(|e| ClientError::Protocol {
            server: self.server().to_owned(),
            operation: method.to_owned(),
            detail: format!("the answer does not serialise: {e}"),
        })
    }

    /// Sends `ping` and waits for the answer.
    pub async fn ping(&self) -> Result<(), ClientError> {
        self.service
            .send_request(ClientRequest::PingRequest(
                rmcp::model::PingRequest::default(),
            ))
            .await
            .map(|_| ())
            .map_err(|e| self.error("ping", e))
    }

    /// Every prompt the server lists; under a lock, the pinned definitions
    /// of those listed as pinned, and no other.
    pub async fn list_prompts(&self) -> Result<Vec<rmcp::model::Prompt>, ClientError> {
        let live = self
            .service
            .list_all_prompts()
            .await
            .map_err(|e| self.error("prompts/list", e))?;
        self.as_pinned(
            self.prompt_pins.as_ref(),
            live.into_iter().map(|p| (p.name.clone(), p)).collect(),
        )
        .map_err(|detail| self.bad_lock(detail))
    }

    /// Every resource the server lists; under a lock, the pinned definitions
    /// of those listed as pinned, and no other.
    pub async fn list_resources(&self) -> Result<Vec<Resource>, ClientError> {
        let live = self
            .service
            .list_all_resources()
            .await
            .map_err(|e| self.error("resources/list", e))?;
        self.as_pinned(
            self.resource_pins.as_ref(),
            live.into_iter().map(|r| (r.uri.clone(), r)).collect(),
        )
        .map_err(|detail| self.bad_lock(detail))
    }

    /// Reads resource `uri` (under a lock, only one listed as pinned).
    pub async fn read_resource(&self, uri: &str) -> Result<ReadResourceResult, ClientError> {
        if let Some(refused) = self.unpinned(self.resource_pins.as_ref(), uri) {
            return Err(refused);
        }
        self.service
            .read_resource(ReadResourceRequestParams::new(uri))
            .await
            .map_err(|e| self.error(&format!("resources/read `{uri}`"), e))
    }

    /// Gets prompt `name` with `arguments`.
    pub async fn get_prompt(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Result<GetPromptResult, ClientError> {
        if let Some(refused) = self.unpinned(self.prompt_pins.as_ref(), name) {
            return Err(refused);
        }
        let mut params = GetPromptRequestParams::new(name);
        params.arguments = arguments;
        self.service
            .get_prompt(params)
            .await
            .map_err(|e| self.error(&format!("prompts/get `{name}`"), e))
    }

    /// Gets prompt `name` once (2026-07-28): a request for input comes
    /// back as the server worded it, for the caller to answer and get the
    /// prompt again with `retry`.
    pub async fn get_prompt_once(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        retry: Retry,
    ) -> Result<rmcp::model::GetPromptResponse, ClientError> {
        if let Some(refused) = self.unpinned(self.prompt_pins.as_ref(), name) {
            return Err(refused);
        }
        let mut params = GetPromptRequestParams::new(name);
        params.arguments = arguments;
        params.input_responses = retry.input_responses;
        params.request_state = retry.request_state;
        self.service
            .get_prompt_once(params)
            .await
            .map_err(|e| self.error(&format!("prompts/get `{name}`"), e))
    }

    /// Reads resource `uri` once (2026-07-28): a request for input comes
    /// back as it is, as for [`Session::get_prompt_once`].
    pub async fn read_resource_once(
        &self,
        uri: &str,
        retry: Retry,
    ) -> Result<rmcp::model::ReadResourceResponse, ClientError> {
        if let Some(refused) = self.unpinned(self.resource_pins.as_ref(), uri) {
            return Err(refused);
        }
        let mut params = ReadResourceRequestParams::new(uri);
        params.input_responses = retry.input_responses;
        params.request_state = retry.request_state;
        self.service
            .read_resource_once(params)
            .await
            .map_err(|e| self.error(&format!("resources/read `{uri}`"), e))
    }

    /// Stops the server from a shared handle: the service ends, which
    /// closes the transport and stops the instance or process group in the
    /// background. [`Session::close`] does the same and awaits it.
    pub fn stop(&self) {
        self.service.cancellation_token().cancel();
    }

    /// Closes the session: EOF on the server's stdin, the grace period, then
    /// the server is stopped and every task of the transport awaited.
    pub async fn close(self) -> Result<(), ClientError> {
        let server = self.server().to_owned();
        self.service
            .cancel()
            .await
            .map(|_| ())
            .map_err(|e| ClientError::Protocol {
                server,
                operation: "close".into(),
                detail: e.to_string(),
            })?;
        // The transport's close has awaited its tasks and the instance.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_that_reached_for_the_network_is_told_so_naming_the_host() {
        let fault = |stderr: &str| Fault::Exited {
            server: "s".into(),
            code: 1,
            stderr_tail: stderr.to_owned(),
        };
        let npm = "npm error code EAI_AGAIN\nnpm error request to https://registry.npmjs.org/turndown failed, reason: getaddrinfo EAI_AGAIN registry.npmjs.org\n";
        let error = sandbox_hint("fetch".into(), "handshake", fault(npm), &[]).to_string();
        assert!(
            error.contains("It tried to reach the network (registry.npmjs.org), which the native sandbox refuses")
                && error.contains("needs it installed ahead of time (`moat add`)")
                && error.contains("`moat learn fetch`"),
            "{error}"
        );
        let python = "httpx.ConnectError: [Errno -3] Temporary failure in name resolution\n  while fetching https://huggingface.co:443/api/models from /opt/app/main.py\n";
        let error = sandbox_hint("models".into(), "handshake", fault(python), &[]).to_string();
        assert!(
            error.contains("(a host its stderr does not name)"),
            "{error}"
        );
        let both =
            "Could not resolve host: files.example.com while reading /srv/data/config.json\n";
        assert_eq!(hosts_in(both), ["files.example.com"]);
        // No network failure, no denial: the server's own exit.
        let own = sandbox_hint(
            "x".into(),
            "handshake",
            fault("error: API_KEY is not set\n"),
            &[],
        );
        assert!(matches!(own, ClientError::Fault { .. }), "{own}");
    }

    #[test]
    fn a_refusal_says_whether_the_path_was_read_only_private_or_outside_every_grant() {
        let fault = Fault::Exited {
            server: "s".into(),
            code: 1,
            stderr_tail: "OSError: [Errno 30] Read-only file system: '/srv/vault/.obsidian/new.md'\nPermissionError: [Errno 13] Permission denied: '/tmp/host-cache/x'\n".into(),
        };
        let granted = [
            (PathBuf::from("/srv"), true),
            (PathBuf::from("/srv/vault"), false),
        ];
        let error = sandbox_hint("notes".into(), "tools/call", fault, &granted).to_string();
        assert!(
            error.contains("; /srv/vault is granted read-only: if the server is to write there, change that entry to `[[servers.notes.dirs]] host = \"/srv/vault\" mode = \"rw\"`"),
            "{error}"
        );
        assert!(
            error.contains(
                "; /tmp/host-cache/x is under /tmp, which is the server's own (private and empty)"
            ),
            "{error}"
        );
        assert!(!error.contains("grant probably missing"), "{error}");
    }

    fn client_side() -> (ClientSide, Askers) {
        let askers = Askers::default();
        let (progress, _) = mpsc::unbounded_channel();
        let (notices, _) = tokio::sync::broadcast::channel(1);
        let shared = Arc::new(Shared::new("s".into(), &crate::limits::Limits::default()));
        let side = ClientSide {
            progress,
            askers: askers.clone(),
            notices,
            shared,
        };
        (side, askers)
    }

    fn roots() -> rmcp::model::InputRequest {
        rmcp::model::InputRequest::ListRoots(Default::default())
    }

    /// A server's own request with no call in flight to take it is refused
    /// at once, naming the server; one that a call takes waits for its
    /// answer, and a call that ended is passed over.
    #[tokio::test]
    async fn a_servers_request_goes_to_a_call_in_flight_and_else_is_refused_at_once() {
        let (side, askers) = client_side();
        let refused = side.ask(roots(), "roots/list").await.unwrap_err();
        assert_eq!(
            refused.message,
            "roots/list from server `s` came while no call was in flight: Moat passes a server's requests to the agent of the call they belong to"
        );
        let (ended, gone) = mpsc::unbounded_channel();
        drop(gone);
        let (taking, mut taken) = mpsc::unbounded_channel();
        askers.lock().unwrap().extend([ended, taking]);
        let answering = tokio::spawn(async move {
            let ask: ServerAsk = taken.recv().await.unwrap();
            assert!(matches!(
                ask.request,
                rmcp::model::InputRequest::ListRoots(_)
            ));
            ask.answer
                .send(Ok(serde_json::json!({"roots": []})))
                .unwrap();
        });
        let answer = side.ask(roots(), "roots/list").await.unwrap();
        assert_eq!(answer, serde_json::json!({"roots": []}));
        answering.await.unwrap();
        assert_eq!(
            askers.lock().unwrap().len(),
            1,
            "the ended call is forgotten"
        );
    }
}

//! Gateway: one MCP server for the agent in front of many servers. This
//! module owns agent sessions: each session starts its servers on first use,
//! reuses them within the session by execution identity, never shares them
//! across sessions, and closes them with the session. Tools are exposed as
//! `server__tool`; calls are routed to the right child and audited. It never
//! matches on the launcher kind.

use crate::audit::{AuditError, AuditLog, Event};
use crate::config::Config;
pub use crate::config::SEPARATOR;
use crate::host::Host;
use crate::revoke::Revoked;
use crate::session::SessionError;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
mod agent;
mod bridge;
mod call;
mod calls;
mod children;
mod error;
mod gate;
mod generation;
mod handler;
mod idle;
mod listings;
mod names;
mod own_task;
mod parked;
mod record;
mod reload;
mod session;
mod start;
mod start_failures;
mod subscriptions;
mod tasks;
mod tasks_2025;

pub use call::Takes;
pub use children::MAX_RESTARTS;
pub use error::CallError;
pub use gate::Enforced;
use generation::Generation;
pub use names::{check_lock_names, valid_exposed_name};
pub use session::{AgentSession, SessionState};
pub use start_failures::{START_RETRY_MAX, StartFailure};

/// Everything sessions share: the configuration in force (a
/// [`Generation`]), the audit log and the metrics.
#[derive(Clone)]
pub struct Gateway {
    /// What new sessions get; a reload replaces it, and each session keeps
    /// the one it began with.
    current: Arc<std::sync::RwLock<Arc<Generation>>>,
    audit: Option<Arc<AuditLog>>,
    /// Counted where the audit events are written, log or not.
    metrics: Arc<crate::metrics::Metrics>,
    sessions: Arc<AtomicU64>,
    live: Arc<std::sync::Mutex<Vec<std::sync::Weak<SessionState>>>>,
    /// Sessions kept past the stateless request that began them, by the id
    /// of the task they run (see [`Gateway::hold`]).
    held: Arc<std::sync::Mutex<BTreeMap<String, AgentSession>>>,
    /// When set, each session's claim is signed and placed at its end.
    claims: Arc<std::sync::OnceLock<crate::claim::Claims>>,
    /// When set, every id naming state this gateway alone holds ends in
    /// the replica's name (see [`crate::replica`]).
    replica: Arc<std::sync::OnceLock<crate::replica::Replica>>,
    /// Set when [`Gateway::close_all`] begins: no new session from then.
    draining: Arc<std::sync::atomic::AtomicBool>,
}

/// Why a reload (SIGHUP, `--watch`) was refused. Nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Lock(#[from] crate::lock::LockError),
    #[error(
        "{path}: the [wasm] table changed, and the engine cannot change while serving: restart `moat serve` to apply it"
    )]
    WasmChanged { path: String },
    #[error(
        "{path} is gone: a reload never drops the pins of a gateway that enforces a lock (restart `moat serve` to run without one)"
    )]
    LockRemoved { path: String },
}

/// What a reload did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reloaded {
    /// The generation new sessions get from now on.
    pub generation: u64,
    /// Its configured servers.
    pub servers: usize,
    /// The revocations its lock holds.
    pub revocations: usize,
    /// The revocations put in force, and the servers that older sessions
    /// stopped because the lock no longer matches them.
    pub enforced: Enforced,
}

/// A tool or prompt name the gateway cannot expose: it is left out of the
/// listings, with this warning, and the rest is served.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(
        "server `{server}`, {what} `{tool}`: the exposed name `{exposed}` does not match ^[a-zA-Z0-9_-]{{1,64}}$, so it is left out (a shorter server name may make it fit)"
    )]
    InvalidName {
        server: String,
        /// `tool` or `prompt`.
        what: &'static str,
        tool: String,
        exposed: String,
    },
    #[error(
        "server `{server}` lists two {what}s named `{name}`: the exposed name `{exposed}` would be ambiguous, so only the first is served"
    )]
    DuplicateName {
        server: String,
        /// `tool` or `prompt`.
        what: &'static str,
        name: String,
        exposed: String,
    },
}

/// 128 random bits, in hex: what makes an id a capability.
pub(crate) fn capability_bits() -> String {
    names::unguessable()
}

impl Gateway {
    /// A gateway for `config`'s servers, launched by `host`. Native
    /// servers' egress proxies share `[serve] egress_connections` across
    /// the gateway, at most a quarter of Moat's descriptor limit (each
    /// connection costs two descriptors).
    pub fn new(host: Host, config: Config, audit: Option<Arc<AuditLog>>) -> Self {
        #[cfg(unix)]
        let host = {
            let configured = config.serve.egress_connections.get();
            let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
                .current
                .unwrap_or(u64::MAX);
            let bound = usize::try_from(soft / 4)
                .unwrap_or(usize::MAX)
                .clamp(1, configured);
            if bound < configured {
                tracing::warn!(
                    configured,
                    bound,
                    open_files = soft,
                    "egress_connections is more than a quarter of Moat's descriptor limit: bounded to that"
                );
            }
            // Each egress refusal is a record in the audit chain.
            let audit = audit.clone();
            host.with_egress(
                crate::egress::Shares::gateway(
                    config.serve.egress_connections_per_server.get(),
                    crate::egress::Pool::new(bound, "gateway"),
                )
                .observe(crate::egress::Observer::new(move |refusal| {
                    if let Some(log) = &audit {
                        let _ = log.record(&Event::EgressRefused {
                            server: refusal.server,
                            destination: refusal.destination,
                            reason: refusal.reason,
                        });
                    }
                })),
            )
        };
        Self {
            current: Arc::new(std::sync::RwLock::new(Arc::new(Generation::new(
                1, host, config,
            )))),
            audit,
            metrics: Arc::default(),
            sessions: Arc::default(),
            live: Arc::default(),
            held: Arc::default(),
            claims: Arc::default(),
            replica: Arc::default(),
            draining: Arc::default(),
        }
    }

    /// Signs a claim of every session that opens from now on when it ends,
    /// with `claims.key`, placed where `claims.place` says (see
    /// [`crate::claim`]). Set once; a second call changes nothing.
    pub fn sign_claims(&self, claims: crate::claim::Claims) {
        let _ = self.claims.set(claims);
    }

    /// Marks every id this gateway hands out for state it alone holds (a
    /// 2025 session, a task, a parked call) as `replica`'s, and refuses by
    /// name the ids of other replicas. Set once, before serving.
    pub fn serve_as_replica(&self, replica: crate::replica::Replica) {
        let _ = self.replica.set(replica);
    }

    /// This gateway's replica, when it is one.
    pub fn replica(&self) -> Option<&crate::replica::Replica> {
        self.replica.get()
    }

    /// A fresh capability (128 random bits), marked with the replica.
    pub(crate) fn capability(&self) -> String {
        let random = names::unguessable();
        match self.replica() {
            Some(replica) => replica.tag(&random),
            None => random,
        }
    }

    /// What a request naming `id`, a `what` of another replica, is told.
    pub(crate) fn misrouted(&self, what: &str, id: &str) -> Option<String> {
        self.replica()?.misrouted(what, id)
    }

    /// What claims are signed with and where they go, when they are.
    pub(crate) fn claims(&self) -> Option<&crate::claim::Claims> {
        self.claims.get()
    }

    /// Keeps `session` (and the children it started) alive under `key`, a
    /// capability its agent was handed, past the stateless request that
    /// began it: over HTTP on 2026-07-28 every request is a session of its
    /// own, and a task must outlive the request that made it. Released by
    /// [`Gateway::release`], or after `ttl`. A held session counts against
    /// `max_sessions` as any other.
    fn hold(&self, key: String, session: AgentSession, ttl: Duration) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), session);
        self.release_after(key, ttl);
    }

    /// Takes the session held under `key` out of the gateway's keeping.
    fn release(&self, key: &str) -> Option<AgentSession> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
    }

    /// The session held under `key`, if any.
    fn held(&self, key: &str) -> Option<AgentSession> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    /// Lets go of the session held under `key` after `delay` (it closes once
    /// no request of its own is left).
    fn release_after(&self, key: String, delay: Duration) {
        let held = Arc::downgrade(&self.held);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(held) = held.upgrade() {
                let released = held.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                drop(released);
            }
        });
    }

    /// The generation new sessions get.
    fn current(&self) -> Arc<Generation> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The generation new sessions get: 1 at start, one more per reload.
    pub fn generation(&self) -> u64 {
        self.current().number
    }

    /// How `moat serve` runs sessions (`[serve]`), as last loaded.
    pub fn serve_settings(&self) -> crate::config::ServeSettings {
        self.current().config.serve.clone()
    }

    /// Whether the gateway is closing ([`Gateway::close_all`]): a front
    /// turns new sessions away (503, which a load balancer retries on
    /// another replica), and the open ones drain.
    pub fn draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Agent sessions alive now (open, or closing).
    pub fn live_sessions(&self) -> usize {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|s| s.strong_count() > 0);
        live.len()
    }

    /// The sessions alive now.
    fn live(&self) -> Vec<Arc<SessionState>> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect()
    }

    /// The gateway's metrics.
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// Counts `event` in the metrics and appends it to the audit log, if
    /// there is one. When the log cannot be written this fails, the log
    /// says so once, and the gateway admits no calls from then on (see
    /// [`Gateway::audit_failure`]): a caller that must not go on unrecorded
    /// (a tool call's answer) checks the result; the others' events are
    /// lost with the log, which stops everything after them.
    pub fn record(&self, event: &Event) -> Result<(), AuditError> {
        self.record_line(event).map(drop)
    }

    /// [`Self::record`], returning where the log stands after the event's
    /// line (`None` without a log).
    pub(crate) fn record_line(
        &self,
        event: &Event,
    ) -> Result<Option<crate::audit::Head>, AuditError> {
        self.metrics.observe(event);
        match &self.audit {
            Some(log) => log.record_line(event).map(Some),
            None => Ok(None),
        }
    }

    /// Why the gateway admits no calls and no new sessions: its audit log
    /// could not be written (and Moat must be restarted once it can be).
    pub fn audit_failure(&self) -> Option<AuditError> {
        self.audit.as_ref()?.failure()
    }

    /// The host that launches new sessions' servers. Every generation's
    /// host shares its engine, launch counts and revocations.
    pub fn host(&self) -> Host {
        self.current().host.clone()
    }

    /// Tool calls admitted and not yet finished, over every live session.
    pub fn calls_in_flight(&self) -> usize {
        self.live()
            .iter()
            .map(|state| state.admission.open_calls())
            .sum()
    }

    /// The revocations in force.
    pub fn revoked(&self) -> Arc<Revoked> {
        self.current().host.revoked()
    }

    /// Puts `revoked` (moat.lock's `[[revoked]]`, read again while serving)
    /// in force at once, in every session: new calls to what it names are
    /// refused; its calls in flight get up to the drain timeout
    /// (`[serve] drain_timeout_ms`) to end and are then cancelled; its
    /// children stop, and agents are told that their tools changed. A
    /// digest is matched also where it already runs. Each entry that comes
    /// into force or is lifted is audited, with `source`. Returns when all
    /// of that is done.
    pub async fn set_revocations(&self, revoked: Revoked, source: &str) -> Enforced {
        self.put_in_force(revoked, source, false).await
    }

    /// Without a lock, tool and prompt names are only known once servers
    /// run: starts each server once, before serving, and warns of each
    /// name that cannot be exposed (left out of the listings), naming the
    /// server and the name. A server that fails to start here is logged,
    /// left out of the listings and tried again with a backoff.
    pub async fn check_names(&self) {
        self.current().check_names().await
    }

    /// The servers of the configuration in force that could not start, and
    /// why: left out of the listings until a try succeeds.
    pub fn not_started(&self) -> Vec<(String, StartFailure)> {
        self.current().failures.all()
    }

    /// Closes every session still open (graceful shutdown): each drains its
    /// in-flight calls, cancels what outlives the drain timeout, and stops
    /// its children. Reports what failed to close, by session and server.
    pub async fn close_all(&self) -> Vec<(String, SessionError)> {
        self.draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut failures = Vec::new();
        self.current()
            .close_spares(|_, _| false, &mut failures)
            .await;
        let live: Vec<Arc<SessionState>> = {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            let open = live.iter().filter_map(std::sync::Weak::upgrade).collect();
            live.clear();
            open
        };
        let mut closing = tokio::task::JoinSet::new();
        for state in live {
            closing.spawn(async move {
                let id = state.id.clone();
                state
                    .close()
                    .await
                    .into_iter()
                    .map(move |(server, error)| (format!("{id}/{server}"), error))
                    .collect::<Vec<_>>()
            });
        }
        while let Some(closed) = closing.join_next().await {
            match closed {
                Ok(closed) => failures.extend(closed),
                Err(error) => tracing::error!(%error, "closing a session panicked"),
            }
        }
        failures
    }
}

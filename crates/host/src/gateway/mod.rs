//! Gateway: one MCP server for the agent in front of many servers. This
//! module owns agent sessions: each session starts its servers on first use,
//! reuses them within the session by execution identity, never shares them
//! across sessions, and closes them with the session. Tools are exposed as
//! `server__tool`; calls are routed to the right child and audited. It never
//! matches on the launcher kind.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ErrorData, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, Peer, RequestContext};
use rmcp::{RoleServer, ServerHandler};
use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditError, AuditLog, Event, Outcome};
use crate::config::{Config, ServerSpec};
use crate::host::Host;
use crate::identity::Digest;
use crate::revoke::Revoked;
use crate::session::{CallAnswer, ClientError, ProgressSender, Retry, ServerAsk, Session};

pub use crate::config::SEPARATOR;

mod generation;
mod handler;
mod listings;
mod names;
mod own_task;
mod record;
mod start_failures;

use generation::Generation;
use names::unexposable;
pub use names::{check_lock_names, valid_exposed_name};
use record::{
    cancelled, evidence_of, explained, limit_of, outcome_of, to_error, typed_limit, unaudited,
};

use own_task::OwnTask;
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
        }
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
        self.metrics.observe(event);
        match &self.audit {
            Some(log) => log.record(event),
            None => Ok(()),
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
            .map(|state| state.calls().open.len())
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

    /// [`Gateway::set_revocations`]; with `always`, every session enforces
    /// even when the revocations did not change (a reload made servers
    /// stale).
    async fn put_in_force(&self, revoked: Revoked, source: &str, always: bool) -> Enforced {
        let before = self.current().host.set_revoked(revoked.clone());
        let (_, added) = before.with(&revoked);
        let (_, lifted) = revoked.with(&before);
        for ((_, entry), lifted) in added
            .iter()
            .map(|e| (e, false))
            .chain(lifted.iter().map(|e| (e, true)))
        {
            tracing::warn!(target = %entry.target, by = %entry.by, lifted, "revocation");
            // Put in force whether or not it can be recorded: a log that
            // fails stops every call anyway.
            let _ = self.record(&Event::Revoke {
                target: entry.target.clone(),
                by: entry.by.clone(),
                at: entry.at.clone(),
                reason: entry.reason.clone(),
                source: source.to_owned(),
                lifted,
            });
        }
        let mut enforced = Enforced {
            added: added.len(),
            lifted: lifted.len(),
            ..Enforced::default()
        };
        if added.is_empty() && lifted.is_empty() && !always {
            return enforced;
        }
        let current = self.current();
        let mut failures = Vec::new();
        enforced.stopped += current
            .close_spares(
                |server, spare| current.refusal(server, None, Some(spare)).is_none(),
                &mut failures,
            )
            .await;
        for (server, error) in failures {
            tracing::warn!(%server, %error, "closing a refused server's name-check instance");
        }
        let mut sessions = tokio::task::JoinSet::new();
        for state in self.live() {
            sessions.spawn(async move { state.enforce_revocations().await });
        }
        while let Some(done) = sessions.join_next().await {
            match done {
                Ok(done) => enforced.merge(&done),
                Err(error) => {
                    tracing::error!(%error, "enforcing revocations in a session panicked")
                }
            }
        }
        enforced
    }

    /// Reads the config and its moat.lock again (SIGHUP, `--watch`): new
    /// sessions get the new configuration, sessions already open keep
    /// theirs until they end, except that what the new lock revokes or no
    /// longer matches stops in them at once, as a revocation does. A reload
    /// that cannot be read, names a server badly, changes `[wasm]` or
    /// removes the lock changes nothing. Either way it is audited
    /// (`reload`), with `source`.
    pub async fn reload(&self, source: &str) -> Result<Reloaded, ReloadError> {
        let result = self.try_reload(source).await;
        let (generation, outcome, error) = match &result {
            Ok(reloaded) => (reloaded.generation, "reloaded", None),
            Err(error) => (
                self.generation(),
                "refused",
                Some(crate::text::error_chain(error)),
            ),
        };
        if let Some(error) = &error {
            tracing::debug!(%source, %error, "reload refused");
        }
        let _ = self.record(&Event::Reload {
            source: source.to_owned(),
            generation,
            outcome: outcome.into(),
            error,
        });
        result
    }

    async fn try_reload(&self, source: &str) -> Result<Reloaded, ReloadError> {
        let old = self.current();
        let path = old.config.path.clone();
        let config = Config::load(&path)?;
        if config.wasm != old.config.wasm {
            return Err(ReloadError::WasmChanged {
                path: path.display().to_string(),
            });
        }
        let lock_path = crate::lock::Lock::path_for(&path);
        let lock = crate::lock::Lock::load(&lock_path)?;
        if lock.is_none() && old.host.is_locked() {
            return Err(ReloadError::LockRemoved {
                path: lock_path.display().to_string(),
            });
        }
        if let Some(lock) = &lock {
            for problem in check_lock_names(lock) {
                tracing::warn!(lock = %lock_path.display(), "{problem}");
            }
        }
        let revoked = lock
            .as_ref()
            .map(crate::lock::Lock::revocations)
            .unwrap_or_default();
        let revocations = revoked.iter().count();
        let newest = lock.clone().map(Arc::new);
        let host = old
            .host
            .relocked(lock.map(|lock| (lock, lock_path.clone())));
        let generation = Arc::new(Generation::new(old.number + 1, host, config));
        if !generation.host.is_locked() {
            generation.check_names().await;
        }
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = generation.clone();
        tracing::info!(%source, generation = generation.number, "reloaded");
        let mut failures = Vec::new();
        old.close_spares(|_, _| false, &mut failures).await;
        for (server, error) in failures {
            tracing::warn!(%server, %error, "closing an old name-check instance");
        }
        if let Some(newest) = newest {
            for state in self.live() {
                if state.generation.number < generation.number {
                    *state
                        .generation
                        .superseded
                        .write()
                        .unwrap_or_else(|e| e.into_inner()) = Some(newest.clone());
                }
            }
        }
        let enforced = self.put_in_force(revoked, source, true).await;
        Ok(Reloaded {
            generation: generation.number,
            servers: generation.config.servers.len(),
            revocations,
            enforced,
        })
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
    pub async fn close_all(&self) -> Vec<(String, ClientError)> {
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

    /// A new agent session (one per agent connection), in the current
    /// generation.
    pub fn session(&self) -> AgentSession {
        let id = format!("s{}", self.sessions.fetch_add(1, Ordering::SeqCst) + 1);
        let generation = self.current();
        #[cfg(unix)]
        let egress = crate::egress::Pool::new(
            generation.config.serve.egress_connections_per_session.get(),
            "session",
        );
        let state = Arc::new(SessionState {
            id,
            #[cfg(unix)]
            egress,
            gateway: self.clone(),
            generation,
            children: Arc::default(),
            restarts: Arc::default(),
            slots: Arc::default(),
            resource_owners: Arc::default(),
            tasks: std::sync::Mutex::default(),
            own_tasks: std::sync::Mutex::default(),
            parked: Arc::default(),
            subscriptions: std::sync::Mutex::default(),
            closing: CancellationToken::new(),
            cancel_calls: CancellationToken::new(),
            in_flight: Arc::new(watch::Sender::new(0)),
            calls: std::sync::Mutex::default(),
            agent: Arc::default(),
            listeners: Arc::default(),
            closed: Arc::default(),
            told_not_started: std::sync::Mutex::default(),
            retrying: std::sync::Mutex::default(),
        });
        {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            live.retain(|s| s.strong_count() > 0);
            live.push(Arc::downgrade(&state));
        }
        let session = AgentSession {
            close_on_drop: Arc::new(CloseOnDrop(state.clone())),
            state,
        };
        let _ = session.audit(Event::SessionOpen {
            session: session.id.clone(),
        });
        session
    }
}

/// One agent session and the children it started. Clones share the
/// session; when the last clone is dropped without [`SessionState::close`]
/// (an HTTP session that ended, say), the session is closed in the
/// background.
#[derive(Clone)]
pub struct AgentSession {
    state: Arc<SessionState>,
    #[allow(dead_code, reason = "held for its Drop")]
    close_on_drop: Arc<CloseOnDrop>,
}

impl std::ops::Deref for AgentSession {
    type Target = SessionState;
    fn deref(&self) -> &SessionState {
        &self.state
    }
}

/// Closes the session when the last [`AgentSession`] handle goes.
struct CloseOnDrop(Arc<SessionState>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        if self.0.closed.load(Ordering::SeqCst) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let state = self.0.clone();
            runtime.spawn(async move {
                for (server, error) in state.close().await {
                    tracing::error!(session = %state.id, %server, %error, "closing a dropped session");
                }
            });
        }
    }
}

/// The state of one agent session.
pub struct SessionState {
    id: String,
    gateway: Gateway,
    /// The configuration this session began in, kept until it ends.
    generation: Arc<Generation>,
    children: Arc<Mutex<Children>>,
    restarts: Arc<Mutex<BTreeMap<String, u32>>>,
    /// One launch slot per configured server: a start or a restart backoff
    /// holds its server's slot only, never `children`, so a slow start
    /// never stalls the session's calls to other servers.
    slots: Arc<std::sync::Mutex<BTreeMap<String, Arc<Mutex<()>>>>>,
    resource_owners: Arc<Mutex<BTreeMap<String, String>>>,
    /// Tasks servers made of this session's calls, by the id the agent
    /// knows them by.
    tasks: std::sync::Mutex<BTreeMap<String, IssuedTask>>,
    /// Tasks Moat made of this session's calls (`[serve] task_after_ms`),
    /// by the id the agent knows them by.
    own_tasks: std::sync::Mutex<BTreeMap<String, Arc<OwnTask>>>,
    /// Calls to servers before 2026-07-28 waiting for the agent's input,
    /// by the `requestState` the agent got.
    parked: Arc<std::sync::Mutex<BTreeMap<String, Parked>>>,
    /// Resources an agent before 2026-07-28 subscribed to, each ended by
    /// its token.
    subscriptions: std::sync::Mutex<BTreeMap<String, Subscribed>>,
    /// Set when close begins: no new calls are admitted.
    closing: CancellationToken,
    /// Set when the drain timeout passes: in-flight calls are cancelled.
    cancel_calls: CancellationToken,
    /// Calls admitted and not yet finished.
    in_flight: Arc<watch::Sender<usize>>,
    /// The tool calls among them, each with what it calls: a revocation
    /// drains and cancels those it names.
    calls: std::sync::Mutex<Calls>,
    /// The agent, once initialized: told when a server's tools change.
    agent: Arc<OnceLock<Peer<RoleServer>>>,
    /// The agent's open `subscriptions/listen` streams (2026-07-28): told
    /// when a server's tools change, as `agent` is.
    listeners: Arc<std::sync::Mutex<Vec<rmcp::service::SubscriptionSink>>>,
    /// Set by the first close; later ones return at once.
    closed: Arc<std::sync::atomic::AtomicBool>,
    /// Servers this session has told the agent (and the audit log) could
    /// not start, while held back: once each, not at every listing.
    told_not_started: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Servers held back that a task of this session tries again when
    /// their next try is due, telling the agent its tools changed once one
    /// starts (an agent that keeps its tool list would not see it else).
    retrying: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// The egress connections its native servers may hold at once, all
    /// together (`[serve] egress_connections_per_session`).
    #[cfg(unix)]
    egress: crate::egress::Pool,
}

/// What a subscription that just opened is told: every list it listens to
/// and every resource it subscribed to may have changed.
fn catch_up(accepted: &rmcp::model::SubscriptionFilter) -> Vec<rmcp::model::ServerNotification> {
    use rmcp::model::ServerNotification as N;
    let mut notifications = Vec::new();
    if accepted.tools_list_changed == Some(true) {
        notifications.push(N::ToolListChangedNotification(Default::default()));
    }
    if accepted.prompts_list_changed == Some(true) {
        notifications.push(N::PromptListChangedNotification(Default::default()));
    }
    if accepted.resources_list_changed == Some(true) {
        notifications.push(N::ResourceListChangedNotification(Default::default()));
    }
    for uri in accepted.resource_subscriptions.iter().flatten() {
        notifications.push(N::ResourceUpdatedNotification(
            rmcp::model::ResourceUpdatedNotification::new(
                rmcp::model::ResourceUpdatedNotificationParam::new(uri.clone()),
            ),
        ));
    }
    notifications
}

/// A resource an agent before 2026-07-28 subscribed to: the task that
/// passes its updates on, and what ends it.
struct Subscribed {
    stop: CancellationToken,
    passing: Option<tokio::task::JoinHandle<()>>,
}

/// A task a server made of an agent's call. The agent knows it as
/// `server__id`: two servers' ids never collide, and a session finds only
/// the tasks of its own calls.
struct IssuedTask {
    server: String,
    tool: String,
    task_id: String,
}

/// Where a call goes: the server, its tool and the child that runs it.
#[derive(Clone, Copy)]
struct Target<'a> {
    server: &'a str,
    tool: &'a str,
    child: &'a Arc<Session>,
}

/// Whether the agent of a request takes requests for input (2026-07-28).
fn takes_input(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|version| version >= rmcp::model::ProtocolVersion::V_2026_07_28)
}

/// Marks a server's result as complete when it does not say: a server
/// before 2026-07-28 never does, and an agent on 2026-07-28 is always told
/// (rmcp takes the mark off again for an older agent).
fn complete(result_type: &mut Option<rmcp::model::ResultType>) {
    result_type.get_or_insert(rmcp::model::ResultType::COMPLETE);
}

/// What a server before 2026-07-28 gets when it asks, while serving
/// `subject` (`tool `x``, `prompt `x``, `resource x`), for input that the
/// caller cannot give.
fn cannot_answer(server: &str, subject: &str) -> ErrorData {
    ErrorData::invalid_request(
        format!("{subject} on server `{server}` asked for input that its caller cannot give"),
        None,
    )
}

/// Passes a server's own request for input (`ask`, made while serving
/// `subject`) to `agent` when it declared what the request needs, and the
/// agent's answer back; refuses it otherwise.
async fn answer_ask(agent: Option<&Peer<RoleServer>>, server: &str, subject: &str, ask: ServerAsk) {
    let mut asked = rmcp::model::InputRequests::new();
    asked.insert("ask".to_owned(), ask.request);
    let Some(agent) = agent.filter(|agent| can_ask(agent, Some(&asked))) else {
        let _ = ask.answer.send(Err(cannot_answer(server, subject)));
        return;
    };
    let answer = match ask_agent(agent, server, subject, &asked).await {
        Ok(mut answers) => answers
            .remove("ask")
            .ok_or_else(|| cannot_answer(server, subject)),
        Err(error) => Err(ErrorData::internal_error(error.to_string(), None)),
    };
    let _ = ask.answer.send(answer);
}

/// Runs `work` (serving `subject` at `child`) while passing the server's
/// own requests for input to `agent` (see [`answer_ask`]).
async fn answering<T>(
    child: &Session,
    agent: Option<&Peer<RoleServer>>,
    subject: &str,
    work: impl Future<Output = T>,
) -> T {
    let mut asks = child.asks();
    let mut work = std::pin::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return done,
            Some(ask) = asks.recv() => answer_ask(agent, child.server(), subject, ask).await,
        }
    }
}

/// What a task id names (see [`AgentSession::resolve_task`]).
enum TaskAt {
    /// A task of Moat's, in the session that runs it.
    Own(AgentSession, Arc<OwnTask>),
    /// A server's task, as the given session knows it.
    Server(AgentSession, String),
}

/// A round's answer for the request that began it, which waits for it:
/// the request's cancellation (`cancel`) cancels the round.
async fn in_place(
    round: &mut tokio::task::JoinHandle<Result<CallToolResponse, ErrorData>>,
    cancel: &CancellationToken,
    round_cancel: &CancellationToken,
) -> Result<CallToolResponse, ErrorData> {
    tokio::select! {
        done = &mut *round => joined(done),
        () = cancel.cancelled() => {
            round_cancel.cancel();
            joined(round.await)
        }
    }
}

/// A round's answer, once its task has joined: a panic in it is the
/// gateway's own error, never the end of the session.
fn joined(
    done: Result<Result<CallToolResponse, ErrorData>, tokio::task::JoinError>,
) -> Result<CallToolResponse, ErrorData> {
    done.unwrap_or_else(|error| {
        Err(ErrorData::internal_error(
            format!("a call run apart from its request ended abnormally: {error}"),
            None,
        ))
    })
}

/// A call's parts besides its target and arguments.
struct CallParts {
    /// The agent that called, when it came through a connection (not an
    /// in-process call): asked for input on a server's behalf.
    agent: Option<Peer<RoleServer>>,
    progress: Option<ProgressSender>,
    cancel: CancellationToken,
    traceparent: Option<String>,
    retry: Retry,
    takes: Takes,
}

/// Rounds of input Moat asks an agent for on a server's behalf before it
/// gives up on a call (rmcp's own client stops at the same count).
const INPUT_ROUNDS: usize = rmcp::model::DEFAULT_MRTR_MAX_ROUNDS;

/// A call to a server before 2026-07-28 that asked for input (its own
/// `elicitation/create` or `sampling/createMessage`) while its agent, on
/// 2026-07-28, takes requests for input instead of answering such
/// requests. The agent gets the request as an `InputRequiredResult` whose
/// `requestState` names this call; the call goes on waiting at the server,
/// and the agent's retry delivers its answers and takes the call up again.
/// A server is asked once per call, as it asked: nothing is run twice.
struct Parked {
    server: String,
    tool: String,
    /// The session whose child runs the call, when that is not the session
    /// holding it (a stateless request's, taken up by the next request).
    keep: Option<AgentSession>,
    call: std::pin::Pin<Box<dyn Future<Output = Result<CallAnswer, ClientError>> + Send>>,
    asks: tokio::sync::mpsc::UnboundedReceiver<ServerAsk>,
    /// The call's progress, passed to whichever agent request holds it.
    progress: tokio::sync::mpsc::UnboundedReceiver<ProgressNotificationParam>,
    cancel: CancellationToken,
    /// The server's requests the agent was handed, by the key it answers.
    waiting: Vec<(
        String,
        tokio::sync::oneshot::Sender<Result<serde_json::Value, ErrorData>>,
    )>,
    rounds: usize,
}

impl Parked {
    /// Ends the call: the server's requests are answered with an error (no
    /// answer came), and the call is cancelled.
    async fn abandon(mut self) {
        self.waiting.clear();
        self.cancel.cancel();
        let _ = self.call.await;
    }
}

/// How long a parked call waits for the agent's retry before it is
/// cancelled (a person may be answering).
const INPUT_WAIT: Duration = Duration::from_secs(600);

/// What marks a `requestState` as Moat's own, naming a parked call.
const PARKED_STATE: &str = "moat-parked:";

/// How long a task handed out by a stateless request is kept at most (the
/// server's `ttlMs`, when it says, if shorter).
const HELD_TASK_TTL: Duration = Duration::from_secs(3600);

/// How long a held task stays once its agent has seen it end (to read its
/// result again).
const HELD_AFTER_END: Duration = Duration::from_secs(60);

/// 128 random bits, in hex: a name nobody else can guess.
fn unguessable() -> String {
    let mut nonce = [0u8; 16];
    if let Err(error) = getrandom::fill(&mut nonce) {
        // Never seen on Linux (getrandom(2) blocks until seeded); the name
        // then stays unique, though no longer secret.
        tracing::warn!(%error, "no randomness for a capability: using the clock");
        nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            .to_le_bytes();
    }
    nonce.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether an agent on a revision before 2026-07-28 can be asked, through
/// its own requests (`elicitation/create`, `sampling/createMessage`,
/// `roots/list`), for everything `asked` needs; with `None`, for anything
/// at all (then a call keeps its arguments, to call again with the answers).
#[allow(
    deprecated,
    reason = "agents before 2026-07-28 declare roots and sampling"
)]
fn can_ask(agent: &Peer<RoleServer>, asked: Option<&rmcp::model::InputRequests>) -> bool {
    use rmcp::model::InputRequest;
    let Some(info) = agent.peer_info() else {
        return false;
    };
    let capabilities = &info.capabilities;
    let Some(asked) = asked else {
        return capabilities.elicitation.is_some()
            || capabilities.sampling.is_some()
            || capabilities.roots.is_some();
    };
    asked.values().all(|request| match request {
        InputRequest::Elicitation(_) => capabilities.elicitation.is_some(),
        InputRequest::CreateMessage(_) => capabilities.sampling.is_some(),
        InputRequest::ListRoots(_) => capabilities.roots.is_some(),
        _ => false,
    })
}

/// Asks an agent before 2026-07-28 what a server's request for input needs,
/// with the agent's own requests, and returns its answers keyed as asked.
#[allow(
    deprecated,
    reason = "agents before 2026-07-28 are asked with these requests"
)]
async fn ask_agent(
    agent: &Peer<RoleServer>,
    server: &str,
    subject: &str,
    asked: &rmcp::model::InputRequests,
) -> Result<rmcp::model::InputResponses, ClientError> {
    use rmcp::model::InputRequest;
    let failed = |detail: String| ClientError::Protocol {
        server: server.to_owned(),
        operation: format!("asking the agent for input to {subject}"),
        detail,
    };
    let mut answers = rmcp::model::InputResponses::new();
    for (key, request) in asked {
        use rmcp::model::ServerRequest;
        let sent = match request {
            InputRequest::Elicitation(request) => ServerRequest::ElicitRequest(request.clone()),
            InputRequest::CreateMessage(request) => {
                ServerRequest::CreateMessageRequest(request.clone())
            }
            InputRequest::ListRoots(request) => ServerRequest::ListRootsRequest(request.clone()),
            _ => return Err(failed(format!("`{key}` is of a kind Moat cannot ask for"))),
        };
        let answer = agent
            .send_request(sent)
            .await
            .map_err(|error| failed(format!("`{key}`: {error}")))?;
        let answer =
            serde_json::to_value(answer).map_err(|error| failed(format!("`{key}`: {error}")))?;
        answers.insert(key.clone(), answer);
    }
    Ok(answers)
}

/// What an agent can take in answer to a call besides a result, by its
/// revision and capabilities.
#[derive(Clone, Copy, Debug, Default)]
pub struct Takes {
    /// A task (the agent declared the tasks extension).
    pub tasks: bool,
    /// A request for its input (a multi round-trip request: 2026-07-28).
    pub input: bool,
    /// Its connection outlives the call (stdio, or an HTTP session): a
    /// server's own request for input can wait at the gateway for the
    /// agent's retry (see [`Parked`]).
    pub held: bool,
}

/// The running children of one session, keyed by process key (see
/// [`process_key`]); each configured server name points at the child that
/// serves it. Two names share a child only when their keys are equal, so a
/// child never runs with another server's environment, grants or limits.
#[derive(Default)]
struct Children {
    by_key: BTreeMap<Digest, Child>,
    by_server: BTreeMap<String, Digest>,
}

/// One running child and the execution identity it reported.
struct Child {
    identity: Digest,
    session: Arc<Session>,
}

impl Children {
    /// Forgets the child under `key` and every name that shared it.
    fn forget(&mut self, key: &Digest) -> Option<Child> {
        self.by_server.retain(|_, k| k != key);
        self.by_key.remove(key)
    }
}

/// What decides whether two configured servers may share one child: the
/// execution identity the child reported, and everything else that shapes the
/// process (environment values, grants, limits, sandbox, consent) and its
/// lock entry. The display name is left out. The key lives only in memory,
/// within one process, so the derived `Debug` rendering of the configuration
/// (deterministic: ordered maps, fixed field order) serves as its encoding.
fn process_key(
    identity: &Digest,
    spec: &ServerSpec,
    locked: Option<&crate::lock::LockedServer>,
) -> Digest {
    // Other servers' grants (in `writers`) do not change this one's process.
    let unnamed = ServerSpec {
        name: String::new(),
        writers: Vec::new(),
        ..spec.clone()
    };
    Digest::of(format!("{identity}\n{unnamed:?}\n{locked:?}").as_bytes())
}

/// The tool calls one session has admitted and not yet finished.
#[derive(Default)]
struct Calls {
    next: u64,
    open: BTreeMap<u64, Ticket>,
}

/// One admitted tool call: what it calls, and how to cancel it.
struct Ticket {
    server: String,
    tool: String,
    cancel: CancellationToken,
}

/// Counts one admitted call until dropped. A tool call's ticket goes
/// before the count, so whoever waits on the count sees it gone.
struct InFlight<'s> {
    session: &'s SessionState,
    ticket: Option<u64>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket {
            self.session.calls().open.remove(&ticket);
        }
        self.session.in_flight.send_modify(|n| *n -= 1);
    }
}

/// What putting revocations in force did, across sessions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Enforced {
    /// Revocations that came into force.
    pub added: usize,
    /// Revocations that were lifted.
    pub lifted: usize,
    /// Calls in flight to what they refuse that ended within the drain
    /// timeout.
    pub drained: usize,
    /// Calls in flight to what they refuse that were cancelled when the
    /// drain timeout passed.
    pub cancelled: usize,
    /// Children (and instances kept from the name check) stopped.
    pub stopped: usize,
}

impl Enforced {
    fn merge(&mut self, other: &Enforced) {
        self.drained += other.drained;
        self.cancelled += other.cancelled;
        self.stopped += other.stopped;
    }
}

/// How many times one session restarts a crashed server before giving up.
pub const MAX_RESTARTS: u32 = 3;

impl SessionState {
    /// The session's id, as audited.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Records `event`. A log that cannot be written fails closed at the
    /// next admission (see [`AgentSession::admit`]) and for the tool call
    /// being recorded (see [`AgentSession::call_rounds`]).
    fn audit(&self, event: Event) -> Result<(), AuditError> {
        self.gateway.record(&event)
    }

    fn calls(&self) -> std::sync::MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts the revocations in force in this session: its calls in flight
    /// to what they refuse get up to the drain timeout to end, those still
    /// running are cancelled, the children of refused servers stop, and
    /// the agent is told that its tools changed.
    async fn enforce_revocations(&self) -> Enforced {
        let refused_servers = self.refused_servers().await;
        let refused = |ticket: &Ticket| {
            refused_servers.contains_key(&ticket.server)
                || self
                    .generation
                    .refusal(&ticket.server, Some(&ticket.tool), None)
                    .is_some()
        };
        let running = || self.calls().open.values().filter(|t| refused(t)).count();
        let mut enforced = Enforced::default();
        let pending = running();
        if pending > 0 {
            let drain = Duration::from_millis(self.generation.config.serve.drain_timeout_ms);
            let mut in_flight = self.in_flight.subscribe();
            if tokio::time::timeout(drain, in_flight.wait_for(|_| running() == 0))
                .await
                .is_err()
            {
                let cancel: Vec<CancellationToken> = self
                    .calls()
                    .open
                    .values()
                    .filter(|t| refused(t))
                    .map(|t| t.cancel.clone())
                    .collect();
                tracing::warn!(session = %self.id, calls = cancel.len(), ?drain, "drain timeout: cancelling calls to what was revoked");
                enforced.cancelled = cancel.len();
                cancel.iter().for_each(CancellationToken::cancel);
                if tokio::time::timeout(CANCEL_GRACE, in_flight.wait_for(|_| running() == 0))
                    .await
                    .is_err()
                {
                    tracing::error!(session = %self.id, calls = running(), "calls to what was revoked still running {CANCEL_GRACE:?} after cancellation");
                }
            }
            enforced.drained = pending.saturating_sub(enforced.cancelled);
        }
        enforced.stopped = self.stop_refused().await;
        if let Some(agent) = self.agent.get()
            && let Err(error) = agent.notify_tool_list_changed().await
        {
            tracing::debug!(session = %self.id, %error, "telling the agent its tools changed");
        }
        enforced
    }

    /// The configured servers this session refuses as a whole (revoked by
    /// name, by pinned digest or by the digest their child measured, or
    /// stale after a reload), with the outcome their exit is audited with.
    async fn refused_servers(&self) -> BTreeMap<String, Outcome> {
        let children = self.children.lock().await;
        self.generation
            .config
            .servers
            .keys()
            .filter_map(|server| {
                let child = children
                    .by_server
                    .get(server)
                    .and_then(|key| children.by_key.get(key))
                    .map(|child| &*child.session);
                let refusal = self.generation.refusal(server, None, child)?;
                Some((server.clone(), outcome_of(&refusal)))
            })
            .collect()
    }

    /// Stops this session's children of the servers that the revocations in
    /// force refuse as a whole (a child shared with a server they do not
    /// refuse keeps running for that one), auditing each exit as `revoked`.
    /// Returns how many stopped.
    async fn stop_refused(&self) -> usize {
        let refused = self.refused_servers().await;
        let stopping: Vec<(String, Outcome, Child)> = {
            let mut children = self.children.lock().await;
            let mut stopping = Vec::new();
            for (server, outcome) in refused {
                let Some(key) = children.by_server.remove(&server) else {
                    continue;
                };
                if children.by_server.values().all(|k| *k != key)
                    && let Some(child) = children.by_key.remove(&key)
                {
                    stopping.push((server, outcome, child));
                }
            }
            stopping
        };
        let stopped = stopping.len();
        for (server, outcome, Child { identity, session }) in stopping {
            let evidence = evidence_of(&session);
            match Arc::try_unwrap(session) {
                Ok(child) => {
                    if let Err(error) = child.close().await {
                        tracing::warn!(session = %self.id, %server, %error, "closing a revoked server");
                    }
                }
                // Still held by a call that outlived its cancellation: its
                // service ends, which stops the instance in the background.
                Err(shared) => shared.stop(),
            }
            let _ = self.audit(Event::ServerExit {
                session: self.id.clone(),
                server,
                identity: identity.to_string(),
                evidence,
                outcome,
            });
        }
        stopped
    }
}

impl AgentSession {
    /// Tries `server` again when its next try is due, and again after
    /// each failure, until it starts (then the agent is told its tools
    /// changed) or the session closes; one such task per server.
    fn retry_later(&self, server: &str) {
        if !self
            .retrying
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(server.to_owned())
        {
            return;
        }
        let state = Arc::downgrade(&self.state);
        let close_on_drop = Arc::downgrade(&self.close_on_drop);
        let closing = self.closing.clone();
        // The session, while someone else still holds it.
        let session = move || {
            Some(AgentSession {
                state: state.upgrade()?,
                close_on_drop: close_on_drop.upgrade()?,
            })
        };
        let server = server.to_owned();
        tokio::spawn(async move {
            loop {
                let due = {
                    let Some(state) = session() else { return };
                    state
                        .generation
                        .failures
                        .held_back(&server)
                        .map(|failure| failure.retry_in())
                        .unwrap_or_default()
                };
                tokio::select! {
                    () = closing.cancelled() => return,
                    () = tokio::time::sleep(due) => {}
                }
                let Some(state) = session() else { return };
                if state.child(&server).await.is_ok() {
                    state
                        .retrying
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&server);
                    tracing::info!(session = %state.id, %server, "started on a later try; its tools are listed again");
                    state.tell_tools_changed(&server).await;
                    return;
                }
            }
        });
    }

    /// Tells the agent (and its 2026-07-28 subscriptions) that the tool
    /// list changed, because of `server`.
    async fn tell_tools_changed(&self, server: &str) {
        if let Some(agent) = self.agent.get()
            && let Err(error) = agent.notify_tool_list_changed().await
        {
            tracing::debug!(%server, %error, "telling the agent its tools changed");
        }
        let sinks = self
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for sink in sinks {
            if sink.accepted().tools_list_changed == Some(true) {
                let changed = rmcp::model::ServerNotification::ToolListChangedNotification(
                    Default::default(),
                );
                if let Err(error) = sink.send(changed).await {
                    tracing::debug!(%server, %error, "telling a subscription its tools changed");
                }
            }
        }
    }

    /// Admits one call, or refuses it when the session is closing. The
    /// count goes up before the check, so close never misses a call; a tool
    /// call's `ticket` is registered with it, so a revocation finds it.
    fn admit(&self, ticket: Option<Ticket>) -> Result<InFlight<'_>, ErrorData> {
        self.in_flight.send_modify(|n| *n += 1);
        let ticket = ticket.map(|ticket| {
            let mut calls = self.calls();
            calls.next += 1;
            let id = calls.next;
            calls.open.insert(id, ticket);
            id
        });
        let guard = InFlight {
            session: &self.state,
            ticket,
        };
        if self.closing.is_cancelled() {
            return Err(ErrorData::internal_error(
                format!("session {} is closing: no new calls", self.id),
                None,
            ));
        }
        if let Some(error) = self.gateway.audit_failure() {
            return Err(unaudited(&error));
        }
        Ok(guard)
    }

    /// The child for `server`, started on first use within this session.
    /// A running child of this session with the same execution identity
    /// and the same configuration (apart from the name) serves it too.
    /// A child that crashed is restarted on the next call, after a backoff
    /// (100 ms, doubling), at most [`MAX_RESTARTS`] times per session.
    ///
    /// Starting holds only `server`'s launch slot: calls to the session's
    /// other servers go on meanwhile, and `children` is locked only to look
    /// up and to insert.
    async fn child(&self, server: &str) -> Result<Arc<Session>, ClientError> {
        let spec = self
            .generation
            .config
            .server(server)
            .map_err(|e| ClientError::Protocol {
                server: server.to_owned(),
                operation: "route".into(),
                detail: e.to_string(),
            })?;
        if let Some(child) = self.running(server, spec).await {
            return Ok(child);
        }
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(server.to_owned())
            .or_default()
            .clone();
        let _slot = slot.lock().await;
        // Another call may have started it while this one waited.
        if let Some(child) = self.running(server, spec).await {
            return Ok(child);
        }
        if let Some(failure) = self.generation.failures.held_back(server) {
            let error = ClientError::NotStarted {
                server: server.to_owned(),
                reason: failure.reason.clone(),
                retry_in_s: failure.retry_in().as_secs().max(1),
            };
            let first = self
                .told_not_started
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(server.to_owned());
            if first {
                self.tell_not_started(server, &error, &failure);
            }
            self.retry_later(server);
            return Err(error);
        }
        let restarts = self.forget_crashed(server).await?;
        if restarts > 0 {
            let backoff = Duration::from_millis(100 << (restarts - 1));
            tracing::warn!(%server, restarts, ?backoff, "restarting a crashed server");
            tokio::time::sleep(backoff).await;
        }
        let spare = self.generation.take_spare(
            server,
            #[cfg(unix)]
            &self.egress,
        );
        #[cfg(unix)]
        let host = self
            .generation
            .host
            .with_egress(self.generation.host.egress().in_session(&self.egress));
        #[cfg(not(unix))]
        let host = &self.generation.host;
        let session = match (restarts, spare) {
            (0, Some(spare)) => Arc::new(spare),
            (_, spare) => {
                if let Some(spare) = spare {
                    tokio::spawn(async move {
                        let _ = spare.close().await;
                    });
                }
                match host.connect(spec).await {
                    Ok(session) => Arc::new(session),
                    Err(error) => {
                        let failure = self.generation.failures.record(server, &error);
                        tracing::warn!(%server, %error, attempts = failure.attempts, retry_in = ?failure.retry_in(), "could not start; its tools are left out until it does");
                        self.told_not_started
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(server.to_owned());
                        self.tell_not_started(server, &error, &failure);
                        self.retry_later(server);
                        return Err(error);
                    }
                }
            }
        };
        self.generation.failures.started(server);
        self.told_not_started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(server);
        let identity = session
            .launched_identity()
            .ok_or_else(|| ClientError::Protocol {
                server: server.to_owned(),
                operation: "launch".into(),
                detail: "the server reported no identity".into(),
            })?;
        let key = process_key(&identity, spec, self.generation.host.locked(server));
        let mut children = self.children.lock().await;
        // A name of the same process key, started meanwhile under its own
        // slot, is already healthy: it serves this name too, and the new
        // child goes. A live child is never replaced.
        if let Some(old) = children.by_key.get(&key)
            && old.session.fault().is_none()
        {
            let existing = old.session.clone();
            children.by_server.insert(server.to_owned(), key);
            drop(children);
            if let Ok(extra) = Arc::try_unwrap(session) {
                tokio::spawn(async move {
                    let _ = extra.close().await;
                });
            }
            return Ok(existing);
        }
        if let Some(measured) = session.identity() {
            let _ = self.audit(Event::ServerLaunch {
                session: self.id.clone(),
                server: server.to_owned(),
                identity: identity.to_string(),
                sha256: measured.digest.map(|d| d.to_string()),
                evidence: measured.evidence.to_string(),
            });
        }
        self.pass_on_tool_changes(server, &session);
        // A faulted child under this key is replaced: the names it served
        // restart with the new one.
        children.by_key.insert(
            key,
            Child {
                identity,
                session: session.clone(),
            },
        );
        children.by_server.insert(server.to_owned(), key);
        drop(children);
        self.pass_on_list_changes(server, &session).await;
        Ok(session)
    }

    /// The healthy child serving `server` already, or a healthy child of the
    /// same process key that can (then recorded as serving it).
    async fn running(&self, server: &str, spec: &ServerSpec) -> Option<Arc<Session>> {
        let mut children = self.children.lock().await;
        if let Some(key) = children.by_server.get(server) {
            let child = &children.by_key[key];
            return child
                .session
                .fault()
                .is_none()
                .then(|| child.session.clone());
        }
        let (key, child) = self.shareable(&children, spec)?;
        tracing::debug!(%server, %key, "served by a running child of the same process key");
        children.by_server.insert(server.to_owned(), key);
        Some(child)
    }

    /// When `server`'s child has faulted: counts a restart (refusing past
    /// [`MAX_RESTARTS`]), forgets the child and audits its exit. Returns
    /// this session's restart count for `server` (0: a first start).
    async fn forget_crashed(&self, server: &str) -> Result<u32, ClientError> {
        let mut children = self.children.lock().await;
        let Some(key) = children.by_server.get(server).copied() else {
            return Ok(0);
        };
        let Some(fault) = children.by_key[&key].session.fault() else {
            return Ok(0);
        };
        let mut counts = self.restarts.lock().await;
        let count = counts.entry(server.to_owned()).or_insert(0);
        if *count >= MAX_RESTARTS {
            return Err(ClientError::GaveUp {
                server: server.to_owned(),
                restarts: *count,
                fault,
            });
        }
        *count += 1;
        if let Some(child) = children.forget(&key) {
            let _ = self.audit(Event::ServerExit {
                session: self.id.clone(),
                server: server.to_owned(),
                identity: child.identity.to_string(),
                evidence: evidence_of(&child.session),
                outcome: Outcome::of_fault(&fault),
            });
        }
        Ok(*count)
    }

    /// A running, healthy child that can serve `spec`: same process key
    /// (execution identity, configuration apart from the name, lock entry).
    fn shareable(&self, children: &Children, spec: &ServerSpec) -> Option<(Digest, Arc<Session>)> {
        let locked = self.generation.host.locked(&spec.name);
        children.by_key.iter().find_map(|(key, child)| {
            let identity = child.session.execution_identity(spec)?;
            (child.session.fault().is_none()
                && identity == child.identity
                && process_key(&identity, spec, locked) == *key)
                .then(|| (*key, child.session.clone()))
        })
    }

    /// When `child` announces that its tools changed, re-checks them against
    /// the pins and then tells the agent, which lists them again. Ends with
    /// the child's transport.
    fn pass_on_tool_changes(&self, server: &str, child: &Arc<Session>) {
        let mut events = child.tools_changed_events();
        let weak = Arc::downgrade(child);
        let agent = self.agent.clone();
        let listeners = self.listeners.clone();
        let server = server.to_owned();
        tokio::spawn(async move {
            while events.changed().await.is_ok() {
                let Some(child) = weak.upgrade() else { return };
                if let Err(error) = child.tool_reports().await {
                    tracing::warn!(%server, %error, "re-checking tools after list_changed");
                }
                drop(child);
                if let Some(agent) = agent.get()
                    && let Err(error) = agent.notify_tool_list_changed().await
                {
                    tracing::debug!(%server, %error, "passing list_changed to the agent");
                }
                let sinks = listeners.lock().unwrap_or_else(|e| e.into_inner()).clone();
                for sink in sinks {
                    if sink.accepted().tools_list_changed == Some(true) {
                        let changed = rmcp::model::ServerNotification::ToolListChangedNotification(
                            Default::default(),
                        );
                        if let Err(error) = sink.send(changed).await {
                            tracing::debug!(%server, %error, "passing list_changed to a subscription");
                        }
                    }
                }
            }
        });
    }

    /// For an agent before 2026-07-28, which hears of changes outside any
    /// stream: listens to `child`'s prompt and resource list changes and
    /// passes them on (a 2026-07-28 server sends them only on a
    /// `subscriptions/listen` stream, which this opens; an older one on its
    /// own). An agent on 2026-07-28 hears them on its own stream. Returns
    /// once the stream is open (a change after the child's first use is
    /// never missed); the forwarding ends with the child's transport.
    async fn pass_on_list_changes(&self, server: &str, child: &Arc<Session>) {
        use rmcp::model::ServerNotification as N;
        // Children start on first use, after the agent's handshake.
        let Some(agent) = self
            .agent
            .get()
            .filter(|agent| {
                agent.peer_info().is_some_and(|info| {
                    info.protocol_version < rmcp::model::ProtocolVersion::V_2026_07_28
                })
            })
            .cloned()
        else {
            return;
        };
        let filter = rmcp::model::SubscriptionFilter::builder()
            .prompts_list_changed()
            .resources_list_changed()
            .build();
        let mut listening = match child.listen(filter).await {
            Ok(listening) => listening,
            Err(error) => {
                tracing::debug!(%server, %error, "list changes not taken for an older agent");
                return;
            }
        };
        let server = server.to_owned();
        tokio::spawn(async move {
            while let Some(notice) = listening.next().await {
                let passed = match notice {
                    N::PromptListChangedNotification(_) => agent.notify_prompt_list_changed().await,
                    N::ResourceListChangedNotification(_) => {
                        agent.notify_resource_list_changed().await
                    }
                    _ => Ok(()),
                };
                if let Err(error) = passed {
                    tracing::debug!(%server, %error, "passing a list change to the agent");
                }
            }
        });
    }

    /// Every server's tools, as `server__tool`, in server order.
    pub async fn tools(&self) -> Result<Vec<Tool>, ClientError> {
        let mut exposed = Vec::new();
        for server in self.servers() {
            if self.generation.refusal(&server, None, None).is_some() {
                continue;
            }
            let Some(child) = self.listable(&server).await else {
                continue;
            };
            if self
                .generation
                .refusal(&server, None, Some(&child))
                .is_some()
            {
                drop(child);
                self.stop_refused().await;
                continue;
            }
            let tools = match child.list_tools().await {
                Ok(tools) => tools,
                Err(error) => {
                    tracing::warn!(%server, %error, "tools/list failed; its tools are left out of this listing");
                    continue;
                }
            };
            let mut seen = std::collections::BTreeSet::new();
            for mut tool in tools {
                let name = format!("{server}{SEPARATOR}{}", tool.name);
                if self
                    .generation
                    .refusal(&server, Some(&tool.name), None)
                    .is_some()
                {
                    tracing::debug!(%server, tool = %tool.name, "revoked in moat.lock; hidden");
                    continue;
                }
                let problem = if !valid_exposed_name(&name) {
                    Some(GatewayError::InvalidName {
                        server: server.clone(),
                        what: "tool",
                        tool: tool.name.to_string(),
                        exposed: name.clone(),
                    })
                } else if !seen.insert(tool.name.clone()) {
                    Some(GatewayError::DuplicateName {
                        server: server.clone(),
                        what: "tool",
                        name: tool.name.to_string(),
                        exposed: name.clone(),
                    })
                } else {
                    None
                };
                if let Some(problem) = problem {
                    tracing::warn!("{problem}");
                    continue;
                }
                tool.name = name.into();
                exposed.push(tool);
            }
        }
        Ok(exposed)
    }

    /// Calls `server__tool` on the right child, audited.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<rmcp::model::JsonObject>,
    ) -> Result<rmcp::model::CallToolResult, ErrorData> {
        self.call_forwarding(name, arguments, None, CancellationToken::new(), None)
            .await
    }

    /// Splits `server__tool` into a configured server and its tool.
    fn route_tool<'n>(&self, name: &'n str) -> Result<(&'n str, &'n str), ErrorData> {
        let (server, tool) = name.split_once(SEPARATOR).ok_or_else(|| {
            ErrorData::invalid_params(
                format!("no tool {name:?}: tools are named server__tool"),
                None,
            )
        })?;
        if !self.generation.config.servers.contains_key(server) {
            return Err(ErrorData::invalid_params(
                format!("no server {server:?} behind tool {name:?}"),
                None,
            ));
        }
        Ok((server, tool))
    }

    /// Splits `server__name` into a configured server and the name.
    fn route<'n>(&self, name: &'n str) -> Result<(&'n str, &'n str), ErrorData> {
        let (server, rest) = name.split_once(SEPARATOR).ok_or_else(|| {
            ErrorData::invalid_params(format!("no {name:?}: names are server__name"), None)
        })?;
        if !self.generation.config.servers.contains_key(server) {
            return Err(ErrorData::invalid_params(
                format!("no server {server:?} behind {name:?}"),
                None,
            ));
        }
        Ok((server, rest))
    }

    /// Calls `server__tool`, forwarding the child's progress to `progress`
    /// and the agent's cancellation (`cancel`) to the child, in a span of
    /// its own: a child of the agent's `traceparent` (from the request's
    /// `_meta`), which is passed on to the server.
    pub async fn call_forwarding(
        &self,
        name: &str,
        arguments: Option<rmcp::model::JsonObject>,
        progress: Option<ProgressSender>,
        cancel: CancellationToken,
        traceparent: Option<&str>,
    ) -> Result<rmcp::model::CallToolResult, ErrorData> {
        let (server, tool) = self.route_tool(name)?;
        let answer = self
            .call_rounds(
                server,
                tool,
                arguments,
                progress,
                cancel,
                traceparent,
                Retry::default(),
                Takes::default(),
                None,
            )
            .await?;
        match answer {
            CallToolResponse::Complete(result) => Ok(result),
            _ => Err(ErrorData::internal_error(
                format!(
                    "tool {name:?} answered with a task or a request for input, which this caller cannot take"
                ),
                None,
            )),
        }
    }

    /// Calls `tool` on `server` (routed already) for an agent that can take
    /// what `takes` says: a task or a request for input from the server is
    /// handed on if it can, and otherwise followed to its end (a task) or
    /// refused (input). `retry` carries the agent's answers to an earlier
    /// request for input back to the server, as they are.
    #[allow(
        clippy::too_many_arguments,
        reason = "one call's parts, as the agent sent them"
    )]
    async fn call_rounds(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<rmcp::model::JsonObject>,
        progress: Option<ProgressSender>,
        cancel: CancellationToken,
        traceparent: Option<&str>,
        retry: Retry,
        takes: Takes,
        agent: Option<Peer<RoleServer>>,
    ) -> Result<CallToolResponse, ErrorData> {
        use tracing::Instrument;
        // Parsed once: an invalid traceparent is neither parent nor passed on.
        let parent = traceparent.and_then(crate::trace::parse);
        let span = crate::trace::call_span(&self.id, server, tool, parent.as_ref());
        let passed_on = crate::trace::passed_on(&span, parent.as_ref());
        // Boxed, as the call within it is: a call's future holds the
        // child's start, the call and the audit, several kilobytes that
        // were copied at every move (into the span, into rmcp's task).
        Box::pin(self.call_in_span(
            server,
            tool,
            arguments,
            CallParts {
                agent,
                progress,
                cancel,
                traceparent: passed_on,
                retry,
                takes,
            },
            &span,
        ))
        .instrument(span.clone())
        .await
    }

    /// [`AgentSession::call_rounds`] within `span`.
    async fn call_in_span(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<rmcp::model::JsonObject>,
        parts: CallParts,
        span: &tracing::Span,
    ) -> Result<CallToolResponse, ErrorData> {
        let CallParts {
            agent,
            progress,
            cancel,
            traceparent,
            retry,
            takes,
        } = parts;
        // An agent before 2026-07-28 that can be asked for input: Moat asks
        // it on the server's behalf and calls again, so it keeps the call's
        // arguments for that.
        let agent = agent.filter(|agent| !takes.input && can_ask(agent, None));
        let again = agent.as_ref().map(|_| arguments.clone());
        // Cancelled by the agent, by close once the drain timeout passes, or
        // by a revocation of what it calls; a start still under way is
        // dropped, which leaves nothing running.
        let cancel_call = self.cancel_calls.child_token();
        let _in_flight = self.admit(Some(Ticket {
            server: server.to_owned(),
            tool: tool.to_owned(),
            cancel: cancel_call.clone(),
        }))?;
        // Checked once the ticket is registered: a revocation that comes
        // into force after this check finds the call and drains it.
        if let Some(error) = self.generation.refusal(server, Some(tool), None) {
            return Err(to_error(error));
        }
        // What the audit records of the call: only computed for a log.
        let audited = self.gateway.audit.is_some();
        let arguments_json = if audited {
            serde_json::to_vec(&arguments).unwrap_or_default()
        } else {
            Vec::new()
        };
        let started = Instant::now();
        // A retry of a call that an earlier stateless request parked: the
        // call runs on in the session held under its state, on that
        // session's instance, and none is started here for it.
        let holder = retry
            .request_state
            .as_deref()
            .filter(|state| state.starts_with(PARKED_STATE))
            .and_then(|state| self.parked_runner(state));
        let runs_in = holder.as_ref().unwrap_or(self);
        let child = tokio::select! {
            child = runs_in.child(server) => child.map_err(to_error)?,
            () = cancel_call.cancelled() => return Err(self.cancellation(server, tool, None, &cancel)),
            () = cancel.cancelled() => return Err(cancelled(server, tool)),
        };
        // The digest it measured may be revoked: then it stops too.
        if let Some(error) = self.generation.refusal(server, Some(tool), Some(&child)) {
            drop(child);
            self.stop_refused().await;
            return Err(to_error(error));
        }
        // Its launch may be what the log could not record.
        if let Some(error) = self.gateway.audit_failure() {
            return Err(unaudited(&error));
        }
        let fuel_before = child.metrics().fuel_consumed();
        let mut call = Box::pin(async {
            let mut answer = if child.is_current() {
                child
                    .call_tool_answer(
                        tool,
                        arguments,
                        progress.clone(),
                        cancel_call.clone(),
                        traceparent.clone(),
                        retry,
                    )
                    .await?
            } else {
                self.older_answer(
                    Target {
                        server,
                        tool,
                        child: &child,
                    },
                    arguments,
                    progress.clone(),
                    &cancel_call,
                    traceparent.clone(),
                    retry,
                    agent.as_ref(),
                    takes,
                )
                .await?
            };
            let mut rounds = 0;
            while let (CallAnswer::InputRequired(asked), Some(agent)) = (&answer, &agent) {
                let requests = asked.input_requests.clone().unwrap_or_default();
                if rounds == INPUT_ROUNDS || !can_ask(agent, Some(&requests)) {
                    break;
                }
                rounds += 1;
                let retry = Retry {
                    input_responses: Some(
                        ask_agent(agent, server, &format!("tool `{tool}`"), &requests).await?,
                    ),
                    request_state: asked.request_state.clone(),
                };
                answer = child
                    .call_tool_answer(
                        tool,
                        again.clone().flatten(),
                        progress.clone(),
                        cancel_call.clone(),
                        traceparent.clone(),
                        retry,
                    )
                    .await?;
            }
            match answer {
                CallAnswer::Task(created) if takes.tasks => Ok(CallToolResponse::Task(
                    self.issue_task(server, tool, created, takes.held),
                )),
                CallAnswer::Task(created) => child
                    .finish_task(tool, &created.task, &cancel_call)
                    .await
                    .map(CallToolResponse::Complete),
                CallAnswer::InputRequired(asked) if takes.input => {
                    Ok(CallToolResponse::InputRequired(asked))
                }
                CallAnswer::InputRequired(_) => Err(ClientError::InputRequired {
                    server: server.to_owned(),
                    tool: tool.to_owned(),
                }),
                CallAnswer::Complete(result) => Ok(CallToolResponse::Complete(result)),
            }
        });
        let result = loop {
            tokio::select! {
                result = &mut call => break result,
                () = cancel.cancelled(), if !cancel_call.is_cancelled() => cancel_call.cancel(),
            }
        };
        drop(call);
        let result = result.map_err(|error| match error {
            ClientError::Cancelled { .. } if !cancel.is_cancelled() => {
                match self.generation.refusal(server, Some(tool), Some(&child)) {
                    Some(refusal) => ClientError::CancelledByRevocation {
                        server: server.to_owned(),
                        tool: tool.to_owned(),
                        refusal: refusal.to_string(),
                    },
                    None => error,
                }
            }
            error => error,
        });
        // A tool's error that shows the sandbox refusing it says so.
        let (result, seen) = match result {
            Ok(CallToolResponse::Complete(answer)) if answer.is_error == Some(true) => {
                let (answer, seen) = explained(&child, server, answer);
                (Ok(CallToolResponse::Complete(answer)), seen)
            }
            other => (other, None),
        };
        let fuel = child.metrics().fuel_consumed() - fuel_before;
        let elapsed = started.elapsed();
        let (outcome, limit) = match &result {
            Ok(CallToolResponse::Complete(answer)) if answer.is_error == Some(true) => {
                (Outcome::plain("tool-error"), typed_limit(&child, answer))
            }
            Ok(CallToolResponse::Task(_)) => (Outcome::plain("task"), None),
            Ok(CallToolResponse::InputRequired(_)) => (Outcome::plain("input-required"), None),
            Ok(_) => (Outcome::plain("ok"), None),
            Err(error) => (outcome_of(error), limit_of(error)),
        };
        self.gateway
            .metrics
            .call(server, tool, &outcome.outcome, elapsed, fuel, limit);
        crate::trace::record_end(span, &outcome.outcome, elapsed, fuel, limit);
        if !audited {
            return result.map_err(to_error);
        }
        let result_json = result.as_ref().ok().and_then(|r| match r {
            CallToolResponse::Complete(r) => serde_json::to_vec(r).ok(),
            CallToolResponse::InputRequired(r) => serde_json::to_vec(r).ok(),
            CallToolResponse::Task(r) => serde_json::to_vec(r).ok(),
            _ => None,
        });
        // Fails closed: an answer that cannot be recorded is not given (the
        // server did the work; the agent gets the log's error instead).
        if let Some(seen) = seen {
            self.audit(Event::SandboxRefused {
                session: self.id.clone(),
                server: server.to_owned(),
                during: format!("tools/call {tool}"),
                kind: seen.kind.to_owned(),
                subject: seen.subject,
            })
            .map_err(|error| unaudited(&error))?;
        }
        self.audit(Event::ToolCall {
            session: self.id.clone(),
            server: server.to_owned(),
            tool: tool.to_owned(),
            arguments_sha256: Digest::of(&arguments_json).to_string(),
            arguments_bytes: arguments_json.len(),
            result_sha256: result_json.as_ref().map(|r| Digest::of(r).to_string()),
            result_bytes: result_json.as_ref().map_or(0, Vec::len),
            duration_ms: elapsed.as_millis() as u64,
            fuel,
            outcome,
        })
        .map_err(|error| unaudited(&error))?;
        result.map_err(to_error)
    }

    /// The answer of a server before 2026-07-28 to a call. Such a server
    /// may ask for input on its own while it works (`elicitation/create`,
    /// `sampling/createMessage`): each request goes to `asker` (an older
    /// agent that declared what it needs), or, for an agent that takes
    /// requests for input and will come back (`park`), to the agent as an
    /// `InputRequiredResult` while the call waits parked at the gateway
    /// (see [`Parked`]); any other caller's is refused. A retry whose
    /// `requestState` names a parked call of this session takes it up.
    #[allow(
        clippy::too_many_arguments,
        reason = "one call's parts, as the agent sent them"
    )]
    async fn older_answer(
        &self,
        target: Target<'_>,
        arguments: Option<rmcp::model::JsonObject>,
        progress: Option<ProgressSender>,
        cancel_call: &CancellationToken,
        traceparent: Option<String>,
        retry: Retry,
        asker: Option<&Peer<RoleServer>>,
        takes: Takes,
    ) -> Result<CallAnswer, ClientError> {
        let Takes {
            input: takes_input,
            held,
            ..
        } = takes;
        let Target {
            server,
            tool,
            child,
        } = target;
        let mut parked = match retry
            .request_state
            .as_deref()
            .filter(|state| state.starts_with(PARKED_STATE))
        {
            Some(state) => {
                // Parked by an earlier stateless request: its session is
                // held under the state, and comes along until the call ends.
                let holder = self.gateway.release(state);
                let found = match &holder {
                    Some(holder) => holder.unpark(server, tool, state, retry.input_responses),
                    None => self.unpark(server, tool, state, retry.input_responses),
                };
                if let (None, Some(holder)) = (&found, &holder) {
                    // Named for another tool: it waits on for its own retry.
                    self.gateway.hold(state.to_owned(), holder.clone(), INPUT_WAIT);
                }
                found.map(|mut parked| {
                    if parked.keep.is_none() {
                        parked.keep = holder;
                    }
                    parked
                })
            }
            .ok_or_else(|| ClientError::Protocol {
                    server: server.to_owned(),
                    operation: format!("tools/call `{tool}`"),
                    detail: format!(
                        "requestState {state:?} names no call of this tool waiting for input in this session (it may have waited longer than {INPUT_WAIT:?})"
                    ),
                })?,
            None => {
                let asks = child.asks();
                let (relay, relayed) = tokio::sync::mpsc::unbounded_channel();
                let cancel = CancellationToken::new();
                let call = {
                    let (child, tool, cancel) = (child.clone(), tool.to_owned(), cancel.clone());
                    Box::pin(async move {
                        child
                            .call_tool_answer(
                                &tool,
                                arguments,
                                Some(relay),
                                cancel,
                                traceparent,
                                retry,
                            )
                            .await
                    })
                };
                Parked {
                    server: server.to_owned(),
                    tool: tool.to_owned(),
                    keep: None,
                    call,
                    asks,
                    progress: relayed,
                    cancel,
                    waiting: Vec::new(),
                    rounds: 0,
                }
            }
        };
        loop {
            tokio::select! {
                answer = &mut parked.call => return answer,
                Some(note) = parked.progress.recv() => {
                    if let Some(progress) = &progress {
                        let _ = progress.send(note);
                    }
                }
                () = cancel_call.cancelled(), if !parked.cancel.is_cancelled() => parked.cancel.cancel(),
                Some(ask) = parked.asks.recv() => {
                    if asker.is_some() || !takes_input || parked.rounds == INPUT_ROUNDS {
                        // Asked of an older agent, or refused.
                        answer_ask(asker, server, &format!("tool `{tool}`"), ask).await;
                    } else {
                        parked.rounds += 1;
                        let key = format!("moat-{}", parked.rounds);
                        let asked = rmcp::model::InputRequests::from([(key.clone(), ask.request)]);
                        parked.waiting.push((key, ask.answer));
                        let state = self.park(parked, held);
                        return Ok(CallAnswer::InputRequired(rmcp::model::InputRequiredResult::new(
                            Some(asked),
                            Some(state),
                        )));
                    }
                }
            }
        }
    }

    /// Keeps `parked` for the agent's retry, under a fresh `requestState`
    /// of this session; after [`INPUT_WAIT`] without one it is cancelled.
    fn park(&self, parked: Parked, held: bool) -> String {
        let state = format!("{PARKED_STATE}{}", unguessable());
        self.parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(state.clone(), parked);
        if !held {
            // A stateless request's session ends with it: held for the retry.
            self.gateway.hold(state.clone(), self.clone(), INPUT_WAIT);
        }
        let (all, key) = (Arc::downgrade(&self.parked), state.clone());
        tokio::spawn(async move {
            tokio::time::sleep(INPUT_WAIT).await;
            let Some(all) = all.upgrade() else { return };
            let expired = all.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
            if let Some(parked) = expired {
                tracing::warn!(server = %parked.server, tool = %parked.tool, "no retry came for a request for input: the call is cancelled");
                parked.abandon().await;
            }
        });
        state
    }

    /// The session whose instance runs the call that an earlier stateless
    /// request parked under `state`: the session held under it, or the
    /// one that session keeps for the call (parked again by a later round).
    fn parked_runner(&self, state: &str) -> Option<AgentSession> {
        let holder = self.gateway.held(state)?;
        let kept = holder
            .parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(state)
            .and_then(|parked| parked.keep.clone());
        Some(kept.unwrap_or(holder))
    }

    /// Lets go of the parked call `state` names, if it is still parked: its
    /// server is told that no answer came, and the call is cancelled.
    fn abandon_parked(&self, state: &str) {
        let parked = self
            .parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(state);
        drop(self.gateway.release(state));
        if let Some(parked) = parked {
            tokio::spawn(parked.abandon());
        }
    }

    /// Takes up the parked call `state` names, for a retry of `server`'s
    /// `tool`, and gives the server the agent's answers; `None` if this
    /// session has no such call.
    fn unpark(
        &self,
        server: &str,
        tool: &str,
        state: &str,
        answers: Option<rmcp::model::InputResponses>,
    ) -> Option<Parked> {
        let mut parked = {
            let mut all = self.parked.lock().unwrap_or_else(|e| e.into_inner());
            let found = all
                .get(state)
                .is_some_and(|parked| parked.server == server && parked.tool == tool);
            found.then(|| all.remove(state)).flatten()?
        };
        let mut answers = answers.unwrap_or_default();
        for (key, answer) in parked.waiting.drain(..) {
            let _ = answer.send(answers.remove(&key).ok_or_else(|| {
                ErrorData::invalid_params(format!("the agent gave no answer to `{key}`"), None)
            }));
        }
        Some(parked)
    }

    /// Every server's prompts, named `server__name`; a name that cannot be
    /// exposed is hidden, with a warning.
    pub async fn prompts(&self) -> Result<Vec<rmcp::model::Prompt>, ClientError> {
        let mut exposed = Vec::new();
        for (server, prompts) in self.gather::<rmcp::model::Prompt>().await {
            let mut seen = std::collections::BTreeSet::new();
            for mut prompt in prompts {
                let name = format!("{server}{SEPARATOR}{}", prompt.name);
                if valid_exposed_name(&name) && seen.insert(prompt.name.clone()) {
                    prompt.name = name;
                    exposed.push(prompt);
                } else {
                    tracing::warn!(%server, prompt = %prompt.name, "prompt name not exposable; hidden");
                }
            }
        }
        Ok(exposed)
    }

    /// Every server's resources, named `server__name`, URIs unchanged. Two
    /// servers listing the same URI is an error naming both.
    pub async fn resources(&self) -> Result<Vec<rmcp::model::Resource>, ClientError> {
        let mut exposed = Vec::new();
        let mut owners = BTreeMap::new();
        for (server, resources) in self.gather::<rmcp::model::Resource>().await {
            for mut resource in resources {
                if let Some(other) = owners.insert(resource.uri.clone(), server.clone()) {
                    return Err(ClientError::Protocol {
                        server: server.clone(),
                        operation: "resources/list".into(),
                        detail: format!(
                            "resource {} is listed by both `{other}` and `{server}`",
                            resource.uri
                        ),
                    });
                }
                resource.name = format!("{server}{SEPARATOR}{}", resource.name);
                exposed.push(resource);
            }
        }
        *self.resource_owners.lock().await = owners;
        Ok(exposed)
    }

    /// What each server lists of `T`, in server order. A server that cannot
    /// start, or whose listing fails, is left out (with a warning), never
    /// the whole listing.
    async fn gather<T: listings::Listed>(&self) -> Vec<(String, Vec<T>)> {
        let mut gathered = Vec::new();
        for server in self.servers() {
            let Some(child) = self.listable(&server).await else {
                continue;
            };
            match T::list(&child).await {
                Ok(items) => gathered.push((server, items)),
                Err(error) => {
                    tracing::warn!(%server, %error, method = T::METHOD, "listing failed; what the server lists is left out of this listing");
                }
            }
        }
        gathered
    }

    fn servers(&self) -> Vec<String> {
        self.generation.config.servers.keys().cloned().collect()
    }

    /// `server`'s child for a listing, or `None` when the listing leaves it
    /// out: it failed to start (now or before, its next try not yet due;
    /// see [`start_failures`]). One server that cannot start
    /// never hides the others.
    async fn listable(&self, server: &str) -> Option<Arc<Session>> {
        match self.child(server).await {
            Ok(child) => Some(child),
            Err(error) => {
                tracing::debug!(%server, %error, "left out of the listing");
                None
            }
        }
    }

    /// Says that `server` could not start where this session's agent and
    /// its operator see it: the audit log, and the agent (a log
    /// notification). Each failed start is told; a failure seen again while
    /// the server is held back, once a session.
    fn tell_not_started(&self, server: &str, error: &ClientError, failure: &StartFailure) {
        let retry_in = failure.retry_in();
        let _ = self.audit(Event::ServerStartFailed {
            session: self.id.clone(),
            server: server.to_owned(),
            attempts: failure.attempts,
            outcome: outcome_of(error),
        });
        if let Some(seen) = failure.seen.clone() {
            let _ = self.audit(Event::SandboxRefused {
                session: self.id.clone(),
                server: server.to_owned(),
                during: "start".to_owned(),
                kind: seen.kind.to_owned(),
                subject: seen.subject,
            });
        }
        if let Some(agent) = self.agent.get().cloned() {
            let message = format!(
                "moat: server `{server}` could not start, so its tools are left out (tried again in {} s): {}",
                retry_in.as_secs().max(1),
                failure.reason
            );
            tokio::spawn(async move {
                #[allow(deprecated, reason = "agents before 2026-07-28 read log notifications")]
                let sent = agent
                    .notify_logging_message(
                        rmcp::model::LoggingMessageNotificationParam::new(
                            rmcp::model::LoggingLevel::Error,
                            message.into(),
                        )
                        .with_logger("moat"),
                    )
                    .await;
                if let Err(error) = sent {
                    tracing::debug!(%error, "telling the agent of a failed start");
                }
            });
        }
    }
}

impl SessionState {
    /// Closes the session: refuses new calls, lets in-flight calls finish
    /// for up to the drain timeout (`[serve] drain_timeout_ms`), cancels the
    /// rest, then stops every child. Reports the children that failed to
    /// close (and calls that outlived even their cancellation).
    pub async fn close(&self) -> Vec<(String, ClientError)> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Vec::new();
        }
        self.closing.cancel();
        // Calls waiting for input that will never come: their children close below.
        self.parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let drain = Duration::from_millis(self.generation.config.serve.drain_timeout_ms);
        let mut in_flight = self.in_flight.subscribe();
        let mut failures = Vec::new();
        let drained = tokio::time::timeout(drain, in_flight.wait_for(|n| *n == 0))
            .await
            .is_ok();
        if !drained {
            let left = *in_flight.borrow();
            tracing::warn!(session = %self.id, calls = left, ?drain, "drain timeout: cancelling in-flight calls");
            self.cancel_calls.cancel();
            if tokio::time::timeout(CANCEL_GRACE, in_flight.wait_for(|n| *n == 0))
                .await
                .is_err()
            {
                failures.push((
                    "*".to_owned(),
                    ClientError::Protocol {
                        server: "*".to_owned(),
                        operation: "close".into(),
                        detail: format!(
                            "{} calls still running {CANCEL_GRACE:?} after cancellation",
                            *in_flight.borrow()
                        ),
                    },
                ));
            }
        }
        let children = std::mem::take(&mut *self.children.lock().await);
        for (
            key,
            Child {
                identity,
                session: child,
            },
        ) in children.by_key
        {
            let server = children
                .by_server
                .iter()
                .filter(|(_, k)| **k == key)
                .map(|(name, _)| name.as_str())
                .collect::<Vec<_>>()
                .join(",");
            let evidence = evidence_of(&child);
            let outcome = match Arc::try_unwrap(child) {
                Ok(child) => child.close().await.err(),
                Err(_) => Some(ClientError::Protocol {
                    server: server.clone(),
                    operation: "close".into(),
                    detail: "still in use by a call that outlived its cancellation".into(),
                }),
            };
            let _ = self.audit(Event::ServerExit {
                session: self.id.clone(),
                server: server.clone(),
                identity: identity.to_string(),
                evidence,
                outcome: outcome
                    .as_ref()
                    .map_or_else(|| Outcome::plain("closed"), outcome_of),
            });
            if let Some(error) = outcome {
                failures.push((server, error));
            }
        }
        let _ = self.audit(Event::SessionClose {
            session: self.id.clone(),
            outcome: if failures.is_empty() {
                "closed".into()
            } else {
                format!("{} servers failed to close", failures.len())
            },
        });
        return_freed_memory();
        failures
    }
}

/// Hands memory freed by closed sessions back to the system. glibc's
/// allocator keeps freed heap pages for reuse, so after a burst of sessions
/// (a flood of abandoned HTTP sessions, say) the process would stay at its
/// peak. Trimming walks every arena, so a burst of closes is trimmed once,
/// a second after the first of them.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static PENDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if PENDING.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            PENDING.store(false, Ordering::SeqCst);
            return;
        };
        runtime.spawn(async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            PENDING.store(false, Ordering::SeqCst);
            // SAFETY: malloc_trim only releases free memory at the top of,
            // and inside, the allocator's arenas; it touches no live
            // allocation.
            unsafe {
                libc::malloc_trim(0);
            }
        });
    }
}

/// How long cancelled calls get to end once the drain timeout has passed.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// The error of a call cancelled before its server had started.
impl AgentSession {
    /// The answer to a call cancelled by close or by a revocation (then
    /// naming it), before its child answered.
    fn cancellation(
        &self,
        server: &str,
        tool: &str,
        child: Option<&Session>,
        agent: &CancellationToken,
    ) -> ErrorData {
        match self.generation.refusal(server, Some(tool), child) {
            Some(refusal) if !agent.is_cancelled() => {
                to_error(ClientError::CancelledByRevocation {
                    server: server.to_owned(),
                    tool: tool.to_owned(),
                    refusal: refusal.to_string(),
                })
            }
            _ => cancelled(server, tool),
        }
    }
}

impl AgentSession {
    /// What to ask each server for on behalf of the agent's `accepted`
    /// subscription: list changes of every kind the agent asked for, and the
    /// resources that server lists. Refused servers are left out.
    async fn listen_filters(
        &self,
        accepted: &rmcp::model::SubscriptionFilter,
    ) -> Vec<(String, rmcp::model::SubscriptionFilter)> {
        let owners = self.resource_owners.lock().await.clone();
        let mut filters = Vec::new();
        for server in self.servers() {
            if self.generation.refusal(&server, None, None).is_some() {
                continue;
            }
            let mut filter = accepted.clone();
            let uris: Vec<String> = accepted
                .resource_subscriptions
                .iter()
                .flatten()
                .filter(|uri| owners.get(*uri) == Some(&server))
                .cloned()
                .collect();
            // None rather than an empty list, which a server may refuse.
            filter.resource_subscriptions = (!uris.is_empty()).then_some(uris);
            filters.push((server, filter));
        }
        filters
    }

    /// The server that lists resource `uri` (listing every server's
    /// resources first if this session has not seen it).
    async fn owner_of(&self, uri: &str) -> Result<String, ErrorData> {
        if !self.resource_owners.lock().await.contains_key(uri) {
            self.resources().await.map_err(to_error)?;
        }
        let owner = self.resource_owners.lock().await.get(uri).cloned();
        owner.ok_or_else(|| {
            ErrorData::resource_not_found(format!("no server lists resource {uri}"), None)
        })
    }

    /// Calls `tool` on `server` as [`AgentSession::call_rounds`] does, for
    /// an agent that takes tasks, and makes a task of Moat's of the call if
    /// it is still running `after` it began (`[serve] task_after_ms`): the
    /// agent gets the task at once and the call runs on. A task its server
    /// makes is handed on as ever, or, made later, reached under Moat's id;
    /// a request for input leaves Moat's task `input_required` until
    /// `tasks/update` brings the answers (see [`OwnTask`]).
    #[allow(
        clippy::too_many_arguments,
        reason = "one call's parts, as the agent sent them"
    )]
    async fn call_or_own_task(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<rmcp::model::JsonObject>,
        progress: Option<ProgressSender>,
        cancel: CancellationToken,
        traceparent: Option<&str>,
        retry: Retry,
        takes: Takes,
        after: Duration,
    ) -> Result<CallToolResponse, ErrorData> {
        let round_cancel = CancellationToken::new();
        let mut round = self.spawn_round(
            server,
            tool,
            arguments.clone(),
            progress,
            round_cancel.clone(),
            traceparent.map(str::to_owned),
            retry,
            takes,
            None,
        );
        tokio::select! {
            done = in_place(&mut round, &cancel, &round_cancel) => return done,
            () = tokio::time::sleep(after) => {}
        }
        if !self.room_for_a_task() {
            // No room for another task: the call is answered in place.
            return in_place(&mut round, &cancel, &round_cancel).await;
        }
        let (id, own) = self.adopt_round(server, tool, arguments, round, round_cancel, takes.held);
        Ok(CallToolResponse::Task(rmcp::model::CreateTaskResult::new(
            own.task(&id),
        )))
    }

    /// Whether this session has room for another task of Moat's (see
    /// [`own_task::make_room`]).
    fn room_for_a_task(&self) -> bool {
        own_task::make_room(&mut self.own_tasks.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Makes a task of Moat's of `round` (a call to `server`'s `tool`
    /// under `cancel`), and returns the id the agent knows it by. On a
    /// connection that ends with the request (`held` false), the session is
    /// held for it.
    fn adopt_round(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<rmcp::model::JsonObject>,
        round: tokio::task::JoinHandle<Result<CallToolResponse, ErrorData>>,
        cancel: CancellationToken,
        held: bool,
    ) -> (String, Arc<OwnTask>) {
        let own = Arc::new(OwnTask::new(server, tool, arguments, cancel));
        // Unguessable in every session: over stateless HTTP the id is the
        // capability that finds the task, and a server's own task ids
        // (`server__id`) never meet it.
        let id = format!("{server}{SEPARATOR}{}", unguessable());
        // Room was made for it before its round began.
        self.own_tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), own.clone());
        if !held {
            self.gateway.hold(id.clone(), self.clone(), own_task::KEPT);
        }
        self.settle_round(own.clone(), round);
        (id, own)
    }

    /// One round of a call, run apart from the request that began it: the
    /// call itself, or a retry with the agent's answers. `agent` is asked
    /// for input on the server's behalf when it is on a revision that is
    /// asked with requests of its own.
    #[allow(
        clippy::too_many_arguments,
        reason = "one call's parts, as the agent sent them"
    )]
    fn spawn_round(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<rmcp::model::JsonObject>,
        progress: Option<ProgressSender>,
        cancel: CancellationToken,
        traceparent: Option<String>,
        retry: Retry,
        takes: Takes,
        agent: Option<Peer<RoleServer>>,
    ) -> tokio::task::JoinHandle<Result<CallToolResponse, ErrorData>> {
        let (session, server, tool) = (self.clone(), server.to_owned(), tool.to_owned());
        tokio::spawn(async move {
            session
                .call_rounds(
                    &server,
                    &tool,
                    arguments,
                    progress,
                    cancel,
                    traceparent.as_deref(),
                    retry,
                    takes,
                    agent,
                )
                .await
        })
    }

    /// Records in `own` how `round` ends, when it does.
    fn settle_round(
        &self,
        own: Arc<OwnTask>,
        round: tokio::task::JoinHandle<Result<CallToolResponse, ErrorData>>,
    ) {
        // The parked calls, not the session: a round's end keeps nothing
        // alive.
        let parked = Arc::downgrade(&self.parked);
        let gateway = self.gateway.clone();
        tokio::spawn(async move {
            let Some(state) = own.settle(joined(round.await)) else {
                return;
            };
            // Cancelled while it was asking: nobody takes it up.
            drop(gateway.release(&state));
            let parked = parked
                .upgrade()
                .and_then(|all| all.lock().unwrap_or_else(|e| e.into_inner()).remove(&state));
            if let Some(parked) = parked {
                parked.abandon().await;
            }
        });
    }

    /// The task of Moat's the agent calls `id`, and the session it runs in
    /// (this one, or the one a stateless request left held under `id`).
    fn own_task(&self, id: &str) -> Option<(AgentSession, Arc<OwnTask>)> {
        let here = |session: &AgentSession| {
            let tasks = session.own_tasks.lock().unwrap_or_else(|e| e.into_inner());
            tasks.get(id).cloned()
        };
        if let Some(own) = here(self) {
            return Some((self.clone(), own));
        }
        let holder = self.gateway.held(id)?;
        here(&holder).map(|own| (holder, own))
    }

    /// Where `tasks/get`, `tasks/update` and `tasks/cancel` for `id` go: a
    /// task of Moat's, or a server's task in the session that knows it
    /// (a task of Moat's that the server's own task took over is the
    /// server's).
    fn resolve_task(&self, id: &str) -> TaskAt {
        match self.own_task(id) {
            Some((holder, own)) => match own.delegate() {
                Some(delegate) => TaskAt::Server(holder, delegate),
                None => TaskAt::Own(holder, own),
            },
            None => TaskAt::Server(self.clone(), id.to_owned()),
        }
    }

    /// Lets the session held for task `id` (over stateless HTTP) go a
    /// while after its agent has seen it end or cancelled it.
    fn release_task(&self, id: &str) {
        if self.gateway.held(id).is_some() {
            self.gateway.release_after(id.to_owned(), HELD_AFTER_END);
        }
    }

    /// Hands a task that `server` made of a call to `tool` on to the agent,
    /// under the id the agent will know it by.
    ///
    /// On a connection that ends with the request (`held` false: stateless
    /// HTTP), the task's id is a capability, `server__` and 128 random
    /// bits, and the session is kept for it (see [`Gateway::hold`]): a
    /// later request that names the id finds the task wherever it comes
    /// from, and nobody finds it without.
    fn issue_task(
        &self,
        server: &str,
        tool: &str,
        mut created: rmcp::model::CreateTaskResult,
        held: bool,
    ) -> rmcp::model::CreateTaskResult {
        let exposed = if held {
            format!("{server}{SEPARATOR}{}", created.task.task_id)
        } else {
            let kept = created.task.ttl_ms.map_or(HELD_TASK_TTL, |ms| {
                Duration::from_millis(ms).min(HELD_TASK_TTL)
            });
            let exposed = format!("{server}{SEPARATOR}{}", unguessable());
            self.gateway.hold(exposed.clone(), self.clone(), kept);
            exposed
        };
        let task_id = std::mem::replace(&mut created.task.task_id, exposed.clone());
        self.tasks.lock().unwrap_or_else(|e| e.into_inner()).insert(
            exposed,
            IssuedTask {
                server: server.to_owned(),
                tool: tool.to_owned(),
                task_id,
            },
        );
        created
    }

    /// The server, tool and server's id of the task the agent calls
    /// `exposed`, if a call of this session made it; and the server's child,
    /// unless what the lock or a revocation refuses.
    async fn task_child(&self, exposed: &str) -> Result<(Arc<Session>, String, String), ErrorData> {
        let own = {
            let tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
            tasks
                .get(exposed)
                .map(|task| (task.server.clone(), task.tool.clone(), task.task_id.clone()))
        };
        let Some((server, tool, task_id)) = own else {
            // A task handed out by a stateless request: its id is the key.
            if let Some(holder) = self.gateway.held(exposed) {
                return Box::pin(holder.task_child(exposed)).await;
            }
            return Err(ErrorData::invalid_params(
                format!("no task {exposed:?} in this session"),
                None,
            ));
        };
        if let Some(error) = self.generation.refusal(&server, Some(&tool), None) {
            return Err(to_error(error));
        }
        let child = self.child(&server).await.map_err(to_error)?;
        if let Some(error) = self.generation.refusal(&server, Some(&tool), Some(&child)) {
            return Err(to_error(error));
        }
        Ok((child, tool, task_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{LOCK_VERSION, Lock, LockedServer, LockedTool};

    #[test]
    fn exposed_names_are_checked_at_start_from_the_lock() {
        let tool = |name: &str| LockedTool {
            name: name.into(),
            sha256: String::new(),
            definition: String::new(),
            flags: vec![],
        };
        let server = |tools: Vec<LockedTool>| LockedServer {
            kind: "wasm".into(),
            evidence: "wasm-measured".into(),
            sha256: String::new(),
            identity: String::new(),
            measured: Default::default(),
            grants: Default::default(),
            tools,
            prompts: Default::default(),
            resources: Default::default(),
            package: None,
            oci: None,
        };
        let mut lock = Lock {
            version: LOCK_VERSION,
            revoked: Vec::new(),
            servers: Default::default(),
        };
        lock.servers.insert(
            "files".into(),
            server(vec![tool("read"), tool("write-all")]),
        );
        assert!(check_lock_names(&lock).is_empty());
        lock.servers
            .insert("web".into(), server(vec![tool("fetch url")]));
        match &check_lock_names(&lock)[..] {
            [
                GatewayError::InvalidName {
                    server,
                    tool,
                    exposed,
                    ..
                },
            ] => {
                assert_eq!((server.as_str(), tool.as_str()), ("web", "fetch url"));
                assert_eq!(exposed, "web__fetch url");
            }
            other => panic!("{other:?}"),
        }
        assert!(valid_exposed_name(&"a".repeat(64)));
        assert!(!valid_exposed_name(&"a".repeat(65)));
        lock.servers.remove("web");
        lock.servers.insert(
            "twice".into(),
            server(vec![tool("get"), tool("get"), tool("put")]),
        );
        match &check_lock_names(&lock)[..] {
            [error @ GatewayError::DuplicateName { .. }] => assert_eq!(
                error.to_string(),
                "server `twice` lists two tools named `get`: the exposed name `twice__get` would be ambiguous, so only the first is served"
            ),
            other => panic!("{other:?}"),
        }
        lock.servers.remove("twice");
        let mut prompted = server(vec![tool("get")]);
        prompted.prompts = vec![tool("hello world")];
        lock.servers.insert("greeter".into(), prompted);
        match &check_lock_names(&lock)[..] {
            [GatewayError::InvalidName { what, exposed, .. }] => {
                assert_eq!(
                    (*what, exposed.as_str()),
                    ("prompt", "greeter__hello world")
                )
            }
            other => panic!("{other:?}"),
        }
    }
}

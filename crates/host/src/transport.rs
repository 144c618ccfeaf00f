//! The one client transport: rmcp's `Transport<RoleClient>` over a launched
//! server, whichever launcher started it.
//!
//! This module owns everything between a server's stdio and rmcp's client:
//! connecting once, newline-delimited JSON-RPC framing with a maximum line
//! length (fail closed), draining stderr into tracing and a bounded rolling
//! buffer, the per-request deadline, faults on premature exit, and the
//! lifecycle (close = EOF on stdin, grace period, stop, await every task).
//! Launchers hand it a [`Launched`] and never see the protocol.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::model::{ClientJsonRpcMessage, RequestId, ServerJsonRpcMessage};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::instance::{Exit, Identity, Launched, Metrics, Tracker};
use crate::limits::{LimitHit, Limits};

/// A fault that ended a session with a server. The first fault wins.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    #[error("server `{server}` hit its {limit}")]
    Limit { server: String, limit: LimitHit },
    #[error(
        "server `{server}` exited with code {code} before closing; stderr tail: {stderr_tail:?}"
    )]
    Exited {
        server: String,
        code: i32,
        stderr_tail: String,
    },
    #[error("server `{server}` crashed: {reason}; stderr tail: {stderr_tail:?}")]
    Crashed {
        server: String,
        reason: String,
        stderr_tail: String,
    },
    #[error(
        "server `{server}` wrote a stdout line that is not a JSON-RPC message ({detail}): {excerpt:?}"
    )]
    NotJsonRpc {
        server: String,
        detail: String,
        excerpt: String,
    },
    #[error("server `{server}`: reading stdout failed: {detail}")]
    Io { server: String, detail: String },
    #[error(
        "server `{server}` answered request {id}, which was never sent or was already answered (fail closed)"
    )]
    UnknownResponse { server: String, id: String },
    #[error(
        "server `{server}` has more than {limit} requests to the client unanswered: it is not reading the answers (fail closed)"
    )]
    RequestFlood { server: String, limit: usize },
}

impl Fault {
    /// The fault in Moat's words only: without the stderr tail or the
    /// excerpt of a bad line, which the server chose (for the audit log).
    pub fn summary(&self) -> String {
        match self {
            Self::Exited { server, code, .. } => {
                format!("server `{server}` exited with code {code} before closing")
            }
            Self::Crashed { server, reason, .. } => format!("server `{server}` crashed: {reason}"),
            Self::NotJsonRpc { server, detail, .. } => {
                format!(
                    "server `{server}` wrote a stdout line that is not a JSON-RPC message ({detail})"
                )
            }
            other => other.to_string(),
        }
    }

    /// The text of the server's that explains the fault, if any.
    pub fn server_text(&self) -> Option<&str> {
        match self {
            Self::Exited { stderr_tail, .. } | Self::Crashed { stderr_tail, .. } => {
                Some(stderr_tail)
            }
            Self::NotJsonRpc { excerpt, .. } => Some(excerpt),
            _ => None,
        }
    }
}

/// Errors of the transport itself (not of the server).
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(
        "transport for server `{server}` is already connected: a transport connects at most once"
    )]
    AlreadyConnected { server: String },
    #[error("server `{server}` is no longer running: {fault}")]
    Faulted { server: String, fault: Fault },
    #[error("server `{server}`: the transport is closed")]
    Closed { server: String },
    #[error("server `{server}`: encoding a message failed: {detail}")]
    Encode { server: String, detail: String },
}

/// Bytes read from a server's stdout or stderr at a time. Each session holds
/// one such buffer per stream for its whole life, idle or not (the buffers
/// are zeroed, so resident), so they are kept small: a longer line is
/// gathered across reads, up to `max_line_bytes`.
const STDIO_CHUNK_BYTES: usize = 4096;

/// A bounded rolling buffer of a server's stderr, with a byte count.
#[derive(Debug)]
pub struct StderrBuffer {
    capacity: usize,
    inner: Mutex<(VecDeque<u8>, u64)>,
}

impl StderrBuffer {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            // Grown as stderr arrives: most servers write little or
            // nothing, and an idle session should not hold the capacity.
            inner: Mutex::new((VecDeque::new(), 0)),
        }
    }

    fn push(&self, bytes: &[u8]) {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (buffer, total) = &mut *guard;
        *total += bytes.len() as u64;
        let keep = bytes.len().min(self.capacity);
        let bytes = &bytes[bytes.len() - keep..];
        let overflow = (buffer.len() + bytes.len()).saturating_sub(self.capacity);
        buffer.drain(..overflow);
        buffer.extend(bytes);
    }

    /// Bytes currently held (never more than the capacity).
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).0.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The configured capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Every byte the server has written to stderr.
    pub fn total_bytes(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    /// The last lines of stderr, sanitised for display: escape sequences and
    /// control characters removed, at most `max` bytes.
    pub fn tail(&self, max: usize) -> String {
        let bytes: Vec<u8> = {
            let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            guard.0.iter().copied().collect()
        };
        sanitize_tail(&bytes, max)
    }
}

/// Bytes of stderr carried in a fault.
const FAULT_TAIL_BYTES: usize = 2048;

/// How long a fault for an exit waits for the stderr reader to finish: its
/// pipe closes with the server, unless something the server started holds it.
const STDERR_SETTLE: Duration = Duration::from_millis(250);

/// Strips ANSI escape sequences and control characters (keeping newlines and
/// tabs), trims, and keeps at most the last `max` bytes on a char boundary.
pub fn sanitize_tail(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte; other escapes: ESC + one char.
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else if c == '\n' || c == '\t' || !c.is_control() {
            out.push(c);
        }
    }
    let trimmed = out.trim();
    if trimmed.len() <= max {
        return trimmed.to_owned();
    }
    let mut start = trimmed.len() - max;
    while !trimmed.is_char_boundary(start) {
        start += 1;
    }
    trimmed[start..].to_owned()
}

/// State shared by the transport, its tasks and the client that wraps it.
#[derive(Debug)]
pub struct Shared {
    server: String,
    fault: Mutex<Option<Fault>>,
    closing: AtomicBool,
    stderr: StderrBuffer,
    tracker: Arc<Tracker>,
    /// Requests sent and not yet answered: the method, and the deadline by
    /// which the server must answer (none for a `subscriptions/listen` that
    /// the server acknowledged: its answer ends the stream, whenever).
    pending: Mutex<HashMap<RequestId, (String, Option<Instant>)>>,
    /// Requests the host cancelled recently: a late answer to one of them is
    /// dropped, not a fault. Bounded to the last [`CANCELLED_REMEMBERED`].
    cancelled: Mutex<std::collections::VecDeque<RequestId>>,
    /// Requests from the server read but not yet answered on its stdin.
    server_requests: AtomicUsize,
    /// The server's own requests that wait for an agent's answer (a person
    /// may be typing it): while one does, the server's deadlines stand
    /// still, and they resume pushed back by the wait when it ends.
    asking: AtomicUsize,
    pending_changed: Notify,
    requests_sent: AtomicU64,
    identity: std::sync::OnceLock<Identity>,
    metrics: std::sync::OnceLock<Arc<Metrics>>,
    tools_changed: AtomicBool,
    tools_changed_events: watch::Sender<u64>,
    progress_routes: Mutex<HashMap<rmcp::model::ProgressToken, ProgressSender>>,
    /// Set once the stderr reader has read everything (or given up).
    stderr_drained: watch::Sender<bool>,
}

/// How many cancelled request ids a transport remembers, so that a late
/// answer to one is dropped rather than treated as an answer to nothing.
const CANCELLED_REMEMBERED: usize = 1024;

/// How many of its own requests a server may leave unanswered on its stdin
/// (each answer waits in the host until the server reads it). A server that
/// asks more without reading is flooding the host: the session ends.
pub const MAX_UNANSWERED_SERVER_REQUESTS: usize = 256;

/// Where one call's progress notifications go.
pub type ProgressSender = mpsc::UnboundedSender<rmcp::model::ProgressNotificationParam>;

impl Shared {
    pub(crate) fn new(server: String, limits: &Limits) -> Self {
        Self {
            server,
            fault: Mutex::new(None),
            closing: AtomicBool::new(false),
            stderr: StderrBuffer::new(
                usize::try_from(limits.stderr_buffer_bytes).unwrap_or(usize::MAX),
            ),
            tracker: Arc::new(Tracker::default()),
            pending: Mutex::new(HashMap::new()),
            cancelled: Mutex::default(),
            server_requests: AtomicUsize::new(0),
            asking: AtomicUsize::new(0),
            pending_changed: Notify::new(),
            requests_sent: AtomicU64::new(0),
            identity: std::sync::OnceLock::new(),
            metrics: std::sync::OnceLock::new(),
            tools_changed: AtomicBool::new(false),
            tools_changed_events: watch::Sender::new(0),
            progress_routes: Mutex::new(HashMap::new()),
            stderr_drained: watch::Sender::new(false),
        }
    }

    /// Marks one of the server's own requests (`elicitation/create`,
    /// `sampling/createMessage`) as waiting for the agent until the guard
    /// drops. The per-request deadline bounds the server's work, not the
    /// agent's (or its user's) time to answer: while any such request
    /// waits, no deadline of this server passes, and when it is answered
    /// every pending deadline moves back by the time it waited. The wait
    /// itself is bounded by whoever holds the guard.
    pub fn asking_agent(self: &Arc<Self>) -> AskingAgent {
        self.asking.fetch_add(1, Ordering::SeqCst);
        self.pending_changed.notify_one();
        AskingAgent {
            shared: self.clone(),
            since: Instant::now(),
        }
    }

    /// The server's configured name.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// What was measured about the server, once launched.
    pub fn identity(&self) -> Option<Identity> {
        self.identity.get().cloned()
    }

    /// Whether the server announced `notifications/tools/list_changed`
    /// since the last call; clears the flag. Set by the stdout reader before
    /// any later message is delivered, so a response that follows the
    /// notification never races it.
    pub fn take_tools_changed(&self) -> bool {
        self.tools_changed.swap(false, Ordering::SeqCst)
    }

    /// Counts each `notifications/tools/list_changed` from the server, for
    /// whoever must pass the news on (after re-checking the pins). Ends when
    /// the transport is gone.
    pub fn tools_changed_events(&self) -> watch::Receiver<u64> {
        self.tools_changed_events.subscribe()
    }

    /// Sends progress for `token` to `sender` until [`Shared::unroute`]:
    /// delivered by the stdout reader in order, before the response that
    /// follows, and not passed on to rmcp.
    pub fn route_progress(&self, token: rmcp::model::ProgressToken, sender: ProgressSender) {
        self.progress_routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token, sender);
    }

    /// Stops routing progress for `token`.
    pub fn unroute(&self, token: &rmcp::model::ProgressToken) {
        self.progress_routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(token);
    }

    /// The launcher's counters (zero before launch).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.get().cloned().unwrap_or_default()
    }

    /// The fault that ended the session, once every task of the transport
    /// has ended (waiting at most `bound`): a send that failed because the
    /// server exited can come before the exit is known.
    pub async fn settled_fault(&self, bound: Duration) -> Option<Fault> {
        let _ = tokio::time::timeout(bound, self.tracker.wait_idle()).await;
        self.fault()
    }

    /// The fault that ended the session, if one did.
    pub fn fault(&self) -> Option<Fault> {
        self.fault.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The server's stderr buffer.
    pub fn stderr(&self) -> &StderrBuffer {
        &self.stderr
    }

    /// Tasks and instances of this transport.
    pub fn tracker(&self) -> &Arc<Tracker> {
        &self.tracker
    }

    /// Requests sent so far.
    pub fn requests_sent(&self) -> u64 {
        self.requests_sent.load(Ordering::SeqCst)
    }

    fn set_fault(&self, fault: Fault) {
        let mut slot = self.fault.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            tracing::warn!(server = %self.server, %fault, "server fault");
            *slot = Some(fault);
        }
    }

    fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// The fault an exit amounts to, built once the stderr reader has read
    /// what the server wrote before it went (at most [`STDERR_SETTLE`]
    /// later), so the fault's stderr tail is whole.
    async fn exit_fault(&self, exit: &Exit) -> Option<Fault> {
        if matches!(exit, Exit::Code(_) | Exit::Crashed(_)) {
            let mut drained = self.stderr_drained.subscribe();
            let _ = tokio::time::timeout(STDERR_SETTLE, drained.wait_for(|d| *d)).await;
        }
        self.fault_for_exit(exit)
    }

    fn fault_for_exit(&self, exit: &Exit) -> Option<Fault> {
        let server = self.server.clone();
        match exit {
            Exit::Stopped => None,
            Exit::Code(0) if self.is_closing() => None,
            Exit::Code(code) => Some(Fault::Exited {
                server,
                code: *code,
                stderr_tail: self.stderr.tail(FAULT_TAIL_BYTES),
            }),
            Exit::Limit(limit) => Some(Fault::Limit {
                server,
                limit: limit.clone(),
            }),
            Exit::Crashed(reason) => Some(Fault::Crashed {
                server,
                reason: reason.clone(),
                stderr_tail: self.stderr.tail(FAULT_TAIL_BYTES),
            }),
        }
    }
}

type BoxFuture<E> = Pin<Box<dyn Future<Output = Result<Launched, E>> + Send>>;

/// The one client transport, before it is connected: built from a launch
/// request, it connects at most once. `E` is the launch's error type, which
/// the layer above defines; the transport adds only its own
/// [`TransportError`] to it.
pub struct ServerTransport<E> {
    shared: Arc<Shared>,
    limits: Limits,
    launch: Mutex<Option<BoxFuture<E>>>,
}

impl<E: From<TransportError>> ServerTransport<E> {
    /// A transport that will run the launch `make_launch` builds when
    /// connected. The launch registers what it starts with the tracker.
    pub fn new<F>(
        server: impl Into<String>,
        limits: Limits,
        make_launch: impl FnOnce(Arc<Tracker>) -> F,
    ) -> Self
    where
        F: Future<Output = Result<Launched, E>> + Send + 'static,
    {
        let shared = Arc::new(Shared::new(server.into(), &limits));
        let launch = make_launch(shared.tracker.clone());
        Self {
            shared,
            limits,
            launch: Mutex::new(Some(Box::pin(launch))),
        }
    }

    /// State shared with the connected transport (fault, stderr, tracker).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Launches the server and returns the connected transport. A second call
    /// fails with [`TransportError::AlreadyConnected`]; it never launches twice.
    /// Dropping the returned future part-way leaves nothing running.
    pub async fn connect(&self) -> Result<Connected, E> {
        let launch = self
            .launch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| TransportError::AlreadyConnected {
                server: self.shared.server.clone(),
            })?;
        let launched = launch.await?;
        Ok(Connected::start(
            self.shared.clone(),
            &self.limits,
            launched,
        ))
    }
}

/// A connected transport: what rmcp's client drives.
pub struct Connected {
    shared: Arc<Shared>,
    /// Boxed: a channel allocates its first block of 32 slots up front, and
    /// 32 unboxed messages are 12 KB held by every idle session.
    incoming: mpsc::Receiver<Box<ServerJsonRpcMessage>>,
    stdin: Arc<tokio::sync::Mutex<Option<Box<dyn AsyncWrite + Send + Unpin>>>>,
    on_request: Arc<dyn Fn() + Send + Sync>,
    terminate: Box<dyn Fn() + Send + Sync>,
    stop: Arc<dyn Fn() + Send + Sync>,
    server_task: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    /// The server's exit, for a drop that must still learn why it ended.
    exit: watch::Receiver<Option<Exit>>,
    grace: Duration,
    request_timeout: Duration,
}

impl Connected {
    fn start(shared: Arc<Shared>, limits: &Limits, launched: Launched) -> Self {
        let Launched {
            stdin,
            stdout,
            stderr,
            exit,
            task: server_task,
            terminate,
            stop,
            on_request,
            metrics,
            identity,
            answers_deadlines,
        } = launched;
        let _ = shared.identity.set(identity);
        let _ = shared.metrics.set(metrics);
        let stop: Arc<dyn Fn() + Send + Sync> = Arc::from(stop);
        let (incoming_tx, incoming) = mpsc::channel(64);
        let max_line = usize::try_from(limits.max_line_bytes).unwrap_or(usize::MAX);
        let tracker = shared.tracker.clone();
        let exit_for_drop = exit.clone();
        // In this order: Drop relies on it.
        let tasks = vec![
            spawn_tracked(
                &tracker,
                read_stdout(
                    shared.clone(),
                    stdout,
                    max_line,
                    exit.clone(),
                    incoming_tx,
                    stop.clone(),
                ),
            ),
            spawn_tracked(&tracker, drain_stderr(shared.clone(), stderr)),
            spawn_tracked(
                &tracker,
                watchdog(
                    shared.clone(),
                    limits.request_timeout_ms,
                    exit,
                    stop.clone(),
                ),
            ),
        ];
        Self {
            shared,
            incoming,
            stdin: Arc::new(tokio::sync::Mutex::new(Some(stdin))),
            on_request: Arc::from(on_request),
            terminate,
            stop,
            server_task: Some(server_task),
            tasks,
            exit: exit_for_drop,
            grace: limits.close_grace(),
            // A server that answers its own deadlines gets a grace period
            // more before the transport stops it.
            request_timeout: if answers_deadlines {
                limits.request_timeout() + limits.close_grace()
            } else {
                limits.request_timeout()
            },
        }
    }

    /// State shared with the transport's tasks (fault, stderr, tracker).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Closes within twice the grace period: EOF on stdin and the grace
    /// period; then terminate and three quarters of it; then kill, and the
    /// rest of the second period for the server to be gone and its pipes to
    /// drain. Nothing is waited for past that: a pipe still held open by
    /// something the server started is dropped, never waited on.
    async fn shutdown(&mut self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        let start = Instant::now();
        let deadline = start + self.grace * 2;
        // EOF on the server's stdin.
        if let Some(mut stdin) = self.stdin.lock().await.take() {
            let _ = stdin.shutdown().await;
        }
        if let Some(mut server_task) = self.server_task.take() {
            let mut done = tokio::time::timeout_at(start + self.grace, &mut server_task)
                .await
                .is_ok();
            if !done {
                tracing::debug!(server = %self.shared.server, "grace period over; terminating server");
                (self.terminate)();
                done = tokio::time::timeout_at(deadline - self.grace / 4, &mut server_task)
                    .await
                    .is_ok();
            }
            if !done {
                tracing::debug!(server = %self.shared.server, "still running; killing server");
                (self.stop)();
                done = tokio::time::timeout_at(deadline, &mut server_task)
                    .await
                    .is_ok();
            }
            if !done {
                tracing::warn!(server = %self.shared.server, "server did not stop; abandoning its task");
                server_task.abort();
                let _ = server_task.await;
            }
        }
        // The server is gone. Its pipes close with it, unless something it
        // started still holds them (possible only without a PID namespace):
        // drain them until the deadline, then drop them.
        for mut task in self.tasks.drain(..) {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                tracing::debug!(server = %self.shared.server, "a pipe is still held open after the server stopped; dropping it");
                task.abort();
                let _ = task.await;
            }
        }
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        // Dropped without close (a cancelled or failed handshake): stop the
        // server at once, then, off this thread, learn how it ended (a
        // server that exited on its own gets its fault, with its stderr,
        // for whoever reports the failure), bounded by the grace period.
        let Some(server_task) = self.server_task.take() else {
            return;
        };
        (self.stop)();
        let mut tasks = std::mem::take(&mut self.tasks).into_iter();
        let (stdout_reader, stderr_drain, others) = (tasks.next(), tasks.next(), tasks);
        if let Some(task) = &stdout_reader {
            task.abort();
        }
        for task in others {
            task.abort();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            server_task.abort();
            if let Some(task) = stderr_drain {
                task.abort();
            }
            return;
        };
        let shared = self.shared.clone();
        let mut exit = self.exit.clone();
        let grace = self.grace;
        let guard = shared.tracker.enter();
        runtime.spawn(async move {
            let _guard = guard;
            let status = tokio::time::timeout(grace, exit.wait_for(Option::is_some))
                .await
                .ok()
                .and_then(|s| s.ok().and_then(|s| s.clone()));
            if let Some(status) = &status
                && let Some(fault) = shared.exit_fault(status).await
            {
                shared.set_fault(fault);
            }
            let mut server_task = server_task;
            if tokio::time::timeout(grace, &mut server_task).await.is_err() {
                server_task.abort();
            }
            if let Some(mut task) = stderr_drain
                && tokio::time::timeout(grace, &mut task).await.is_err()
            {
                task.abort();
            }
        });
    }
}

fn spawn_tracked(
    tracker: &Arc<Tracker>,
    task: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    let guard = tracker.enter();
    tokio::spawn(async move {
        let _guard = guard;
        task.await;
    })
}

impl rmcp::transport::Transport<RoleClient> for Connected {
    type Error = TransportError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let shared = self.shared.clone();
        let stdin = self.stdin.clone();
        let encoded = serde_json::to_vec(&item);
        let answers_server = matches!(
            item,
            ClientJsonRpcMessage::Response(_) | ClientJsonRpcMessage::Error(_)
        );
        match &item {
            ClientJsonRpcMessage::Request(request) => {
                let method = request.request.method().to_owned();
                let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
                if method
                    == <rmcp::model::InitializeResultMethod as rmcp::model::ConstString>::VALUE
                {
                    // rmcp falls back to `initialize` when `server/discover`
                    // goes unanswered too long: a late answer to discover is
                    // then an answer to nothing, and must not be read as
                    // initialize's.
                    let given_up: Vec<RequestId> = pending
                        .iter()
                        .filter(|(_, (method, _))| {
                            method
                                == <rmcp::model::DiscoverRequestMethod as rmcp::model::ConstString>::VALUE
                        })
                        .map(|(id, _)| id.clone())
                        .collect();
                    for id in given_up {
                        forget_pending(&shared, &mut pending, &id);
                    }
                }
                pending.insert(
                    request.id.clone(),
                    (method, Some(Instant::now() + self.request_timeout)),
                );
                drop(pending);
                shared.requests_sent.fetch_add(1, Ordering::SeqCst);
                shared.pending_changed.notify_one();
                (self.on_request)();
            }
            ClientJsonRpcMessage::Notification(notification) => {
                if let rmcp::model::ClientNotification::CancelledNotification(cancelled) =
                    &notification.notification
                    && let Some(id) = &cancelled.params.request_id
                {
                    // The pending lock is held until the id is remembered as
                    // cancelled: the stdout reader, which checks both under
                    // the same lock, never sees it in neither.
                    let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
                    forget_pending(&shared, &mut pending, id);
                    drop(pending);
                }
            }
            _ => {}
        }
        async move {
            let mut line = encoded.map_err(|error| TransportError::Encode {
                server: shared.server.clone(),
                detail: error.to_string(),
            })?;
            line.push(b'\n');
            let closed = || match shared.fault() {
                Some(fault) => TransportError::Faulted {
                    server: shared.server.clone(),
                    fault,
                },
                None => TransportError::Closed {
                    server: shared.server.clone(),
                },
            };
            // One message per lock: lines never interleave.
            let mut guard = stdin.lock().await;
            let writer = guard.as_mut().ok_or_else(closed)?;
            let written = async {
                writer.write_all(&line).await?;
                writer.flush().await
            }
            .await;
            if answers_server {
                let _ =
                    shared
                        .server_requests
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            }
            match written {
                Ok(()) => Ok(()),
                Err(error) => {
                    tracing::debug!(server = %shared.server, %error, "writing to server stdin failed");
                    Err(closed())
                }
            }
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        self.incoming.recv().await.map(|message| *message)
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.shutdown().await;
        Ok(())
    }
}

async fn drain_stderr(shared: Arc<Shared>, stderr: Box<dyn AsyncRead + Send + Unpin>) {
    /// Longest stderr line echoed to the log; the buffer keeps the rest.
    const LOG_LINE_BYTES: usize = 1024;
    let mut stderr = stderr;
    let mut chunk = vec![0u8; STDIO_CHUNK_BYTES];
    let mut partial: Vec<u8> = Vec::new();
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        shared.stderr.push(&chunk[..n]);
        for &byte in &chunk[..n] {
            if byte == b'\n' {
                tracing::debug!(server = %shared.server, line = %sanitize_tail(&partial, LOG_LINE_BYTES), "stderr");
                partial.clear();
            } else if partial.len() < LOG_LINE_BYTES {
                partial.push(byte);
            }
        }
    }
    if !partial.is_empty() {
        tracing::debug!(server = %shared.server, line = %sanitize_tail(&partial, LOG_LINE_BYTES), "stderr");
    }
    shared.stderr_drained.send_replace(true);
}

/// Reads newline-delimited JSON-RPC from stdout. A line longer than
/// `max_line` or one that is not a JSON-RPC message is fatal: the server is
/// stopped and nothing more is read.
async fn read_stdout(
    shared: Arc<Shared>,
    stdout: Box<dyn AsyncRead + Send + Unpin>,
    max_line: usize,
    mut exit: watch::Receiver<Option<Exit>>,
    incoming: mpsc::Sender<Box<ServerJsonRpcMessage>>,
    stop: Arc<dyn Fn() + Send + Sync>,
) {
    let mut reader = BufReader::with_capacity(STDIO_CHUNK_BYTES, stdout);
    let mut line: Vec<u8> = Vec::new();
    let fault = loop {
        let buf = match reader.fill_buf().await {
            Ok(buf) => buf,
            Err(error) => {
                break Some(Fault::Io {
                    server: shared.server.clone(),
                    detail: error.to_string(),
                });
            }
        };
        if buf.is_empty() {
            // EOF: the server closed stdout. Its exit status says why.
            break None;
        }
        let (taken, complete) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let content = if complete { taken - 1 } else { taken };
        if line.len() + content > max_line {
            break Some(Fault::Limit {
                server: shared.server.clone(),
                limit: LimitHit::LineLength {
                    max_line_bytes: max_line as u64,
                },
            });
        }
        line.extend_from_slice(&buf[..content]);
        reader.consume(taken);
        if !complete {
            continue;
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        match parse_message(&shared, &line) {
            Ok(message) => {
                if let ServerJsonRpcMessage::Notification(notification) = &message
                    && matches!(
                        notification.notification,
                        rmcp::model::ServerNotification::ToolListChangedNotification(_)
                    )
                {
                    shared.tools_changed.store(true, Ordering::SeqCst);
                    shared.tools_changed_events.send_modify(|n| *n += 1);
                }
                if let ServerJsonRpcMessage::Notification(notification) = &message
                    && let rmcp::model::ServerNotification::SubscriptionsAcknowledgedNotification(_) =
                        &notification.notification
                {
                    use rmcp::model::GetMeta;
                    lift_deadline(
                        &shared,
                        notification.notification.get_meta().subscription_id(),
                    );
                }
                if let ServerJsonRpcMessage::Notification(notification) = &message
                    && let rmcp::model::ServerNotification::ProgressNotification(progress) =
                        &notification.notification
                {
                    let route = shared
                        .progress_routes
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&progress.params.progress_token)
                        .cloned();
                    if let Some(route) = route {
                        let _ = route.send(progress.params.clone());
                        line.clear();
                        continue;
                    }
                }
                if matches!(message, ServerJsonRpcMessage::Request(_))
                    && shared.server_requests.fetch_add(1, Ordering::SeqCst)
                        >= MAX_UNANSWERED_SERVER_REQUESTS
                {
                    break Some(Fault::RequestFlood {
                        server: shared.server.clone(),
                        limit: MAX_UNANSWERED_SERVER_REQUESTS,
                    });
                }
                if let Some(id) = response_id(&message) {
                    // Pending and cancelled are read under the pending lock,
                    // which a cancellation holds while it moves an id from
                    // one to the other.
                    let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
                    let answered = pending.remove(&id).is_some();
                    let late = !answered && {
                        let mut recent = shared.cancelled.lock().unwrap_or_else(|e| e.into_inner());
                        recent
                            .iter()
                            .position(|c| *c == id)
                            .map(|at| recent.remove(at))
                            .is_some()
                    };
                    drop(pending);
                    if late {
                        // A late answer to a cancelled request: dropped.
                        line.clear();
                        continue;
                    }
                    if !answered {
                        // An answer to nothing, or a second answer: the
                        // stream can no longer be trusted.
                        break Some(Fault::UnknownResponse {
                            server: shared.server.clone(),
                            id: id.to_string(),
                        });
                    }
                }
                if incoming.send(Box::new(message)).await.is_err() {
                    return; // the client is gone
                }
            }
            Err(detail) => {
                break Some(Fault::NotJsonRpc {
                    server: shared.server.clone(),
                    detail,
                    excerpt: sanitize_tail(&line[..line.len().min(200)], 200),
                });
            }
        }
        line.clear();
    };
    match fault {
        Some(fault) => {
            shared.set_fault(fault);
            stop();
        }
        None => {
            // Wait for the exit status so the fault is known before rmcp sees
            // the transport close.
            let status = exit
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|s| s.clone());
            if let Some(status) = &status
                && let Some(fault) = shared.exit_fault(status).await
            {
                shared.set_fault(fault);
            }
        }
    }
    // Dropping `incoming` tells rmcp the transport is closed.
}

fn parse_message(shared: &Shared, line: &[u8]) -> Result<ServerJsonRpcMessage, String> {
    if line.is_empty() {
        return Err("empty line".to_owned());
    }
    if let Some(answer) = call_answer(shared, line) {
        return Ok(answer);
    }
    let message =
        serde_json::from_slice::<ServerJsonRpcMessage>(line).map_err(|error| error.to_string())?;
    Ok(draft_discover(&message, line).unwrap_or(message))
}

/// A `server/discover` answer in the shape of a draft of the 2026-07-28
/// revision (no `ttlMs`, no `cacheScope`: Google's MCP Toolbox 1.12 answers
/// so, and speaks nothing else), read as a discover result that may not be
/// cached (`ttlMs` 0, `cacheScope` private). `None` for anything else; only
/// a line that did not decode as a known result gets here.
fn draft_discover(decoded: &ServerJsonRpcMessage, line: &[u8]) -> Option<ServerJsonRpcMessage> {
    use rmcp::model::{JsonRpcMessage, ServerResult};
    // Only what rmcp could not read as any known result is looked at again.
    let JsonRpcMessage::Response(response) = decoded else {
        return None;
    };
    let ServerResult::CustomResult(_) = &response.result else {
        return None;
    };
    let mut value: serde_json::Value = serde_json::from_slice(line).ok()?;
    let result = value.get_mut("result")?.as_object_mut()?;
    if !(result.contains_key("supportedVersions") && result.contains_key("capabilities")) {
        return None;
    }
    result.entry("ttlMs").or_insert(serde_json::json!(0));
    result
        .entry("cacheScope")
        .or_insert(serde_json::json!("private"));
    let patched = serde_json::from_value::<ServerJsonRpcMessage>(value).ok()?;
    match &patched {
        JsonRpcMessage::Response(response)
            if matches!(response.result, ServerResult::DiscoverResult(_)) =>
        {
            Some(patched)
        }
        _ => None,
    }
}

/// The answer to a pending `tools/call`, decoded as what it answers.
///
/// rmcp decodes a server's message as an untagged union: the line is
/// buffered whole, then tried as a request, then as each of twenty result
/// types in turn, and every miss builds an error message; a call's result
/// is the sixteenth. That was a sixth of the host's instructions per
/// forwarded call. The transport knows what each pending id asked, so the
/// answer to a call is decoded as a `CallToolResult` at once, under the same
/// shape rule (a `result`, and neither `method` nor `error`, whatever their
/// values). Anything else takes rmcp's path: every other message, an answer
/// to another request, and a result that is not a call's (a task, a request
/// for input), so nothing is accepted that rmcp would refuse.
fn call_answer(shared: &Shared, line: &[u8]) -> Option<ServerJsonRpcMessage> {
    /// Whether a key is present at all (`"error": null` counts).
    fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
        serde::de::IgnoredAny::deserialize(deserializer).map(|_| true)
    }
    #[derive(serde::Deserialize)]
    struct CallAnswer {
        jsonrpc: rmcp::model::JsonRpcVersion2_0,
        id: RequestId,
        result: rmcp::model::CallToolResult,
        #[serde(default, deserialize_with = "present")]
        method: bool,
        #[serde(default, deserialize_with = "present")]
        error: bool,
    }
    use serde::Deserialize;
    let answer: CallAnswer = serde_json::from_slice(line).ok()?;
    if answer.method || answer.error {
        return None;
    }
    let asked_a_call = shared
        .pending
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&answer.id)
        .is_some_and(|(method, _)| {
            method == <rmcp::model::CallToolRequestMethod as rmcp::model::ConstString>::VALUE
        });
    asked_a_call.then(|| {
        ServerJsonRpcMessage::Response(rmcp::model::JsonRpcResponse {
            jsonrpc: answer.jsonrpc,
            id: answer.id,
            result: rmcp::model::ServerResult::CallToolResult(answer.result),
        })
    })
}

/// Moves request `id` from `pending` to the recently cancelled, whose late
/// answers are dropped. The caller holds the pending lock throughout, so
/// the stdout reader, which checks both under it, never sees the id in
/// neither.
fn forget_pending(
    shared: &Shared,
    pending: &mut HashMap<RequestId, (String, Option<Instant>)>,
    id: &RequestId,
) {
    if pending.remove(id).is_some() {
        let mut recent = shared.cancelled.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() == CANCELLED_REMEMBERED {
            recent.pop_front();
        }
        recent.push_back(id.clone());
    }
}

/// One of the server's requests waiting for the agent; see
/// [`Shared::asking_agent`].
#[derive(Debug)]
pub struct AskingAgent {
    shared: Arc<Shared>,
    since: Instant,
}

impl Drop for AskingAgent {
    fn drop(&mut self) {
        let waited = self.since.elapsed();
        {
            let mut pending = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for (_, deadline) in pending.values_mut() {
                if let Some(deadline) = deadline {
                    *deadline += waited;
                }
            }
        }
        self.shared.asking.fetch_sub(1, Ordering::SeqCst);
        self.shared.pending_changed.notify_one();
    }
}

/// A `subscriptions/listen` request stays open until either side ends it:
/// once the server acknowledges it (the acknowledgement names the request
/// `id` in its `_meta`), the per-request deadline no longer applies to it.
/// Only to a pending listen request: an acknowledgement that names any
/// other request changes nothing.
fn lift_deadline(shared: &Shared, id: Option<RequestId>) {
    let Some(id) = id else {
        return;
    };
    let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((method, deadline)) = pending.get_mut(&id)
        && method
            == <rmcp::model::SubscriptionsListenRequestMethod as rmcp::model::ConstString>::VALUE
    {
        *deadline = None;
        shared.pending_changed.notify_one();
    }
}

fn response_id(message: &ServerJsonRpcMessage) -> Option<RequestId> {
    match message {
        ServerJsonRpcMessage::Response(response) => Some(response.id.clone()),
        ServerJsonRpcMessage::Error(error) => error.id.clone(),
        _ => None,
    }
}

/// Enforces the per-request deadline, and records a fault when the server
/// stops on its own while requests are outstanding.
async fn watchdog(
    shared: Arc<Shared>,
    request_timeout_ms: u64,
    mut exit: watch::Receiver<Option<Exit>>,
    stop: Arc<dyn Fn() + Send + Sync>,
) {
    let status = loop {
        // Registered before the state is read: a change after the read
        // wakes this loop.
        let changed = shared.pending_changed.notified();
        let next = if shared.asking.load(Ordering::SeqCst) > 0 {
            None
        } else {
            let pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.values().filter_map(|(_, deadline)| *deadline).min()
        };
        tokio::select! {
            _ = async {
                match next {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            } => {
                let expired = if shared.asking.load(Ordering::SeqCst) > 0 {
                    None
                } else {
                    let pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
                    let now = Instant::now();
                    pending.values().find(|(_, deadline)| deadline.is_some_and(|d| d <= now)).map(|(method, _)| method.clone())
                };
                if let Some(method) = expired {
                    tracing::warn!(server = %shared.server, %method, "request deadline passed; stopping server");
                    shared.set_fault(Fault::Limit {
                        server: shared.server.clone(),
                        limit: LimitHit::Deadline { request_timeout_ms },
                    });
                    stop();
                    return;
                }
            }
            _ = changed => {}
            result = exit.wait_for(Option::is_some) => {
                break result.ok().and_then(|s| s.clone());
            }
        }
    };
    if let Some(status) = &status
        && let Some(fault) = shared.exit_fault(status).await
    {
        shared.set_fault(fault);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_draft_discover_answer_is_read_as_one_that_may_not_be_cached() {
        use rmcp::model::{CacheScope, JsonRpcMessage, ServerResult};
        let line = br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","supportedVersions":["2025-11-25","2026-07-28"],"capabilities":{"tools":{}},"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"Toolbox","version":"1.12.0"}}}}"#;
        let decoded = serde_json::from_slice::<ServerJsonRpcMessage>(line).unwrap();
        let patched = draft_discover(&decoded, line).expect("read as a discover result");
        let JsonRpcMessage::Response(response) = patched else {
            panic!("a response");
        };
        let ServerResult::DiscoverResult(result) = response.result else {
            panic!("a discover result: {:?}", response.result);
        };
        assert_eq!(
            (result.ttl_ms, result.cache_scope),
            (0, CacheScope::Private)
        );
        assert_eq!(result.supported_versions.len(), 2);
        // Any other result rmcp could not read is left as it is.
        let other =
            br#"{"jsonrpc":"2.0","id":2,"result":{"supportedVersions":"not a list","x":1}}"#;
        let decoded = serde_json::from_slice::<ServerJsonRpcMessage>(other).unwrap();
        assert!(draft_discover(&decoded, other).is_none());
    }

    use super::*;

    #[test]
    fn tail_strips_escapes_and_controls_and_bounds_length() {
        let raw = b"ok line\n\x1b[31mred\x1b[0m\x07 bell\x00\n";
        assert_eq!(sanitize_tail(raw, 100), "ok line\nred bell");
        assert_eq!(sanitize_tail(b"abcdef", 3), "def");
        assert_eq!(sanitize_tail("ééé".as_bytes(), 3), "é");
    }

    #[test]
    fn stderr_buffer_keeps_the_last_bytes_and_counts_all() {
        let buffer = StderrBuffer::new(8);
        buffer.push(b"0123456789");
        buffer.push(b"ab");
        assert_eq!(buffer.len(), 8);
        assert_eq!(buffer.total_bytes(), 12);
        assert_eq!(buffer.tail(100), "456789ab");
    }

    /// `shared` with request `id` pending as `method`.
    fn pending(method: &str) -> Shared {
        let shared = Shared::new("s".into(), &Limits::default());
        shared.pending.lock().unwrap().insert(
            RequestId::Number(7),
            (
                method.to_owned(),
                Some(Instant::now() + Duration::from_secs(60)),
            ),
        );
        shared
    }

    #[test]
    fn an_acknowledged_subscription_has_no_deadline_and_nothing_else_loses_one() {
        // As a server sends it: the listen request's id in `_meta`.
        let acknowledged = |shared: &Shared, id: i64| {
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{{"notifications":{{}},"_meta":{{"io.modelcontextprotocol/subscriptionId":{id}}}}}}}"#
            );
            let message = parse_message(shared, line.as_bytes()).unwrap();
            let ServerJsonRpcMessage::Notification(notification) = message else {
                panic!("{message:?}")
            };
            use rmcp::model::GetMeta;
            lift_deadline(
                shared,
                notification.notification.get_meta().subscription_id(),
            );
        };
        let deadline = |shared: &Shared| shared.pending.lock().unwrap()[&RequestId::Number(7)].1;
        let listening = pending("subscriptions/listen");
        acknowledged(&listening, 8);
        assert!(deadline(&listening).is_some(), "another id");
        acknowledged(&listening, 7);
        assert_eq!(deadline(&listening), None);
        // A server cannot lift a call's deadline by acknowledging its id.
        let calling = pending("tools/call");
        acknowledged(&calling, 7);
        assert!(deadline(&calling).is_some());
    }

    /// The deadline bounds the server's work, not the agent's time to
    /// answer the server's own request; and it is not lost either.
    #[tokio::test(start_paused = true)]
    async fn a_request_waiting_for_the_agent_holds_the_deadline_and_moves_it_back() {
        let shared = Arc::new(pending("tools/call"));
        let deadline = || {
            shared.pending.lock().unwrap()[&RequestId::Number(7)]
                .1
                .unwrap()
        };
        let first = deadline();
        let stopped = Arc::new(AtomicBool::new(false));
        let (_exit, exit) = watch::channel(None);
        let stop = stopped.clone();
        let watching = tokio::spawn(watchdog(
            shared.clone(),
            60_000,
            exit,
            Arc::new(move || stop.store(true, Ordering::SeqCst)),
        ));
        let settle = || async {
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
        };
        let asking = shared.asking_agent();
        settle().await;
        tokio::time::advance(Duration::from_secs(90)).await;
        settle().await;
        assert!(
            shared.fault().is_none(),
            "the deadline passed while the agent was asked"
        );
        assert!(!stopped.load(Ordering::SeqCst));
        drop(asking);
        assert_eq!(deadline(), first + Duration::from_secs(90));
        settle().await;
        tokio::time::advance(Duration::from_secs(59)).await;
        settle().await;
        assert!(shared.fault().is_none(), "fired before the moved deadline");
        tokio::time::advance(Duration::from_secs(2)).await;
        settle().await;
        assert!(
            stopped.load(Ordering::SeqCst),
            "the moved deadline never fired"
        );
        assert!(matches!(
            shared.fault(),
            Some(Fault::Limit {
                limit: LimitHit::Deadline {
                    request_timeout_ms: 60_000
                },
                ..
            })
        ));
        watching.await.unwrap();
    }

    fn result_of(message: &ServerJsonRpcMessage) -> &rmcp::model::ServerResult {
        match message {
            ServerJsonRpcMessage::Response(response) => &response.result,
            other => panic!("not a response: {other:?}"),
        }
    }

    #[test]
    fn a_calls_answer_is_decoded_as_a_call_result_and_nothing_else_is() {
        use rmcp::model::ServerResult;
        let call = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hi"}],"isError":false}}"#;
        // Taken at once when the pending id asked `tools/call`...
        let shared = pending("tools/call");
        let fast = call_answer(&shared, call).expect("the fast path takes a call's answer");
        let ServerResult::CallToolResult(result) = result_of(&fast) else {
            panic!("{fast:?}");
        };
        assert_eq!(result.is_error, Some(false));
        // ... and the same as rmcp's own decoding of it.
        let json = |m: &ServerJsonRpcMessage| serde_json::to_value(m).unwrap();
        assert_eq!(json(&parse_message(&shared, call).unwrap()), json(&fast));
        let general = serde_json::from_slice::<ServerJsonRpcMessage>(call).unwrap();
        assert!(matches!(
            result_of(&general),
            ServerResult::CallToolResult(_)
        ));
        assert_eq!(json(&general), json(&fast));
        // Not for an id that asked something else, nor one not pending.
        assert!(call_answer(&pending("tools/list"), call).is_none());
        let other = br#"{"jsonrpc":"2.0","id":8,"result":{"content":[]}}"#;
        assert!(call_answer(&shared, other).is_none());
        // A stray `error` or `method` beside the result, even null, is refused
        // as rmcp refuses it.
        for stray in [
            &br#"{"jsonrpc":"2.0","id":7,"result":{"content":[]},"error":null}"#[..],
            br#"{"jsonrpc":"2.0","id":7,"result":{"content":[]},"method":"x"}"#,
        ] {
            assert!(call_answer(&shared, stray).is_none());
            let refused = parse_message(&shared, stray).unwrap_err();
            assert!(
                refused.contains("unrecognized JSON-RPC message"),
                "{refused}"
            );
        }
        // A result that is not a call's (a task) takes rmcp's path.
        let task = br#"{"jsonrpc":"2.0","id":7,"result":{"task":{"taskId":"t","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttl":null}}}"#;
        assert!(call_answer(&shared, task).is_none());
        let decoded = parse_message(&shared, task).unwrap();
        assert!(
            !matches!(result_of(&decoded), ServerResult::CallToolResult(_)),
            "{decoded:?}"
        );
    }
}

//! The one client transport: rmcp's `Transport<RoleClient>` over a launched
//! server, whichever launcher started it.
//!
//! This module owns everything between a server's stdio and rmcp's client:
//! connecting once, newline-delimited JSON-RPC framing with a maximum line
//! length (fail closed), draining stderr into tracing and a bounded rolling
//! buffer, the per-request deadline, faults on premature exit, and the
//! lifecycle (close = EOF on stdin, grace period, stop, await every task).
//! Launchers hand it a [`Launched`] and never see the protocol.

mod book;
mod direct;
mod fault;
mod frame;
mod shared;
mod tap;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use book::{AskingAgent, Book, MAX_UNANSWERED_SERVER_REQUESTS};
pub use direct::Direct;
pub use fault::{Fault, TransportError};
pub use frame::{StderrBuffer, sanitize_tail};
pub use shared::Shared;
pub use tap::{Pass, Tap};

use crate::instance::{Exit, Launched, Tracker};
use crate::limits::{LimitHit, Limits};
use book::Answered;
use frame::{FrameError, Lines};

type BoxFuture<E> = Pin<Box<dyn Future<Output = Result<Launched, E>> + Send>>;

/// The server's stdin, shared by rmcp's sends and direct ones; `None` once
/// closed.
type Stdin = Arc<tokio::sync::Mutex<Option<Box<dyn AsyncWrite + Send + Unpin>>>>;

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

    /// Sets what sees each message from the server before rmcp (at most
    /// once, before connecting; a later tap is ignored).
    pub fn set_tap(&self, tap: Arc<dyn Tap>) {
        let _ = self.shared.tap.set(tap);
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
    stdin: Stdin,
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
            spawn_tracked(&tracker, {
                let shared = shared.clone();
                async move {
                    frame::drain_stderr(
                        &shared.server,
                        &shared.stderr,
                        stderr,
                        &shared.stderr_drained,
                    )
                    .await;
                }
            }),
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

    /// What sends requests past rmcp's client service (see [`Direct`]):
    /// taken before rmcp gets the transport.
    pub fn direct(&self) -> Direct {
        Direct {
            shared: self.shared.clone(),
            stdin: self.stdin.clone(),
            on_request: self.on_request.clone(),
            request_timeout: self.request_timeout,
        }
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
        let encoded = encode(&self.shared, &item);
        let answers_server = matches!(
            item,
            ClientJsonRpcMessage::Response(_) | ClientJsonRpcMessage::Error(_)
        );
        match &item {
            ClientJsonRpcMessage::Request(request) => {
                shared.book.sent(
                    request.id.clone(),
                    request.request.method().to_owned(),
                    Instant::now() + self.request_timeout,
                );
                (self.on_request)();
            }
            ClientJsonRpcMessage::Notification(notification) => {
                if let rmcp::model::ClientNotification::CancelledNotification(cancelled) =
                    &notification.notification
                    && let Some(id) = &cancelled.params.request_id
                {
                    shared.book.cancelled(id);
                }
            }
            _ => {}
        }
        async move {
            let written = write_line(&shared, &stdin, encoded?).await;
            if answers_server {
                shared.book.server_answered();
            }
            written
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

/// `message` as the line rmcp would write (without its newline).
fn encode(shared: &Shared, message: &ClientJsonRpcMessage) -> Result<Vec<u8>, TransportError> {
    serde_json::to_vec(message).map_err(|error| TransportError::Encode {
        server: shared.server.clone(),
        detail: error.to_string(),
    })
}

/// Writes `line` and its newline to the server's stdin, whole: one message
/// per lock, so lines never interleave. A closed stdin or a failed write is
/// the session's fault, if it has one, or else "closed".
async fn write_line(
    shared: &Shared,
    stdin: &Stdin,
    mut line: Vec<u8>,
) -> Result<(), TransportError> {
    line.push(b'\n');
    let mut guard = stdin.lock().await;
    let writer = guard.as_mut().ok_or_else(|| shared.closed())?;
    let written = async {
        writer.write_all(&line).await?;
        writer.flush().await
    }
    .await;
    written.map_err(|error| {
        tracing::debug!(server = %shared.server, %error, "writing to server stdin failed");
        shared.closed()
    })
}

/// Ends every direct request's wait when the stdout reader ends, however
/// it ends (aborted too), after any fault it found is set.
struct CloseDirect(Arc<Shared>);

impl Drop for CloseDirect {
    fn drop(&mut self) {
        self.0.direct.close();
    }
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
    let _close_direct = CloseDirect(shared.clone());
    let mut lines = Lines::new(stdout, max_line);
    let fault = loop {
        let line = match lines.next().await {
            Ok(Some(line)) => line,
            // EOF: the server closed stdout. Its exit status says why.
            Ok(None) => break None,
            Err(FrameError::Io(detail)) => {
                break Some(Fault::Io {
                    server: shared.server.clone(),
                    detail,
                });
            }
            Err(FrameError::TooLong) => {
                break Some(Fault::Limit {
                    server: shared.server.clone(),
                    limit: LimitHit::LineLength {
                        max_line_bytes: max_line as u64,
                    },
                });
            }
        };
        let message = match frame::decode(&shared.book, line) {
            Ok(message) => message,
            Err(detail) => {
                break Some(Fault::NotJsonRpc {
                    server: shared.server.clone(),
                    detail,
                    excerpt: sanitize_tail(&line[..line.len().min(200)], 200),
                });
            }
        };
        if let Some(tap) = shared.tap.get()
            && tap.on_message(&message, &shared.book) == Pass::Taken
        {
            continue;
        }
        if matches!(message, ServerJsonRpcMessage::Request(_)) && !shared.book.server_asked() {
            break Some(Fault::RequestFlood {
                server: shared.server.clone(),
                limit: MAX_UNANSWERED_SERVER_REQUESTS,
            });
        }
        if let Some(id) = frame::response_id(&message) {
            match shared.book.answer(&id) {
                Answered::Pending => {}
                // A late answer to a cancelled request: dropped.
                Answered::Late => continue,
                // An answer to nothing, or a second answer: the stream can
                // no longer be trusted.
                Answered::Unknown => {
                    break Some(Fault::UnknownResponse {
                        server: shared.server.clone(),
                        id: id.to_string(),
                    });
                }
            }
            // Sent past rmcp: answered past it too.
            if direct::Waiters::is_direct(&id) {
                shared.direct.answer(&id, Box::new(message));
                continue;
            }
        }
        if incoming.send(Box::new(message)).await.is_err() {
            return; // the client is gone
        }
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
        let changed = shared.book.changed();
        let next = shared.book.next_deadline();
        tokio::select! {
            _ = async {
                match next {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            } => {
                if let Some(method) = shared.book.expired() {
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

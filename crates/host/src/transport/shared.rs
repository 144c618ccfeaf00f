//! What the connection, its tasks and the session that wraps it share:
//! the server's name, its fault once it has one (built from an exit when
//! stderr has settled), the stderr buffer, the tracker, the book of
//! requests in flight, what was measured at launch, and the tap.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

use super::direct::Waiters;
use super::{AskingAgent, Book, Fault, StderrBuffer, Tap, TransportError};
use crate::instance::{Exit, Identity, Metrics, Tracker};
use crate::limits::Limits;

/// Bytes of stderr carried in a fault.
const FAULT_TAIL_BYTES: usize = 2048;

/// How long a fault for an exit waits for the stderr reader to finish: its
/// pipe closes with the server, unless something the server started holds it.
const STDERR_SETTLE: Duration = Duration::from_millis(250);

/// State shared by the transport, its tasks and the session that wraps it.
#[derive(Debug)]
pub struct Shared {
    pub(super) server: String,
    pub(super) fault: Mutex<Option<Fault>>,
    pub(super) closing: AtomicBool,
    pub(super) stderr: StderrBuffer,
    pub(super) tracker: Arc<Tracker>,
    /// Requests in flight, both ways.
    pub(super) book: Arc<Book>,
    pub(super) identity: OnceLock<Identity>,
    pub(super) metrics: OnceLock<Arc<Metrics>>,
    /// What sees each message before rmcp (set before connecting).
    pub(super) tap: OnceLock<Arc<dyn Tap>>,
    /// Set once the stderr reader has read everything (or given up).
    pub(super) stderr_drained: watch::Sender<bool>,
    /// Callers waiting for the answers to requests sent past rmcp.
    pub(super) direct: Waiters,
}

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
            book: Arc::default(),
            identity: OnceLock::new(),
            metrics: OnceLock::new(),
            tap: OnceLock::new(),
            stderr_drained: watch::Sender::new(false),
            direct: Waiters::default(),
        }
    }

    /// See [`Book::asking_agent`].
    pub fn asking_agent(&self) -> AskingAgent {
        self.book.asking_agent()
    }

    /// The server's configured name.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// What was measured about the server, once launched.
    pub fn identity(&self) -> Option<Identity> {
        self.identity.get().cloned()
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
        self.book.requests_sent()
    }

    /// See [`Book::quiet_since`].
    pub fn quiet_since(&self) -> Option<tokio::time::Instant> {
        self.book.quiet_since()
    }

    /// Why nothing more can be sent: the session's fault, or closed.
    pub(super) fn closed(&self) -> TransportError {
        match self.fault() {
            Some(fault) => TransportError::Faulted {
                server: self.server.clone(),
                fault,
            },
            None => TransportError::Closed {
                server: self.server.clone(),
            },
        }
    }

    pub(super) fn set_fault(&self, fault: Fault) {
        let mut slot = self.fault.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            tracing::warn!(server = %self.server, %fault, "server fault");
            *slot = Some(fault);
        }
    }

    pub(super) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// The fault an exit amounts to, built once the stderr reader has read
    /// what the server wrote before it went (at most [`STDERR_SETTLE`]
    /// later), so the fault's stderr tail is whole.
    pub(super) async fn exit_fault(&self, exit: &Exit) -> Option<Fault> {
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

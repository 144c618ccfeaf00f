//! Admission: the calls one session has admitted and not yet finished,
//! each tool call with a ticket naming what it calls, so close and a
//! revocation can drain them and cancel those that outlive the drain.
//! What is refused is the gate's to say; admission only counts, drains
//! and cancels.

use std::collections::BTreeMap;
use std::time::Duration;

use rmcp::model::ErrorData;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long cancelled calls get to end once the drain timeout has passed.
pub(super) const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// The calls of one session: admitted, counted, drained and cancelled.
pub(super) struct Admission {
    /// Set when close begins: no new calls are admitted.
    closing: CancellationToken,
    /// Set when the drain timeout passes: in-flight calls are cancelled.
    cancel_calls: CancellationToken,
    /// Calls admitted and not yet finished.
    in_flight: watch::Sender<usize>,
    /// The tool calls among them, each with what it calls: a revocation
    /// drains and cancels those it names.
    calls: std::sync::Mutex<Calls>,
}

/// The tool calls one session has admitted and not yet finished.
#[derive(Default)]
struct Calls {
    next: u64,
    open: BTreeMap<u64, Ticket>,
}

/// One admitted tool call: what it calls, and how to cancel it.
pub(super) struct Ticket {
    pub(super) server: String,
    pub(super) tool: String,
    pub(super) cancel: CancellationToken,
}

/// Counts one admitted call until dropped. A tool call's ticket goes
/// before the count, so whoever waits on the count sees it gone.
pub(super) struct InFlight<'s> {
    admission: &'s Admission,
    ticket: Option<u64>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket {
            self.admission.calls().open.remove(&ticket);
        }
        self.admission.in_flight.send_modify(|n| *n -= 1);
    }
}

/// What draining a session's calls to what was revoked did.
pub(super) struct Drained {
    /// Calls that ended within the drain timeout.
    pub(super) drained: usize,
    /// Calls cancelled when it passed.
    pub(super) cancelled: usize,
}

impl Admission {
    pub(super) fn new() -> Self {
        Admission {
            closing: CancellationToken::new(),
            cancel_calls: CancellationToken::new(),
            in_flight: watch::Sender::new(0),
            calls: std::sync::Mutex::default(),
        }
    }

    fn calls(&self) -> std::sync::MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits one call of session `session`, or refuses it when the
    /// session is closing. The count goes up before the check, so close
    /// never misses a call; a tool call's `ticket` is registered with it,
    /// so a revocation finds it.
    pub(super) fn admit(
        &self,
        session: &str,
        ticket: Option<Ticket>,
    ) -> Result<InFlight<'_>, ErrorData> {
        self.in_flight.send_modify(|n| *n += 1);
        let ticket = ticket.map(|ticket| {
            let mut calls = self.calls();
            calls.next += 1;
            let id = calls.next;
            calls.open.insert(id, ticket);
            id
        });
        let guard = InFlight {
            admission: self,
            ticket,
        };
        if self.closing.is_cancelled() {
            return Err(ErrorData::internal_error(
                format!("session {session} is closing: no new calls"),
                None,
            ));
        }
        Ok(guard)
    }

    /// A token that cancels one call: when the drain timeout of close
    /// passes, or when its own ticket is cancelled.
    pub(super) fn call_token(&self) -> CancellationToken {
        self.cancel_calls.child_token()
    }

    /// Set once close begins.
    pub(super) fn closing(&self) -> &CancellationToken {
        &self.closing
    }

    /// The tool calls admitted and not yet finished.
    pub(super) fn open_calls(&self) -> usize {
        self.calls().open.len()
    }

    /// Gives the tool calls that `refused` matches up to `drain` to end,
    /// then cancels those still running and waits [`CANCEL_GRACE`] more.
    pub(super) async fn drain_matching(
        &self,
        session: &str,
        drain: Duration,
        refused: impl Fn(&Ticket) -> bool,
    ) -> Drained {
        let running = || self.calls().open.values().filter(|t| refused(t)).count();
        let mut done = Drained {
            drained: 0,
            cancelled: 0,
        };
        let pending = running();
        if pending == 0 {
            return done;
        }
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
            tracing::warn!(%session, calls = cancel.len(), ?drain, "drain timeout: cancelling calls to what was revoked");
            done.cancelled = cancel.len();
            cancel.iter().for_each(CancellationToken::cancel);
            if tokio::time::timeout(CANCEL_GRACE, in_flight.wait_for(|_| running() == 0))
                .await
                .is_err()
            {
                tracing::error!(%session, calls = running(), "calls to what was revoked still running {CANCEL_GRACE:?} after cancellation");
            }
        }
        done.drained = pending.saturating_sub(done.cancelled);
        done
    }

    /// Closes admission: refuses new calls, lets in-flight calls finish for
    /// up to `drain`, cancels the rest and waits [`CANCEL_GRACE`] more.
    /// Returns how many calls outlived even their cancellation.
    pub(super) async fn close(&self, session: &str, drain: Duration) -> Option<usize> {
        self.closing.cancel();
        let mut in_flight = self.in_flight.subscribe();
        let drained = tokio::time::timeout(drain, in_flight.wait_for(|n| *n == 0))
            .await
            .is_ok();
        if drained {
            return None;
        }
        let left = *in_flight.borrow();
        tracing::warn!(%session, calls = left, ?drain, "drain timeout: cancelling in-flight calls");
        self.cancel_calls.cancel();
        if tokio::time::timeout(CANCEL_GRACE, in_flight.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            return Some(*in_flight.borrow());
        }
        None
    }
}

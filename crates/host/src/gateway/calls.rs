//! Admission: the calls one session has admitted and not yet finished,
//! each tool call with a ticket naming what it calls, so close and a
//! revocation can drain them and cancel those that outlive the drain.

use super::*;

/// The tool calls one session has admitted and not yet finished.
#[derive(Default)]
pub(super) struct Calls {
    pub(super) next: u64,
    pub(super) open: BTreeMap<u64, Ticket>,
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
    pub(super) session: &'s SessionState,
    pub(super) ticket: Option<u64>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket {
            self.session.calls().open.remove(&ticket);
        }
        self.session.in_flight.send_modify(|n| *n -= 1);
    }
}

/// How long cancelled calls get to end once the drain timeout has passed.
pub(super) const CANCEL_GRACE: Duration = Duration::from_secs(5);

impl SessionState {
    pub(super) fn calls(&self) -> std::sync::MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl AgentSession {
    /// Admits one call, or refuses it when the session is closing. The
    /// count goes up before the check, so close never misses a call; a tool
    /// call's `ticket` is registered with it, so a revocation finds it.
    pub(super) fn admit(&self, ticket: Option<Ticket>) -> Result<InFlight<'_>, ErrorData> {
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
}

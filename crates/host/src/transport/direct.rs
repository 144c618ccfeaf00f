//! Requests sent past rmcp's client service: the hot path of a call.
//!
//! rmcp's client runs a service task per server. A request goes to that
//! task over a channel, the task writes it, and the answer comes back
//! through it: from the stdout reader over the transport's channel into
//! the task, then over a oneshot to the caller. That is two task
//! hand-overs each way, and rmcp's service loop moves its messages and
//! futures by value at each. A `tools/call` needs none of it once the
//! handshake is done: the caller writes its line itself (booked with its
//! method and deadline, as every request is), and the stdout reader hands
//! the answer straight to the caller. Everything else (the handshake,
//! listings, the server's own requests, notifications, tasks) stays with
//! rmcp.
//!
//! The line is the one rmcp would write (the same `ClientJsonRpcMessage`,
//! encoded by the same serde code), and the answer is read by the same
//! codec under the same book: an answer to nothing or a second answer
//! still ends the session, and a cancelled request's late answer is still
//! dropped.
//!
//! Ids: rmcp numbers its requests one by one from 0; these are numbered
//! from 2^32 up, which rmcp's counter would reach only after four billion
//! requests on one connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CancelledNotification, CancelledNotificationParam, ClientJsonRpcMessage, ClientNotification,
    ClientRequest, NumberOrString, RequestId, ServerJsonRpcMessage,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Shared, Stdin, TransportError, encode, write_line};

/// The first id of a direct request: above every id rmcp's counter hands
/// out in practice, and exact in a JSON number as every SDK reads one
/// (below 2^53).
pub const FIRST_DIRECT_ID: i64 = 1 << 32;

type Answer = Box<ServerJsonRpcMessage>;

/// Callers waiting for the answer to a direct request, by id; `None` once
/// the stdout reader has ended (nothing more will be answered).
#[derive(Debug)]
pub(super) struct Waiters {
    waiting: Mutex<Option<HashMap<RequestId, oneshot::Sender<Answer>>>>,
    next: AtomicI64,
}

impl Default for Waiters {
    fn default() -> Self {
        Self {
            waiting: Mutex::new(Some(HashMap::new())),
            next: AtomicI64::new(FIRST_DIRECT_ID),
        }
    }
}

impl Waiters {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, Option<HashMap<RequestId, oneshot::Sender<Answer>>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `id` is one of the ids direct requests are given.
    pub(super) fn is_direct(id: &RequestId) -> bool {
        matches!(id, NumberOrString::Number(n) if *n >= FIRST_DIRECT_ID)
    }

    /// Hands `answer` to whoever waits for `id`. Nobody may wait any more
    /// (the caller gave up, or cancelled): the answer is dropped, as rmcp
    /// drops an answer whose caller is gone.
    pub(super) fn answer(&self, id: &RequestId, answer: Answer) {
        let waiter = self.lock().as_mut().and_then(|waiting| waiting.remove(id));
        if let Some(waiter) = waiter {
            let _ = waiter.send(answer);
        }
    }

    /// Ends every wait: the stdout reader has stopped, so each waiting
    /// caller learns the session is closed (its fault is set before this).
    pub(super) fn close(&self) {
        let waiting = self.lock().take();
        drop(waiting);
    }

    fn wait(&self, id: RequestId) -> Option<oneshot::Receiver<Answer>> {
        let (sender, receiver) = oneshot::channel();
        self.lock().as_mut()?.insert(id, sender);
        Some(receiver)
    }

    fn forget(&self, id: &RequestId) {
        if let Some(waiting) = self.lock().as_mut() {
            waiting.remove(id);
        }
    }
}

/// Sends requests to the server past rmcp's client service (see the
/// module's docs). Taken from the connected transport before rmcp gets it.
#[derive(Clone)]
pub struct Direct {
    pub(super) shared: Arc<Shared>,
    pub(super) stdin: Stdin,
    pub(super) on_request: Arc<dyn Fn() + Send + Sync>,
    pub(super) request_timeout: Duration,
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direct")
            .field("server", &self.shared.server)
            .finish_non_exhaustive()
    }
}

/// A direct request in flight: its answer, or its cancellation. Dropped
/// unanswered, its answer is dropped when it comes.
#[derive(Debug)]
pub struct InFlight {
    id: RequestId,
    answer: oneshot::Receiver<Answer>,
    direct: Direct,
}

impl Direct {
    /// The id the next direct request takes (known before it is sent, so
    /// that what routes its progress is in place first).
    pub fn next_id(&self) -> RequestId {
        NumberOrString::Number(self.shared.direct.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Sends `request` as `id`, booked with its deadline as every request
    /// is, and returns what waits for its answer.
    pub async fn send(
        &self,
        id: RequestId,
        request: ClientRequest,
    ) -> Result<InFlight, TransportError> {
        let method = request.method().to_owned();
        let message = ClientJsonRpcMessage::request(request, id.clone());
        let line = encode(&self.shared, &message)?;
        let answer = self
            .shared
            .direct
            .wait(id.clone())
            .ok_or_else(|| self.shared.closed())?;
        self.shared
            .book
            .sent(id.clone(), method, Instant::now() + self.request_timeout);
        (self.on_request)();
        // Until the line is written whole, a failed or dropped send takes
        // the request off the book (so no deadline stops the server for a
        // request it never got) and forgets its waiter.
        let mut unsent = Unsent {
            shared: &self.shared,
            id: Some(&id),
        };
        write_line(&self.shared, &self.stdin, line).await?;
        unsent.id = None;
        drop(unsent);
        Ok(InFlight {
            id,
            answer,
            direct: self.clone(),
        })
    }
}

impl InFlight {
    /// The request's id.
    pub fn id(&self) -> &RequestId {
        &self.id
    }

    /// The server's answer (a response or an error); `None` when the
    /// session ended first (its fault, if any, is set by then).
    pub async fn answer(&mut self) -> Option<ServerJsonRpcMessage> {
        (&mut self.answer).await.ok().map(|answer| *answer)
    }

    /// Cancels the request on the server (`notifications/cancelled`); a
    /// late answer is dropped.
    pub async fn cancel(self, reason: Option<String>) -> Result<(), TransportError> {
        let direct = &self.direct;
        direct.shared.direct.forget(&self.id);
        direct.shared.book.cancelled(&self.id);
        let notification = ClientJsonRpcMessage::notification(
            ClientNotification::CancelledNotification(CancelledNotification::new(
                CancelledNotificationParam::new(Some(self.id.clone()), reason),
            )),
        );
        write_line(
            &direct.shared,
            &direct.stdin,
            encode(&direct.shared, &notification)?,
        )
        .await
    }
}

/// A request booked and not yet written whole (see [`Direct::send`]).
struct Unsent<'a> {
    shared: &'a Shared,
    id: Option<&'a RequestId>,
}

impl Drop for Unsent<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.shared.direct.forget(id);
            self.shared.book.cancelled(id);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.direct.shared.direct.forget(&self.id);
    }
}

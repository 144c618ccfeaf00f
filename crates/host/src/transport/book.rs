//! The book of requests in flight to one server, in both directions: each
//! request Moat sent (its method and the deadline by which the server must
//! answer), the ones it cancelled (whose late answers are dropped, not a
//! fault), and the server's own requests not yet answered (a server that
//! asks more than [`MAX_UNANSWERED_SERVER_REQUESTS`] without reading the
//! answers is flooding the host). An answer to nothing, or a second answer,
//! is a fault: the stream can no longer be trusted.
//!
//! While one of the server's requests waits for the agent (a person may be
//! typing the answer), the server's deadlines stand still, and they resume
//! pushed back by the wait.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rmcp::model::RequestId;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How many cancelled request ids a transport remembers, so that a late
/// answer to one is dropped rather than treated as an answer to nothing.
const CANCELLED_REMEMBERED: usize = 1024;

/// How many of its own requests a server may leave unanswered on its stdin
/// (each answer waits in the host until the server reads it). A server that
/// asks more without reading is flooding the host: the session ends.
pub const MAX_UNANSWERED_SERVER_REQUESTS: usize = 256;

type Pending = HashMap<RequestId, (String, Option<Instant>)>;

/// The book of one server's requests in flight.
#[derive(Debug, Default)]
pub struct Book {
    /// Requests sent and not yet answered: the method, and the deadline by
    /// which the server must answer (none for a `subscriptions/listen` that
    /// the server acknowledged: its answer ends the stream, whenever).
    pending: Mutex<Pending>,
    /// Requests the host cancelled recently: a late answer to one of them is
    /// dropped, not a fault. Bounded to the last [`CANCELLED_REMEMBERED`].
    cancelled: Mutex<VecDeque<RequestId>>,
    /// Requests from the server read but not yet answered on its stdin.
    server_requests: AtomicUsize,
    /// The server's own requests that wait for an agent's answer.
    asking: AtomicUsize,
    /// Woken whenever a deadline may have moved.
    changed: Notify,
    requests_sent: AtomicU64,
    /// When a request either way was last taken off the book (answered,
    /// cancelled; none yet: never). Only that moment can end a busy
    /// spell, so sending costs nothing more.
    last_moved: Mutex<Option<Instant>>,
}

/// What an answer read from the server answers.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answered {
    /// A request in flight: pass it on.
    Pending,
    /// A request cancelled a moment ago: drop it.
    Late,
    /// Nothing in flight: fail closed.
    Unknown,
}

impl Book {
    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that a request was taken off the book now.
    fn moved(&self) {
        *self.last_moved.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Since when nothing has been in flight either way: no request of the
    /// host's awaiting its answer by a deadline (an acknowledged
    /// `subscriptions/listen` has none, and does not count), none of the
    /// server's own unanswered, no agent being asked. `None` while
    /// something is, and before the first request.
    pub fn quiet_since(&self) -> Option<Instant> {
        let pending = self.pending();
        if pending.values().any(|(_, deadline)| deadline.is_some())
            || self.server_requests.load(Ordering::SeqCst) > 0
            || self.asking.load(Ordering::SeqCst) > 0
        {
            return None;
        }
        *self.last_moved.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Books request `id` (`method`), to be answered by `deadline`. rmcp
    /// falls back to `initialize` when `server/discover` goes unanswered too
    /// long: a discover still pending is then given up (a late answer to
    /// it is an answer to nothing, and must not be read as initialize's).
    pub(super) fn sent(&self, id: RequestId, method: String, deadline: Instant) {
        let mut pending = self.pending();
        if method == <rmcp::model::InitializeResultMethod as rmcp::model::ConstString>::VALUE {
            let given_up: Vec<RequestId> = pending
                .iter()
                .filter(|(_, (method, _))| {
                    method
                        == <rmcp::model::DiscoverRequestMethod as rmcp::model::ConstString>::VALUE
                })
                .map(|(id, _)| id.clone())
                .collect();
            for id in given_up {
                self.forget(&mut pending, &id);
            }
        }
        pending.insert(id, (method, Some(deadline)));
        drop(pending);
        self.requests_sent.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_one();
    }

    /// Moves request `id` to the recently cancelled, whose late answers are
    /// dropped.
    pub(super) fn cancelled(&self, id: &RequestId) {
        // The pending lock is held until the id is remembered as cancelled:
        // [`Self::answer`], which checks both under the same lock, never
        // sees it in neither.
        let mut pending = self.pending();
        self.forget(&mut pending, id);
        drop(pending);
        self.moved();
    }

    fn forget(&self, pending: &mut Pending, id: &RequestId) {
        if pending.remove(id).is_some() {
            let mut recent = self.cancelled.lock().unwrap_or_else(|e| e.into_inner());
            if recent.len() == CANCELLED_REMEMBERED {
                recent.pop_front();
            }
            recent.push_back(id.clone());
        }
    }

    /// Takes the answer to `id` off the book.
    pub(super) fn answer(&self, id: &RequestId) -> Answered {
        // Under the pending lock, which a cancellation holds while it moves
        // an id from one to the other.
        let mut pending = self.pending();
        if pending.remove(id).is_some() {
            drop(pending);
            self.moved();
            return Answered::Pending;
        }
        let mut recent = self.cancelled.lock().unwrap_or_else(|e| e.into_inner());
        match recent.iter().position(|c| c == id) {
            Some(at) => {
                recent.remove(at);
                Answered::Late
            }
            None => Answered::Unknown,
        }
    }

    /// Whether request `id` is in flight and asked `method`.
    pub(super) fn asks(&self, id: &RequestId, method: &str) -> bool {
        self.pending().get(id).is_some_and(|(m, _)| m == method)
    }

    /// Which of `methods` the requests in flight asked: bit `i` for
    /// `methods[i]`.
    pub(super) fn asking(&self, methods: &[&str]) -> u32 {
        let mut asked = 0;
        for (method, _) in self.pending().values() {
            if let Some(at) = methods.iter().position(|m| m == method) {
                asked |= 1 << at;
            }
        }
        asked
    }

    /// Which of `methods` request `id`, in flight, asked.
    pub(super) fn asked_by(&self, id: &RequestId, methods: &[&str]) -> Option<usize> {
        let pending = self.pending();
        let (method, _) = pending.get(id)?;
        methods.iter().position(|m| m == method)
    }

    /// Lifts the deadline of request `id` when it is in flight and asked
    /// `method`: a stream the server acknowledged stays open until either
    /// side ends it. A request of any other method keeps its deadline, so a
    /// server cannot lift a call's by naming its id.
    pub fn lift_deadline(&self, id: &RequestId, method: &str) {
        if let Some((asked, deadline)) = self.pending().get_mut(id)
            && asked == method
        {
            *deadline = None;
            self.changed.notify_one();
        }
    }

    /// Counts one of the server's own requests read; `false` once more than
    /// [`MAX_UNANSWERED_SERVER_REQUESTS`] wait for their answers.
    pub(super) fn server_asked(&self) -> bool {
        self.server_requests.fetch_add(1, Ordering::SeqCst) < MAX_UNANSWERED_SERVER_REQUESTS
    }

    /// One of the server's requests was answered on its stdin.
    pub(super) fn server_answered(&self) {
        self.moved();
        let _ = self
            .server_requests
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// Requests sent so far.
    pub fn requests_sent(&self) -> u64 {
        self.requests_sent.load(Ordering::SeqCst)
    }

    /// The earliest deadline in force: none while the agent is asked.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        if self.asking.load(Ordering::SeqCst) > 0 {
            return None;
        }
        self.pending()
            .values()
            .filter_map(|(_, deadline)| *deadline)
            .min()
    }

    /// The method of a request whose deadline has passed (none while the
    /// agent is asked).
    pub(super) fn expired(&self) -> Option<String> {
        if self.asking.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let now = Instant::now();
        self.pending()
            .values()
            .find(|(_, deadline)| deadline.is_some_and(|d| d <= now))
            .map(|(method, _)| method.clone())
    }

    /// Resolves when a deadline may have moved (register before reading).
    pub(super) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
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
        self.changed.notify_one();
        AskingAgent {
            book: self.clone(),
            since: Instant::now(),
        }
    }
}

/// One of the server's requests waiting for the agent; see
/// [`Book::asking_agent`].
#[derive(Debug)]
pub struct AskingAgent {
    book: Arc<Book>,
    since: Instant,
}

impl Drop for AskingAgent {
    fn drop(&mut self) {
        let waited = self.since.elapsed();
        for (_, deadline) in self.book.pending().values_mut() {
            if let Some(deadline) = deadline {
                *deadline += waited;
            }
        }
        self.book.asking.fetch_sub(1, Ordering::SeqCst);
        self.book.changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A book with request 7 in flight as `method`.
    fn pending(method: &str) -> Book {
        let book = Book::default();
        book.sent(
            RequestId::Number(7),
            method.to_owned(),
            Instant::now() + Duration::from_secs(60),
        );
        book
    }

    #[test]
    fn a_deadline_is_lifted_only_for_the_method_named() {
        let deadline = |book: &Book| book.pending()[&RequestId::Number(7)].1;
        let listening = pending("subscriptions/listen");
        listening.lift_deadline(&RequestId::Number(8), "subscriptions/listen");
        assert!(deadline(&listening).is_some(), "another id");
        listening.lift_deadline(&RequestId::Number(7), "subscriptions/listen");
        assert_eq!(deadline(&listening), None);
        // A server cannot lift a call's deadline by acknowledging its id.
        let calling = pending("tools/call");
        calling.lift_deadline(&RequestId::Number(7), "subscriptions/listen");
        assert!(deadline(&calling).is_some());
    }

    #[test]
    fn an_answer_is_taken_once_and_a_cancelled_ones_late_answer_is_dropped() {
        let book = pending("tools/call");
        assert_eq!(book.answer(&RequestId::Number(7)), Answered::Pending);
        assert_eq!(book.answer(&RequestId::Number(7)), Answered::Unknown);
        let book = pending("tools/call");
        book.cancelled(&RequestId::Number(7));
        assert_eq!(book.answer(&RequestId::Number(7)), Answered::Late);
        assert_eq!(book.answer(&RequestId::Number(7)), Answered::Unknown);
    }

    #[test]
    fn initialize_gives_up_a_pending_discover() {
        let book = pending("server/discover");
        book.sent(
            RequestId::Number(8),
            "initialize".to_owned(),
            Instant::now() + Duration::from_secs(60),
        );
        assert_eq!(book.answer(&RequestId::Number(7)), Answered::Late);
        assert_eq!(book.answer(&RequestId::Number(8)), Answered::Pending);
    }
}

//! Who holds a connection slot, and who may be asked to give one up: at
//! `max_connections` the oldest connection that has not sent a request, or
//! whose request body is still arriving, is evicted to make room. The
//! connection itself ([`super::connection`]) says which phase it is in and
//! closes when told to.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// How long a new connection waits for the room an eviction makes.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// Where a connection is in its life, for eviction: a connection waiting
/// for its first request, or whose request body is still arriving, can be
/// closed to make room; one being answered (or that has been, and idles
/// between requests under `header_timeout_ms`) is not.
pub(super) mod phase {
    /// Admitted; no request head yet.
    pub const NEW: u8 = 0;
    /// A request's head has arrived; its body is being read.
    pub const BODY: u8 = 1;
    /// Its request is being answered, or has been.
    pub const ANSWERING: u8 = 2;
}

/// An admitted connection that may be asked to make room (see [`phase`]).
struct Waiting {
    phase: std::sync::Weak<AtomicU8>,
    evict: CancellationToken,
}

/// Who holds a connection slot, and who may be asked to give one up.
pub(super) struct Admission {
    slots: Arc<Semaphore>,
    max: usize,
    waiting: Mutex<VecDeque<Waiting>>,
}

impl Admission {
    pub(super) fn new(max: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
            waiting: Mutex::default(),
        }
    }

    pub(super) fn enlist(&self, phase: &Arc<AtomicU8>, evict: &CancellationToken) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if waiting.len() > 2 * self.max {
            waiting.retain(Waiting::alive);
        }
        waiting.push_back(Waiting {
            phase: Arc::downgrade(phase),
            evict: evict.clone(),
        });
    }

    /// Asks the oldest admitted connection that has not sent a request, or
    /// whose request body is still arriving, to close. Whether there was
    /// one. Connections being answered stay listed: their next request's
    /// body may be slow too.
    pub(super) fn evict_oldest_waiting(&self) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.retain(Waiting::alive);
        match waiting.iter().position(Waiting::evictable) {
            Some(at) => {
                if let Some(oldest) = waiting.remove(at) {
                    oldest.evict.cancel();
                }
                true
            }
            None => false,
        }
    }

    /// A slot for a new connection: a free one, or one an eviction frees.
    pub(super) async fn admit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Some(permit);
        }
        if !self.evict_oldest_waiting() {
            return None;
        }
        tokio::time::timeout(EVICTION_WAIT, self.slots.clone().acquire_owned())
            .await
            .ok()?
            .ok()
    }
}

impl Waiting {
    /// Whether its connection is still open.
    fn alive(&self) -> bool {
        !self.evict.is_cancelled() && self.phase.strong_count() > 0
    }

    fn evictable(&self) -> bool {
        !self.evict.is_cancelled()
            && self
                .phase
                .upgrade()
                .is_some_and(|p| p.load(Ordering::SeqCst) != phase::ANSWERING)
    }
}

//! The servers of one generation that could not start: why, how often in a
//! row, and when each is tried again (1 s after the first failure, then
//! doubling, at most [`START_RETRY_MAX`] apart). Sessions leave such a
//! server out of their listings and answer its calls with the reason until
//! its next try is due, so one broken server costs one failed start per
//! backoff, not one per session and listing.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why a server could not start, and when it is tried again.
#[derive(Clone, Debug)]
pub struct StartFailure {
    /// The launch error, in Moat's words (with the server's stderr tail
    /// where the launch had one).
    pub reason: String,
    /// The sandbox's refusal the server's stderr showed, if it did.
    pub(super) seen: Option<crate::session::SeenRefusal>,
    /// Failed starts in a row.
    pub attempts: u32,
    retry_at: Instant,
}

/// The longest wait between two tries of a server that cannot start.
pub const START_RETRY_MAX: Duration = Duration::from_secs(300);

impl StartFailure {
    /// How long until the next try (zero when it is due).
    pub fn retry_in(&self) -> Duration {
        self.retry_at.saturating_duration_since(Instant::now())
    }
}

/// The failures of one generation's servers, by server name.
#[derive(Default)]
pub(super) struct StartFailures(Mutex<BTreeMap<String, StartFailure>>);

impl StartFailures {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, StartFailure>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that `server` could not start: returns the failure, with
    /// the next try 1 s away after the first failure, doubling after each
    /// one more, at most [`START_RETRY_MAX`].
    pub(super) fn record(&self, server: &str, error: &crate::host::ConnectError) -> StartFailure {
        let mut failures = self.lock();
        let attempts = failures.get(server).map_or(0, |f| f.attempts) + 1;
        let backoff = Duration::from_secs(1)
            .saturating_mul(1 << (attempts - 1).min(16))
            .min(START_RETRY_MAX);
        let failure = StartFailure {
            reason: error.to_string(),
            seen: error.session().and_then(crate::session::SeenRefusal::of),
            attempts,
            retry_at: Instant::now() + backoff,
        };
        failures.insert(server.to_owned(), failure.clone());
        failure
    }

    /// `server` started: its failures are forgotten.
    pub(super) fn started(&self, server: &str) {
        self.lock().remove(server);
    }

    /// `server`'s recorded failure, while its next try is not yet due.
    pub(super) fn held_back(&self, server: &str) -> Option<StartFailure> {
        self.lock()
            .get(server)
            .filter(|f| !f.retry_in().is_zero())
            .cloned()
    }

    /// Every recorded failure, by server.
    pub(super) fn all(&self) -> Vec<(String, StartFailure)> {
        self.lock()
            .iter()
            .map(|(server, failure)| (server.clone(), failure.clone()))
            .collect()
    }
}

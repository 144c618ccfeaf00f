//! What bounds a server's relayed connections (its own [`Pool`], its
//! session's and its gateway's, gathered in [`Shares`]), how names are
//! looked up ([`Lookup`]) and who is told of each refusal ([`Observer`],
//! through the per-start [`Recorder`]).

use std::collections::HashSet;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{MAX_CONNECTIONS, MAX_RECORDED};

/// A bound on proxied connections at once, shared by every proxy that
/// draws from it.
#[derive(Clone, Debug)]
pub struct Pool {
    slots: Arc<Semaphore>,
    max: usize,
    /// What it bounds: `server`, `session` or `gateway`.
    per: &'static str,
}

impl Pool {
    /// A pool of `max` connections, bounding what one `per` may have open.
    pub fn new(max: usize, per: &'static str) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
            per,
        }
    }

    /// Its bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections open against it now.
    pub fn in_use(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

/// How names in `net` entries are looked up at launch: the system's
/// resolver unless an embedder gives another ([`Shares::with_lookup`]).
#[derive(Clone)]
pub struct Lookup(pub(super) Arc<LookupFn>);

type LookupFn = dyn Fn(String) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>
    + Send
    + Sync;

impl Lookup {
    /// Looks names up with `lookup`.
    pub fn new<F, R>(lookup: F) -> Self
    where
        F: Fn(String) -> R + Send + Sync + 'static,
        R: Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'static,
    {
        Self(Arc::new(move |name| Box::pin(lookup(name))))
    }

    /// The system's resolver (`getaddrinfo`, on tokio's blocking pool).
    pub fn system() -> Self {
        Self::new(|name: String| async move {
            Ok(tokio::net::lookup_host((name.as_str(), 0))
                .await?
                .map(|address| address.ip().to_canonical())
                .collect())
        })
    }
}

impl std::fmt::Debug for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lookup")
    }
}

/// One destination Moat refused a server, as told to the observer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub server: String,
    /// `host:port`, or a name asked of Moat's DNS.
    pub destination: String,
    pub reason: String,
}

/// Told of each refusal ([`Shares::observe`]).
#[derive(Clone)]
pub struct Observer(Arc<dyn Fn(Refusal) + Send + Sync>);

impl Observer {
    pub fn new(observe: impl Fn(Refusal) + Send + Sync + 'static) -> Self {
        Self(Arc::new(observe))
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

/// The bounds on a server's relayed connections: its own (a pool of
/// `per_server` made at its start), and the pools it shares with others,
/// its gateway's and its agent session's. A server started before any
/// session needed it (the gateway's name check) has no session yet; the
/// session that takes it over gives it its pool with [`Shares::adopt`].
/// With them: how names are looked up, and who is told of refusals.
#[derive(Clone, Debug)]
pub struct Shares {
    pub(super) per_server: usize,
    gateway: Option<Pool>,
    session: Arc<OnceLock<Pool>>,
    pub(super) lookup: Option<Lookup>,
    pub(super) observer: Option<Observer>,
}

impl Default for Shares {
    /// [`MAX_CONNECTIONS`] per server, nothing shared, the system's
    /// resolver, and refusals only logged.
    fn default() -> Self {
        Self {
            per_server: MAX_CONNECTIONS,
            gateway: None,
            session: Arc::default(),
            lookup: None,
            observer: None,
        }
    }
}

impl Shares {
    /// `per_server` for each server, all drawing from `gateway`, with no
    /// session yet.
    pub fn gateway(per_server: usize, gateway: Pool) -> Self {
        Self {
            per_server,
            gateway: Some(gateway),
            ..Self::default()
        }
    }

    /// The same, with names looked up by `lookup`.
    pub fn with_lookup(mut self, lookup: Lookup) -> Self {
        self.lookup = Some(lookup);
        self
    }

    /// The same, with `observer` told of every refusal recorded.
    pub fn observe(mut self, observer: Observer) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The same bounds, and no session yet (of its own: see
    /// [`Shares::adopt`]).
    pub fn detached(&self) -> Self {
        Self {
            session: Arc::default(),
            ..self.clone()
        }
    }

    /// The same bounds, and `session`'s pool.
    pub fn in_session(&self, session: &Pool) -> Self {
        Self {
            session: Arc::new(OnceLock::from(session.clone())),
            ..self.clone()
        }
    }

    /// Draws from `session` from now on, if no session's pool was given
    /// yet.
    pub fn adopt(&self, session: &Pool) {
        let _ = self.session.set(session.clone());
    }

    /// A slot in `server` and in each shared pool, or the refusal naming
    /// the bound that is reached.
    pub(super) fn take(&self, server: &Pool) -> Result<Vec<OwnedSemaphorePermit>, String> {
        [Some(server), self.session.get(), self.gateway.as_ref()]
            .into_iter()
            .flatten()
            .map(|pool| {
                pool.slots.clone().try_acquire_owned().map_err(|_| {
                    format!(
                        "egress connection limit ({} per {}) reached",
                        pool.max, pool.per
                    )
                })
            })
            .collect()
    }
}

/// Tells the observer of refusals, each distinct one once, the first
/// [`MAX_RECORDED`] of them.
pub(super) struct Recorder {
    pub(super) server: String,
    pub(super) observer: Option<Observer>,
    pub(super) seen: Mutex<HashSet<String>>,
}

impl Recorder {
    pub(super) fn refused(&self, destination: &str, reason: &str) {
        let destination = crate::text::printable(destination);
        tracing::info!(server = %self.server, %destination, %reason, "egress refused");
        let Some(observer) = &self.observer else {
            return;
        };
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let refusal = if seen.len() < MAX_RECORDED {
            if !seen.insert(format!("{destination} {reason}")) {
                return;
            }
            Refusal {
                server: self.server.clone(),
                destination,
                reason: reason.to_owned(),
            }
        } else if seen.insert(String::new()) {
            Refusal {
                server: self.server.clone(),
                destination: "*".to_owned(),
                reason: format!(
                    "more than {MAX_RECORDED} distinct refusals since this server started: the rest are not recorded"
                ),
            }
        } else {
            return;
        };
        drop(seen);
        (observer.0)(refusal);
    }
}

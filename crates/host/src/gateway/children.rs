//! The running children of one session: keyed by process key, so two
//! configured names share a child only when nothing that shapes the
//! process differs; restarts counted per server; one launch slot per
//! server; which servers the agent was told could not start, and which
//! are being retried. Starting a child is `start.rs`'s; this module owns
//! what is running.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tokio::sync::Mutex;

use crate::audit::Outcome;
use crate::config::ServerSpec;
use crate::identity::Digest;
use crate::lock::LockedServer;
use crate::session::Session;

use super::CallError;

/// How many times one session restarts a crashed server before giving up.
pub const MAX_RESTARTS: u32 = 3;

/// Everything one session knows of its children.
pub(super) struct ChildSet {
    running: Mutex<Children>,
    restarts: Mutex<BTreeMap<String, u32>>,
    /// One launch slot per configured server: a start or a restart backoff
    /// holds its server's slot only, never `running`, so a slow start
    /// never stalls the session's calls to other servers.
    slots: std::sync::Mutex<BTreeMap<String, Arc<Mutex<()>>>>,
    /// Servers this session has told the agent (and the audit log) could
    /// not start, while held back: once each, not at every listing.
    told_not_started: std::sync::Mutex<BTreeSet<String>>,
    /// Servers held back that a task of this session tries again when
    /// their next try is due, telling the agent its tools changed once one
    /// starts (an agent that keeps its tool list would not see it else).
    retrying: std::sync::Mutex<BTreeSet<String>>,
    /// The egress connections its native servers may hold at once, all
    /// together (`[serve] egress_connections_per_session`).
    #[cfg(unix)]
    egress: crate::egress::Pool,
}

/// The running children of one session, keyed by process key (see
/// [`process_key`]); each configured server name points at the child that
/// serves it. Two names share a child only when their keys are equal, so a
/// child never runs with another server's environment, grants or limits.
#[derive(Default)]
pub(super) struct Children {
    by_key: BTreeMap<Digest, Child>,
    by_server: BTreeMap<String, Digest>,
}

/// One running child and the execution identity it reported.
pub(super) struct Child {
    pub(super) identity: Digest,
    pub(super) session: Arc<Session>,
}

/// Whether a child may be stopped for being idle (see
/// [`ChildSet::stop_if_idle`]).
pub(super) enum Idle {
    /// It was: taken off every name it served (joined by commas), to be
    /// closed.
    Stopped(String, Child),
    /// Not yet: look again at this instant, or (`None`) a full idle period
    /// from now, while it is in use.
    NotYet(Option<tokio::time::Instant>),
    /// It no longer serves this session: closed, crashed or replaced.
    Gone,
}

/// What became of a child just started (see [`ChildSet::adopt`]).
pub(super) enum Adopted {
    /// It serves its name from now on.
    New(Arc<Session>),
    /// A healthy child of the same process key, started meanwhile, serves
    /// the name instead; the new one is closed.
    Existing(Arc<Session>),
}

/// What decides whether two configured servers may share one child: the
/// execution identity the child reported, and everything else that shapes the
/// process (environment values, grants, limits, sandbox, consent) and its
/// lock entry. The display name is left out. The key lives only in memory,
/// within one process, so the derived `Debug` rendering of the configuration
/// (deterministic: ordered maps, fixed field order) serves as its encoding.
pub(super) fn process_key(
    identity: &Digest,
    spec: &ServerSpec,
    locked: Option<&LockedServer>,
) -> Digest {
    // Other servers' grants (in `writers`) do not change this one's process.
    let unnamed = ServerSpec {
        name: String::new(),
        writers: Vec::new(),
        ..spec.clone()
    };
    Digest::of(format!("{identity}\n{unnamed:?}\n{locked:?}").as_bytes())
}

impl Children {
    /// The child serving `server`, healthy or not.
    pub(super) fn serving(&self, server: &str) -> Option<&Session> {
        let key = self.by_server.get(server)?;
        self.by_key.get(key).map(|child| &*child.session)
    }

    /// Forgets the child under `key` and every name that shared it.
    fn forget(&mut self, key: &Digest) -> Option<Child> {
        self.by_server.retain(|_, k| k != key);
        self.by_key.remove(key)
    }

    /// Takes the names in `refused` off their children, and returns the
    /// children no name is left on (a child shared with a name that is not
    /// refused keeps running for that one), each with the first refused
    /// name and its outcome.
    pub(super) fn unname(
        &mut self,
        refused: BTreeMap<String, Outcome>,
    ) -> Vec<(String, Outcome, Child)> {
        let mut stopping = Vec::new();
        for (server, outcome) in refused {
            let Some(key) = self.by_server.remove(&server) else {
                continue;
            };
            if self.by_server.values().all(|k| *k != key)
                && let Some(child) = self.by_key.remove(&key)
            {
                stopping.push((server, outcome, child));
            }
        }
        stopping
    }

    /// Every child, with the names it served joined by commas.
    pub(super) fn into_named(self) -> Vec<(String, Child)> {
        let Children { by_key, by_server } = self;
        by_key
            .into_iter()
            .map(|(key, child)| {
                let names = by_server
                    .iter()
                    .filter(|(_, k)| **k == key)
                    .map(|(name, _)| name.as_str())
                    .collect::<Vec<_>>()
                    .join(",");
                (names, child)
            })
            .collect()
    }

    /// A running, healthy child that can serve `spec`: same process key
    /// (execution identity, configuration apart from the name, lock entry).
    fn shareable(
        &self,
        spec: &ServerSpec,
        locked: Option<&LockedServer>,
    ) -> Option<(Digest, Arc<Session>)> {
        self.by_key.iter().find_map(|(key, child)| {
            let identity = child.session.execution_identity(spec)?;
            (child.session.fault().is_none()
                && identity == child.identity
                && process_key(&identity, spec, locked) == *key)
                .then(|| (*key, child.session.clone()))
        })
    }
}

impl ChildSet {
    pub(super) fn new(#[cfg(unix)] egress: crate::egress::Pool) -> Self {
        ChildSet {
            running: Mutex::default(),
            restarts: Mutex::default(),
            slots: std::sync::Mutex::default(),
            told_not_started: std::sync::Mutex::default(),
            retrying: std::sync::Mutex::default(),
            #[cfg(unix)]
            egress,
        }
    }

    /// The session's egress pool, shared by its native children.
    #[cfg(unix)]
    pub(super) fn egress(&self) -> &crate::egress::Pool {
        &self.egress
    }

    /// The running children, locked.
    pub(super) async fn lock(&self) -> tokio::sync::MutexGuard<'_, Children> {
        self.running.lock().await
    }

    /// `server`'s launch slot.
    pub(super) fn slot(&self, server: &str) -> Arc<Mutex<()>> {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(server.to_owned())
            .or_default()
            .clone()
    }

    /// Marks `server` as told not to have started; whether it was not yet.
    pub(super) fn told_not_started(&self, server: &str) -> bool {
        self.told_not_started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(server.to_owned())
    }

    /// `server` started: a later failure is told again.
    pub(super) fn started(&self, server: &str) {
        self.told_not_started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(server);
    }

    /// Marks `server` as retried in the background; whether it was not yet
    /// (one retrying task per server).
    pub(super) fn retrying(&self, server: &str) -> bool {
        self.retrying
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(server.to_owned())
    }

    /// `server` started on a later try: its retrying task ends.
    pub(super) fn retried(&self, server: &str) {
        self.retrying
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(server);
    }

    /// The healthy child serving `server` already, or a healthy child of the
    /// same process key that can (then recorded as serving it).
    pub(super) async fn running(
        &self,
        server: &str,
        spec: &ServerSpec,
        locked: Option<&LockedServer>,
    ) -> Option<Arc<Session>> {
        let mut children = self.running.lock().await;
        if let Some(key) = children.by_server.get(server) {
            let child = &children.by_key[key];
            return child
                .session
                .fault()
                .is_none()
                .then(|| child.session.clone());
        }
        let (key, child) = children.shareable(spec, locked)?;
        tracing::debug!(%server, %key, "served by a running child of the same process key");
        children.by_server.insert(server.to_owned(), key);
        Some(child)
    }

    /// When `server`'s child has faulted: counts a restart (refusing past
    /// [`MAX_RESTARTS`]) and forgets the child, returned with its fault for
    /// its exit to be recorded. Returns this session's restart count for
    /// `server` (0: a first start).
    pub(super) async fn forget_crashed(
        &self,
        server: &str,
    ) -> Result<(u32, Option<(Child, crate::transport::Fault)>), CallError> {
        let mut children = self.running.lock().await;
        let Some(key) = children.by_server.get(server).copied() else {
            return Ok((0, None));
        };
        let Some(fault) = children.by_key[&key].session.fault() else {
            return Ok((0, None));
        };
        let mut counts = self.restarts.lock().await;
        let count = counts.entry(server.to_owned()).or_insert(0);
        if *count >= MAX_RESTARTS {
            return Err(CallError::GaveUp {
                server: server.to_owned(),
                restarts: *count,
                fault,
            });
        }
        *count += 1;
        let forgotten = children.forget(&key).map(|child| (child, fault));
        Ok((*count, forgotten))
    }

    /// Records `child`, just started for `server` under process `key`, as
    /// serving it, unless a healthy child of the same key started meanwhile
    /// under its own slot (then that one serves it too, and the new child
    /// goes: a live child is never replaced). `on_new` runs for a child
    /// that is kept, before any call can find it. A faulted child under the
    /// key is replaced: the names it served restart with the new one.
    pub(super) async fn adopt(
        &self,
        server: &str,
        key: Digest,
        identity: Digest,
        child: Arc<Session>,
        on_new: impl FnOnce(),
    ) -> Adopted {
        let mut children = self.running.lock().await;
        if let Some(old) = children.by_key.get(&key)
            && old.session.fault().is_none()
        {
            let existing = old.session.clone();
            children.by_server.insert(server.to_owned(), key);
            drop(children);
            if let Ok(extra) = Arc::try_unwrap(child) {
                tokio::spawn(async move {
                    let _ = extra.close().await;
                });
            }
            return Adopted::Existing(existing);
        }
        on_new();
        children.by_key.insert(
            key,
            Child {
                identity,
                session: child.clone(),
            },
        );
        children.by_server.insert(server.to_owned(), key);
        Adopted::New(child)
    }

    /// Takes `child`, running under process `key`, off every name it
    /// serves if it has been idle for `idle`: still the child under `key`
    /// and healthy, held by no one but this set and the caller (a call and
    /// a task of Moat's hold it too) nor by a [`Session::hold`] (an agent's
    /// subscription), none of its
    /// names `busy` (a server's own task of the session's is on it), and
    /// nothing in flight to or from it for `idle`. Checked under the lock
    /// that every use of a child takes first, so no call can find it
    /// between the check and its removal.
    pub(super) async fn stop_if_idle(
        &self,
        key: &Digest,
        child: &Arc<Session>,
        idle: std::time::Duration,
        busy: impl Fn(&str) -> bool,
    ) -> Idle {
        let mut children = self.running.lock().await;
        let Some(running) = children.by_key.get(key) else {
            return Idle::Gone;
        };
        if !Arc::ptr_eq(&running.session, child) || child.fault().is_some() {
            return Idle::Gone;
        }
        // This set's reference and the caller's; a hold: an agent's open
        // subscription.
        if Arc::strong_count(child) > 2 || child.held() {
            return Idle::NotYet(None);
        }
        let names: Vec<String> = children
            .by_server
            .iter()
            .filter(|(_, k)| *k == key)
            .map(|(name, _)| name.clone())
            .collect();
        if names.iter().any(|name| busy(name)) {
            return Idle::NotYet(None);
        }
        let Some(since) = child.quiet_since() else {
            return Idle::NotYet(None);
        };
        if since + idle > tokio::time::Instant::now() {
            return Idle::NotYet(Some(since + idle));
        }
        match children.forget(key) {
            Some(stopped) => Idle::Stopped(names.join(","), stopped),
            None => Idle::Gone,
        }
    }

    /// Takes every child, to close them all.
    pub(super) async fn take_all(&self) -> Children {
        std::mem::take(&mut *self.running.lock().await)
    }
}

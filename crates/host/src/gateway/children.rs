//! The running children of one session: keyed by process key, so two
//! configured names share a child only when nothing that shapes the
//! process differs; restarts counted per server; launch slots.

use super::*;

/// The running children of one session, keyed by process key (see
/// [`process_key`]); each configured server name points at the child that
/// serves it. Two names share a child only when their keys are equal, so a
/// child never runs with another server's environment, grants or limits.
#[derive(Default)]
pub(super) struct Children {
    pub(super) by_key: BTreeMap<Digest, Child>,
    pub(super) by_server: BTreeMap<String, Digest>,
}

/// One running child and the execution identity it reported.
pub(super) struct Child {
    pub(super) identity: Digest,
    pub(super) session: Arc<Session>,
}

impl Children {
    /// Forgets the child under `key` and every name that shared it.
    pub(super) fn forget(&mut self, key: &Digest) -> Option<Child> {
        self.by_server.retain(|_, k| k != key);
        self.by_key.remove(key)
    }
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
    locked: Option<&crate::lock::LockedServer>,
) -> Digest {
    // Other servers' grants (in `writers`) do not change this one's process.
    let unnamed = ServerSpec {
        name: String::new(),
        writers: Vec::new(),
        ..spec.clone()
    };
    Digest::of(format!("{identity}\n{unnamed:?}\n{locked:?}").as_bytes())
}

/// How many times one session restarts a crashed server before giving up.
pub const MAX_RESTARTS: u32 = 3;

impl AgentSession {
    /// The healthy child serving `server` already, or a healthy child of the
    /// same process key that can (then recorded as serving it).
    pub(super) async fn running(&self, server: &str, spec: &ServerSpec) -> Option<Arc<Session>> {
        let mut children = self.children.lock().await;
        if let Some(key) = children.by_server.get(server) {
            let child = &children.by_key[key];
            return child
                .session
                .fault()
                .is_none()
                .then(|| child.session.clone());
        }
        let (key, child) = self.shareable(&children, spec)?;
        tracing::debug!(%server, %key, "served by a running child of the same process key");
        children.by_server.insert(server.to_owned(), key);
        Some(child)
    }

    /// When `server`'s child has faulted: counts a restart (refusing past
    /// [`MAX_RESTARTS`]), forgets the child and audits its exit. Returns
    /// this session's restart count for `server` (0: a first start).
    pub(super) async fn forget_crashed(&self, server: &str) -> Result<u32, ClientError> {
        let mut children = self.children.lock().await;
        let Some(key) = children.by_server.get(server).copied() else {
            return Ok(0);
        };
        let Some(fault) = children.by_key[&key].session.fault() else {
            return Ok(0);
        };
        let mut counts = self.restarts.lock().await;
        let count = counts.entry(server.to_owned()).or_insert(0);
        if *count >= MAX_RESTARTS {
            return Err(ClientError::GaveUp {
                server: server.to_owned(),
                restarts: *count,
                fault,
            });
        }
        *count += 1;
        if let Some(child) = children.forget(&key) {
            let _ = self.audit(Event::ServerExit {
                session: self.id.clone(),
                server: server.to_owned(),
                identity: child.identity.to_string(),
                evidence: evidence_of(&child.session),
                outcome: Outcome::of_fault(&fault),
            });
        }
        Ok(*count)
    }

    /// A running, healthy child that can serve `spec`: same process key
    /// (execution identity, configuration apart from the name, lock entry).
    pub(super) fn shareable(
        &self,
        children: &Children,
        spec: &ServerSpec,
    ) -> Option<(Digest, Arc<Session>)> {
        let locked = self.generation.host.locked(&spec.name);
        children.by_key.iter().find_map(|(key, child)| {
            let identity = child.session.execution_identity(spec)?;
            (child.session.fault().is_none()
                && identity == child.identity
                && process_key(&identity, spec, locked) == *key)
                .then(|| (*key, child.session.clone()))
        })
    }
}

//! The node's side of a launch: a request's body parsed, resolved against
//! the node's own config and lock, the profile launched by the node's
//! locked host under its own sandbox, and the statement of what runs,
//! signed with the node's key. What serves this over the network is the
//! node's front; this is the whole decision.

use std::sync::Arc;

use super::profile::resolve;
use super::{FORMAT, LaunchRequest, NodeError, SignedStatement, Statement};
use crate::claim::SigningKey;
use crate::config::Config;
use crate::host::Host;
use crate::lock::Lock;
use crate::session::Session;

/// A launch host: its config and lock, the host that launches under that
/// lock, and its signing key.
pub struct Node {
    config: Config,
    lock: Lock,
    host: Host,
    key: Arc<SigningKey>,
    /// The lock file's modification time and size when its revocations
    /// were last read.
    seen: std::sync::Mutex<Option<(std::time::SystemTime, u64)>>,
}

/// One launch: the node's id for it, the connected server, and the signed
/// statement of what runs.
pub struct Launched {
    pub id: String,
    pub session: Session,
    pub statement: SignedStatement,
}

impl Node {
    /// A node serving `config`'s servers as `lock` pins them, launched by
    /// `host` (which must enforce that lock), signing with `key`.
    pub fn new(config: Config, lock: Lock, host: Host, key: Arc<SigningKey>) -> Self {
        Self {
            config,
            lock,
            host,
            key,
            seen: std::sync::Mutex::new(None),
        }
    }

    /// Puts in force the revocations the node's lock holds now: a
    /// revocation written with `moat revoke` on the node applies without a
    /// restart. The file is read again only when its modification time or
    /// size changed; one that cannot be read keeps what is in force.
    fn refresh_revocations(&self) {
        let path = crate::lock::Lock::path_for(&self.config.path);
        let Ok(meta) = std::fs::metadata(&path) else {
            return;
        };
        let stamp = (meta.modified().unwrap_or(std::time::UNIX_EPOCH), meta.len());
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *seen == Some(stamp) {
            return;
        }
        match crate::lock::Lock::load(&path) {
            Ok(Some(lock)) => {
                let (revoked, _) = lock.revocations().with(&self.lock.revocations());
                self.host.set_revoked(revoked);
                *seen = Some(stamp);
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%error, "moat node: re-reading the lock's revocations; keeping those in force");
            }
        }
    }

    /// Why `profile` must not run, if it was revoked (by name, or by a
    /// digest its lock entry holds).
    pub fn revocation_of(&self, profile: &str) -> Option<String> {
        self.refresh_revocations();
        let locked = self.lock.servers.get(profile)?;
        let revoked = self.host.revoked();
        revoked
            .of_name(profile, None)
            .or_else(|| revoked.of_digests(&locked.digests()))
            .map(crate::revoke::describe)
    }

    /// The node's config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The node's public key.
    pub fn public_key(&self) -> crate::claim::PublicKey {
        self.key.public()
    }

    /// Every profile the node can launch, with its revision (what a front
    /// writes as `revision`); a server with no lock entry is left out.
    pub fn revisions(&self) -> Vec<(String, crate::identity::Digest)> {
        self.config
            .servers
            .iter()
            .filter_map(|(name, spec)| {
                let locked = self.lock.servers.get(name)?;
                Some((name.clone(), super::profile::revision(spec, locked)))
            })
            .collect()
    }

    /// Launches what the request `body` asks for, its statement bound to
    /// the front's `nonce`, or says why not: a body that is not exactly a
    /// profile and a revision, a profile the node does not have, a
    /// revision it does not hold, or a launch its lock or sandbox refuses.
    pub async fn launch(&self, body: &[u8], nonce: &str) -> Result<Launched, NodeError> {
        let request = LaunchRequest::parse(body)?;
        let (spec, revision) = resolve(&self.config, &self.lock, &request)?;
        if let Some(revocation) = self.revocation_of(&request.profile) {
            return Err(NodeError::Revoked {
                profile: request.profile,
                revocation,
            });
        }
        let session = self
            .host
            .connect(spec)
            .await
            .map_err(|source| NodeError::Launch {
                profile: request.profile.clone(),
                source: Box::new(source),
            })?;
        let (Some(identity), Some(execution)) = (session.identity(), session.launched_identity())
        else {
            let _ = session.close().await;
            return Err(NodeError::NoIdentity {
                profile: request.profile,
            });
        };
        // Unguessable: a launch's endpoint is the front's alone, whoever
        // else holds a token for this node.
        let mut id = [0u8; 16];
        if let Err(error) = getrandom::fill(&mut id) {
            let _ = session.close().await;
            return Err(NodeError::Random(error.to_string()));
        }
        let id = hex::encode(id);
        let statement = Statement {
            format: FORMAT.to_owned(),
            session: id.clone(),
            nonce: nonce.to_owned(),
            profile: request.profile,
            revision: revision.to_string(),
            identity: execution.to_string(),
            sha256: identity.digest.map(|d| d.to_string()),
            evidence: identity.evidence.to_string(),
            sandbox: identity.sandbox.lines(),
            launched_unix_ms: crate::audit::now_unix_ms(),
        };
        let statement = SignedStatement {
            signature: self.key.signature(FORMAT, &statement),
            statement,
        };
        Ok(Launched {
            id,
            session,
            statement,
        })
    }
}

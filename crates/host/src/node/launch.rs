//! The node's side of a launch: a request's body parsed, resolved against
//! the node's own config and lock, the profile launched by the node's
//! locked host under its own sandbox, and the statement of what runs,
//! signed with the node's key. What serves this over the network is the
//! node's front; this is the whole decision.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::NodeError;
use super::profile::resolve;
use super::request::LaunchRequest;
use super::statement::{FORMAT, SignedStatement, Statement};
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
    launches: AtomicU64,
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
            launches: AtomicU64::new(0),
        }
    }

    /// Launches what the request `body` asks for, or says why not: a body
    /// that is not exactly a profile and a revision, a profile the node
    /// does not have, a revision it does not hold, or a launch its lock or
    /// sandbox refuses.
    pub async fn launch(&self, body: &[u8]) -> Result<Launched, NodeError> {
        let request = LaunchRequest::parse(body)?;
        let (spec, revision) = resolve(&self.config, &self.lock, &request)?;
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
            return Err(NodeError::BadRequest {
                detail: format!(
                    "profile `{}` reported no identity once launched",
                    request.profile
                ),
            });
        };
        let id = format!("n{}", self.launches.fetch_add(1, Ordering::SeqCst) + 1);
        let statement = Statement {
            format: FORMAT.to_owned(),
            session: id.clone(),
            profile: request.profile,
            revision: revision.to_string(),
            identity: execution.to_string(),
            sha256: identity.digest.map(|d| d.to_string()),
            evidence: identity.evidence.to_string(),
            sandbox: identity.sandbox.lines(),
            launched_unix_ms: crate::audit::now_unix_ms(),
        }
        .sign(&self.key);
        Ok(Launched {
            id,
            session,
            statement,
        })
    }
}

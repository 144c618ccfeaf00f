//! The gate: whether what a call names is refused (revoked by name,
//! pinned digest or measured digest, or stale after a reload), decided at
//! fixed points of a call, and a revocation put in force in one session
//! (drain, cancel, stop the children it refuses).

use super::calls::Ticket;
use super::children::Child;
use super::error::CallError;
use super::generation::Generation;
use super::record::{cancelled, evidence_of, outcome_of, to_error};
use super::session::{AgentSession, SessionState};
use crate::audit::{Event, Outcome};
use crate::identity::Digest;
use crate::session::Session;
use rmcp::model::ErrorData;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

impl Generation {
    /// The refusal of `server` (or its `tool`) in this generation: when a
    /// revocation in force names it, or names a digest it runs (the one its
    /// config or lock pins, checked before anything starts, or the one
    /// `child` measured); or when a reloaded lock no longer matches it.
    pub(super) fn refusal(
        &self,
        server: &str,
        tool: Option<&str>,
        child: Option<&Session>,
    ) -> Option<CallError> {
        if let Some(detail) = self.stale(server, child) {
            return Some(CallError::Stale {
                server: server.to_owned(),
                detail,
            });
        }
        let revoked = self.host.revoked();
        if revoked.is_empty() {
            return None;
        }
        let mut digests: Vec<Digest> = Vec::new();
        if let Ok(spec) = self.config.server(server) {
            digests.extend(spec.sha256);
        }
        if let Some(locked) = self.host.locked(server) {
            digests.extend(locked.digests());
        }
        if let Some(identity) = child.and_then(|c| c.identity()) {
            digests.extend(identity.digest);
            digests.extend(identity.oci.map(|oci| oci.manifest));
        }
        let (revocation, subject) = match revoked.of_name(server, tool) {
            Some(revocation) => (revocation, tool),
            None => (revoked.of_digests(&digests)?, None),
        };
        Some(CallError::Revoked {
            server: server.to_owned(),
            subject: match subject {
                Some(tool) => format!("tool `{tool}` on server `{server}`"),
                None => format!("server `{server}`"),
            },
            revocation: crate::revoke::describe(revocation),
        })
    }

    /// Whether this generation lets `server` (or its `tool`, or `child`,
    /// the instance serving it) be used: the error is the refusal.
    pub(super) fn admits(
        &self,
        server: &str,
        tool: Option<&str>,
        child: Option<&Session>,
    ) -> Result<(), Refused> {
        match self.refusal(server, tool, child) {
            Some(refusal) => Err(Refused(Box::new(refusal))),
            None => Ok(()),
        }
    }
}

impl SessionState {
    /// The gate's first point, before anything of `server` is used: its
    /// name, its `tool`, and the digests its config and lock pin.
    pub(super) fn gate(&self, server: &str, tool: Option<&str>) -> Result<(), Refused> {
        self.generation.admits(server, tool, None)
    }

    /// The gate's second point, once `child` serves `server`: the digest
    /// it measured. A child refused here stops, with every child of what
    /// the revocations refuse.
    pub(super) async fn gate_child(
        &self,
        server: &str,
        tool: Option<&str>,
        child: Arc<Session>,
    ) -> Result<Arc<Session>, Refused> {
        if let Err(refusal) = self.generation.admits(server, tool, Some(&child)) {
            drop(child);
            self.stop_refused().await;
            return Err(refusal);
        }
        Ok(child)
    }

    /// Why a call to `server`'s `tool`, cancelled though its agent did not
    /// cancel it, was: the revocation of what it calls, if one is in force.
    pub(super) fn revoked_during(
        &self,
        server: &str,
        tool: &str,
        child: Option<&Session>,
    ) -> Option<CallError> {
        let refusal = self.generation.admits(server, Some(tool), child).err()?;
        Some(CallError::CancelledByRevocation {
            server: server.to_owned(),
            tool: tool.to_owned(),
            refusal: refusal.0.to_string(),
        })
    }
}

/// A refusal at the gate: what the agent and the audit log are told.
#[derive(Debug)]
pub(super) struct Refused(pub(super) Box<CallError>);

impl From<Refused> for ErrorData {
    fn from(refused: Refused) -> Self {
        to_error(*refused.0)
    }
}

/// What putting revocations in force did, across sessions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Enforced {
    /// Revocations that came into force.
    pub added: usize,
    /// Revocations that were lifted.
    pub lifted: usize,
    /// Calls in flight to what they refuse that ended within the drain
    /// timeout.
    pub drained: usize,
    /// Calls in flight to what they refuse that were cancelled when the
    /// drain timeout passed.
    pub cancelled: usize,
    /// Children (and instances kept from the name check) stopped.
    pub stopped: usize,
}

impl Enforced {
    pub(super) fn merge(&mut self, other: &Enforced) {
        self.drained += other.drained;
        self.cancelled += other.cancelled;
        self.stopped += other.stopped;
    }
}

impl SessionState {
    /// Puts the revocations in force in this session: its calls in flight
    /// to what they refuse get up to the drain timeout to end, those still
    /// running are cancelled, the children of refused servers stop, and
    /// the agent is told that its tools changed.
    pub(super) async fn enforce_revocations(&self) -> Enforced {
        let refused_servers = self.refused_servers().await;
        let refused = |ticket: &Ticket| {
            refused_servers.contains_key(&ticket.server)
                || self.gate(&ticket.server, Some(&ticket.tool)).is_err()
        };
        let drain = Duration::from_millis(self.generation.config.serve.drain_timeout_ms);
        let done = self
            .admission
            .drain_matching(&self.id, drain, refused)
            .await;
        let mut enforced = Enforced {
            drained: done.drained,
            cancelled: done.cancelled,
            ..Enforced::default()
        };
        enforced.stopped = self.stop_refused().await;
        if let Some(agent) = self.agent.peer()
            && let Err(error) = agent.notify_tool_list_changed().await
        {
            tracing::debug!(session = %self.id, %error, "telling the agent its tools changed");
        }
        enforced
    }

    /// The configured servers this session refuses as a whole (revoked by
    /// name, by pinned digest or by the digest their child measured, or
    /// stale after a reload), with the outcome their exit is audited with.
    pub(super) async fn refused_servers(&self) -> BTreeMap<String, Outcome> {
        let children = self.children.lock().await;
        self.generation
            .config
            .servers
            .keys()
            .filter_map(|server| {
                let refusal = self
                    .generation
                    .admits(server, None, children.serving(server))
                    .err()?;
                Some((server.clone(), outcome_of(&refusal.0)))
            })
            .collect()
    }

    /// Stops this session's children of the servers that the revocations in
    /// force refuse as a whole (a child shared with a server they do not
    /// refuse keeps running for that one), auditing each exit as `revoked`.
    /// Returns how many stopped.
    pub(super) async fn stop_refused(&self) -> usize {
        let refused = self.refused_servers().await;
        let stopping = self.children.lock().await.unname(refused);
        let stopped = stopping.len();
        for (server, outcome, Child { identity, session }) in stopping {
            let evidence = evidence_of(&session);
            match Arc::try_unwrap(session) {
                Ok(child) => {
                    if let Err(error) = child.close().await {
                        tracing::warn!(session = %self.id, %server, %error, "closing a revoked server");
                    }
                }
                // Still held by a call that outlived its cancellation: its
                // service ends, which stops the instance in the background.
                Err(shared) => shared.stop(),
            }
            let _ = self.audit(Event::ServerExit {
                session: self.id.clone(),
                server,
                identity: identity.to_string(),
                evidence,
                outcome,
            });
        }
        stopped
    }
}

impl AgentSession {
    /// The answer to a call cancelled by close or by a revocation (then
    /// naming it), before its child answered.
    pub(super) fn cancellation(
        &self,
        server: &str,
        tool: &str,
        child: Option<&Session>,
        agent: &CancellationToken,
    ) -> ErrorData {
        match self.revoked_during(server, tool, child) {
            Some(revoked) if !agent.is_cancelled() => to_error(revoked),
            _ => cancelled(server, tool),
        }
    }
}

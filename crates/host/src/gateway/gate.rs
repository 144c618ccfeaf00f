//! The gate: whether what a call names is refused (revoked by name,
//! pinned digest or measured digest, or stale after a reload), decided at
//! fixed points of a call, and a revocation put in force in one session
//! (drain, cancel, stop the children it refuses).

use super::*;

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
                || self
                    .generation
                    .refusal(&ticket.server, Some(&ticket.tool), None)
                    .is_some()
        };
        let running = || self.calls().open.values().filter(|t| refused(t)).count();
        let mut enforced = Enforced::default();
        let pending = running();
        if pending > 0 {
            let drain = Duration::from_millis(self.generation.config.serve.drain_timeout_ms);
            let mut in_flight = self.in_flight.subscribe();
            if tokio::time::timeout(drain, in_flight.wait_for(|_| running() == 0))
                .await
                .is_err()
            {
                let cancel: Vec<CancellationToken> = self
                    .calls()
                    .open
                    .values()
                    .filter(|t| refused(t))
                    .map(|t| t.cancel.clone())
                    .collect();
                tracing::warn!(session = %self.id, calls = cancel.len(), ?drain, "drain timeout: cancelling calls to what was revoked");
                enforced.cancelled = cancel.len();
                cancel.iter().for_each(CancellationToken::cancel);
                if tokio::time::timeout(CANCEL_GRACE, in_flight.wait_for(|_| running() == 0))
                    .await
                    .is_err()
                {
                    tracing::error!(session = %self.id, calls = running(), "calls to what was revoked still running {CANCEL_GRACE:?} after cancellation");
                }
            }
            enforced.drained = pending.saturating_sub(enforced.cancelled);
        }
        enforced.stopped = self.stop_refused().await;
        if let Some(agent) = self.agent.get()
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
                let child = children
                    .by_server
                    .get(server)
                    .and_then(|key| children.by_key.get(key))
                    .map(|child| &*child.session);
                let refusal = self.generation.refusal(server, None, child)?;
                Some((server.clone(), outcome_of(&refusal)))
            })
            .collect()
    }

    /// Stops this session's children of the servers that the revocations in
    /// force refuse as a whole (a child shared with a server they do not
    /// refuse keeps running for that one), auditing each exit as `revoked`.
    /// Returns how many stopped.
    pub(super) async fn stop_refused(&self) -> usize {
        let refused = self.refused_servers().await;
        let stopping: Vec<(String, Outcome, Child)> = {
            let mut children = self.children.lock().await;
            let mut stopping = Vec::new();
            for (server, outcome) in refused {
                let Some(key) = children.by_server.remove(&server) else {
                    continue;
                };
                if children.by_server.values().all(|k| *k != key)
                    && let Some(child) = children.by_key.remove(&key)
                {
                    stopping.push((server, outcome, child));
                }
            }
            stopping
        };
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
        match self.generation.refusal(server, Some(tool), child) {
            Some(refusal) if !agent.is_cancelled() => {
                to_error(ClientError::CancelledByRevocation {
                    server: server.to_owned(),
                    tool: tool.to_owned(),
                    refusal: refusal.to_string(),
                })
            }
            _ => cancelled(server, tool),
        }
    }
}

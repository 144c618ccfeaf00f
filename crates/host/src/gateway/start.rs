//! Starting a session's children: on first use, under the server's own
//! launch slot, from a spare of the name check when one fits, with a
//! backoff after a crash; a server that cannot start is held back, told
//! to the agent and the audit log once, and retried in the background.

use super::children::{Adopted, process_key};
use super::error::CallError;
use super::record::{evidence_of, outcome_of};
use super::session::AgentSession;
use super::start_failures::StartFailure;
use crate::audit::{Event, Outcome};
use crate::session::{Session, SessionError};
use std::sync::Arc;
use std::time::Duration;

impl AgentSession {
    /// Tries `server` again when its next try is due, and again after
    /// each failure, until it starts (then the agent is told its tools
    /// changed) or the session closes; one such task per server.
    pub(super) fn retry_later(&self, server: &str) {
        if !self.children.retrying(server) {
            return;
        }
        let state = Arc::downgrade(&self.state);
        let close_on_drop = Arc::downgrade(&self.close_on_drop);
        let closing = self.admission.closing().clone();
        // The session, while someone else still holds it.
        let session = move || {
            Some(AgentSession {
                state: state.upgrade()?,
                close_on_drop: close_on_drop.upgrade()?,
            })
        };
        let server = server.to_owned();
        tokio::spawn(async move {
            loop {
                let due = {
                    let Some(state) = session() else { return };
                    state
                        .generation
                        .failures
                        .held_back(&server)
                        .map(|failure| failure.retry_in())
                        .unwrap_or_default()
                };
                tokio::select! {
                    () = closing.cancelled() => return,
                    () = tokio::time::sleep(due) => {}
                }
                let Some(state) = session() else { return };
                if state.child(&server).await.is_ok() {
                    state.children.retried(&server);
                    tracing::info!(session = %state.id, %server, "started on a later try; its tools are listed again");
                    state.agent.tell_tools_changed(&server).await;
                    return;
                }
            }
        });
    }

    /// The child for `server`, started on first use within this session.
    /// A running child of this session with the same execution identity
    /// and the same configuration (apart from the name) serves it too.
    /// A child that crashed is restarted on the next call, after a backoff
    /// (100 ms, doubling), at most [`MAX_RESTARTS`] times per session.
    ///
    /// Starting holds only `server`'s launch slot: calls to the session's
    /// other servers go on meanwhile, and `children` is locked only to look
    /// up and to insert.
    pub(super) async fn child(&self, server: &str) -> Result<Arc<Session>, CallError> {
        let spec = self
            .generation
            .config
            .server(server)
            .map_err(|e| SessionError::Protocol {
                server: server.to_owned(),
                operation: "route".into(),
                detail: e.to_string(),
            })?;
        let locked = self.generation.host.locked(server);
        if let Some(child) = self.children.running(server, spec, locked).await {
            return Ok(child);
        }
        let slot = self.children.slot(server);
        let _slot = slot.lock().await;
        // Another call may have started it while this one waited.
        if let Some(child) = self.children.running(server, spec, locked).await {
            return Ok(child);
        }
        if let Some(failure) = self.generation.failures.held_back(server) {
            let error = CallError::NotStarted {
                server: server.to_owned(),
                reason: failure.reason.clone(),
                retry_in_s: failure.retry_in().as_secs().max(1),
            };
            if self.children.told_not_started(server) {
                self.tell_not_started(server, &error, &failure);
            }
            self.retry_later(server);
            return Err(error);
        }
        let (restarts, crashed) = self.children.forget_crashed(server).await?;
        if let Some((child, fault)) = crashed {
            let _ = self.audit(Event::ServerExit {
                session: self.id.clone(),
                server: server.to_owned(),
                identity: child.identity.to_string(),
                evidence: evidence_of(&child.session),
                outcome: Outcome::of_fault(&fault),
            });
        }
        if restarts > 0 {
            let backoff = Duration::from_millis(100 << (restarts - 1));
            tracing::warn!(%server, restarts, ?backoff, "restarting a crashed server");
            tokio::time::sleep(backoff).await;
        }
        let spare = self.generation.take_spare(
            server,
            #[cfg(unix)]
            self.children.egress(),
        );
        #[cfg(unix)]
        let host = self.generation.host.with_egress(
            self.generation
                .host
                .egress()
                .in_session(self.children.egress()),
        );
        #[cfg(not(unix))]
        let host = &self.generation.host;
        let session = match (restarts, spare) {
            (0, Some(spare)) => Arc::new(spare),
            (_, spare) => {
                if let Some(spare) = spare {
                    tokio::spawn(async move {
                        let _ = spare.close().await;
                    });
                }
                match host.connect(spec).await {
                    Ok(session) => Arc::new(session),
                    Err(error) => {
                        let failure = self.generation.failures.record(server, &error);
                        tracing::warn!(%server, %error, attempts = failure.attempts, retry_in = ?failure.retry_in(), "could not start; its tools are left out until it does");
                        self.children.told_not_started(server);
                        let error = CallError::from(error);
                        self.tell_not_started(server, &error, &failure);
                        self.retry_later(server);
                        return Err(error);
                    }
                }
            }
        };
        // A start that ends after the session closed (a retry, say) is not
        // adopted: its children were already taken and its claim drawn up.
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = Arc::try_unwrap(session).map(|s| tokio::spawn(s.close()));
            return Err(SessionError::Protocol {
                server: server.to_owned(),
                operation: "start".into(),
                detail: "the agent session closed while the server was starting".into(),
            }
            .into());
        }
        self.generation.failures.started(server);
        self.children.started(server);
        let identity = session
            .launched_identity()
            .ok_or_else(|| SessionError::Protocol {
                server: server.to_owned(),
                operation: "launch".into(),
                detail: "the server reported no identity".into(),
            })?;
        let key = process_key(&identity, spec, locked);
        let on_new = || {
            if let Some(measured) = session.identity() {
                if let Some(ledger) = self.ledger().as_mut() {
                    // The endpoint without its query or fragment, which
                    // may carry a credential: a claim is for third parties.
                    let endpoint = match &spec.kind {
                        crate::config::ServerKind::Remote { url, .. } => {
                            url::Url::parse(url).ok().map(|mut url| {
                                url.set_query(None);
                                url.set_fragment(None);
                                url.to_string()
                            })
                        }
                        crate::config::ServerKind::Node { node, .. } => Some(node.url.clone()),
                        _ => None,
                    };
                    ledger.launched(
                        server,
                        &identity.to_string(),
                        &measured,
                        endpoint.as_deref(),
                    );
                }
                let _ = self.audit(Event::ServerLaunch {
                    session: self.id.clone(),
                    server: server.to_owned(),
                    identity: identity.to_string(),
                    sha256: measured.digest.map(|d| d.to_string()),
                    snapshot: measured
                        .component
                        .as_ref()
                        .and_then(|c| c.snapshot)
                        .map(|d| d.to_string()),
                    evidence: measured.evidence.to_string(),
                });
            }
            self.pass_on_tool_changes(server, &session);
        };
        let session = match self
            .children
            .adopt(server, key, identity, session.clone(), on_new)
            .await
        {
            Adopted::Existing(existing) => return Ok(existing),
            Adopted::New(session) => session,
        };
        if let Some(idle) = spec.limits.idle_stop() {
            self.stop_when_idle(server, key, &session, idle);
        }
        self.pass_on_list_changes(server, &session).await;
        Ok(session)
    }

    /// When `child` announces that its tools changed, re-checks them against
    /// the pins and then tells the agent, which lists them again. Ends with
    /// the child's transport.
    pub(super) fn pass_on_tool_changes(&self, server: &str, child: &Arc<Session>) {
        let mut events = child.tools_changed_events();
        let weak = Arc::downgrade(child);
        let agent = self.agent.clone();
        let server = server.to_owned();
        tokio::spawn(async move {
            while events.changed().await.is_ok() {
                let Some(child) = weak.upgrade() else { return };
                if let Err(error) = child.tool_reports().await {
                    tracing::warn!(%server, %error, "re-checking tools after list_changed");
                }
                drop(child);
                agent.tell_tools_changed(&server).await;
            }
        });
    }

    /// For an agent before 2026-07-28, which hears of changes outside any
    /// stream: listens to `child`'s prompt and resource list changes and
    /// passes them on (a 2026-07-28 server sends them only on a
    /// `subscriptions/listen` stream, which this opens; an older one on its
    /// own). An agent on 2026-07-28 hears them on its own stream. Returns
    /// once the stream is open (a change after the child's first use is
    /// never missed); the forwarding ends with the child's transport.
    pub(super) async fn pass_on_list_changes(&self, server: &str, child: &Arc<Session>) {
        use rmcp::model::ServerNotification as N;
        // Children start on first use, after the agent's handshake.
        let Some(agent) = self
            .agent
            .peer()
            .filter(|agent| {
                agent.peer_info().is_some_and(|info| {
                    info.protocol_version < rmcp::model::ProtocolVersion::V_2026_07_28
                })
            })
            .cloned()
        else {
            return;
        };
        let filter = rmcp::model::SubscriptionFilter::builder()
            .prompts_list_changed()
            .resources_list_changed()
            .build();
        let mut listening = match child.listen(filter).await {
            Ok(listening) => listening,
            Err(error) => {
                tracing::debug!(%server, %error, "list changes not taken for an older agent");
                return;
            }
        };
        let server = server.to_owned();
        tokio::spawn(async move {
            while let Some(notice) = listening.next().await {
                let passed = match notice {
                    N::PromptListChangedNotification(_) => agent.notify_prompt_list_changed().await,
                    N::ResourceListChangedNotification(_) => {
                        agent.notify_resource_list_changed().await
                    }
                    _ => Ok(()),
                };
                if let Err(error) = passed {
                    tracing::debug!(%server, %error, "passing a list change to the agent");
                }
            }
        });
    }

    /// Says that `server` could not start where this session's agent and
    /// its operator see it: the audit log, and the agent (a log
    /// notification). Each failed start is told; a failure seen again while
    /// the server is held back, once a session.
    pub(super) fn tell_not_started(&self, server: &str, error: &CallError, failure: &StartFailure) {
        let retry_in = failure.retry_in();
        let _ = self.audit(Event::ServerStartFailed {
            session: self.id.clone(),
            server: server.to_owned(),
            attempts: failure.attempts,
            outcome: outcome_of(error),
        });
        if let Some(seen) = failure.seen.clone() {
            let _ = self.audit(Event::SandboxRefused {
                session: self.id.clone(),
                server: server.to_owned(),
                during: "start".to_owned(),
                kind: seen.kind.to_owned(),
                subject: seen.subject,
            });
        }
        if let Some(agent) = self.agent.peer().cloned() {
            let message = format!(
                "moat: server `{server}` could not start, so its tools are left out (tried again in {} s): {}",
                retry_in.as_secs().max(1),
                failure.reason
            );
            tokio::spawn(async move {
                #[allow(deprecated, reason = "agents before 2026-07-28 read log notifications")]
                let sent = agent
                    .notify_logging_message(
                        rmcp::model::LoggingMessageNotificationParam::new(
                            rmcp::model::LoggingLevel::Error,
                            message.into(),
                        )
                        .with_logger("moat"),
                    )
                    .await;
                if let Err(error) = sent {
                    tracing::debug!(%error, "telling the agent of a failed start");
                }
            });
        }
    }
}

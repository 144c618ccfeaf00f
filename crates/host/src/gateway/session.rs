//! One agent session: its state, grouped by the stage that owns each part
//! (children, admission, tasks, parked calls, subscriptions, the agent),
//! how it opens, and how it closes (drain, cancel, stop every child).

use super::Gateway;
use super::agent::AgentLink;
use super::calls::{Admission, CANCEL_GRACE, InFlight, Ticket};
use super::children::{Child, ChildSet};
use super::generation::Generation;
use super::parked::Parked;
use super::record::{evidence_of, session_outcome, unaudited};
use super::subscriptions::Resources;
use super::tasks::Tasks;
use crate::audit::{AuditError, Event, Outcome};
use crate::session::SessionError;
use rmcp::model::ErrorData;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// One agent session and the children it started. Clones share the
/// session; when the last clone is dropped without [`SessionState::close`]
/// (an HTTP session that ended, say), the session is closed in the
/// background.
#[derive(Clone)]
pub struct AgentSession {
    pub(super) state: Arc<SessionState>,
    #[allow(dead_code, reason = "held for its Drop")]
    pub(super) close_on_drop: Arc<CloseOnDrop>,
}

impl std::ops::Deref for AgentSession {
    type Target = SessionState;
    fn deref(&self) -> &SessionState {
        &self.state
    }
}

/// Closes the session when the last [`AgentSession`] handle goes.
pub(super) struct CloseOnDrop(Arc<SessionState>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        if self.0.closed.load(Ordering::SeqCst) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let state = self.0.clone();
            runtime.spawn(async move {
                for (server, error) in state.close().await {
                    tracing::error!(session = %state.id, %server, %error, "closing a dropped session");
                }
            });
        }
    }
}

/// The state of one agent session.
pub struct SessionState {
    pub(super) id: String,
    pub(super) gateway: Gateway,
    /// The configuration this session began in, kept until it ends.
    pub(super) generation: Arc<Generation>,
    pub(super) children: ChildSet,
    /// Which server lists each resource, and the agent's subscriptions.
    pub(super) resources: Resources,
    /// The tasks made of this session's calls.
    pub(super) tasks: Tasks,
    /// Calls to servers before 2026-07-28 waiting for the agent's input,
    /// by the `requestState` the agent got.
    pub(super) parked: Arc<std::sync::Mutex<BTreeMap<String, Parked>>>,
    /// The calls admitted and not yet finished.
    pub(super) admission: Admission,
    /// The agent, once initialized, and its listening streams: told when
    /// a server's tools change.
    pub(super) agent: AgentLink,
    /// Set by the first close; later ones return at once.
    pub(super) closed: Arc<std::sync::atomic::AtomicBool>,
    /// What the session's claim will say, when the gateway signs claims.
    pub(super) ledger: std::sync::Mutex<Option<crate::claim::Ledger>>,
}

/// Hands memory freed by closed sessions back to the system. glibc's
/// allocator keeps freed heap pages for reuse, so after a burst of sessions
/// (a flood of abandoned HTTP sessions, say) the process would stay at its
/// peak. Trimming walks every arena, so a burst of closes is trimmed once,
/// a second after the first of them.
pub(super) fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static PENDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if PENDING.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            PENDING.store(false, Ordering::SeqCst);
            return;
        };
        runtime.spawn(async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            PENDING.store(false, Ordering::SeqCst);
            // SAFETY: malloc_trim only releases free memory at the top of,
            // and inside, the allocator's arenas; it touches no live
            // allocation.
            unsafe {
                libc::malloc_trim(0);
            }
        });
    }
}

impl Gateway {
    /// A new agent session (one per agent connection), in the current
    /// generation.
    pub fn session(&self) -> AgentSession {
        let id = format!("s{}", self.sessions.fetch_add(1, Ordering::SeqCst) + 1);
        let ledger = self.claims().map(|_| crate::claim::Ledger::new(&id));
        let generation = self.current();
        #[cfg(unix)]
        let egress = crate::egress::Pool::new(
            generation.config.serve.egress_connections_per_session.get(),
            "session",
        );
        let state = Arc::new(SessionState {
            id,
            gateway: self.clone(),
            generation,
            children: ChildSet::new(
                #[cfg(unix)]
                egress,
            ),
            resources: Resources::default(),
            tasks: Tasks::default(),
            parked: Arc::default(),
            admission: Admission::new(),
            agent: AgentLink::default(),
            closed: Arc::default(),
            ledger: std::sync::Mutex::new(ledger),
        });
        {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            live.retain(|s| s.strong_count() > 0);
            live.push(Arc::downgrade(&state));
        }
        let session = AgentSession {
            close_on_drop: Arc::new(CloseOnDrop(state.clone())),
            state,
        };
        let _ = session.audit(Event::SessionOpen {
            session: session.id.clone(),
        });
        session
    }
}

impl SessionState {
    /// The session's id, as audited.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Records `event`. A log that cannot be written fails closed at the
    /// next admission (see [`AgentSession::admit`]) and for the tool call
    /// being recorded (see [`AgentSession::call_rounds`]).
    pub(super) fn audit(&self, event: Event) -> Result<(), AuditError> {
        // No claims signed, no ledger (one is only made when claims are):
        // the call path takes no lock for it.
        if self.gateway.claims().is_none() {
            return self.gateway.record(&event);
        }
        // The ledger is held across the write, so it sees the session's
        // events in the log's order (its head is the last it saw).
        let mut ledger = self.ledger();
        let written = self.gateway.record_line(&event);
        if let Some(ledger) = ledger.as_mut() {
            ledger.observe(&event, &written);
        }
        written.map(drop)
    }

    /// The session's ledger (see [`crate::claim::Ledger`]), when claims
    /// are signed.
    pub(super) fn ledger(&self) -> std::sync::MutexGuard<'_, Option<crate::claim::Ledger>> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Signs the session's claim and puts it where the gateway's claims go.
    /// An incomplete record (`failures`: children that could not be closed;
    /// an audit write that failed) is written unsigned, with its reasons.
    fn place_claim(&self, failures: &[(String, SessionError)]) {
        let (Some(claims), Some(mut ledger)) = (self.gateway.claims(), self.ledger().take()) else {
            return;
        };
        for (server, error) in failures {
            ledger.incomplete(format!("server `{server}` could not be closed: {error}"));
        }
        let signed = ledger.finish().sign(&claims.key);
        let placed = match &claims.place {
            crate::claim::Place::Dir(dir) => {
                signed.write_to(dir).map(|path| path.display().to_string())
            }
            crate::claim::Place::AuditLog => self
                .gateway
                .record(&Event::Claim {
                    session: self.id.clone(),
                    claim: serde_json::to_value(&signed).unwrap_or_default(),
                })
                .map(|()| "the audit log".to_owned())
                .map_err(crate::claim::ClaimError::from),
        };
        match placed {
            Ok(place) => {
                tracing::debug!(session = %self.id, signed = signed.signature.is_some(), %place, "claim written")
            }
            Err(error) => {
                tracing::error!(session = %self.id, %error, "the session's claim could not be written")
            }
        }
    }

    /// Closes the session: refuses new calls, lets in-flight calls finish
    /// for up to the drain timeout (`[serve] drain_timeout_ms`), cancels the
    /// rest, then stops every child. Reports the children that failed to
    /// close (and calls that outlived even their cancellation).
    pub async fn close(&self) -> Vec<(String, SessionError)> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Vec::new();
        }
        self.admission.closing().cancel();
        // Calls waiting for input that will never come: their children close below.
        self.parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let drain = Duration::from_millis(self.generation.config.serve.drain_timeout_ms);
        let mut failures = Vec::new();
        if let Some(left) = self.admission.close(&self.id, drain).await {
            failures.push((
                "*".to_owned(),
                SessionError::Protocol {
                    server: "*".to_owned(),
                    operation: "close".into(),
                    detail: format!(
                        "{left} calls still running {CANCEL_GRACE:?} after cancellation"
                    ),
                },
            ));
        }
        for (
            server,
            Child {
                identity,
                session: child,
            },
        ) in self.children.take_all().await.into_named()
        {
            let evidence = evidence_of(&child);
            let outcome = match Arc::try_unwrap(child) {
                Ok(child) => child.close().await.err(),
                Err(_) => Some(SessionError::Protocol {
                    server: server.clone(),
                    operation: "close".into(),
                    detail: "still in use by a call that outlived its cancellation".into(),
                }),
            };
            let _ = self.audit(Event::ServerExit {
                session: self.id.clone(),
                server: server.clone(),
                identity: identity.to_string(),
                evidence,
                outcome: outcome
                    .as_ref()
                    .map_or_else(|| Outcome::plain("closed"), session_outcome),
            });
            if let Some(error) = outcome {
                failures.push((server, error));
            }
        }
        let _ = self.audit(Event::SessionClose {
            session: self.id.clone(),
            outcome: if failures.is_empty() {
                "closed".into()
            } else {
                format!("{} servers failed to close", failures.len())
            },
        });
        self.place_claim(&failures);
        return_freed_memory();
        failures
    }
}

impl SessionState {
    /// Admits one call (see [`Admission::admit`]); refused too once the
    /// audit log has failed (a log that cannot be written fails closed).
    pub(super) fn admit(&self, ticket: Option<Ticket>) -> Result<InFlight<'_>, ErrorData> {
        let admitted = self.admission.admit(&self.id, ticket)?;
        if let Some(error) = self.gateway.audit_failure() {
            return Err(unaudited(&error));
        }
        Ok(admitted)
    }
}

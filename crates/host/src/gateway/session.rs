//! One agent session: its state, grouped by the stage that owns each part
//! (children, admission, tasks, parked calls, subscriptions, the agent),
//! how it opens, and how it closes (drain, cancel, stop every child).

use super::*;

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
    pub(super) children: Arc<Mutex<Children>>,
    pub(super) restarts: Arc<Mutex<BTreeMap<String, u32>>>,
    /// One launch slot per configured server: a start or a restart backoff
    /// holds its server's slot only, never `children`, so a slow start
    /// never stalls the session's calls to other servers.
    pub(super) slots: Arc<std::sync::Mutex<BTreeMap<String, Arc<Mutex<()>>>>>,
    pub(super) resource_owners: Arc<Mutex<BTreeMap<String, String>>>,
    /// Tasks servers made of this session's calls, by the id the agent
    /// knows them by.
    pub(super) tasks: std::sync::Mutex<BTreeMap<String, IssuedTask>>,
    /// Tasks Moat made of this session's calls (`[serve] task_after_ms`),
    /// by the id the agent knows them by.
    pub(super) own_tasks: std::sync::Mutex<BTreeMap<String, Arc<OwnTask>>>,
    /// Calls to servers before 2026-07-28 waiting for the agent's input,
    /// by the `requestState` the agent got.
    pub(super) parked: Arc<std::sync::Mutex<BTreeMap<String, Parked>>>,
    /// Resources an agent before 2026-07-28 subscribed to, each ended by
    /// its token.
    pub(super) subscriptions: std::sync::Mutex<BTreeMap<String, Subscribed>>,
    /// Set when close begins: no new calls are admitted.
    pub(super) closing: CancellationToken,
    /// Set when the drain timeout passes: in-flight calls are cancelled.
    pub(super) cancel_calls: CancellationToken,
    /// Calls admitted and not yet finished.
    pub(super) in_flight: Arc<watch::Sender<usize>>,
    /// The tool calls among them, each with what it calls: a revocation
    /// drains and cancels those it names.
    pub(super) calls: std::sync::Mutex<Calls>,
    /// The agent, once initialized: told when a server's tools change.
    pub(super) agent: Arc<OnceLock<Peer<RoleServer>>>,
    /// The agent's open `subscriptions/listen` streams (2026-07-28): told
    /// when a server's tools change, as `agent` is.
    pub(super) listeners: Arc<std::sync::Mutex<Vec<rmcp::service::SubscriptionSink>>>,
    /// Set by the first close; later ones return at once.
    pub(super) closed: Arc<std::sync::atomic::AtomicBool>,
    /// Servers this session has told the agent (and the audit log) could
    /// not start, while held back: once each, not at every listing.
    pub(super) told_not_started: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Servers held back that a task of this session tries again when
    /// their next try is due, telling the agent its tools changed once one
    /// starts (an agent that keeps its tool list would not see it else).
    pub(super) retrying: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// The egress connections its native servers may hold at once, all
    /// together (`[serve] egress_connections_per_session`).
    #[cfg(unix)]
    pub(super) egress: crate::egress::Pool,
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
        let generation = self.current();
        #[cfg(unix)]
        let egress = crate::egress::Pool::new(
            generation.config.serve.egress_connections_per_session.get(),
            "session",
        );
        let state = Arc::new(SessionState {
            id,
            #[cfg(unix)]
            egress,
            gateway: self.clone(),
            generation,
            children: Arc::default(),
            restarts: Arc::default(),
            slots: Arc::default(),
            resource_owners: Arc::default(),
            tasks: std::sync::Mutex::default(),
            own_tasks: std::sync::Mutex::default(),
            parked: Arc::default(),
            subscriptions: std::sync::Mutex::default(),
            closing: CancellationToken::new(),
            cancel_calls: CancellationToken::new(),
            in_flight: Arc::new(watch::Sender::new(0)),
            calls: std::sync::Mutex::default(),
            agent: Arc::default(),
            listeners: Arc::default(),
            closed: Arc::default(),
            told_not_started: std::sync::Mutex::default(),
            retrying: std::sync::Mutex::default(),
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
        self.gateway.record(&event)
    }

    /// Closes the session: refuses new calls, lets in-flight calls finish
    /// for up to the drain timeout (`[serve] drain_timeout_ms`), cancels the
    /// rest, then stops every child. Reports the children that failed to
    /// close (and calls that outlived even their cancellation).
    pub async fn close(&self) -> Vec<(String, ClientError)> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Vec::new();
        }
        self.closing.cancel();
        // Calls waiting for input that will never come: their children close below.
        self.parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let drain = Duration::from_millis(self.generation.config.serve.drain_timeout_ms);
        let mut in_flight = self.in_flight.subscribe();
        let mut failures = Vec::new();
        let drained = tokio::time::timeout(drain, in_flight.wait_for(|n| *n == 0))
            .await
            .is_ok();
        if !drained {
            let left = *in_flight.borrow();
            tracing::warn!(session = %self.id, calls = left, ?drain, "drain timeout: cancelling in-flight calls");
            self.cancel_calls.cancel();
            if tokio::time::timeout(CANCEL_GRACE, in_flight.wait_for(|n| *n == 0))
                .await
                .is_err()
            {
                failures.push((
                    "*".to_owned(),
                    ClientError::Protocol {
                        server: "*".to_owned(),
                        operation: "close".into(),
                        detail: format!(
                            "{} calls still running {CANCEL_GRACE:?} after cancellation",
                            *in_flight.borrow()
                        ),
                    },
                ));
            }
        }
        let children = std::mem::take(&mut *self.children.lock().await);
        for (
            key,
            Child {
                identity,
                session: child,
            },
        ) in children.by_key
        {
            let server = children
                .by_server
                .iter()
                .filter(|(_, k)| **k == key)
                .map(|(name, _)| name.as_str())
                .collect::<Vec<_>>()
                .join(",");
            let evidence = evidence_of(&child);
            let outcome = match Arc::try_unwrap(child) {
                Ok(child) => child.close().await.err(),
                Err(_) => Some(ClientError::Protocol {
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
                    .map_or_else(|| Outcome::plain("closed"), outcome_of),
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
        return_freed_memory();
        failures
    }
}

impl AgentSession {
    /// Tells the agent (and its 2026-07-28 subscriptions) that the tool
    /// list changed, because of `server`.
    pub(super) async fn tell_tools_changed(&self, server: &str) {
        if let Some(agent) = self.agent.get()
            && let Err(error) = agent.notify_tool_list_changed().await
        {
            tracing::debug!(%server, %error, "telling the agent its tools changed");
        }
        let sinks = self
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for sink in sinks {
            if sink.accepted().tools_list_changed == Some(true) {
                let changed = rmcp::model::ServerNotification::ToolListChangedNotification(
                    Default::default(),
                );
                if let Err(error) = sink.send(changed).await {
                    tracing::debug!(%server, %error, "telling a subscription its tools changed");
                }
            }
        }
    }
}

//! Stopping a session's child that has sat idle for its server's
//! `idle_stop_ms` (off by default): one watcher task per child started with
//! it, which wakes when the child could first have been idle that long,
//! stops it if it was (recorded as its exit, outcome `idle`), and ends with
//! the child or the session. The next use starts the server afresh, through
//! the usual start; an idle session then holds no instance.

use std::sync::Arc;
use std::time::Duration;

use super::children::{Child, Idle};
use super::record::evidence_of;
use super::session::{AgentSession, SessionState, return_freed_memory};
use crate::audit::{Event, Outcome};
use crate::identity::Digest;
use crate::session::Session;

impl AgentSession {
    /// Watches `child`, just adopted for `server` under process `key`, and
    /// stops it once it has been idle for `idle`. Holds neither the child
    /// nor the session: a closed session or a child gone another way
    /// (crash, revocation, reload) ends the watch.
    pub(super) fn stop_when_idle(
        &self,
        server: &str,
        key: Digest,
        child: &Arc<Session>,
        idle: Duration,
    ) {
        let state = Arc::downgrade(&self.state);
        let watched = Arc::downgrade(child);
        let server = server.to_owned();
        tokio::spawn(async move {
            let mut due = tokio::time::Instant::now() + idle;
            loop {
                tokio::time::sleep_until(due).await;
                let (Some(state), Some(child)) = (state.upgrade(), watched.upgrade()) else {
                    return;
                };
                let idled = state
                    .children
                    .stop_if_idle(&key, &child, idle, |name| state.has_task_on(name))
                    .await;
                drop(child);
                match idled {
                    Idle::Gone => return,
                    Idle::NotYet(next) => {
                        due = next.unwrap_or_else(|| tokio::time::Instant::now() + idle);
                    }
                    Idle::Stopped(names, stopped) => {
                        tracing::debug!(%server, served = %names, ?idle, "stopping an idle server");
                        stop(&state, names, stopped).await;
                        return;
                    }
                }
            }
        });
    }
}

/// Closes a child taken off its names for being idle, and records its
/// exit.
async fn stop(state: &SessionState, names: String, child: Child) {
    let Child { identity, session } = child;
    let evidence = evidence_of(&session);
    match Arc::try_unwrap(session) {
        Ok(session) => {
            // It is stopped either way; how its close went is the log's.
            if let Err(error) = session.close().await {
                tracing::warn!(session = %state.id, server = %names, %error, "closing an idle server");
            }
        }
        // Nobody else held it when it was taken off its names, and nobody
        // can have found it since; should that ever not hold, its service
        // ends, which stops the instance in the background.
        Err(shared) => shared.stop(),
    }
    let _ = state.audit(Event::ServerExit {
        session: state.id.clone(),
        server: names,
        identity: identity.to_string(),
        evidence,
        outcome: Outcome::plain("idle"),
    });
    // What the instance held goes back to the system, as at a session's
    // close: an idle session is to cost only what it still holds.
    return_freed_memory();
}

impl SessionState {
    /// Whether a task `server` made of one of this session's calls is
    /// still known to the session (its agent may yet ask for it).
    pub(super) fn has_task_on(&self, server: &str) -> bool {
        self.tasks
            .issued
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .any(|task| task.server == server)
    }
}

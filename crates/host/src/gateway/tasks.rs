//! Tasks: those servers make of an agent's calls (handed on under the id
//! the agent knows) and Moat's own (`[serve] task_after_ms`): a call run
//! apart from its request, adopted as a task, found again by its id, held
//! for a stateless request. The state machine of one task of Moat's is
//! `own_task.rs`.

use super::call::CallRequest;
use super::own_task;
use super::own_task::OwnTask;
use super::record::to_error;
use super::session::AgentSession;
use crate::config::SEPARATOR;
use crate::session::Session;
use rmcp::model::{CallToolResponse, ErrorData};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The tasks made of one session's calls, by the id the agent knows them
/// by.
#[derive(Default)]
pub(super) struct Tasks {
    /// Tasks servers made.
    pub(super) issued: std::sync::Mutex<BTreeMap<String, IssuedTask>>,
    /// Tasks Moat made (`[serve] task_after_ms`).
    pub(super) own: std::sync::Mutex<BTreeMap<String, Arc<OwnTask>>>,
}

/// A task a server made of an agent's call. The agent knows it as
/// `server__id`: two servers' ids never collide, and a session finds only
/// the tasks of its own calls.
pub(super) struct IssuedTask {
    pub(super) server: String,
    pub(super) tool: String,
    pub(super) task_id: String,
}

/// What a task id names (see [`AgentSession::resolve_task`]).
pub(super) enum TaskAt {
    /// A task of Moat's, in the session that runs it.
    Own(AgentSession, Arc<OwnTask>),
    /// A server's task, as the given session knows it.
    Server(AgentSession, String),
}

/// A round's answer for the request that began it, which waits for it:
/// the request's cancellation (`cancel`) cancels the round.
pub(super) async fn in_place(
    round: &mut tokio::task::JoinHandle<Result<CallToolResponse, ErrorData>>,
    cancel: &CancellationToken,
    round_cancel: &CancellationToken,
) -> Result<CallToolResponse, ErrorData> {
    tokio::select! {
        done = &mut *round => joined(done),
        () = cancel.cancelled() => {
            round_cancel.cancel();
            joined(round.await)
        }
    }
}

/// A round's answer, once its task has joined: a panic in it is the
/// gateway's own error, never the end of the session.
pub(super) fn joined(
    done: Result<Result<CallToolResponse, ErrorData>, tokio::task::JoinError>,
) -> Result<CallToolResponse, ErrorData> {
    done.unwrap_or_else(|error| {
        Err(ErrorData::internal_error(
            format!("a call run apart from its request ended abnormally: {error}"),
            None,
        ))
    })
}

/// How long a task handed out by a stateless request is kept at most (the
/// server's `ttlMs`, when it says, if shorter).
pub(super) const HELD_TASK_TTL: Duration = Duration::from_secs(3600);

/// How long a held task stays once its agent has seen it end (to read its
/// result again).
pub(super) const HELD_AFTER_END: Duration = Duration::from_secs(60);

impl AgentSession {
    /// Calls `tool` on `server` as [`AgentSession::call_rounds`] does, for
    /// an agent that takes tasks, and makes a task of Moat's of the call if
    /// it is still running `after` it began (`[serve] task_after_ms`): the
    /// agent gets the task at once and the call runs on. A task its server
    /// makes is handed on as ever, or, made later, reached under Moat's id;
    /// a request for input leaves Moat's task `input_required` until
    /// `tasks/update` brings the answers (see [`OwnTask`]).
    pub(super) async fn call_or_own_task(
        &self,
        request: CallRequest,
        after: Duration,
    ) -> Result<CallToolResponse, ErrorData> {
        let round_cancel = CancellationToken::new();
        let (server, tool, arguments) = (
            request.server.clone(),
            request.tool.clone(),
            request.arguments.clone(),
        );
        let (cancel, held) = (request.cancel.clone(), request.takes.held);
        let mut round = self.spawn_round(CallRequest {
            cancel: round_cancel.clone(),
            agent: None,
            ..request
        });
        tokio::select! {
            done = in_place(&mut round, &cancel, &round_cancel) => return done,
            () = tokio::time::sleep(after) => {}
        }
        if !self.room_for_a_task() {
            // No room for another task: the call is answered in place.
            return in_place(&mut round, &cancel, &round_cancel).await;
        }
        let (id, own) = self.adopt_round(&server, &tool, arguments, round, round_cancel, held);
        Ok(CallToolResponse::Task(rmcp::model::CreateTaskResult::new(
            own.task(&id),
        )))
    }

    /// Whether this session has room for another task of Moat's (see
    /// [`own_task::make_room`]).
    pub(super) fn room_for_a_task(&self) -> bool {
        own_task::make_room(&mut self.tasks.own.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Makes a task of Moat's of `round` (a call to `server`'s `tool`
    /// under `cancel`), and returns the id the agent knows it by. On a
    /// connection that ends with the request (`held` false), the session is
    /// held for it.
    pub(super) fn adopt_round(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<rmcp::model::JsonObject>,
        round: tokio::task::JoinHandle<Result<CallToolResponse, ErrorData>>,
        cancel: CancellationToken,
        held: bool,
    ) -> (String, Arc<OwnTask>) {
        let own = Arc::new(OwnTask::new(server, tool, arguments, cancel));
        // Unguessable in every session: over stateless HTTP the id is the
        // capability that finds the task, and a server's own task ids
        // (`server__id`) never meet it.
        let id = format!("{server}{SEPARATOR}{}", self.gateway.capability());
        // Room was made for it before its round began.
        self.tasks
            .own
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), own.clone());
        if !held {
            self.gateway.hold(id.clone(), self.clone(), own_task::KEPT);
        }
        self.settle_round(own.clone(), round);
        (id, own)
    }

    /// One round of a call, run apart from the request that began it: the
    /// call itself, or a retry with the agent's answers. `agent` is asked
    /// for input on the server's behalf when it is on a revision that is
    /// asked with requests of its own.
    pub(super) fn spawn_round(
        &self,
        request: CallRequest,
    ) -> tokio::task::JoinHandle<Result<CallToolResponse, ErrorData>> {
        let session = self.clone();
        tokio::spawn(async move { session.call_rounds(request).await })
    }

    /// Records in `own` how `round` ends, when it does.
    pub(super) fn settle_round(
        &self,
        own: Arc<OwnTask>,
        round: tokio::task::JoinHandle<Result<CallToolResponse, ErrorData>>,
    ) {
        // The parked calls, not the session: a round's end keeps nothing
        // alive.
        let parked = Arc::downgrade(&self.parked);
        let gateway = self.gateway.clone();
        tokio::spawn(async move {
            let Some(state) = own.settle(joined(round.await)) else {
                return;
            };
            // Cancelled while it was asking: nobody takes it up.
            drop(gateway.release(&state));
            let parked = parked
                .upgrade()
                .and_then(|all| all.lock().unwrap_or_else(|e| e.into_inner()).remove(&state));
            if let Some(parked) = parked {
                parked.abandon().await;
            }
        });
    }

    /// The task of Moat's the agent calls `id`, and the session it runs in
    /// (this one, or the one a stateless request left held under `id`).
    pub(super) fn own_task(&self, id: &str) -> Option<(AgentSession, Arc<OwnTask>)> {
        let here = |session: &AgentSession| {
            let tasks = session.tasks.own.lock().unwrap_or_else(|e| e.into_inner());
            tasks.get(id).cloned()
        };
        if let Some(own) = here(self) {
            return Some((self.clone(), own));
        }
        let holder = self.gateway.held(id)?;
        here(&holder).map(|own| (holder, own))
    }

    /// What a request naming a task `id` that this session does not know
    /// is told: by name, when another replica issued it.
    pub(super) fn unknown_task(&self, id: &str) -> ErrorData {
        let told = self
            .gateway
            .misrouted("task", id)
            .unwrap_or_else(|| format!("no task {id:?} in this session"));
        ErrorData::invalid_params(told, None)
    }

    /// Where `tasks/get`, `tasks/update` and `tasks/cancel` for `id` go: a
    /// task of Moat's, or a server's task in the session that knows it
    /// (a task of Moat's that the server's own task took over is the
    /// server's).
    pub(super) fn resolve_task(&self, id: &str) -> TaskAt {
        match self.own_task(id) {
            Some((holder, own)) => match own.delegate() {
                Some(delegate) => TaskAt::Server(holder, delegate),
                None => TaskAt::Own(holder, own),
            },
            None => TaskAt::Server(self.clone(), id.to_owned()),
        }
    }

    /// Lets the session held for task `id` (over stateless HTTP) go a
    /// while after its agent has seen it end or cancelled it.
    pub(super) fn release_task(&self, id: &str) {
        if self.gateway.held(id).is_some() {
            self.gateway.release_after(id.to_owned(), HELD_AFTER_END);
        }
    }

    /// Hands a task that `server` made of a call to `tool` on to the agent,
    /// under the id the agent will know it by.
    ///
    /// On a connection that ends with the request (`held` false: stateless
    /// HTTP), the task's id is a capability, `server__` and 128 random
    /// bits, and the session is kept for it (see [`Gateway::hold`]): a
    /// later request that names the id finds the task wherever it comes
    /// from, and nobody finds it without.
    pub(super) fn issue_task(
        &self,
        server: &str,
        tool: &str,
        mut created: rmcp::model::CreateTaskResult,
        held: bool,
    ) -> rmcp::model::CreateTaskResult {
        let exposed = if held {
            format!("{server}{SEPARATOR}{}", created.task.task_id)
        } else {
            let kept = created.task.ttl_ms.map_or(HELD_TASK_TTL, |ms| {
                Duration::from_millis(ms).min(HELD_TASK_TTL)
            });
            let exposed = format!("{server}{SEPARATOR}{}", self.gateway.capability());
            self.gateway.hold(exposed.clone(), self.clone(), kept);
            exposed
        };
        let task_id = std::mem::replace(&mut created.task.task_id, exposed.clone());
        self.tasks
            .issued
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                exposed,
                IssuedTask {
                    server: server.to_owned(),
                    tool: tool.to_owned(),
                    task_id,
                },
            );
        created
    }

    /// The server, tool and server's id of the task the agent calls
    /// `exposed`, if a call of this session made it (or of the session a
    /// stateless request left held under that id); and the server's child,
    /// unless what the lock or a revocation refuses. The held session is
    /// looked up once: an id held for something else (a parked call's
    /// `requestState`) names no task.
    pub(super) async fn task_child(
        &self,
        exposed: &str,
    ) -> Result<(Arc<Session>, String, String), ErrorData> {
        let issued = |session: &AgentSession| {
            let tasks = session
                .tasks
                .issued
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            tasks
                .get(exposed)
                .map(|task| (task.server.clone(), task.tool.clone(), task.task_id.clone()))
        };
        let found = match issued(self) {
            Some(found) => Some((self.clone(), found)),
            None => self
                .gateway
                .held(exposed)
                .and_then(|holder| issued(&holder).map(|found| (holder, found))),
        };
        let Some((holder, (server, tool, task_id))) = found else {
            return Err(self.unknown_task(exposed));
        };
        holder.gate(&server, Some(&tool))?;
        let child = holder.child(&server).await.map_err(to_error)?;
        let child = holder.gate_child(&server, Some(&tool), child).await?;
        Ok((child, tool, task_id))
    }
}

//! Tasks of Moat's own (`[serve] task_after_ms`): a tool call of an agent
//! that declared the tasks extension which is still running after that
//! long is handed to the agent as a task, whatever its server's revision,
//! and runs on in the background. This module owns a task's state between
//! its rounds: what `tasks/get` shows, what `tasks/update` resumes and what
//! `tasks/cancel` stops. Running a round (a call, or a retry with the
//! agent's answers) is the gateway's: the call path is the same as for a
//! call answered in place, audit and limits included.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rmcp::ErrorData;
use rmcp::model::{
    CallToolResponse, DetailedTask, GetTaskResult, InputResponses, JsonObject, Task, TaskPayload,
    TaskStatus,
};
use tokio_util::sync::CancellationToken;

/// How long a task's result is kept for the agent to read once the task
/// ended, and what its `ttlMs` says (the held session of a stateless
/// request is let go by then too).
pub(super) const KEPT: Duration = Duration::from_secs(3600);

/// The `pollIntervalMs` a task of Moat's suggests: a round's end is seen
/// within this, without a poll per millisecond.
const POLL_INTERVAL_MS: u64 = 100;

/// One task of Moat's: the call it runs and where it stands.
pub(super) struct OwnTask {
    pub(super) server: String,
    pub(super) tool: String,
    /// The call's arguments, sent again with a retry's answers.
    pub(super) arguments: Option<JsonObject>,
    created_at: String,
    state: Mutex<State>,
    /// Woken at every change of state (`tasks/result` waits for the end).
    changed: tokio::sync::Notify,
}

struct State {
    payload: TaskPayload,
    updated_at: String,
    /// The `requestState` of the round that asked for input, for the
    /// retry that `tasks/update` starts.
    request_state: Option<String>,
    /// Cancels the round under way.
    cancel: CancellationToken,
    cancel_requested: bool,
    ended: Option<Instant>,
    /// The id of the task the server itself made of a round, once it did:
    /// from then on the task is the server's, reached under Moat's id.
    delegate: Option<String>,
}

/// What `tasks/update` starts: the next round, with the agent's answers.
pub(super) struct Resume {
    pub(super) input_responses: InputResponses,
    pub(super) request_state: Option<String>,
    pub(super) cancel: CancellationToken,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A JSON object of `value` (a result or an error), as a task carries it.
fn object(value: impl serde::Serialize) -> JsonObject {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(object)) => object,
        Ok(other) => JsonObject::from_iter([("value".to_owned(), other)]),
        Err(error) => JsonObject::from_iter([(
            "message".to_owned(),
            serde_json::Value::String(error.to_string()),
        )]),
    }
}

impl OwnTask {
    /// A task of a call to `server`'s `tool` whose first round runs under
    /// `cancel`.
    pub(super) fn new(
        server: &str,
        tool: &str,
        arguments: Option<JsonObject>,
        cancel: CancellationToken,
    ) -> Self {
        let created_at = now();
        Self {
            server: server.to_owned(),
            tool: tool.to_owned(),
            arguments,
            state: Mutex::new(State {
                payload: TaskPayload::Working,
                updated_at: created_at.clone(),
                request_state: None,
                cancel,
                cancel_requested: false,
                ended: None,
                delegate: None,
            }),
            created_at,
            changed: tokio::sync::Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The task as the agent knows it, under `id`.
    pub(super) fn task(&self, id: &str) -> Task {
        let state = self.state();
        Task::new(
            id,
            state.payload.status(),
            self.created_at.clone(),
            state.updated_at.clone(),
        )
        .with_ttl_ms(KEPT.as_millis() as u64)
        .with_poll_interval_ms(POLL_INTERVAL_MS)
    }

    /// `tasks/get`: the task under `id`, with its result, error or request
    /// for input when it has one.
    pub(super) fn get(&self, id: &str) -> GetTaskResult {
        let task = self.task(id);
        GetTaskResult::new(DetailedTask::new(task, self.state().payload.clone()))
    }

    /// The id (as the session knows it) of the server's own task this one
    /// became, if it did.
    pub(super) fn delegate(&self) -> Option<String> {
        self.state().delegate.clone()
    }

    /// Where the task stands: its result, error or request for input.
    pub(super) fn payload(&self) -> TaskPayload {
        self.state().payload.clone()
    }

    /// Returns once the task has ended.
    pub(super) async fn until_ended(&self) {
        loop {
            let notified = self.changed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.ended() {
                return;
            }
            notified.await;
        }
    }

    /// Whether the task has ended.
    pub(super) fn ended(&self) -> bool {
        self.state().payload.status().is_terminal()
    }

    /// Whether it ended longer than [`KEPT`] ago (then it is forgotten).
    pub(super) fn expired(&self) -> bool {
        self.state()
            .ended
            .is_some_and(|ended| ended.elapsed() > KEPT)
    }

    /// When it ended, if it has.
    fn ended_at(&self) -> Option<Instant> {
        self.state().ended
    }

    /// Records how a round ended. A round that asked for input leaves the
    /// task waiting for `tasks/update`; one that failed after a cancel
    /// request leaves it cancelled. Returns the `requestState` of a parked
    /// call nobody will take up any more (a cancel came while it was
    /// asking), for the caller to let go of.
    pub(super) fn settle(&self, done: Result<CallToolResponse, ErrorData>) -> Option<String> {
        let abandoned = self.settle_state(done);
        self.changed.notify_waiters();
        abandoned
    }

    fn settle_state(&self, done: Result<CallToolResponse, ErrorData>) -> Option<String> {
        let mut state = self.state();
        let mut abandoned = None;
        state.payload = match done {
            Ok(CallToolResponse::InputRequired(asked)) if state.cancel_requested => {
                abandoned = asked.request_state;
                TaskPayload::Cancelled
            }
            Ok(CallToolResponse::InputRequired(asked)) => {
                state.request_state = asked.request_state;
                TaskPayload::InputRequired {
                    input_requests: asked.input_requests.unwrap_or_default(),
                }
            }
            Ok(CallToolResponse::Complete(mut result)) => {
                super::call::complete(&mut result.result_type);
                TaskPayload::Completed {
                    result: object(result),
                }
            }
            // The server made a task of its own after all: the agent
            // follows that one under Moat's id.
            Ok(CallToolResponse::Task(created)) => {
                state.delegate = Some(created.task.task_id);
                TaskPayload::Working
            }
            Err(_) if state.cancel_requested => TaskPayload::Cancelled,
            Err(error) => TaskPayload::Failed {
                error: object(error),
            },
            Ok(_) => TaskPayload::Failed {
                error: object(ErrorData::internal_error(
                    "a round of a task of Moat's answered in a shape Moat does not know",
                    None,
                )),
            },
        };
        state.updated_at = now();
        if state.payload.status().is_terminal() {
            state.ended = Some(Instant::now());
        }
        abandoned
    }

    /// `tasks/update` on `id`: the next round's answers and state, once the
    /// task is waiting for input.
    pub(super) fn resume(&self, id: &str, answers: InputResponses) -> Result<Resume, ErrorData> {
        let mut state = self.state();
        if state.payload.status() != TaskStatus::InputRequired {
            return Err(ErrorData::invalid_params(
                format!(
                    "task {id:?} is not waiting for input (it is {})",
                    status_name(state.payload.status())
                ),
                None,
            ));
        }
        state.payload = TaskPayload::Working;
        state.updated_at = now();
        state.cancel = CancellationToken::new();
        Ok(Resume {
            input_responses: answers,
            request_state: state.request_state.take(),
            cancel: state.cancel.clone(),
        })
    }

    /// `tasks/cancel`: the round under way is cancelled (the task ends
    /// `cancelled` unless the call had finished anyway); a task waiting for
    /// input ends at once, and the `requestState` of its parked call is
    /// returned for the caller to let go of.
    pub(super) fn cancel(&self) -> Option<String> {
        let parked = self.cancel_state();
        self.changed.notify_waiters();
        parked
    }

    fn cancel_state(&self) -> Option<String> {
        let mut state = self.state();
        if state.payload.status().is_terminal() {
            return None;
        }
        state.cancel_requested = true;
        state.cancel.cancel();
        if state.payload.status() != TaskStatus::InputRequired {
            return None;
        }
        state.payload = TaskPayload::Cancelled;
        state.updated_at = now();
        state.ended = Some(Instant::now());
        state.request_state.take()
    }
}

/// Tasks of Moat's one session keeps at most, running or ended: each holds
/// its result, so an agent that makes task after task and never reads
/// them cannot grow Moat without bound.
pub(super) const MAX_KEPT: usize = 256;

/// Makes room in a session's tasks for one more: the expired ones go, and
/// at [`MAX_KEPT`] the one that ended first; `false` when every task kept
/// is still running.
pub(super) fn make_room<K: Ord + Clone>(
    tasks: &mut std::collections::BTreeMap<K, std::sync::Arc<OwnTask>>,
) -> bool {
    tasks.retain(|_, task| !task.expired());
    if tasks.len() < MAX_KEPT {
        return true;
    }
    let oldest = tasks
        .iter()
        .filter_map(|(id, task)| Some((task.ended_at()?, id.clone())))
        .min();
    match oldest {
        Some((_, id)) => {
            tasks.remove(&id);
            true
        }
        None => false,
    }
}

fn status_name(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Working => "working",
        TaskStatus::InputRequired => "input_required",
        TaskStatus::Completed => "completed",
        TaskStatus::Failed => "failed",
        TaskStatus::Cancelled => "cancelled",
        _ => "in another state",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolResult, InputRequests, InputRequiredResult};

    fn task() -> OwnTask {
        OwnTask::new("a", "job", None, CancellationToken::new())
    }

    #[test]
    fn a_round_that_asks_waits_for_update_and_a_cancel_then_ends_it_at_once() {
        let own = task();
        assert_eq!(own.get("a__1").task.status(), TaskStatus::Working);
        let Err(refused) = own.resume("a__1", InputResponses::new()) else {
            panic!("resumed a working task")
        };
        assert!(
            refused
                .message
                .contains("task \"a__1\" is not waiting for input (it is working)"),
            "{refused:?}"
        );
        let asked =
            InputRequiredResult::new(Some(InputRequests::new()), Some("moat-parked:1".into()));
        assert_eq!(own.settle(Ok(CallToolResponse::InputRequired(asked))), None);
        assert_eq!(own.get("a__1").task.status(), TaskStatus::InputRequired);
        let resume = own.resume("a__1", InputResponses::new()).unwrap();
        assert_eq!(resume.request_state.as_deref(), Some("moat-parked:1"));
        assert_eq!(own.get("a__1").task.status(), TaskStatus::Working);
        let asked =
            InputRequiredResult::new(Some(InputRequests::new()), Some("moat-parked:2".into()));
        own.settle(Ok(CallToolResponse::InputRequired(asked)));
        assert_eq!(own.cancel().as_deref(), Some("moat-parked:2"));
        assert_eq!(own.get("a__1").task.status(), TaskStatus::Cancelled);
        assert!(own.ended() && !own.expired());
        assert_eq!(own.cancel(), None, "an ended task stays as it ended");
    }

    #[test]
    fn a_cancel_ends_a_failing_round_cancelled_and_a_finished_one_completed() {
        let own = task();
        let cancel = own.state().cancel.clone();
        own.cancel();
        assert!(cancel.is_cancelled(), "the round is cancelled");
        own.settle(Err(ErrorData::internal_error("cancelled", None)));
        assert_eq!(own.get("a__1").task.status(), TaskStatus::Cancelled);

        let own = task();
        own.cancel();
        own.settle(Ok(CallToolResponse::Complete(CallToolResult::success(
            vec![],
        ))));
        let got = serde_json::to_value(own.get("a__1")).unwrap();
        assert_eq!(got["status"], "completed", "{got}");
        assert_eq!(got["result"]["resultType"], "complete", "{got}");

        let own = task();
        own.settle(Err(ErrorData::invalid_params("bad", None)));
        let got = serde_json::to_value(own.get("a__1")).unwrap();
        assert_eq!(got["status"], "failed", "{got}");
        assert_eq!(got["error"]["code"], -32602, "{got}");
        assert_eq!(got["ttlMs"], 3_600_000, "{got}");
    }

    #[test]
    fn a_full_session_forgets_the_task_that_ended_first_and_refuses_when_all_run() {
        let mut tasks = std::collections::BTreeMap::new();
        for n in 0..MAX_KEPT {
            tasks.insert(n, std::sync::Arc::new(task()));
        }
        assert!(!make_room(&mut tasks), "every one still running");
        tasks[&7].settle(Err(ErrorData::internal_error("x", None)));
        tasks[&3].settle(Err(ErrorData::internal_error("y", None)));
        assert!(make_room(&mut tasks));
        assert!(
            !tasks.contains_key(&7) && tasks.contains_key(&3),
            "the first to end"
        );
        assert_eq!(tasks.len(), MAX_KEPT - 1);
    }
}

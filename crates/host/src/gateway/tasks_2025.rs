//! The task requests of 2025-11-25 (`tasks/get`, `tasks/result`,
//! `tasks/list`, `tasks/cancel`, and `tools/call` as a task), which an
//! agent on that revision sends as custom requests: answered from the
//! tasks of Moat's own that this session holds.

use super::call::{CallRequest, Takes};
use super::calls::CANCEL_GRACE;
use super::own_task;
use super::own_task::OwnTask;
use super::session::AgentSession;
use crate::session::Retry;
use rmcp::RoleServer;
use rmcp::model::{CallToolRequestParams, ErrorData};
use rmcp::service::RequestContext;
use tokio_util::sync::CancellationToken;

impl AgentSession {
    pub(super) async fn tasks_2025(
        &self,
        request: rmcp::model::CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        let Some(method) = request
            .method
            .strip_prefix(crate::tasks_2025::METHOD_PREFIX)
        else {
            return Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                request.method,
                None,
            ));
        };
        let _in_flight = self.admit(None)?;
        let params = request.params.unwrap_or_default();
        let found = |params: &serde_json::Value| {
            let id = params
                .get("taskId")
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| {
                    ErrorData::invalid_params(format!("{method}: `taskId` is required"), None)
                })?;
            self.own_task(id)
                .map(|(holder, own)| (id.to_owned(), holder, own))
                .ok_or_else(|| self.unknown_task(id))
        };
        let worded = |id: &str, own: &OwnTask| crate::tasks_2025::task(&own.task(id));
        let answer = match method {
            "tools/call" => {
                let call: CallToolRequestParams =
                    serde_json::from_value(params).map_err(|error| {
                        ErrorData::invalid_params(format!("tools/call: {error}"), None)
                    })?;
                let (server, tool) = self.route_tool(&call.name)?;
                if !self.room_for_a_task() {
                    return Err(ErrorData::invalid_request(
                        format!(
                            "this session has {} tasks running: no room for another until one ends",
                            own_task::MAX_KEPT
                        ),
                        None,
                    ));
                }
                let cancel = CancellationToken::new();
                let round = self.spawn_round(CallRequest {
                    server: server.to_owned(),
                    tool: tool.to_owned(),
                    arguments: call.arguments.clone(),
                    progress: None,
                    cancel: cancel.clone(),
                    traceparent: context.meta.get_traceparent().map(str::to_owned),
                    retry: Retry::default(),
                    takes: Takes::default(),
                    agent: Some(context.peer.clone()),
                });
                let (id, own) = self.adopt_round(server, tool, call.arguments, round, cancel, true);
                serde_json::json!({"task": worded(&id, &own)})
            }
            "tasks/get" => {
                let (id, _, own) = found(&params)?;
                worded(&id, &own)
            }
            "tasks/result" => {
                let (id, _, own) = found(&params)?;
                tokio::select! {
                    () = own.until_ended() => {}
                    () = context.ct.cancelled() => {
                        return Err(ErrorData::internal_error(format!("tasks/result for {id:?} was cancelled"), None));
                    }
                }
                match own.payload() {
                    rmcp::model::TaskPayload::Completed { mut result } => {
                        let related = serde_json::json!({"io.modelcontextprotocol/related-task": {"taskId": id}});
                        result.insert("_meta".to_owned(), related);
                        serde_json::Value::Object(result)
                    }
                    rmcp::model::TaskPayload::Failed { error } => {
                        return Err(serde_json::from_value(serde_json::Value::Object(error))
                            .unwrap_or_else(|_| {
                                ErrorData::internal_error(format!("task {id:?} failed"), None)
                            }));
                    }
                    _ => {
                        return Err(ErrorData::invalid_params(
                            format!("task {id:?} was cancelled: it has no result"),
                            None,
                        ));
                    }
                }
            }
            "tasks/list" => {
                let tasks: Vec<_> = self
                    .tasks
                    .own
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .filter(|(_, own)| !own.expired())
                    .map(|(id, own)| worded(id, own))
                    .collect();
                serde_json::json!({"tasks": tasks})
            }
            "tasks/cancel" => {
                let (id, holder, own) = found(&params)?;
                if own.ended() {
                    return Err(ErrorData::invalid_params(
                        format!("task {id:?} has already ended: it cannot be cancelled"),
                        None,
                    ));
                }
                if let Some(state) = own.cancel() {
                    holder.abandon_parked(&state);
                }
                // Answered as it ended, when that is prompt.
                let _ = tokio::time::timeout(CANCEL_GRACE, own.until_ended()).await;
                worded(&id, &own)
            }
            other => {
                return Err(ErrorData::new(
                    rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                    format!("{other}: not a request of 2025-11-25's tasks"),
                    None,
                ));
            }
        };
        Ok(rmcp::model::CustomResult::new(answer))
    }
}

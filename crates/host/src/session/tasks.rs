//! A server's tasks: get, update, cancel, and following one to its end
//! for an agent that does not take tasks.

use rmcp::model::CallToolResult;
use tokio_util::sync::CancellationToken;

use super::Session;
use super::error::SessionError;

impl Session {
    /// `tasks/get` for task `task_id` of tool `tool` (the call that made
    /// it): a completed task's result is checked as a call's result is.
    pub async fn get_task(
        &self,
        tool: &str,
        task_id: &str,
    ) -> Result<rmcp::model::GetTaskResult, SessionError> {
        let operation = format!("tasks/get `{task_id}`");
        let found = self
            .service
            .get_task(rmcp::model::GetTaskParams::new(task_id))
            .await
            .map_err(|e| self.error(&operation, e))?;
        if let rmcp::model::TaskPayload::Completed { result } = &found.task.payload {
            let result: CallToolResult =
                serde_json::from_value(serde_json::Value::Object(result.clone())).map_err(|e| {
                    SessionError::Protocol {
                        server: self.server().to_owned(),
                        operation: operation.clone(),
                        detail: format!("the completed task's result is not a tool's result: {e}"),
                    }
                })?;
            if let Some(withheld) = self.check_output(tool, &result) {
                return Err(withheld);
            }
        }
        Ok(found)
    }

    /// `tasks/update`: the agent's answers to what task `task_id` asked.
    pub async fn update_task(
        &self,
        task_id: &str,
        input_responses: rmcp::model::InputResponses,
    ) -> Result<(), SessionError> {
        self.service
            .update_task(rmcp::model::UpdateTaskParams::new(task_id, input_responses))
            .await
            .map_err(|e| self.error(&format!("tasks/update `{task_id}`"), e))
    }

    /// `tasks/cancel`: asks the server to stop task `task_id`.
    pub async fn cancel_task(&self, task_id: &str) -> Result<(), SessionError> {
        self.service
            .cancel_task(rmcp::model::CancelTaskParams::new(task_id))
            .await
            .map_err(|e| self.error(&format!("tasks/cancel `{task_id}`"), e))
    }

    /// Polls task `task` (made of a call to `tool`) until it ends, for a
    /// caller that cannot take a task: its result, or the error it failed
    /// with. A task that asks for input is cancelled, as nobody can answer
    /// it; so is one whose caller cancels.
    pub async fn finish_task(
        &self,
        tool: &str,
        task: &rmcp::model::Task,
        cancel: &CancellationToken,
    ) -> Result<CallToolResult, SessionError> {
        use rmcp::model::TaskPayload;
        // The server's hint, kept between 10 ms and a second.
        let interval =
            std::time::Duration::from_millis(task.poll_interval_ms.unwrap_or(100).clamp(10, 1_000));
        loop {
            let found = self.get_task(tool, &task.task_id).await?;
            match found.task.payload {
                TaskPayload::Working => {}
                TaskPayload::Completed { result } => {
                    return serde_json::from_value(serde_json::Value::Object(result)).map_err(
                        |e| SessionError::Protocol {
                            server: self.server().to_owned(),
                            operation: format!("tasks/get `{}`", task.task_id),
                            detail: format!(
                                "the completed task's result is not a tool's result: {e}"
                            ),
                        },
                    );
                }
                TaskPayload::Failed { error } => {
                    return Err(SessionError::Server {
                        server: self.server().to_owned(),
                        operation: format!("task `{}` of tools/call `{tool}`", task.task_id),
                        code: error.get("code").and_then(|c| c.as_i64()).unwrap_or(-32603) as i32,
                        message: error
                            .get("message")
                            .and_then(|m| m.as_str())
                            .unwrap_or("the task failed")
                            .to_owned(),
                    });
                }
                TaskPayload::Cancelled => {
                    return Err(SessionError::Cancelled {
                        server: self.server().to_owned(),
                        tool: tool.to_owned(),
                    });
                }
                TaskPayload::InputRequired { .. } => {
                    let _ = self.cancel_task(&task.task_id).await;
                    return Err(SessionError::InputRequired {
                        server: self.server().to_owned(),
                        tool: tool.to_owned(),
                    });
                }
                _ => {}
            }
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = cancel.cancelled() => {
                    let _ = self.cancel_task(&task.task_id).await;
                    return Err(SessionError::Cancelled {
                        server: self.server().to_owned(),
                        tool: tool.to_owned(),
                    });
                }
            }
        }
    }
}

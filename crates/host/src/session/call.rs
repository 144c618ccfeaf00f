//! One `tools/call` on a session: the pins' check of the arguments, the
//! request with its progress and cancellation, the answer checked against
//! the pinned output schema.

use rmcp::ServiceError;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientRequest, GetMeta, JsonObject, ProgressToken,
    Request, ServerJsonRpcMessage, ServerResult,
};
use tokio_util::sync::CancellationToken;

use super::Session;
use super::client_side::ProgressSender;
use super::error::SessionError;
use crate::policy::ToolStatus;

/// What a server answered a `tools/call` with: 2026-07-28 adds two
/// answers besides a result.
#[derive(Debug)]
pub enum CallAnswer {
    /// The result.
    Complete(CallToolResult),
    /// The server needs the caller's input first: the caller answers the
    /// requests and calls again with [`Retry`].
    InputRequired(rmcp::model::InputRequiredResult),
    /// The server made a task of the call: `tasks/get` follows it.
    Task(rmcp::model::CreateTaskResult),
}

/// What a call again after [`CallAnswer::InputRequired`] carries back to
/// the server: the caller's answers and the state the server asked to get
/// back, as they are.
#[derive(Clone, Debug, Default)]
pub struct Retry {
    pub input_responses: Option<rmcp::model::InputResponses>,
    pub request_state: Option<String>,
}

/// A call's progress route, removed with it.
struct Route<'a> {
    tap: &'a super::client_side::ServerTap,
    token: &'a ProgressToken,
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        self.tap.routes().remove(self.token);
    }
}

impl Session {
    /// Calls tool `name` with `arguments`.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallToolResult, SessionError> {
        self.call_tool_with(name, arguments, None, CancellationToken::new(), None)
            .await
    }

    /// With a lock: the tool must be as pinned and the arguments must fit
    /// its pinned input schema, or the call is refused before it is sent.
    pub(crate) async fn check_call(
        &self,
        name: &str,
        arguments: &Option<JsonObject>,
    ) -> Result<(), SessionError> {
        let (Some(state), Some(reports)) = (&self.pins, self.tool_reports().await?) else {
            return Ok(());
        };
        let status = reports.iter().find(|r| r.name == name).map(|r| &r.status);
        let reason = match status {
            Some(ToolStatus::Pinned { .. }) => None,
            Some(ToolStatus::Drifted { locked, live }) => Some(format!(
                "its definition drifted from the lock (locked {locked}, live {live})"
            )),
            Some(ToolStatus::New { .. }) | None => Some("it is not in the lock".to_owned()),
            Some(ToolStatus::Missing { .. }) => Some("the server no longer lists it".to_owned()),
        };
        if let Some(reason) = reason {
            return Err(SessionError::ToolUnavailable {
                server: self.server().to_owned(),
                tool: name.to_owned(),
                reason,
            });
        }
        let value = serde_json::Value::Object(arguments.clone().unwrap_or_default());
        state
            .pins
            .check_arguments(name, &value)
            .map_err(|violation| SessionError::InvalidArguments {
                server: self.server().to_owned(),
                tool: name.to_owned(),
                violation,
            })
    }

    /// Calls tool `name`, sending its progress notifications to `progress`
    /// and cancelling it on the server (`notifications/cancelled`) when
    /// `cancel` fires.
    pub async fn call_tool_with(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        progress: Option<ProgressSender>,
        cancel: CancellationToken,
        traceparent: Option<String>,
    ) -> Result<CallToolResult, SessionError> {
        let answer = self
            .call_tool_answer(
                name,
                arguments,
                progress,
                cancel.clone(),
                traceparent,
                Retry::default(),
            )
            .await?;
        match answer {
            CallAnswer::Complete(result) => Ok(result),
            CallAnswer::Task(created) => self.finish_task(name, &created.task, &cancel).await,
            CallAnswer::InputRequired(_) => Err(SessionError::InputRequired {
                server: self.server().to_owned(),
                tool: name.to_owned(),
            }),
        }
    }

    /// Calls tool `name` once and returns what the server answered: a
    /// result, a request for input (a multi round-trip request, answered by
    /// calling again with `retry`), or a task it made of the call.
    pub async fn call_tool_answer(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        progress: Option<ProgressSender>,
        cancel: CancellationToken,
        traceparent: Option<String>,
        retry: Retry,
    ) -> Result<CallAnswer, SessionError> {
        use rmcp::model::RequestParamsMeta;
        self.check_call(name, &arguments).await?;
        let operation = format!("tools/call `{name}`");
        let mut params = CallToolRequestParams::new(name.to_owned());
        if let Some(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        params.input_responses = retry.input_responses;
        params.request_state = retry.request_state;
        if let Some(traceparent) = traceparent {
            params.set_traceparent(&traceparent);
        }
        // Past rmcp's client service (see `transport::Direct`): the line
        // rmcp would write, with the `_meta` it would add.
        let mut request = ClientRequest::CallToolRequest(Request::new(params));
        let id = self.direct.next_id();
        let token = ProgressToken(id.clone());
        let meta = request.get_meta_mut();
        if let Some(request_meta) = &self.request_meta {
            request_meta.set_on(meta);
        }
        meta.set_progress_token(token.clone());
        // The route goes with the call, however the call ends (its future
        // dropped too).
        let route = progress.map(|progress| {
            self.tap.routes().insert(token.clone(), progress);
            Route {
                tap: &self.tap,
                token: &token,
            }
        });
        let mut in_flight = match self.direct.send(id, request).await {
            Ok(in_flight) => in_flight,
            Err(_) => return Err(self.error(&operation, ServiceError::TransportClosed)),
        };
        let outcome = tokio::select! {
            answer = in_flight.answer() => Some(answer),
            () = cancel.cancelled() => None,
        };
        drop(route);
        let response = match outcome {
            Some(Some(ServerJsonRpcMessage::Response(response))) => response.result,
            Some(Some(ServerJsonRpcMessage::Error(error))) => {
                return Err(self.error(&operation, ServiceError::McpError(error.error)));
            }
            Some(Some(_)) => return Err(self.error(&operation, ServiceError::UnexpectedResponse)),
            Some(None) => return Err(self.error(&operation, ServiceError::TransportClosed)),
            None => {
                let _ = in_flight
                    .cancel(Some("cancelled by the client".into()))
                    .await;
                return Err(SessionError::Cancelled {
                    server: self.server().to_owned(),
                    tool: name.to_owned(),
                });
            }
        };
        match response {
            ServerResult::CallToolResult(result) => match self.check_output(name, &result) {
                Some(withheld) => Err(withheld),
                None => Ok(CallAnswer::Complete(result)),
            },
            ServerResult::InputRequiredResult(asked) => Ok(CallAnswer::InputRequired(asked)),
            ServerResult::CreateTaskResult(created) => Ok(CallAnswer::Task(created)),
            _ => Err(self.error(&operation, ServiceError::UnexpectedResponse)),
        }
    }

    /// A result's structured content against the tool's pinned output
    /// schema, when a lock pins it: the error that withholds it.
    pub(crate) fn check_output(&self, name: &str, result: &CallToolResult) -> Option<SessionError> {
        let (state, structured) = (self.pins.as_ref()?, result.structured_content.as_ref()?);
        let violation = state.pins.check_output(name, structured).err()?;
        Some(SessionError::InvalidOutput {
            server: self.server().to_owned(),
            tool: name.to_owned(),
            violation,
        })
    }
}

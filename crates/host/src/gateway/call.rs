//! One `tools/call`, from the routed name to the recorded answer: admit,
//! check the gate, get the child, call it (through the bridge for an older
//! server), follow rounds of input, and record the end.

use super::bridge::{INPUT_ROUNDS, ask_agent, can_ask};
use super::calls::Ticket;
use super::parked::PARKED_STATE;
use super::record::{CallRecord, cancelled, to_error, unaudited};
use super::session::AgentSession;
use crate::config::SEPARATOR;
use crate::session::{CallAnswer, ProgressSender, Retry};
use crate::session::{Session, SessionError};
use rmcp::RoleServer;
use rmcp::model::{CallToolRequestParams, CallToolResponse, ErrorData, ProgressNotificationParam};
use rmcp::service::{Peer, RequestContext};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Where a call goes: the server, its tool and the child that runs it.
#[derive(Clone, Copy)]
pub(super) struct Target<'a> {
    pub(super) server: &'a str,
    pub(super) tool: &'a str,
    pub(super) child: &'a Arc<Session>,
}

/// Whether the agent of a request takes requests for input (2026-07-28).
pub(super) fn takes_input(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|version| version >= rmcp::model::ProtocolVersion::V_2026_07_28)
}

/// Marks a server's result as complete when it does not say: a server
/// before 2026-07-28 never does, and an agent on 2026-07-28 is always told
/// (rmcp takes the mark off again for an older agent).
pub(super) fn complete(result_type: &mut Option<rmcp::model::ResultType>) {
    result_type.get_or_insert(rmcp::model::ResultType::COMPLETE);
}

/// One tool call as the agent sent it, routed: what every stage of the
/// call path receives.
pub(super) struct CallRequest {
    pub(super) server: String,
    pub(super) tool: String,
    pub(super) arguments: Option<rmcp::model::JsonObject>,
    /// Where the child's progress goes.
    pub(super) progress: Option<ProgressSender>,
    /// The agent's cancellation of the call.
    pub(super) cancel: CancellationToken,
    /// The agent's `traceparent` (from the request's `_meta`).
    pub(super) traceparent: Option<String>,
    /// The agent's answers to an earlier request for input.
    pub(super) retry: Retry,
    pub(super) takes: Takes,
    /// The agent that called, when it came through a connection (not an
    /// in-process call): asked for input on a server's behalf.
    pub(super) agent: Option<Peer<RoleServer>>,
}

/// What an agent can take in answer to a call besides a result, by its
/// revision and capabilities.
#[derive(Clone, Copy, Debug, Default)]
pub struct Takes {
    /// A task (the agent declared the tasks extension).
    pub tasks: bool,
    /// A request for its input (a multi round-trip request: 2026-07-28).
    pub input: bool,
    /// Its connection outlives the call (stdio, or an HTTP session): a
    /// server's own request for input can wait at the gateway for the
    /// agent's retry (see [`Parked`]).
    pub held: bool,
}

impl AgentSession {
    /// Calls `server__tool` on the right child, audited.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<rmcp::model::JsonObject>,
    ) -> Result<rmcp::model::CallToolResult, ErrorData> {
        self.call_forwarding(name, arguments, None, CancellationToken::new(), None)
            .await
    }

    /// Splits `server__tool` into a configured server and its tool.
    pub(super) fn route_tool<'n>(&self, name: &'n str) -> Result<(&'n str, &'n str), ErrorData> {
        self.split_exposed(name, "tool ", "tools are named server__tool")
    }

    /// Splits `server__name` into a configured server and the name.
    pub(super) fn route<'n>(&self, name: &'n str) -> Result<(&'n str, &'n str), ErrorData> {
        self.split_exposed(name, "", "names are server__name")
    }

    /// Splits an exposed name (of a `kind`, which the errors name, and
    /// whose `rule` they state) into a configured server and the rest.
    fn split_exposed<'n>(
        &self,
        name: &'n str,
        kind: &str,
        rule: &str,
    ) -> Result<(&'n str, &'n str), ErrorData> {
        let (server, rest) = name
            .split_once(SEPARATOR)
            .ok_or_else(|| ErrorData::invalid_params(format!("no {kind}{name:?}: {rule}"), None))?;
        if !self.generation.config.servers.contains_key(server) {
            return Err(ErrorData::invalid_params(
                format!("no server {server:?} behind {kind}{name:?}"),
                None,
            ));
        }
        Ok((server, rest))
    }

    /// Calls `server__tool`, forwarding the child's progress to `progress`
    /// and the agent's cancellation (`cancel`) to the child, in a span of
    /// its own: a child of the agent's `traceparent` (from the request's
    /// `_meta`), which is passed on to the server.
    pub async fn call_forwarding(
        &self,
        name: &str,
        arguments: Option<rmcp::model::JsonObject>,
        progress: Option<ProgressSender>,
        cancel: CancellationToken,
        traceparent: Option<&str>,
    ) -> Result<rmcp::model::CallToolResult, ErrorData> {
        let (server, tool) = self.route_tool(name)?;
        let answer = self
            .call_rounds(CallRequest {
                server: server.to_owned(),
                tool: tool.to_owned(),
                arguments,
                progress,
                cancel,
                traceparent: traceparent.map(str::to_owned),
                retry: Retry::default(),
                takes: Takes::default(),
                agent: None,
            })
            .await?;
        match answer {
            CallToolResponse::Complete(result) => Ok(result),
            _ => Err(ErrorData::internal_error(
                format!(
                    "tool {name:?} answered with a task or a request for input, which this caller cannot take"
                ),
                None,
            )),
        }
    }

    /// Calls `tool` on `server` (routed already) for an agent that can take
    /// what `takes` says: a task or a request for input from the server is
    /// handed on if it can, and otherwise followed to its end (a task) or
    /// refused (input). `retry` carries the agent's answers to an earlier
    /// request for input back to the server, as they are.
    pub(super) async fn call_rounds(
        &self,
        request: CallRequest,
    ) -> Result<CallToolResponse, ErrorData> {
        use tracing::Instrument;
        // Parsed once: an invalid traceparent is neither parent nor passed on.
        let parent = request.traceparent.as_deref().and_then(crate::trace::parse);
        let span =
            crate::trace::call_span(&self.id, &request.server, &request.tool, parent.as_ref());
        let passed_on = crate::trace::passed_on(&span, parent.as_ref());
        // Boxed, as the call within it is: a call's future holds the
        // child's start, the call and the audit, several kilobytes that
        // were copied at every move (into the span, into rmcp's task).
        Box::pin(self.call_in_span(
            CallRequest {
                traceparent: passed_on,
                ..request
            },
            &span,
        ))
        .instrument(span.clone())
        .await
    }

    /// [`AgentSession::call_rounds`] within `span`.
    pub(super) async fn call_in_span(
        &self,
        request: CallRequest,
        span: &tracing::Span,
    ) -> Result<CallToolResponse, ErrorData> {
        let CallRequest {
            server,
            tool,
            arguments,
            progress,
            cancel,
            traceparent,
            retry,
            takes,
            agent,
        } = request;
        let (server, tool) = (server.as_str(), tool.as_str());
        // An agent before 2026-07-28 that can be asked for input: Moat asks
        // it on the server's behalf and calls again, so it keeps the call's
        // arguments for that.
        let agent = agent.filter(|agent| !takes.input && can_ask(agent, None));
        let again = agent.as_ref().map(|_| arguments.clone());
        // Cancelled by the agent, by close once the drain timeout passes, or
        // by a revocation of what it calls; a start still under way is
        // dropped, which leaves nothing running.
        let cancel_call = self.admission.call_token();
        let _in_flight = self.admit(Some(Ticket {
            server: server.to_owned(),
            tool: tool.to_owned(),
            cancel: cancel_call.clone(),
        }))?;
        // Checked once the ticket is registered: a revocation that comes
        // into force after this check finds the call and drains it.
        self.gate(server, Some(tool))?;
        let record = CallRecord::begin(self, server, tool, &arguments);
        // A retry of a call that an earlier stateless request parked: the
        // call runs on in the session held under its state, on that
        // session's instance, and none is started here for it.
        let holder = retry
            .request_state
            .as_deref()
            .filter(|state| state.starts_with(PARKED_STATE))
            .and_then(|state| self.parked_runner(state));
        let runs_in = holder.as_ref().unwrap_or(self);
        let child = tokio::select! {
            child = runs_in.child(server) => child.map_err(to_error)?,
            () = cancel_call.cancelled() => return Err(self.cancellation(server, tool, None, &cancel)),
            () = cancel.cancelled() => return Err(cancelled(server, tool)),
        };
        // The digest it measured may be revoked: then it stops too.
        let child = self.gate_child(server, Some(tool), child).await?;
        // Its launch may be what the log could not record.
        if let Some(error) = self.gateway.audit_failure() {
            return Err(unaudited(&error));
        }
        let fuel_before = child.metrics().fuel_consumed();
        let mut call = Box::pin(async {
            let mut answer = if child.is_current() {
                child
                    .call_tool_answer(
                        tool,
                        arguments,
                        progress.clone(),
                        cancel_call.clone(),
                        traceparent.clone(),
                        retry,
                    )
                    .await?
            } else {
                self.older_answer(
                    Target {
                        server,
                        tool,
                        child: &child,
                    },
                    arguments,
                    progress.clone(),
                    &cancel_call,
                    traceparent.clone(),
                    retry,
                    agent.as_ref(),
                    takes,
                )
                .await?
            };
            let mut rounds = 0;
            while let (CallAnswer::InputRequired(asked), Some(agent)) = (&answer, &agent) {
                let requests = asked.input_requests.clone().unwrap_or_default();
                if rounds == INPUT_ROUNDS || !can_ask(agent, Some(&requests)) {
                    break;
                }
                rounds += 1;
                let retry = Retry {
                    input_responses: Some(
                        ask_agent(agent, server, &format!("tool `{tool}`"), &requests).await?,
                    ),
                    request_state: asked.request_state.clone(),
                };
                answer = child
                    .call_tool_answer(
                        tool,
                        again.clone().flatten(),
                        progress.clone(),
                        cancel_call.clone(),
                        traceparent.clone(),
                        retry,
                    )
                    .await?;
            }
            match answer {
                CallAnswer::Task(created) if takes.tasks => Ok(CallToolResponse::Task(
                    self.issue_task(server, tool, created, takes.held),
                )),
                CallAnswer::Task(created) => child
                    .finish_task(tool, &created.task, &cancel_call)
                    .await
                    .map(CallToolResponse::Complete),
                CallAnswer::InputRequired(asked) if takes.input => {
                    Ok(CallToolResponse::InputRequired(asked))
                }
                CallAnswer::InputRequired(_) => Err(SessionError::InputRequired {
                    server: server.to_owned(),
                    tool: tool.to_owned(),
                }),
                CallAnswer::Complete(result) => Ok(CallToolResponse::Complete(result)),
            }
        });
        let result = loop {
            tokio::select! {
                result = &mut call => break result,
                () = cancel.cancelled(), if !cancel_call.is_cancelled() => cancel_call.cancel(),
            }
        };
        drop(call);
        let result = result.map_err(|error| match error {
            SessionError::Cancelled { .. } if !cancel.is_cancelled() => self
                .revoked_during(server, tool, Some(&child))
                .unwrap_or_else(|| error.into()),
            error => error.into(),
        });
        let fuel = child.metrics().fuel_consumed() - fuel_before;
        record.end(&child, span, fuel, result)
    }
}

impl AgentSession {
    pub(super) async fn call_from_agent(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // The child's progress, renamed to the agent's token and sent on.
        let forwarder = context.meta.get_progress_token().map(|token| {
            let (sender, mut receiver) =
                tokio::sync::mpsc::unbounded_channel::<ProgressNotificationParam>();
            let peer = context.peer.clone();
            let task = tokio::spawn(async move {
                while let Some(note) = receiver.recv().await {
                    let mut forwarded =
                        ProgressNotificationParam::new(token.clone(), note.progress);
                    forwarded.total = note.total;
                    forwarded.message = note.message;
                    if peer.notify_progress(forwarded).await.is_err() {
                        return;
                    }
                }
            });
            (sender, task)
        });
        let (sender, task) = match forwarder {
            Some((sender, task)) => (Some(sender), Some(task)),
            None => (None, None),
        };
        let current = takes_input(&context);
        // Over HTTP, 2026-07-28 has no sessions: each request is a session
        // of its own here, whose children end with it, unless a task it
        // hands out keeps it (`Gateway::hold`).
        let stateless = current && context.extensions.get::<http::request::Parts>().is_some();
        let takes = Takes {
            tasks: context
                .client_capabilities()
                .is_some_and(|capabilities| capabilities.supports_tasks()),
            input: current,
            held: !stateless,
        };
        let (server, tool) = self.route_tool(&request.name)?;
        let retry = Retry {
            input_responses: request.input_responses,
            request_state: request.request_state,
        };
        let after = self.generation.config.serve.task_after_ms;
        let result = match after.filter(|_| takes.tasks) {
            Some(after) => {
                self.call_or_own_task(
                    CallRequest {
                        server: server.to_owned(),
                        tool: tool.to_owned(),
                        arguments: request.arguments,
                        progress: sender,
                        cancel: context.ct.clone(),
                        traceparent: context.meta.get_traceparent().map(str::to_owned),
                        retry,
                        takes,
                        agent: None,
                    },
                    Duration::from_millis(after.get()),
                )
                .await
            }
            None => {
                self.call_rounds(CallRequest {
                    server: server.to_owned(),
                    tool: tool.to_owned(),
                    arguments: request.arguments,
                    progress: sender,
                    cancel: context.ct.clone(),
                    traceparent: context.meta.get_traceparent().map(str::to_owned),
                    retry,
                    takes,
                    agent: Some(context.peer.clone()),
                })
                .await
            }
        };
        if let Some(task) = task {
            // The sender is gone with the call (or with its task, which
            // runs on): the forwarder drains and ends.
            if !matches!(result, Ok(CallToolResponse::Task(_))) {
                let _ = task.await;
            }
        }
        result.map(|mut answer| {
            if let CallToolResponse::Complete(result) = &mut answer {
                complete(&mut result.result_type);
            }
            answer
        })
    }
}

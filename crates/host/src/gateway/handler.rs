//! The agent's side: rmcp's `ServerHandler` for an agent session. Each
//! request is parsed here and handed to one stage of the session.

use super::bridge::{answering, can_ask};
use super::call::{CallRequest, Takes, complete, takes_input};
use super::record::to_error;
use super::session::AgentSession;
use super::tasks::TaskAt;
use crate::session::Retry;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ErrorData, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{RoleServer, ServerHandler};

impl ServerHandler for AgentSession {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_prompts()
                .enable_prompts_list_changed()
                .enable_resources()
                .enable_resources_list_changed()
                .enable_resources_subscribe()
                .enable_tasks()
                .build(),
        )
    }

    /// `subscriptions/listen`: list changes of every server, merged, and a
    /// resource's updates from the server that lists it. A resource is
    /// accepted once the session has listed it (`resources/list` first), so
    /// the agent hears only of what Moat serves it.
    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        let mut accepted = requested.clone();
        let listed = self.resources.owners.try_lock().ok();
        accepted.resource_subscriptions = requested.resource_subscriptions.as_ref().map(|uris| {
            uris.iter()
                .filter(|uri| {
                    listed
                        .as_ref()
                        .is_some_and(|owners| owners.contains_key(*uri))
                })
                .cloned()
                .collect()
        });
        Some(accepted)
    }

    /// `resources/subscribe` (before 2026-07-28): the server that lists the
    /// resource is subscribed to it (with its own `resources/subscribe`,
    /// or a `subscriptions/listen` stream at a 2026-07-28 server), and its
    /// updates reach the agent as `notifications/resources/updated` until
    /// `resources/unsubscribe` or the session's end.
    #[allow(deprecated, reason = "answering the legacy request")]
    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Box::pin(async move { self.subscribe_resource(request, context).await }).await
    }

    #[allow(deprecated, reason = "answering the legacy request")]
    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Box::pin(async move { self.unsubscribe_resource(request, _context).await }).await
    }

    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), ErrorData> {
        Box::pin(async move { self.listen_all(context).await }).await
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        Box::pin(async move {
            let _in_flight = self.admit(None)?;
            let (holder, id) = match self.resolve_task(&request.task_id) {
                TaskAt::Own(_, own) => {
                    if own.ended() {
                        self.release_task(&request.task_id);
                    }
                    return Ok(own.get(&request.task_id));
                }
                TaskAt::Server(holder, id) => (holder, id),
            };
            let (child, tool, task_id) = holder.task_child(&id).await?;
            let mut found = child.get_task(&tool, &task_id).await.map_err(to_error)?;
            if found.task.task.status.is_terminal() {
                self.release_task(&request.task_id);
            }
            // The agent's id for it, whatever the server put there.
            found.task.task.task_id = request.task_id;
            Ok(found)
        })
        .await
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Box::pin(async move {
            let _in_flight = self.admit(None)?;
            let (holder, id) = match self.resolve_task(&request.task_id) {
                TaskAt::Own(holder, own) => {
                    let resume = own.resume(&request.task_id, request.input_responses)?;
                    let round = holder.spawn_round(CallRequest {
                        server: own.server.clone(),
                        tool: own.tool.clone(),
                        arguments: own.arguments.clone(),
                        progress: None,
                        cancel: resume.cancel,
                        traceparent: None,
                        retry: Retry {
                            input_responses: Some(resume.input_responses),
                            request_state: resume.request_state,
                        },
                        takes: Takes {
                            tasks: true,
                            input: true,
                            held: true,
                        },
                        agent: None,
                    });
                    holder.settle_round(own, round);
                    return Ok(());
                }
                TaskAt::Server(holder, id) => (holder, id),
            };
            let (child, _, task_id) = holder.task_child(&id).await?;
            child
                .update_task(&task_id, request.input_responses)
                .await
                .map_err(to_error)
        })
        .await
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Box::pin(async move {
            let _in_flight = self.admit(None)?;
            match self.resolve_task(&request.task_id) {
                TaskAt::Own(holder, own) => {
                    if let Some(state) = own.cancel() {
                        holder.abandon_parked(&state);
                    }
                }
                TaskAt::Server(holder, id) => {
                    let (child, _, task_id) = holder.task_child(&id).await?;
                    child.cancel_task(&task_id).await.map_err(to_error)?;
                }
            }
            self.release_task(&request.task_id);
            Ok(())
        })
        .await
    }

    /// 2025-11-25's task requests, renamed on the way in
    /// ([`crate::tasks_2025`]): a `tools/call` that asks for a task gets a
    /// task of Moat's at once, whatever the server's revision, and
    /// `tasks/get`, `tasks/result`, `tasks/list` and `tasks/cancel` find this
    /// session's tasks.
    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        Box::pin(async move { self.tasks_2025(request, context).await }).await
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.agent.set(context.peer);
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, ErrorData> {
        Box::pin(async move {
            let _in_flight = self.admit(None)?;
            self.prompts()
                .await
                .map(rmcp::model::ListPromptsResult::with_all_items)
                .map_err(to_error)
        })
        .await
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, ErrorData> {
        Box::pin(async move {
            let _in_flight = self.admit(None)?;
            let (server, prompt) = self.route(&request.name)?;
            let child = self.child(server).await.map_err(to_error)?;
            if takes_input(&context) && child.is_current() {
                // The server's request for input goes to the agent as it is,
                // and the agent's retry back to the server.
                let retry = Retry {
                    input_responses: request.input_responses,
                    request_state: request.request_state,
                };
                return match child
                    .get_prompt_once(prompt, request.arguments, retry)
                    .await
                {
                    Ok(rmcp::model::GetPromptResponse::Complete(mut prompt)) => {
                        complete(&mut prompt.result_type);
                        Ok(prompt.into())
                    }
                    other => other.map_err(to_error),
                };
            }
            let subject = format!("prompt `{prompt}`");
            let agent = Some(&context.peer).filter(|agent| can_ask(agent, None));
            answering(
                &child,
                agent,
                &subject,
                child.get_prompt(prompt, request.arguments),
            )
            .await
            .map(|mut prompt| {
                complete(&mut prompt.result_type);
                prompt.into()
            })
            .map_err(to_error)
        })
        .await
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, ErrorData> {
        Box::pin(async move {
            let _in_flight = self.admit(None)?;
            self.resources()
                .await
                .map(rmcp::model::ListResourcesResult::with_all_items)
                .map_err(to_error)
        })
        .await
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, ErrorData> {
        Box::pin(async move {
            let _in_flight = self.admit(None)?;
            let server = self.owner_of(&request.uri).await?;
            let child = self.child(&server).await.map_err(to_error)?;
            if takes_input(&context) && child.is_current() {
                let retry = Retry {
                    input_responses: request.input_responses,
                    request_state: request.request_state,
                };
                return match child.read_resource_once(&request.uri, retry).await {
                    Ok(rmcp::model::ReadResourceResponse::Complete(mut read)) => {
                        complete(&mut read.result_type);
                        Ok(read.into())
                    }
                    other => other.map_err(to_error),
                };
            }
            let subject = format!("resource {}", request.uri);
            let agent = Some(&context.peer).filter(|agent| can_ask(agent, None));
            answering(&child, agent, &subject, child.read_resource(&request.uri))
                .await
                .map(|mut read| {
                    complete(&mut read.result_type);
                    read.into()
                })
                .map_err(to_error)
        })
        .await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Box::pin(async move {
            // Revisions without `initialized` reach the agent through here.
            self.agent.set(context.peer.clone());
            let _in_flight = self.admit(None)?;
            // No `ttlMs` or `cacheScope` of Moat's own: the listing changes with
            // every reload, revocation and list_changed, and hides what they
            // refuse, so rmcp's default for 2026-07-28 (0 ms, private) is the
            // only honest answer, whatever the servers said of theirs.
            self.tools()
                .await
                .map(ListToolsResult::with_all_items)
                .map_err(to_error)
        })
        .await
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Box::pin(async move { self.call_from_agent(request, context).await }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, for one lifetime.
    fn future_size<'a, A, B, F: std::future::Future>(
        _f: impl FnOnce(&'a AgentSession, A, B) -> F,
    ) -> usize {
        std::mem::size_of::<F>()
    }

    /// rmcp spawns a task of `handle_request`'s future for every request
    /// an agent sends, and moves it by value on the way (into the task's
    /// cell, and as it is polled): its size is copied at every request. It
    /// holds the largest of the handlers' futures, so each handler boxes its
    /// own work: 14.7 KB before they did (`list_tools`, `get_prompt`,
    /// `read_resource` and the task requests each held 11-13 KB).
    #[test]
    fn the_future_spawned_for_each_agent_request_holds_no_handlers_work() {
        let request = future_size(<AgentSession as rmcp::Service<RoleServer>>::handle_request);
        assert!(
            request <= 4096,
            "handle_request's future is {request} bytes"
        );
        let handlers = [
            (
                "tools/call",
                future_size(<AgentSession as ServerHandler>::call_tool),
            ),
            (
                "tools/list",
                future_size(<AgentSession as ServerHandler>::list_tools),
            ),
            (
                "prompts/get",
                future_size(<AgentSession as ServerHandler>::get_prompt),
            ),
            (
                "prompts/list",
                future_size(<AgentSession as ServerHandler>::list_prompts),
            ),
            (
                "resources/read",
                future_size(<AgentSession as ServerHandler>::read_resource),
            ),
            (
                "resources/list",
                future_size(<AgentSession as ServerHandler>::list_resources),
            ),
            (
                "tasks/get",
                future_size(<AgentSession as ServerHandler>::get_task),
            ),
            (
                "tasks/update",
                future_size(<AgentSession as ServerHandler>::update_task),
            ),
            (
                "tasks/cancel",
                future_size(<AgentSession as ServerHandler>::cancel_task),
            ),
            (
                "a custom request",
                future_size(<AgentSession as ServerHandler>::on_custom_request),
            ),
        ];
        for (method, size) in handlers {
            assert!(
                size <= 1024,
                "the {method} handler's future is {size} bytes"
            );
        }
    }
}

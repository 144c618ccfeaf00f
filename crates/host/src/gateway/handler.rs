//! The agent's side: rmcp's `ServerHandler` for an agent session. Each
//! request is parsed here and handed to one stage of the session.

use super::*;

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
        let listed = self.resource_owners.try_lock().ok();
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
        let _in_flight = self.admit(None)?;
        let uri = request.uri;
        if self
            .subscriptions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&uri)
        {
            return Ok(());
        }
        let server = self.owner_of(&uri).await?;
        if let Some(error) = self.generation.refusal(&server, None, None) {
            return Err(to_error(error));
        }
        let child = self.child(&server).await.map_err(to_error)?;
        let filter = rmcp::model::SubscriptionFilter::builder()
            .resource_subscription(uri.clone())
            .build();
        let mut listening = child.listen(filter).await.map_err(to_error)?;
        let stop = CancellationToken::new();
        let taken = {
            let mut open = self.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
            let taken = open.contains_key(&uri);
            if !taken {
                open.insert(
                    uri.clone(),
                    Subscribed {
                        stop: stop.clone(),
                        passing: None,
                    },
                );
            }
            taken
        };
        if taken {
            // Subscribed meanwhile by another request of this session.
            listening.cancel().await;
            return Ok(());
        }
        let (agent, closing) = (context.peer, self.closing.clone());
        let passing = tokio::spawn(async move {
            use rmcp::model::ServerNotification as N;
            loop {
                let next = tokio::select! {
                    next = listening.next() => next,
                    () = stop.cancelled() => break,
                    // The server closes with the session: nothing to undo.
                    () = closing.cancelled() => return,
                };
                match next {
                    Some(N::ResourceUpdatedNotification(updated)) => {
                        if let Err(error) = agent.notify_resource_updated(updated.params).await {
                            tracing::debug!(%server, %error, "passing a resource update to the agent");
                        }
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            listening.cancel().await;
        });
        if let Some(open) = self
            .subscriptions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&uri)
        {
            open.passing = Some(passing);
        }
        Ok(())
    }

    #[allow(deprecated, reason = "answering the legacy request")]
    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let _in_flight = self.admit(None)?;
        let open = self
            .subscriptions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&request.uri);
        match open {
            Some(open) => {
                // Answered once the server has let go of it too.
                open.stop.cancel();
                if let Some(passing) = open.passing {
                    let _ = passing.await;
                }
                Ok(())
            }
            None => Err(ErrorData::invalid_params(
                format!("resource {} is not subscribed in this session", request.uri),
                None,
            )),
        }
    }

    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), ErrorData> {
        // In flight until its servers' streams are ended: close waits for
        // that, and ends it.
        let _in_flight = self.admit(None)?;
        let accepted = context.accepted().clone();
        let sink = context.sink().clone();
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(sink.clone());
        // Every server's stream is opened at once: one that is slow to
        // acknowledge (until its deadline) holds back no other.
        let opening = futures::future::join_all(self.listen_filters(&accepted).await.into_iter().map(
            |(server, filter)| async move {
                let child = match self.child(&server).await {
                    Ok(child) => child,
                    Err(error) => {
                        tracing::warn!(%server, %error, "subscriptions/listen: server not started");
                        return None;
                    }
                };
                let uris = filter.resource_subscriptions.clone().unwrap_or_default();
                match child.listen(filter).await {
                    Ok(subscription) => Some((server, uris, subscription)),
                    Err(error) => {
                        // A server that does not take subscriptions: its tool
                        // changes still reach the agent through the pin check.
                        tracing::debug!(%server, %error, "subscriptions/listen not taken");
                        None
                    }
                }
            },
        ));
        let opened = tokio::select! {
            opened = opening => opened,
            () = context.cancelled() => Vec::new(),
            () = self.closing.cancelled() => Vec::new(),
        };
        let stop = CancellationToken::new();
        let mut forwarding = tokio::task::JoinSet::new();
        for (server, uris, mut subscription) in opened.into_iter().flatten() {
            let (sink, stop) = (sink.clone(), stop.clone());
            forwarding.spawn(async move {
                use rmcp::model::ServerNotification as N;
                loop {
                    let next = tokio::select! {
                        next = subscription.next() => next,
                        () = stop.cancelled() => break,
                    };
                    let Some(notification) = next else { return };
                    let pass = match &notification {
                        // Through the pin check first (`pass_on_tool_changes`).
                        N::ToolListChangedNotification(_) => false,
                        N::PromptListChangedNotification(_)
                        | N::ResourceListChangedNotification(_) => true,
                        N::ResourceUpdatedNotification(update) => uris.contains(&update.params.uri),
                        _ => false,
                    };
                    if pass && let Err(error) = sink.send(notification).await {
                        tracing::debug!(%server, %error, "passing a notification to a subscription");
                    }
                }
                subscription.cancel().await;
            });
        }
        // rmcp acknowledges the agent's stream before this runs, so a change
        // between the acknowledgement and the servers' streams opening would
        // be lost: tell the agent that what it listens to may have changed.
        for notification in catch_up(&accepted) {
            if let Err(error) = sink.send(notification).await {
                tracing::debug!(%error, "catching a subscription up");
            }
        }
        tokio::select! {
            () = context.cancelled() => {}
            () = self.closing.cancelled() => {}
        }
        stop.cancel();
        while forwarding.join_next().await.is_some() {}
        let id = sink.id().clone();
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|open| *open.id() != id);
        Ok(())
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
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
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let _in_flight = self.admit(None)?;
        let (holder, id) = match self.resolve_task(&request.task_id) {
            TaskAt::Own(holder, own) => {
                let resume = own.resume(&request.task_id, request.input_responses)?;
                let round = holder.spawn_round(
                    &own.server,
                    &own.tool,
                    own.arguments.clone(),
                    None,
                    resume.cancel,
                    None,
                    Retry {
                        input_responses: Some(resume.input_responses),
                        request_state: resume.request_state,
                    },
                    Takes {
                        tasks: true,
                        input: true,
                        held: true,
                    },
                    None,
                );
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
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
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
                .ok_or_else(|| {
                    ErrorData::invalid_params(format!("no task {id:?} in this session"), None)
                })
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
                let round = self.spawn_round(
                    server,
                    tool,
                    call.arguments.clone(),
                    None,
                    cancel.clone(),
                    context.meta.get_traceparent().map(str::to_owned),
                    Retry::default(),
                    Takes::default(),
                    Some(context.peer.clone()),
                );
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
                    .own_tasks
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

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let _ = self.agent.set(context.peer);
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, ErrorData> {
        let _in_flight = self.admit(None)?;
        self.prompts()
            .await
            .map(rmcp::model::ListPromptsResult::with_all_items)
            .map_err(to_error)
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, ErrorData> {
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
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, ErrorData> {
        let _in_flight = self.admit(None)?;
        self.resources()
            .await
            .map(rmcp::model::ListResourcesResult::with_all_items)
            .map_err(to_error)
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, ErrorData> {
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
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // Revisions without `initialized` reach the agent through here.
        let _ = self.agent.set(context.peer.clone());
        let _in_flight = self.admit(None)?;
        // No `ttlMs` or `cacheScope` of Moat's own: the listing changes with
        // every reload, revocation and list_changed, and hides what they
        // refuse, so rmcp's default for 2026-07-28 (0 ms, private) is the
        // only honest answer, whatever the servers said of theirs.
        self.tools()
            .await
            .map(ListToolsResult::with_all_items)
            .map_err(to_error)
    }

    async fn call_tool(
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
                    server,
                    tool,
                    request.arguments,
                    sender,
                    context.ct.clone(),
                    context.meta.get_traceparent(),
                    retry,
                    takes,
                    Duration::from_millis(after.get()),
                )
                .await
            }
            None => {
                self.call_rounds(
                    server,
                    tool,
                    request.arguments,
                    sender,
                    context.ct.clone(),
                    context.meta.get_traceparent(),
                    retry,
                    takes,
                    Some(context.peer.clone()),
                )
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

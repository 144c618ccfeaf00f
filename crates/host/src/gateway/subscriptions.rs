//! Resource subscriptions: which server owns a resource URI, what each
//! server is asked to listen to for an agent's subscription, and what a
//! subscription that just opened is told.

use super::record::to_error;
use super::session::AgentSession;
use rmcp::RoleServer;
use rmcp::model::ErrorData;
use rmcp::service::RequestContext;
use std::collections::BTreeMap;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// The resources of one session: which server lists each URI (as last
/// listed), and what an agent before 2026-07-28 subscribed to.
#[derive(Default)]
pub(super) struct Resources {
    /// The server that lists each resource URI.
    pub(super) owners: Mutex<BTreeMap<String, String>>,
    /// Resources an agent before 2026-07-28 subscribed to, each ended by
    /// its token.
    pub(super) subscribed: std::sync::Mutex<BTreeMap<String, Subscribed>>,
}

/// What a subscription that just opened is told: every list it listens to
/// and every resource it subscribed to may have changed.
pub(super) fn catch_up(
    accepted: &rmcp::model::SubscriptionFilter,
) -> Vec<rmcp::model::ServerNotification> {
    use rmcp::model::ServerNotification as N;
    let mut notifications = Vec::new();
    if accepted.tools_list_changed == Some(true) {
        notifications.push(N::ToolListChangedNotification(Default::default()));
    }
    if accepted.prompts_list_changed == Some(true) {
        notifications.push(N::PromptListChangedNotification(Default::default()));
    }
    if accepted.resources_list_changed == Some(true) {
        notifications.push(N::ResourceListChangedNotification(Default::default()));
    }
    for uri in accepted.resource_subscriptions.iter().flatten() {
        notifications.push(N::ResourceUpdatedNotification(
            rmcp::model::ResourceUpdatedNotification::new(
                rmcp::model::ResourceUpdatedNotificationParam::new(uri.clone()),
            ),
        ));
    }
    notifications
}

/// A resource an agent before 2026-07-28 subscribed to: the task that
/// passes its updates on, and what ends it.
pub(super) struct Subscribed {
    pub(super) stop: CancellationToken,
    pub(super) passing: Option<tokio::task::JoinHandle<()>>,
}

impl AgentSession {
    /// What to ask each server for on behalf of the agent's `accepted`
    /// subscription: list changes of every kind the agent asked for, and the
    /// resources that server lists. Refused servers are left out.
    pub(super) async fn listen_filters(
        &self,
        accepted: &rmcp::model::SubscriptionFilter,
    ) -> Vec<(String, rmcp::model::SubscriptionFilter)> {
        let owners = self.resources.owners.lock().await.clone();
        let mut filters = Vec::new();
        for server in self.servers() {
            if self.gate(&server, None).is_err() {
                continue;
            }
            let mut filter = accepted.clone();
            let uris: Vec<String> = accepted
                .resource_subscriptions
                .iter()
                .flatten()
                .filter(|uri| owners.get(*uri) == Some(&server))
                .cloned()
                .collect();
            // None rather than an empty list, which a server may refuse.
            filter.resource_subscriptions = (!uris.is_empty()).then_some(uris);
            filters.push((server, filter));
        }
        filters
    }

    /// The server that lists resource `uri` (listing every server's
    /// resources first if this session has not seen it).
    pub(super) async fn owner_of(&self, uri: &str) -> Result<String, ErrorData> {
        if !self.resources.owners.lock().await.contains_key(uri) {
            self.resources().await.map_err(to_error)?;
        }
        let owner = self.resources.owners.lock().await.get(uri).cloned();
        owner.ok_or_else(|| {
            ErrorData::resource_not_found(format!("no server lists resource {uri}"), None)
        })
    }
}

impl AgentSession {
    pub(super) async fn subscribe_resource(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let _in_flight = self.admit(None)?;
        let uri = request.uri;
        if self
            .resources
            .subscribed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&uri)
        {
            return Ok(());
        }
        let server = self.owner_of(&uri).await?;
        self.gate(&server, None)?;
        let child = self.child(&server).await.map_err(to_error)?;
        let filter = rmcp::model::SubscriptionFilter::builder()
            .resource_subscription(uri.clone())
            .build();
        let mut listening = child.listen(filter).await.map_err(to_error)?;
        let stop = CancellationToken::new();
        let taken = {
            let mut open = self
                .resources
                .subscribed
                .lock()
                .unwrap_or_else(|e| e.into_inner());
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
        let (agent, closing) = (context.peer, self.admission.closing().clone());
        // The server is in use for as long as the agent is subscribed: it
        // is not stopped for being idle (`idle_stop_ms`).
        let hold = child.hold();
        let passing = tokio::spawn(async move {
            use rmcp::model::ServerNotification as N;
            let _hold = hold;
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
            .resources
            .subscribed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&uri)
        {
            open.passing = Some(passing);
        }
        Ok(())
    }

    pub(super) async fn unsubscribe_resource(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let _in_flight = self.admit(None)?;
        let open = self
            .resources
            .subscribed
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

    pub(super) async fn listen_all(
        &self,
        context: rmcp::service::SubscriptionContext,
    ) -> Result<(), ErrorData> {
        // In flight until its servers' streams are ended: close waits for
        // that, and ends it.
        let _in_flight = self.admit(None)?;
        let accepted = context.accepted().clone();
        let sink = context.sink().clone();
        self.agent.listening(sink.clone());
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
                    // In use while the agent listens (see `hold`).
                    Ok(subscription) => Some((server, uris, subscription, child.hold())),
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
            () = self.admission.closing().cancelled() => Vec::new(),
        };
        let stop = CancellationToken::new();
        let mut forwarding = tokio::task::JoinSet::new();
        for (server, uris, mut subscription, hold) in opened.into_iter().flatten() {
            let (sink, stop) = (sink.clone(), stop.clone());
            forwarding.spawn(async move {
                use rmcp::model::ServerNotification as N;
                let _hold = hold;
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
            () = self.admission.closing().cancelled() => {}
        }
        stop.cancel();
        while forwarding.join_next().await.is_some() {}
        let id = sink.id().clone();
        self.agent.stopped_listening(&id);
        Ok(())
    }
}

//! Resource subscriptions: which server owns a resource URI, what each
//! server is asked to listen to for an agent's subscription, and what a
//! subscription that just opened is told.

use super::*;

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
        let owners = self.resource_owners.lock().await.clone();
        let mut filters = Vec::new();
        for server in self.servers() {
            if self.generation.refusal(&server, None, None).is_some() {
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
        if !self.resource_owners.lock().await.contains_key(uri) {
            self.resources().await.map_err(to_error)?;
        }
        let owner = self.resource_owners.lock().await.get(uri).cloned();
        owner.ok_or_else(|| {
            ErrorData::resource_not_found(format!("no server lists resource {uri}"), None)
        })
    }
}

//! The agent of one session as the servers' side sees it: its peer, once
//! it has initialized, and its open `subscriptions/listen` streams
//! (2026-07-28), both told when a server's tools change.

use std::sync::{Arc, OnceLock};

use rmcp::RoleServer;
use rmcp::service::{Peer, SubscriptionSink};

/// The agent's peer and its listening streams. Clones share them (a task
/// that passes a child's changes on holds a clone).
#[derive(Clone, Default)]
pub(super) struct AgentLink {
    peer: Arc<OnceLock<Peer<RoleServer>>>,
    listeners: Arc<std::sync::Mutex<Vec<SubscriptionSink>>>,
}

impl AgentLink {
    /// The agent, once initialized (the first of `initialized` and
    /// `tools/list`: some revisions send no `initialized`).
    pub(super) fn peer(&self) -> Option<&Peer<RoleServer>> {
        self.peer.get()
    }

    /// Records the agent; later calls keep the first.
    pub(super) fn set(&self, peer: Peer<RoleServer>) {
        let _ = self.peer.set(peer);
    }

    /// A `subscriptions/listen` stream opened.
    pub(super) fn listening(&self, sink: SubscriptionSink) {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(sink);
    }

    /// The stream `id` ended.
    pub(super) fn stopped_listening(&self, id: &rmcp::model::RequestId) {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|open| open.id() != id);
    }

    /// Tells the agent (and its 2026-07-28 subscriptions that listen to
    /// tools) that the tool list changed, because of `server`.
    pub(super) async fn tell_tools_changed(&self, server: &str) {
        if let Some(agent) = self.peer()
            && let Err(error) = agent.notify_tool_list_changed().await
        {
            tracing::debug!(%server, %error, "telling the agent its tools changed");
        }
        let sinks = self
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for sink in sinks {
            if sink.accepted().tools_list_changed == Some(true) {
                let changed = rmcp::model::ServerNotification::ToolListChangedNotification(
                    Default::default(),
                );
                if let Err(error) = sink.send(changed).await {
                    tracing::debug!(%server, %error, "telling a subscription its tools changed");
                }
            }
        }
    }
}

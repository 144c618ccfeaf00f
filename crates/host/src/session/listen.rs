//! Subscriptions: a `subscriptions/listen` stream on a 2026-07-28 server,
//! and resource subscriptions held for older servers.

use std::sync::Arc;

use super::Session;
use super::client_side::Notice;
use super::error::SessionError;

/// One subscription at one server: see [`Session::listen`].
pub enum Listening {
    /// A `subscriptions/listen` stream (2026-07-28).
    Stream(Box<rmcp::service::Subscription>),
    /// `resources/subscribe` at an older server, and what it sends on its own.
    Notices {
        /// Weak: a subscription never keeps a closing session in use.
        session: std::sync::Weak<Session>,
        filter: rmcp::model::SubscriptionFilter,
        notices: tokio::sync::broadcast::Receiver<Notice>,
    },
}

impl Listening {
    /// The next notification for this subscription; `None` once the server
    /// or the stream has ended.
    pub async fn next(&mut self) -> Option<rmcp::model::ServerNotification> {
        use rmcp::model::ServerNotification as N;
        match self {
            Self::Stream(stream) => stream.next().await.ok().flatten(),
            Self::Notices {
                filter, notices, ..
            } => loop {
                let notice = match notices.recv().await {
                    Ok(notice) => notice,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(
                            missed,
                            "a subscription fell behind its server's notifications"
                        );
                        continue;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                };
                let wanted = match notice.as_ref() {
                    N::PromptListChangedNotification(_) => {
                        filter.prompts_list_changed == Some(true)
                    }
                    N::ResourceListChangedNotification(_) => {
                        filter.resources_list_changed == Some(true)
                    }
                    N::ResourceUpdatedNotification(updated) => filter
                        .resource_subscriptions
                        .as_ref()
                        .is_some_and(|uris| uris.contains(&updated.params.uri)),
                    _ => false,
                };
                if wanted {
                    return Some(Arc::unwrap_or_clone(notice));
                }
            },
        }
    }

    /// Ends the subscription at the server.
    pub async fn cancel(self) {
        match self {
            Self::Stream(mut stream) => {
                let _ = stream.cancel().await;
            }
            Self::Notices {
                session, filter, ..
            } => {
                let Some(session) = session.upgrade() else {
                    return;
                };
                for uri in filter.resource_subscriptions.iter().flatten() {
                    session.unsubscribe_resource(uri).await;
                }
            }
        }
    }
}

impl Session {
    /// Opens a subscription for `filter`: at a 2026-07-28 server a
    /// `subscriptions/listen` stream (a server that does not take them
    /// answers with an error); at an older one, `resources/subscribe` for
    /// each resource in it (once per resource however many subscriptions
    /// of this session name it) and the notifications the server sends on
    /// its own, filtered as the stream's would be.
    pub async fn listen(
        self: &Arc<Self>,
        filter: rmcp::model::SubscriptionFilter,
    ) -> Result<Listening, SessionError> {
        if self.is_current() {
            let stream = self
                .service
                .peer()
                .listen(filter)
                .await
                .map_err(|e| self.error("subscriptions/listen", e))?;
            return Ok(Listening::Stream(Box::new(stream)));
        }
        let notices = self.notices();
        let uris = filter.resource_subscriptions.clone().unwrap_or_default();
        for (at, uri) in uris.iter().enumerate() {
            if let Err(error) = self.subscribe_resource(uri).await {
                for done in &uris[..at] {
                    self.unsubscribe_resource(done).await;
                }
                return Err(error);
            }
        }
        Ok(Listening::Notices {
            session: Arc::downgrade(self),
            filter,
            notices,
        })
    }

    /// `resources/subscribe` for `uri`, unless this session holds it already.
    #[allow(deprecated, reason = "servers before 2026-07-28 subscribe this way")]
    pub(crate) async fn subscribe_resource(&self, uri: &str) -> Result<(), SessionError> {
        let first = {
            let mut held = self.subscribed.lock().unwrap_or_else(|e| e.into_inner());
            let count = held.entry(uri.to_owned()).or_insert(0);
            *count += 1;
            *count == 1
        };
        if !first {
            return Ok(());
        }
        let subscribed = self
            .service
            .peer()
            .subscribe(rmcp::model::SubscribeRequestParams::new(uri))
            .await;
        if let Err(error) = subscribed {
            self.release(uri);
            return Err(self.error(&format!("resources/subscribe {uri}"), error));
        }
        Ok(())
    }

    /// Lets go of one hold on `uri`; returns whether it was the last.
    pub(crate) fn release(&self, uri: &str) -> bool {
        let mut held = self.subscribed.lock().unwrap_or_else(|e| e.into_inner());
        let Some(count) = held.get_mut(uri) else {
            return false;
        };
        *count -= 1;
        let last = *count == 0;
        if last {
            held.remove(uri);
        }
        last
    }

    /// `resources/unsubscribe` for `uri` once no subscription of this
    /// session holds it.
    #[allow(deprecated, reason = "servers before 2026-07-28 subscribe this way")]
    pub(crate) async fn unsubscribe_resource(&self, uri: &str) {
        if !self.release(uri) {
            return;
        }
        let unsubscribed = self
            .service
            .peer()
            .unsubscribe(rmcp::model::UnsubscribeRequestParams::new(uri))
            .await;
        if let Err(error) = unsubscribed {
            tracing::debug!(server = %self.server(), %uri, %error, "resources/unsubscribe");
        }
    }
}

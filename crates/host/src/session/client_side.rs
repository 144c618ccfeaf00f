//! What the server sends the client on its own: progress, its own
//! requests for input (passed to the call in flight), notifications; and
//! the session's tap on the transport, which sees each message in order.

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::ProgressNotificationParam;
use rmcp::service::NotificationContext;
use rmcp::{ClientHandler, RoleClient};
use tokio::sync::mpsc;

use crate::transport::Shared;

/// A request a server made of its client on its own, in a revision before
/// 2026-07-28 (`elicitation/create`, `sampling/createMessage`): given to the
/// call in flight that takes it, whose agent answers.
#[derive(Debug)]
pub struct ServerAsk {
    /// What the server asked, as a 2026-07-28 request for input would carry it.
    pub request: rmcp::model::InputRequest,
    /// The agent's answer (an `ElicitResult`, a `CreateMessageResult`), or
    /// the error the server gets.
    pub answer: tokio::sync::oneshot::Sender<Result<serde_json::Value, rmcp::ErrorData>>,
}

/// The calls in flight that take a server's own requests. A server before
/// 2026-07-28 names no call in its requests, so the earliest call still
/// waiting gets it.
pub(crate) type Askers = Arc<std::sync::Mutex<Vec<mpsc::UnboundedSender<ServerAsk>>>>;

/// How many notifications a slow reader of [`Session::notices`] may fall
/// behind before it misses some (it is told how many it missed).
pub(crate) const NOTICES_BUFFERED: usize = 64;

/// A notification as [`Session::notices`] hands it out: shared, so that
/// the channel's slots, allocated with every server instance, are a
/// pointer each rather than a whole notification.
pub type Notice = Arc<rmcp::model::ServerNotification>;

/// Receives what the server sends the client on its own: progress not
/// routed to a call, its own requests for input, and notifications not
/// routed to a subscription. (Routed progress and word that the tool list
/// changed are caught by the transport, in order.)
pub(crate) struct ClientSide {
    pub(crate) progress: mpsc::UnboundedSender<ProgressNotificationParam>,
    pub(crate) askers: Askers,
    pub(crate) notices: tokio::sync::broadcast::Sender<Notice>,
    pub(crate) shared: Arc<Shared>,
}

impl ClientSide {
    /// Gives `request` to the earliest call in flight that takes it, and
    /// waits for its answer with the server's deadlines held.
    pub(crate) async fn ask(
        &self,
        request: rmcp::model::InputRequest,
        method: &str,
    ) -> Result<serde_json::Value, rmcp::ErrorData> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let mut unsent = Some(ServerAsk { request, answer });
        {
            let mut askers = self.askers.lock().unwrap_or_else(|e| e.into_inner());
            askers.retain(|asker| !asker.is_closed());
            for asker in askers.iter() {
                let Some(ask) = unsent.take() else { break };
                // A call that ended meanwhile hands it back.
                unsent = asker.send(ask).err().map(|returned| returned.0);
            }
        }
        let taken = unsent.is_none();
        if !taken {
            return Err(rmcp::ErrorData::invalid_request(
                format!(
                    "{method} from server `{}` came while no call was in flight: Moat passes a server's requests to the agent of the call they belong to",
                    self.shared.server()
                ),
                None,
            ));
        }
        let _waiting = self.shared.asking_agent();
        answered.await.unwrap_or_else(|_| {
            Err(rmcp::ErrorData::internal_error(
                format!("the call that {method} belonged to ended before the agent answered"),
                None,
            ))
        })
    }
}

/// Where one call's progress notifications go.
pub type ProgressSender = mpsc::UnboundedSender<ProgressNotificationParam>;

/// The session's tap on its transport (see [`crate::transport::Tap`]):
/// sees each message from the server in order, before rmcp and before any
/// later message, so a call's progress is delivered before the answer that
/// follows it and word that the tool list changed never races the answer
/// after it.
#[derive(Debug)]
pub(crate) struct ServerTap {
    /// Progress by token, for the calls in flight that asked for it.
    pub(crate) progress_routes:
        std::sync::Mutex<HashMap<rmcp::model::ProgressToken, ProgressSender>>,
    /// Set by `notifications/tools/list_changed`, cleared when read.
    pub(crate) tools_changed: std::sync::atomic::AtomicBool,
    /// Counts each `notifications/tools/list_changed`.
    pub(crate) tools_changed_events: tokio::sync::watch::Sender<u64>,
}

impl Default for ServerTap {
    fn default() -> Self {
        Self {
            progress_routes: std::sync::Mutex::default(),
            tools_changed: std::sync::atomic::AtomicBool::new(false),
            tools_changed_events: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl ServerTap {
    pub(crate) fn routes(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<rmcp::model::ProgressToken, ProgressSender>> {
        self.progress_routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

impl crate::transport::Tap for ServerTap {
    fn on_message(
        &self,
        message: &rmcp::model::ServerJsonRpcMessage,
        book: &crate::transport::Book,
    ) -> crate::transport::Pass {
        use crate::transport::Pass;
        use rmcp::model::{GetMeta, ServerJsonRpcMessage, ServerNotification};
        let ServerJsonRpcMessage::Notification(notification) = message else {
            return Pass::On;
        };
        match &notification.notification {
            ServerNotification::ToolListChangedNotification(_) => {
                self.tools_changed
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                self.tools_changed_events.send_modify(|n| *n += 1);
                Pass::On
            }
            // A `subscriptions/listen` stream the server acknowledged (its
            // `_meta` names the request) stays open until either side ends
            // it: the per-request deadline no longer applies to it.
            ServerNotification::SubscriptionsAcknowledgedNotification(_) => {
                if let Some(id) = notification.notification.get_meta().subscription_id() {
                    book.lift_deadline(
                        &id,
                        <rmcp::model::SubscriptionsListenRequestMethod as rmcp::model::ConstString>::VALUE,
                    );
                }
                Pass::On
            }
            ServerNotification::ProgressNotification(progress) => {
                let route = self.routes().get(&progress.params.progress_token).cloned();
                match route {
                    Some(route) => {
                        let _ = route.send(progress.params.clone());
                        Pass::Taken
                    }
                    None => Pass::On,
                }
            }
            _ => Pass::On,
        }
    }
}

impl ClientHandler for ClientSide {
    /// Moat takes tasks from every server: it hands a task on to an agent
    /// that takes tasks, and follows it to its end for one that does not.
    /// It takes elicitation and sampling from servers before 2026-07-28 and
    /// passes them to the agent of the call (see [`ServerAsk`]).
    #[allow(
        deprecated,
        reason = "servers before 2026-07-28 sample through their client"
    )]
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut config = rmcp::model::ClientConfig::default();
        config.capabilities = rmcp::model::ClientCapabilities::builder()
            .enable_tasks()
            .enable_elicitation()
            .enable_sampling()
            .build();
        config
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.progress.send(params);
    }

    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        let asked =
            rmcp::model::InputRequest::Elicitation(rmcp::model::ElicitRequest::new(request));
        let answer = self.ask(asked, "elicitation/create").await?;
        serde_json::from_value(answer).map_err(|e| {
            rmcp::ErrorData::internal_error(
                format!(
                    "the agent's answer to elicitation/create is not an elicitation result: {e}"
                ),
                None,
            )
        })
    }

    #[allow(
        deprecated,
        reason = "servers before 2026-07-28 sample through their client"
    )]
    async fn create_message(
        &self,
        params: rmcp::model::CreateMessageRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, rmcp::ErrorData> {
        let asked = rmcp::model::InputRequest::CreateMessage(
            rmcp::model::CreateMessageRequest::new(params),
        );
        let answer = self.ask(asked, "sampling/createMessage").await?;
        serde_json::from_value(answer).map_err(|e| {
            rmcp::ErrorData::internal_error(
                format!("the agent's answer to sampling/createMessage is not a message: {e}"),
                None,
            )
        })
    }

    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.notices.send(Arc::new(
            rmcp::model::ServerNotification::ResourceUpdatedNotification(
                rmcp::model::ResourceUpdatedNotification::new(params),
            ),
        ));
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.notices.send(Arc::new(
            rmcp::model::ServerNotification::ResourceListChangedNotification(Default::default()),
        ));
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.notices.send(Arc::new(
            rmcp::model::ServerNotification::PromptListChangedNotification(Default::default()),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn client_side() -> (ClientSide, Askers) {
        let askers = Askers::default();
        let (progress, _) = mpsc::unbounded_channel();
        let (notices, _) = tokio::sync::broadcast::channel(1);
        let shared = Arc::new(Shared::new("s".into(), &crate::limits::Limits::default()));
        let side = ClientSide {
            progress,
            askers: askers.clone(),
            notices,
            shared,
        };
        (side, askers)
    }

    pub(crate) fn roots() -> rmcp::model::InputRequest {
        rmcp::model::InputRequest::ListRoots(Default::default())
    }

    /// A server's own request with no call in flight to take it is refused
    /// at once, naming the server; one that a call takes waits for its
    /// answer, and a call that ended is passed over.
    #[tokio::test]
    pub(crate) async fn a_servers_request_goes_to_a_call_in_flight_and_else_is_refused_at_once() {
        let (side, askers) = client_side();
        let refused = side.ask(roots(), "roots/list").await.unwrap_err();
        assert_eq!(
            refused.message,
            "roots/list from server `s` came while no call was in flight: Moat passes a server's requests to the agent of the call they belong to"
        );
        let (ended, gone) = mpsc::unbounded_channel();
        drop(gone);
        let (taking, mut taken) = mpsc::unbounded_channel();
        askers.lock().unwrap().extend([ended, taking]);
        let answering = tokio::spawn(async move {
            let ask: ServerAsk = taken.recv().await.unwrap();
            assert!(matches!(
                ask.request,
                rmcp::model::InputRequest::ListRoots(_)
            ));
            ask.answer
                .send(Ok(serde_json::json!({"roots": []})))
                .unwrap();
        });
        let answer = side.ask(roots(), "roots/list").await.unwrap();
        assert_eq!(answer, serde_json::json!({"roots": []}));
        answering.await.unwrap();
        assert_eq!(
            askers.lock().unwrap().len(),
            1,
            "the ended call is forgotten"
        );
    }
}

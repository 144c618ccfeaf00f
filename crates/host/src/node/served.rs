//! One launched server, served to the front that asked for it: an MCP
//! server whose every request goes to the node's own [`Session`] with the
//! profile, so the node's lock applies on the node (tools as pinned there,
//! arguments checked against the pinned schemas) before anything reaches
//! the process. Progress goes back to the front under the front's token; a
//! front's cancel cancels the call on the server.
//!
//! The 2026-07-28 revision has no sessions (each request is served by a
//! handler of its own), so a launch outlives any one MCP session: it ends
//! when the front releases it (`DELETE /launch/ID`, sent when the front's
//! side closes), when nothing asked anything of it for the node's
//! `session_idle_ms` with no request in flight, or when the node stops.
//! Ending it closes the session, which ends the process tree.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ErrorData, GetPromptRequestParams, GetPromptResponse,
    Implementation, ListPromptsResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler};
use tokio_util::sync::CancellationToken;

use crate::session::{Session, SessionError};

/// A launched session while it is held: taken once, by the front's MCP
/// session; closed when that ends, or when the front never comes for it.
pub(super) struct Held {
    pub(super) id: String,
    pub(super) profile: String,
    session: Mutex<Option<Arc<Session>>>,
    /// Removes the launch from the node's table when it ends.
    on_end: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// When a request last came, and how many are being answered.
    last: Mutex<Instant>,
    in_flight: AtomicUsize,
}

/// A request being answered: the launch is not idle while one is.
pub(super) struct Busy<'a>(&'a Held);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Held {
    pub(super) fn new(
        id: String,
        profile: String,
        session: Session,
        on_end: Box<dyn FnOnce() + Send>,
    ) -> Arc<Self> {
        Arc::new(Self {
            id,
            profile,
            session: Mutex::new(Some(Arc::new(session))),
            on_end: Mutex::new(Some(on_end)),
            last: Mutex::new(Instant::now()),
            in_flight: AtomicUsize::new(0),
        })
    }

    fn touch(&self) {
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
    }

    /// Marks a request in flight until the guard drops.
    pub(super) fn busy(&self) -> Busy<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.touch();
        Busy(self)
    }

    /// How long nothing has been asked of the launch, if nothing is in
    /// flight.
    pub(super) fn idle_for(&self) -> Option<std::time::Duration> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(
            self.last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .elapsed(),
        )
    }

    /// Whether the launch has ended.
    pub(super) fn ended(&self) -> bool {
        self.session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none()
    }

    fn session(&self) -> Result<Arc<Session>, ErrorData> {
        self.session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or_else(|| {
                ErrorData::internal_error(
                    format!(
                        "launch `{}` of profile `{}` has ended on this node",
                        self.id, self.profile
                    ),
                    None,
                )
            })
    }

    /// Ends the launch: the session is closed (its process tree ends) once
    /// no request holds it, and the launch leaves the node's table.
    pub(super) fn end(&self, why: &str) {
        let session = self
            .session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let on_end = self
            .on_end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(on_end) = on_end {
            on_end();
        }
        let Some(session) = session else {
            return;
        };
        tracing::info!(launch = %self.id, profile = %self.profile, why, "launch ended");
        // Stopped now, whoever else still holds it: the process tree goes.
        session.stop();
        if let Ok(session) = Arc::try_unwrap(session) {
            tokio::spawn(async move {
                let _ = session.close().await;
            });
        }
    }
}

/// The MCP server the front talks to for one launch (one per request on
/// 2026-07-28, one per MCP session before it).
pub(super) struct Served {
    pub(super) held: Arc<Held>,
    pub(super) node: Arc<super::launch::Node>,
}

impl Served {
    /// The session, unless the profile was revoked on the node since it
    /// was launched: then the launch ends, and the front is told why.
    fn session(&self) -> Result<Arc<Session>, ErrorData> {
        if let Some(revocation) = self.node.revocation_of(&self.held.profile) {
            self.held.end("its profile was revoked");
            return Err(ErrorData::internal_error(
                format!(
                    "profile `{}`: revoked on this node: {revocation}",
                    self.held.profile
                ),
                None,
            ));
        }
        self.held.session()
    }
}

/// The front's error for `error`: invalid params where the front's request
/// was at fault (a tool not as pinned here, arguments outside its schema).
fn to_error(error: SessionError) -> ErrorData {
    match error {
        SessionError::InvalidArguments { .. } | SessionError::ToolUnavailable { .. } => {
            ErrorData::invalid_params(error.to_string(), None)
        }
        _ => ErrorData::internal_error(error.to_string(), None),
    }
}

impl ServerHandler for Served {
    fn get_info(&self) -> ServerConfig {
        let offers = self.held.session().ok();
        let mut capabilities = ServerCapabilities::builder().enable_tools().build();
        if offers.as_ref().is_some_and(|s| s.offers_prompts()) {
            capabilities.prompts = Some(Default::default());
        }
        if offers.as_ref().is_some_and(|s| s.offers_resources()) {
            capabilities.resources = Some(Default::default());
        }
        let mut info = ServerConfig::new(capabilities);
        info.server_info = Implementation::new(
            format!("moat-node/{}", self.held.profile),
            env!("CARGO_PKG_VERSION"),
        );
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let _busy = self.held.busy();
        let session = self.session()?;
        session
            .list_tools()
            .await
            .map(ListToolsResult::with_all_items)
            .map_err(to_error)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let _busy = self.held.busy();
        let session = self.session()?;
        tracing::debug!(launch = %self.held.id, tool = %request.name, "a front's call");
        let progress = context.meta.get_progress_token().map(|token| {
            let (sender, mut receiver) =
                tokio::sync::mpsc::unbounded_channel::<ProgressNotificationParam>();
            let peer = context.peer.clone();
            tokio::spawn(async move {
                while let Some(mut param) = receiver.recv().await {
                    param.progress_token = token.clone();
                    if peer.notify_progress(param).await.is_err() {
                        break;
                    }
                }
            });
            sender
        });
        let cancel: CancellationToken = context.ct.clone();
        session
            .call_tool_with(&request.name, request.arguments, progress, cancel, None)
            .await
            .map(CallToolResponse::Complete)
            .map_err(to_error)
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let _busy = self.held.busy();
        let session = self.session()?;
        session
            .list_prompts()
            .await
            .map(ListPromptsResult::with_all_items)
            .map_err(to_error)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let _busy = self.held.busy();
        let session = self.session()?;
        session
            .get_prompt(&request.name, request.arguments)
            .await
            .map(Into::into)
            .map_err(to_error)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let _busy = self.held.busy();
        let session = self.session()?;
        session
            .list_resources()
            .await
            .map(ListResourcesResult::with_all_items)
            .map_err(to_error)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let _busy = self.held.busy();
        let session = self.session()?;
        session
            .read_resource(&request.uri)
            .await
            .map(Into::into)
            .map_err(to_error)
    }
}

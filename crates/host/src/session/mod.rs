//! One connected session with one server, over the one transport: the
//! handshake, what the server is (its identity, evidence and sandbox
//! report, read from the launch), its fault, and closing it. Errors say
//! what failed: a transport fault (limit, exit, framing) always wins over
//! the generic "transport closed" rmcp would report. What a session does is
//! cut by kind: calls ([`call`]), tasks ([`tasks`]), prompts and resources
//! ([`listings`]), the pinned tools ([`pins`]), subscriptions ([`listen`]),
//! what the server sends on its own ([`client_side`]), and what its
//! stderr says of the sandbox ([`hints`]).

mod call;
mod client_side;
mod error;
mod hints;
mod listen;
mod listings;
mod pins;
mod tasks;

pub use call::{CallAnswer, Retry};
use client_side::{Askers, ClientSide, NOTICES_BUFFERED, ServerTap};
pub use client_side::{Notice, ProgressSender, ServerAsk};
pub use error::SessionError;
pub(crate) use hints::{SeenRefusal, refusal_seen, sandbox_hint};
use listings::ListingState;
use pins::PinState;

use std::sync::Arc;

use rmcp::model::{ClientRequest, ProgressNotificationParam, ProtocolVersion};
use rmcp::service::RunningService;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceError};
use tokio::sync::mpsc;

use crate::config::{ServerKind, ServerSpec};
use crate::identity::Digest;
use crate::launch::ServerTransport;
use crate::lock::{IdentityParts, execution_identity};
use crate::transport::{Direct, Fault, Shared};

/// Which handshake the client uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Handshake {
    /// `server/discover` (2026-07-28), falling back to `initialize` for
    /// servers that report they are legacy.
    #[default]
    Auto,
    /// Only `initialize` (revisions up to 2025-11-25).
    Initialize,
    /// Only `server/discover` (2026-07-28).
    Discover,
}

impl Handshake {
    pub(crate) fn mode(self) -> ClientLifecycleMode {
        match self {
            Self::Initialize => ClientLifecycleMode::Initialize,
            Self::Discover => ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
            Self::Auto => ClientLifecycleMode::Auto {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                legacy_version: Some(ProtocolVersion::V_2025_11_25),
            },
        }
    }
}

/// The parts of a server's execution identity, from its spec and what the
/// launcher measured. Environment names are the configured ones (values and
/// pass-through names alike), whether or not a pass-through is set.
pub(crate) fn identity_parts<'a>(
    spec: &ServerSpec,
    identity: &crate::instance::Identity,
) -> IdentityParts<'a> {
    let (kind, argv0, cwd) = match &spec.kind {
        ServerKind::Wasm { .. } => ("wasm", spec.name.clone(), None),
        ServerKind::Native { command, cwd, .. } => {
            ("native", command.clone(), Some(cwd.display().to_string()))
        }
        ServerKind::Remote { url, .. } => ("remote", url.clone(), None),
        ServerKind::Node { node, .. } => ("node", node.url.clone(), None),
    };
    let mut argv = vec![argv0];
    if let ServerKind::Node {
        node,
        profile,
        revision,
    } = &spec.kind
    {
        argv.extend([
            format!("node={}", node.name),
            format!("profile={profile}"),
            format!("revision={revision}"),
        ]);
    }
    argv.extend(spec.args.iter().cloned());
    let mut env_names: Vec<String> = spec.env.names().map(str::to_owned).collect();
    if let ServerKind::Remote {
        bearer_token_env: Some(var),
        ..
    } = &spec.kind
    {
        env_names.push(var.clone()); // the name, never the token
    }
    if let ServerKind::Node { node, .. } = &spec.kind {
        env_names.push(node.token_env.clone());
    }
    IdentityParts {
        kind,
        sha256: identity.digest,
        argv,
        cwd,
        env_names,
        measured: identity
            .measured
            .iter()
            .map(|(path, digest)| (path.display().to_string(), digest.to_string()))
            .collect(),
        snapshot: identity
            .component
            .as_ref()
            .is_some_and(|c| c.snapshot.is_some()),
    }
}

/// A live session with one server.
pub struct Session {
    pub(crate) service: RunningService<RoleClient, ClientSide>,
    pub(crate) shared: Arc<Shared>,
    /// Sends `tools/call` past rmcp's client service (see
    /// [`crate::transport::Direct`]).
    pub(crate) direct: Direct,
    /// The `_meta` rmcp puts on each request to a server without a
    /// handshake (2026-07-28): the agreed revision, Moat's client info and
    /// capabilities. Put on direct requests the same way.
    pub(crate) request_meta: Option<RequestMeta>,
    pub(crate) tap: Arc<ServerTap>,
    pub(crate) progress: Option<mpsc::UnboundedReceiver<ProgressNotificationParam>>,
    pub(crate) askers: Askers,
    pub(crate) notices: tokio::sync::broadcast::Sender<Notice>,
    /// Resources subscribed at a server before 2026-07-28, with how many
    /// of this session's subscriptions hold each.
    pub(crate) subscribed: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
    pub(crate) pins: Option<PinState>,
    pub(crate) prompt_pins: Option<ListingState>,
    pub(crate) resource_pins: Option<ListingState>,
    /// The execution identity of the server as its spec launched it,
    /// computed once at connect by [`Host::connect_with`].
    pub(crate) execution: Option<Digest>,
    /// How many [`Hold`]s keep the server in use between requests.
    pub(crate) holds: Arc<std::sync::atomic::AtomicUsize>,
}

/// Keeps a server in use while no request is in flight (an agent's open
/// subscription, say): a gateway stops no held server for being idle. See
/// [`Session::hold`].
#[derive(Debug)]
pub struct Hold(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The native launch `spec` describes: its command resolved on PATH, and,
/// for `moat learn`, where the watched run records what it sees.
/// How long a failed handshake waits for the transport to learn why (a
/// server that exited is known a moment after the send that failed).
pub(crate) const HANDSHAKE_SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// Whether the server ran under the native filesystem sandbox.
pub(crate) fn sandboxed(shared: &Shared) -> bool {
    shared
        .identity()
        .is_some_and(|identity| identity.sandbox.kernel_filesystem)
}

/// What rmcp adds to the `_meta` of every request once the server speaks
/// a revision without a handshake (2026-07-28): the revision agreed,
/// Moat's client info and capabilities. Direct requests carry it too.
#[derive(Clone, Debug)]
pub(crate) struct RequestMeta {
    version: ProtocolVersion,
    info: rmcp::model::Implementation,
    capabilities: rmcp::model::ClientCapabilities,
}

impl RequestMeta {
    /// As rmcp's client decides it: by the revision agreed.
    fn of(service: &RunningService<RoleClient, ClientSide>) -> Option<Self> {
        use rmcp::ClientHandler;
        let version = service.peer_info()?.protocol_version.clone();
        if version.has_initialize() {
            return None;
        }
        let info = service.service().get_info();
        Some(Self {
            version,
            info: info.client_info,
            capabilities: info.capabilities,
        })
    }

    /// Sets it on `meta`, in rmcp's order.
    pub(crate) fn set_on(&self, meta: &mut rmcp::model::RequestMetaObject) {
        meta.set_protocol_version(self.version.clone());
        meta.set_client_info(self.info.clone());
        meta.set_client_capabilities(self.capabilities.clone());
    }
}

impl Session {
    /// Connects `transport` (launching the server) and performs `handshake`.
    /// If this future is dropped part-way, the server is stopped and every
    /// task of the transport ends.
    pub async fn connect(
        transport: ServerTransport,
        handshake: Handshake,
    ) -> Result<Self, SessionError> {
        let shared = transport.shared().clone();
        let server = shared.server().to_owned();
        let tap = Arc::new(ServerTap::default());
        transport.set_tap(tap.clone());
        let connected = transport.connect().await?;
        let direct = connected.direct();
        let (progress_tx, progress) = mpsc::unbounded_channel();
        let askers = Askers::default();
        let (notices, _) = tokio::sync::broadcast::channel(NOTICES_BUFFERED);
        let client = ClientSide {
            progress: progress_tx,
            askers: askers.clone(),
            notices: notices.clone(),
            shared: shared.clone(),
        };
        match client
            .serve_with_lifecycle(connected, handshake.mode())
            .await
        {
            Ok(service) => Ok(Self {
                request_meta: RequestMeta::of(&service),
                service,
                shared,
                direct,
                tap,
                progress: Some(progress),
                askers,
                notices,
                subscribed: Default::default(),
                pins: None,
                prompt_pins: None,
                resource_pins: None,
                execution: None,
                holds: Arc::default(),
            }),
            Err(error) => Err(match shared.settled_fault(HANDSHAKE_SETTLE).await {
                Some(fault) if sandboxed(&shared) => sandbox_hint(
                    server,
                    "handshake",
                    fault,
                    &shared
                        .identity()
                        .map(|identity| identity.sandbox.granted)
                        .unwrap_or_default(),
                ),
                Some(fault) => SessionError::Fault {
                    server,
                    operation: "handshake".into(),
                    fault,
                },
                None if matches!(
                    &error,
                    rmcp::service::ClientInitializeError::ExpectedInitResult(Some(
                        rmcp::model::ServerResult::CustomResult(_)
                    ))
                ) =>
                {
                    SessionError::DiscoverUnreadable {
                        server,
                        detail: error.to_string(),
                    }
                }
                None => SessionError::Protocol {
                    server,
                    operation: "handshake".into(),
                    detail: error.to_string(),
                },
            }),
        }
    }

    /// The server's name.
    pub fn server(&self) -> &str {
        self.shared.server()
    }

    /// State shared with the transport, for the crate's own bookkeeping
    /// (a weak handle to learn when the session is gone).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// What was measured about the server, once launched: its digests,
    /// evidence and sandbox report.
    pub fn identity(&self) -> Option<crate::instance::Identity> {
        self.shared.identity()
    }

    /// The fault that ended the session, if one did.
    pub fn fault(&self) -> Option<Fault> {
        self.shared.fault()
    }

    /// The launcher's counters (fuel, memory; zero before launch).
    pub fn metrics(&self) -> Arc<crate::instance::Metrics> {
        self.shared.metrics()
    }

    /// The server's stderr, a bounded rolling buffer.
    pub fn stderr(&self) -> &crate::transport::StderrBuffer {
        self.shared.stderr()
    }

    /// The tasks and instances of the server's transport.
    pub fn tracker(&self) -> &Arc<crate::instance::Tracker> {
        self.shared.tracker()
    }

    /// Requests sent to the server so far.
    pub fn requests_sent(&self) -> u64 {
        self.shared.requests_sent()
    }

    /// Marks the server as in use until the guard drops; it holds only a
    /// counter, never the session.
    pub fn hold(&self) -> Hold {
        self.holds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Hold(self.holds.clone())
    }

    /// Whether a [`Hold`] keeps the server in use.
    pub fn held(&self) -> bool {
        self.holds.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Since when no request has been in flight either way (see
    /// [`crate::transport::Book::quiet_since`]); `None` while one is.
    pub fn quiet_since(&self) -> Option<tokio::time::Instant> {
        self.shared.quiet_since()
    }

    /// Counts each `notifications/tools/list_changed` from the server, for
    /// whoever must pass the news on (after re-checking the pins). Ends
    /// when the session is gone.
    pub fn tools_changed_events(&self) -> tokio::sync::watch::Receiver<u64> {
        self.tap.tools_changed_events.subscribe()
    }

    /// Whether the server announced `notifications/tools/list_changed`
    /// since the last look; clears the flag. Set before any later message
    /// is delivered, so an answer that follows the notification never
    /// races it.
    pub(crate) fn take_tools_changed(&self) -> bool {
        self.tap
            .tools_changed
            .swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// Progress notifications the server sends, in order. Taken once.
    pub fn take_progress(&mut self) -> Option<mpsc::UnboundedReceiver<ProgressNotificationParam>> {
        self.progress.take()
    }

    /// The server's own requests for input (before 2026-07-28) while the
    /// receiver lives: a call in flight takes them, the earliest first.
    pub fn asks(&self) -> mpsc::UnboundedReceiver<ServerAsk> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.askers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(sender);
        receiver
    }

    /// Notifications the server sends outside any `subscriptions/listen`
    /// stream, as servers before 2026-07-28 do: a subscribed resource's
    /// updates, and changes to its prompt and resource lists.
    pub fn notices(&self) -> tokio::sync::broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    /// Whether the server speaks 2026-07-28 or later (else it was met
    /// with `initialize`, and speaks a revision without requests for input,
    /// tasks or `subscriptions/listen`).
    pub fn is_current(&self) -> bool {
        self.service
            .peer_info()
            .is_some_and(|info| info.protocol_version >= ProtocolVersion::V_2026_07_28)
    }

    /// The protocol revision agreed in the handshake.
    pub fn protocol_version(&self) -> Option<String> {
        self.service
            .peer_info()
            .map(|info| info.protocol_version.to_string())
    }

    pub(crate) fn error(&self, operation: &str, error: ServiceError) -> SessionError {
        let server = self.server().to_owned();
        if let Some(fault) = self.shared.fault() {
            // A server that died of a refusal mid-call is told so as at
            // its start: the agent's error carries the same line.
            if sandboxed(&self.shared) {
                let granted = self
                    .shared
                    .identity()
                    .map(|identity| identity.sandbox.granted)
                    .unwrap_or_default();
                return sandbox_hint(server, operation, fault, &granted);
            }
            return SessionError::Fault {
                server,
                operation: operation.to_owned(),
                fault,
            };
        }
        match error {
            ServiceError::McpError(data) => SessionError::Server {
                server,
                operation: operation.to_owned(),
                code: data.code.0,
                message: data.message.into_owned(),
            },
            other => SessionError::Protocol {
                server,
                operation: operation.to_owned(),
                detail: other.to_string(),
            },
        }
    }

    /// The execution identity computed when [`Host::connect_with`] launched
    /// this session's server: what the lock and the audit log name.
    pub fn launched_identity(&self) -> Option<Digest> {
        self.execution
    }

    /// The execution identity of this session's server as `spec` (another
    /// server's, say) would describe it: what keys reuse of a running
    /// server.
    pub fn execution_identity(&self, spec: &ServerSpec) -> Option<Digest> {
        self.shared
            .identity()
            .map(|identity| execution_identity(&identity_parts(spec, &identity)))
    }

    /// Closes without reporting errors (used on a failed pin check).
    pub(crate) async fn close_quietly(self) -> Result<(), SessionError> {
        self.close().await
    }

    /// Sends request `method` with `params` exactly as given, with no check:
    /// how the fuzzer sends what a typed request cannot carry. The answer is
    /// returned as JSON.
    pub async fn request_raw(
        &self,
        method: &str,
        params: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, SessionError> {
        let request = ClientRequest::CustomRequest(rmcp::model::CustomRequest::new(method, params));
        let result = self
            .service
            .send_request(request)
            .await
            .map_err(|e| self.error(method, e))?;
        serde_json::to_value(result).map_err(|e| SessionError::Protocol {
            server: self.server().to_owned(),
            operation: method.to_owned(),
            detail: format!("the answer does not serialise: {e}"),
        })
    }

    /// Sends `ping` and waits for the answer.
    pub async fn ping(&self) -> Result<(), SessionError> {
        self.service
            .send_request(ClientRequest::PingRequest(
                rmcp::model::PingRequest::default(),
            ))
            .await
            .map(|_| ())
            .map_err(|e| self.error("ping", e))
    }

    /// Stops the server from a shared handle: the service ends, which
    /// closes the transport and stops the instance or process group in the
    /// background. [`Session::close`] does the same and awaits it.
    pub fn stop(&self) {
        self.service.cancellation_token().cancel();
    }

    /// Closes the session: EOF on the server's stdin, the grace period, then
    /// the server is stopped and every task of the transport awaited.
    pub async fn close(self) -> Result<(), SessionError> {
        let server = self.server().to_owned();
        self.service
            .cancel()
            .await
            .map(|_| ())
            .map_err(|e| SessionError::Protocol {
                server,
                operation: "close".into(),
                detail: e.to_string(),
            })?;
        // The transport's close has awaited its tasks and the instance.
        Ok(())
    }
}

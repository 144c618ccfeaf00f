//! Client: a connected session with one server over the one transport, with
//! errors that say what failed. A transport fault (limit, exit, framing)
//! always wins over the generic "transport closed" rmcp would report.

use std::path::PathBuf;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, GetPromptRequestParams, GetPromptResult, JsonObject,
    ProgressNotificationParam, ProtocolVersion, ReadResourceRequestParams, ReadResourceResult,
    Resource, Tool,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceError};
use tokio::sync::mpsc;

use crate::LaunchError;
use crate::config::{ServerKind, ServerSpec};
use crate::transport::{Fault, ServerTransport, Shared};
use crate::wasm::{WasmEngine, WasmLaunch};

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
    fn mode(self) -> ClientLifecycleMode {
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

/// Errors of a client session, naming the server and the operation.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("{operation} on server `{server}` failed: {fault}")]
    Fault {
        server: String,
        operation: String,
        fault: Fault,
    },
    #[error("{operation} on server `{server}`: the server answered with error {code}: {message}")]
    Server {
        server: String,
        operation: String,
        code: i32,
        message: String,
    },
    #[error("{operation} on server `{server}` failed: {detail}")]
    Protocol {
        server: String,
        operation: String,
        detail: String,
    },
}

impl ClientError {
    /// The transport fault behind this error, if one caused it.
    pub fn fault(&self) -> Option<&Fault> {
        match self {
            Self::Fault { fault, .. } => Some(fault),
            _ => None,
        }
    }
}

/// Launches servers. One per process: it holds the wasm engine and cache.
#[derive(Clone)]
pub struct Host {
    wasm: WasmEngine,
}

impl Host {
    /// A host caching compiled components in `cache_dir`, when given.
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Self, LaunchError> {
        Ok(Self {
            wasm: WasmEngine::new(cache_dir)?,
        })
    }

    /// The default cache directory: `$MOAT_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/moat`, else `$HOME/.cache/moat`.
    pub fn default_cache_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os("MOAT_CACHE_DIR") {
            return Some(PathBuf::from(dir));
        }
        if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
            return Some(PathBuf::from(dir).join("moat"));
        }
        std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache").join("moat"))
    }

    /// The wasm engine.
    pub fn wasm(&self) -> &WasmEngine {
        &self.wasm
    }

    /// A transport for `spec`, not yet connected. Refuses a server that has
    /// no pinned digest unless `allow_unmeasured` is set.
    pub fn transport(&self, spec: &ServerSpec) -> Result<ServerTransport, LaunchError> {
        let expected = spec.expectation().ok_or_else(|| LaunchError::Unmeasured {
            server: spec.name.clone(),
        })?;
        match &spec.kind {
            ServerKind::Wasm { path } => {
                let launch = WasmLaunch::from_spec(spec);
                let engine = self.wasm.clone();
                let path = path.clone();
                Ok(ServerTransport::new(
                    spec.name.clone(),
                    spec.limits.clone(),
                    move |tracker| crate::wasm::launch(engine, path, expected, launch, tracker),
                ))
            }
            #[cfg(unix)]
            ServerKind::Native {
                command,
                base_dir,
                cwd,
                measure,
            } => {
                let path_var = std::env::var_os("PATH");
                let resolved = crate::command::resolve(command, base_dir, path_var.as_deref())
                    .map_err(crate::native::NativeError::from)?;
                let launch = crate::native::NativeLaunch {
                    name: spec.name.clone(),
                    resolved,
                    args: spec.args.clone(),
                    env: spec.environment(),
                    cwd: cwd.clone(),
                    measure: measure.clone(),
                    expected,
                    limits: spec.limits.clone(),
                };
                Ok(ServerTransport::new(
                    spec.name.clone(),
                    spec.limits.clone(),
                    move |tracker| crate::native::launch(launch, tracker),
                ))
            }
            #[cfg(not(unix))]
            ServerKind::Native { .. } => Err(LaunchError::Unsupported {
                server: spec.name.clone(),
            }),
        }
    }

    /// Launches `spec` and completes the handshake.
    pub async fn connect(&self, spec: &ServerSpec) -> Result<Session, ClientError> {
        self.connect_with(spec, Handshake::Auto).await
    }

    /// Launches `spec` and completes the given handshake.
    pub async fn connect_with(
        &self,
        spec: &ServerSpec,
        handshake: Handshake,
    ) -> Result<Session, ClientError> {
        let transport = self.transport(spec)?;
        Session::connect(transport, handshake).await
    }
}

/// Receives what the server sends the client on its own: progress.
struct ClientSide {
    progress: mpsc::UnboundedSender<ProgressNotificationParam>,
}

impl ClientHandler for ClientSide {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.progress.send(params);
    }
}

/// A live session with one server.
pub struct Session {
    service: RunningService<RoleClient, ClientSide>,
    shared: Arc<Shared>,
    progress: Option<mpsc::UnboundedReceiver<ProgressNotificationParam>>,
}

impl Session {
    /// Connects `transport` (launching the server) and performs `handshake`.
    /// If this future is dropped part-way, the server is stopped and every
    /// task of the transport ends.
    pub async fn connect(
        transport: ServerTransport,
        handshake: Handshake,
    ) -> Result<Self, ClientError> {
        let shared = transport.shared().clone();
        let server = shared.server().to_owned();
        let connected = transport.connect().await?;
        let (progress_tx, progress) = mpsc::unbounded_channel();
        let client = ClientSide {
            progress: progress_tx,
        };
        match client
            .serve_with_lifecycle(connected, handshake.mode())
            .await
        {
            Ok(service) => Ok(Self {
                service,
                shared,
                progress: Some(progress),
            }),
            Err(error) => Err(match shared.fault() {
                Some(fault) => ClientError::Fault {
                    server,
                    operation: "handshake".into(),
                    fault,
                },
                None => ClientError::Protocol {
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

    /// State shared with the transport: fault, stderr buffer, task tracker.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Progress notifications the server sends, in order. Taken once.
    pub fn take_progress(&mut self) -> Option<mpsc::UnboundedReceiver<ProgressNotificationParam>> {
        self.progress.take()
    }

    /// The protocol revision agreed in the handshake.
    pub fn protocol_version(&self) -> Option<String> {
        self.service
            .peer_info()
            .map(|info| info.protocol_version.to_string())
    }

    fn error(&self, operation: &str, error: ServiceError) -> ClientError {
        let server = self.server().to_owned();
        if let Some(fault) = self.shared.fault() {
            return ClientError::Fault {
                server,
                operation: operation.to_owned(),
                fault,
            };
        }
        match error {
            ServiceError::McpError(data) => ClientError::Server {
                server,
                operation: operation.to_owned(),
                code: data.code.0,
                message: data.message.into_owned(),
            },
            other => ClientError::Protocol {
                server,
                operation: operation.to_owned(),
                detail: other.to_string(),
            },
        }
    }

    /// Every tool the server lists.
    pub async fn list_tools(&self) -> Result<Vec<Tool>, ClientError> {
        self.service
            .list_all_tools()
            .await
            .map_err(|e| self.error("tools/list", e))
    }

    /// Calls tool `name` with `arguments`.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallToolResult, ClientError> {
        let mut params = CallToolRequestParams::new(name.to_owned());
        if let Some(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        self.service
            .call_tool(params)
            .await
            .map_err(|e| self.error(&format!("tools/call `{name}`"), e))
    }

    /// Every resource the server lists.
    pub async fn list_resources(&self) -> Result<Vec<Resource>, ClientError> {
        self.service
            .list_all_resources()
            .await
            .map_err(|e| self.error("resources/list", e))
    }

    /// Reads resource `uri`.
    pub async fn read_resource(&self, uri: &str) -> Result<ReadResourceResult, ClientError> {
        self.service
            .read_resource(ReadResourceRequestParams::new(uri))
            .await
            .map_err(|e| self.error(&format!("resources/read `{uri}`"), e))
    }

    /// Gets prompt `name` with `arguments`.
    pub async fn get_prompt(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Result<GetPromptResult, ClientError> {
        let mut params = GetPromptRequestParams::new(name);
        params.arguments = arguments;
        self.service
            .get_prompt(params)
            .await
            .map_err(|e| self.error(&format!("prompts/get `{name}`"), e))
    }

    /// Closes the session: EOF on the server's stdin, the grace period, then
    /// the server is stopped and every task of the transport awaited.
    pub async fn close(self) -> Result<(), ClientError> {
        let server = self.server().to_owned();
        self.service
            .cancel()
            .await
            .map(|_| ())
            .map_err(|e| ClientError::Protocol {
                server,
                operation: "close".into(),
                detail: e.to_string(),
            })?;
        // The transport's close has awaited its tasks and the instance.
        Ok(())
    }
}

//! Gateway: one MCP server for the agent in front of many servers. This
//! module owns agent sessions: each session starts its servers on first use,
//! reuses them within the session by execution identity, never shares them
//! across sessions, and closes them with the session. Tools are exposed as
//! `server__tool`; calls are routed to the right child and audited. It never
//! matches on the launcher kind.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ErrorData, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditLog, Event};
use crate::client::{ClientError, Host, ProgressSender, Session};
use crate::config::Config;
use crate::identity::Digest;

/// Separates the server name from the tool name in exposed names. Server
/// names cannot contain it (config validation).
pub const SEPARATOR: &str = "__";

/// Whether `name` is a valid exposed tool name: `^[a-zA-Z0-9_-]{1,64}$`.
pub fn valid_exposed_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Everything sessions share: the host, the config, the audit log.
#[derive(Clone)]
pub struct Gateway {
    host: Host,
    config: Arc<Config>,
    audit: Option<Arc<AuditLog>>,
    sessions: Arc<AtomicU64>,
}

/// Why a gateway cannot start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(
        "server `{server}`, tool `{tool}`: the exposed name `{exposed}` does not match ^[a-zA-Z0-9_-]{{1,64}}$ (rename the server, or pin a server without it)"
    )]
    InvalidName {
        server: String,
        tool: String,
        exposed: String,
    },
}

/// Checks, before serving, that every pinned tool of `lock` gets a valid
/// exposed name. (Without a lock, tools are only known once their servers
/// run; an invalid one is then hidden and logged.)
pub fn check_lock_names(lock: &crate::lock::Lock) -> Result<(), GatewayError> {
    for (server, locked) in &lock.servers {
        for tool in &locked.tools {
            let exposed = format!("{server}{SEPARATOR}{}", tool.name);
            if !valid_exposed_name(&exposed) {
                return Err(GatewayError::InvalidName {
                    server: server.clone(),
                    tool: tool.name.clone(),
                    exposed,
                });
            }
        }
    }
    Ok(())
}

impl Gateway {
    /// A gateway for `config`'s servers, launched by `host`.
    pub fn new(host: Host, config: Config, audit: Option<Arc<AuditLog>>) -> Self {
        Self {
            host,
            config: Arc::new(config),
            audit,
            sessions: Arc::default(),
        }
    }

    /// A new agent session (one per agent connection).
    pub fn session(&self) -> AgentSession {
        let id = format!("s{}", self.sessions.fetch_add(1, Ordering::SeqCst) + 1);
        let session = AgentSession {
            id,
            gateway: self.clone(),
            children: Arc::new(Mutex::new(BTreeMap::new())),
            restarts: Arc::default(),
            resource_owners: Arc::default(),
        };
        session.audit(Event::SessionOpen {
            session: session.id.clone(),
        });
        session
    }
}

/// One agent session and the children it started.
#[derive(Clone)]
pub struct AgentSession {
    id: String,
    gateway: Gateway,
    children: Arc<Mutex<BTreeMap<String, Arc<Session>>>>,
    restarts: Arc<Mutex<BTreeMap<String, u32>>>,
    resource_owners: Arc<Mutex<BTreeMap<String, String>>>,
}

/// How many times one session restarts a crashed server before giving up.
pub const MAX_RESTARTS: u32 = 3;

impl AgentSession {
    /// The session's id, as audited.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn audit(&self, event: Event) {
        if let Some(log) = &self.gateway.audit
            && let Err(error) = log.record(&event)
        {
            tracing::error!(%error, "audit record failed");
        }
    }

    /// The child for `server`, started on first use within this session.
    /// A child that crashed is restarted on the next call, after a backoff
    /// (100 ms, doubling), at most [`MAX_RESTARTS`] times per session.
    async fn child(&self, server: &str) -> Result<Arc<Session>, ClientError> {
        let mut children = self.children.lock().await;
        let mut restarts = 0;
        if let Some(child) = children.get(server) {
            let Some(fault) = child.shared().fault() else {
                return Ok(child.clone());
            };
            let mut counts = self.restarts.lock().await;
            let count = counts.entry(server.to_owned()).or_insert(0);
            if *count >= MAX_RESTARTS {
                return Err(ClientError::GaveUp {
                    server: server.to_owned(),
                    restarts: *count,
                    fault,
                });
            }
            *count += 1;
            restarts = *count;
            self.audit(Event::ServerExit {
                session: self.id.clone(),
                server: server.to_owned(),
                outcome: format!("fault: {fault}"),
            });
        }
        if restarts > 0 {
            let backoff = std::time::Duration::from_millis(100 << (restarts - 1));
            tracing::warn!(%server, restarts, ?backoff, "restarting a crashed server");
            tokio::time::sleep(backoff).await;
        }
        let spec = self
            .gateway
            .config
            .server(server)
            .map_err(|e| ClientError::Protocol {
                server: server.to_owned(),
                operation: "route".into(),
                detail: e.to_string(),
            })?;
        let session = Arc::new(self.gateway.host.connect(spec).await?);
        if let Some(identity) = session.shared().identity() {
            self.audit(Event::ServerLaunch {
                session: self.id.clone(),
                server: server.to_owned(),
                identity: identity.digest.map(|d| d.to_string()).unwrap_or_default(),
                sha256: identity.digest.map(|d| d.to_string()),
                evidence: identity.evidence.to_string(),
            });
        }
        children.insert(server.to_owned(), session.clone());
        Ok(session)
    }

    /// Every server's tools, as `server__tool`, in server order.
    pub async fn tools(&self) -> Result<Vec<Tool>, ClientError> {
        let mut exposed = Vec::new();
        for server in self.servers() {
            let child = self.child(&server).await?;
            for mut tool in child.list_tools().await? {
                let name = format!("{server}{SEPARATOR}{}", tool.name);
                if !valid_exposed_name(&name) {
                    tracing::warn!(%server, tool = %tool.name, "tool name not exposable; hidden");
                    continue;
                }
                tool.name = name.into();
                exposed.push(tool);
            }
        }
        Ok(exposed)
    }

    /// Calls `server__tool` on the right child, audited.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<rmcp::model::JsonObject>,
    ) -> Result<rmcp::model::CallToolResult, ErrorData> {
        self.call_forwarding(name, arguments, None, CancellationToken::new())
            .await
    }

    /// Splits `server__name` into a configured server and the name.
    fn route<'n>(&self, name: &'n str) -> Result<(&'n str, &'n str), ErrorData> {
        let (server, rest) = name.split_once(SEPARATOR).ok_or_else(|| {
            ErrorData::invalid_params(format!("no {name:?}: names are server__name"), None)
        })?;
        if !self.gateway.config.servers.contains_key(server) {
            return Err(ErrorData::invalid_params(
                format!("no server {server:?} behind {name:?}"),
                None,
            ));
        }
        Ok((server, rest))
    }

    /// Calls `server__tool`, forwarding the child's progress to `progress`
    /// and the agent's cancellation (`cancel`) to the child.
    pub async fn call_forwarding(
        &self,
        name: &str,
        arguments: Option<rmcp::model::JsonObject>,
        progress: Option<ProgressSender>,
        cancel: CancellationToken,
    ) -> Result<rmcp::model::CallToolResult, ErrorData> {
        let (server, tool) = name.split_once(SEPARATOR).ok_or_else(|| {
            ErrorData::invalid_params(
                format!("no tool {name:?}: tools are named server__tool"),
                None,
            )
        })?;
        if !self.gateway.config.servers.contains_key(server) {
            return Err(ErrorData::invalid_params(
                format!("no server {server:?} behind tool {name:?}"),
                None,
            ));
        }
        let arguments_json = serde_json::to_vec(&arguments).unwrap_or_default();
        let started = Instant::now();
        let child = self.child(server).await.map_err(to_error)?;
        let fuel_before = child.shared().metrics().fuel_consumed();
        let result = child
            .call_tool_with(tool, arguments, progress, cancel)
            .await;
        let fuel = child.shared().metrics().fuel_consumed() - fuel_before;
        let (outcome, result_json) = match &result {
            Ok(result) if result.is_error == Some(true) => {
                ("tool-error".to_owned(), serde_json::to_vec(result).ok())
            }
            Ok(result) => ("ok".to_owned(), serde_json::to_vec(result).ok()),
            Err(error) => (outcome_of(error), None),
        };
        self.audit(Event::ToolCall {
            session: self.id.clone(),
            server: server.to_owned(),
            tool: tool.to_owned(),
            arguments_sha256: Digest::of(&arguments_json).to_string(),
            arguments_bytes: arguments_json.len(),
            result_sha256: result_json.as_ref().map(|r| Digest::of(r).to_string()),
            result_bytes: result_json.as_ref().map_or(0, Vec::len),
            duration_ms: started.elapsed().as_millis() as u64,
            fuel,
            outcome,
        });
        result.map_err(to_error)
    }

    /// Every server's prompts, as `server__prompt`.
    pub async fn prompts(&self) -> Result<Vec<rmcp::model::Prompt>, ClientError> {
        let mut exposed = Vec::new();
        for server in self.servers() {
            for mut prompt in self.child(&server).await?.list_prompts().await? {
                let name = format!("{server}{SEPARATOR}{}", prompt.name);
                if valid_exposed_name(&name) {
                    prompt.name = name;
                    exposed.push(prompt);
                } else {
                    tracing::warn!(%server, prompt = %prompt.name, "prompt name not exposable; hidden");
                }
            }
        }
        Ok(exposed)
    }

    /// Every server's resources, named `server__name`, URIs unchanged. Two
    /// servers listing the same URI is an error naming both.
    pub async fn resources(&self) -> Result<Vec<rmcp::model::Resource>, ClientError> {
        let mut exposed = Vec::new();
        let mut owners = BTreeMap::new();
        for server in self.servers() {
            for mut resource in self.child(&server).await?.list_resources().await? {
                if let Some(other) = owners.insert(resource.uri.clone(), server.clone()) {
                    return Err(ClientError::Protocol {
                        server: server.clone(),
                        operation: "resources/list".into(),
                        detail: format!(
                            "resource {} is listed by both `{other}` and `{server}`",
                            resource.uri
                        ),
                    });
                }
                resource.name = format!("{server}{SEPARATOR}{}", resource.name);
                exposed.push(resource);
            }
        }
        *self.resource_owners.lock().await = owners;
        Ok(exposed)
    }

    fn servers(&self) -> Vec<String> {
        self.gateway.config.servers.keys().cloned().collect()
    }

    /// Closes every child of this session; reports the ones that failed.
    pub async fn close(&self) -> Vec<(String, ClientError)> {
        let children = std::mem::take(&mut *self.children.lock().await);
        let mut failures = Vec::new();
        for (server, child) in children {
            let outcome = match Arc::try_unwrap(child) {
                Ok(child) => child.close().await.err(),
                Err(_) => None, // still in use by an in-flight call; dropped with it
            };
            self.audit(Event::ServerExit {
                session: self.id.clone(),
                server: server.clone(),
                outcome: outcome
                    .as_ref()
                    .map_or("closed".to_owned(), |e| e.to_string()),
            });
            if let Some(error) = outcome {
                failures.push((server, error));
            }
        }
        self.audit(Event::SessionClose {
            session: self.id.clone(),
            outcome: if failures.is_empty() {
                "closed".into()
            } else {
                format!("{} servers failed to close", failures.len())
            },
        });
        failures
    }
}

fn outcome_of(error: &ClientError) -> String {
    match error {
        ClientError::InvalidArguments { .. } => "invalid-params".into(),
        ClientError::ToolUnavailable { .. } => "unavailable".into(),
        ClientError::Cancelled { .. } => "cancelled".into(),
        ClientError::Fault { fault, .. } => format!("fault: {fault}"),
        _ => "error".into(),
    }
}

fn to_error(error: ClientError) -> ErrorData {
    match &error {
        ClientError::InvalidArguments { .. } | ClientError::ToolUnavailable { .. } => {
            ErrorData::invalid_params(error.to_string(), None)
        }
        _ => ErrorData::internal_error(error.to_string(), None),
    }
}

impl ServerHandler for AgentSession {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .enable_resources()
                .build(),
        )
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, ErrorData> {
        self.prompts()
            .await
            .map(rmcp::model::ListPromptsResult::with_all_items)
            .map_err(to_error)
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, ErrorData> {
        let (server, prompt) = self.route(&request.name)?;
        let child = self.child(server).await.map_err(to_error)?;
        child
            .get_prompt(prompt, request.arguments)
            .await
            .map(Into::into)
            .map_err(to_error)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, ErrorData> {
        self.resources()
            .await
            .map(rmcp::model::ListResourcesResult::with_all_items)
            .map_err(to_error)
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, ErrorData> {
        if !self.resource_owners.lock().await.contains_key(&request.uri) {
            self.resources().await.map_err(to_error)?;
        }
        let owner = self.resource_owners.lock().await.get(&request.uri).cloned();
        let Some(server) = owner else {
            return Err(ErrorData::resource_not_found(
                format!("no server lists resource {}", request.uri),
                None,
            ));
        };
        let child = self.child(&server).await.map_err(to_error)?;
        child
            .read_resource(&request.uri)
            .await
            .map(Into::into)
            .map_err(to_error)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
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
        let result = self
            .call_forwarding(&request.name, request.arguments, sender, context.ct.clone())
            .await;
        if let Some(task) = task {
            // The sender is gone with the call: the forwarder drains and ends.
            let _ = task.await;
        }
        result.map(CallToolResponse::Complete)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{LOCK_VERSION, Lock, LockedServer, LockedTool};

    #[test]
    fn exposed_names_are_checked_at_start_from_the_lock() {
        let tool = |name: &str| LockedTool {
            name: name.into(),
            sha256: String::new(),
            definition: String::new(),
            flags: vec![],
        };
        let server = |tools: Vec<LockedTool>| LockedServer {
            kind: "wasm".into(),
            evidence: "wasm-measured".into(),
            sha256: String::new(),
            identity: String::new(),
            measured: Default::default(),
            tools,
        };
        let mut lock = Lock {
            version: LOCK_VERSION,
            servers: Default::default(),
        };
        lock.servers.insert(
            "files".into(),
            server(vec![tool("read"), tool("write-all")]),
        );
        assert!(check_lock_names(&lock).is_ok());
        lock.servers
            .insert("web".into(), server(vec![tool("fetch url")]));
        match check_lock_names(&lock) {
            Err(GatewayError::InvalidName {
                server,
                tool,
                exposed,
            }) => {
                assert_eq!((server.as_str(), tool.as_str()), ("web", "fetch url"));
                assert_eq!(exposed, "web__fetch url");
            }
            other => panic!("{other:?}"),
        }
        assert!(valid_exposed_name(&"a".repeat(64)));
        assert!(!valid_exposed_name(&"a".repeat(65)));
    }
}

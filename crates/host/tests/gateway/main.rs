//! The gateway's agent sessions, in process: namespaced tools across both
//! launchers, children per session reused by execution identity, crash
//! restarts bounded per session, close that drains then cancels, and
//! `list_changed` passed to the agent after the pin check.
//!
//! Tests by topic: `lifecycle`, `sessions`, `audit`, `revocation`, `reload`,
//! `trace`, and on the 2026-07-28 revision `round_trips`, `tasks`,
//! `subscriptions` and `matrix`; this file keeps the helpers they share.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

use std::path::Path;

use common::{Launcher, args, spec, text};
use moat_host::gateway::{Gateway, MAX_RESTARTS};
use moat_host::{Config, Host};
use moat_test_guests as guests;
use serde_json::json;
use tokio_util::sync::CancellationToken;

mod audit;
mod claims;
mod idle;
mod lifecycle;
mod matrix;
mod reload;
mod revocation;
mod round_trips;
mod sessions;
mod subscriptions;
mod tasks;
mod trace;

fn gateway(servers: &[moat_host::ServerSpec]) -> Gateway {
    gateway_audited(servers, 30_000, None)
}

fn gateway_audited(
    servers: &[moat_host::ServerSpec],
    drain_timeout_ms: u64,
    audit: Option<&Path>,
) -> Gateway {
    let config = Config {
        path: "moat.toml".into(),
        servers: servers
            .iter()
            .map(|s| (s.name.clone(), s.clone()))
            .collect(),
        serve: moat_host::config::ServeSettings {
            drain_timeout_ms,
            ..Default::default()
        },
        wasm: Default::default(),
        nodes: Default::default(),
    };
    let audit = audit.map(|path| {
        std::sync::Arc::new(moat_host::audit::AuditLog::open(path, audit_key()).unwrap())
    });
    Gateway::new(host(), config, audit)
}

/// The audit key these tests write and verify with.
fn audit_key() -> moat_host::Key {
    moat_host::audit::key_in(
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("audit-key"),
        true,
    )
    .unwrap()
}

/// The audit log's events as (event, outcome) pairs.
fn audited(path: &Path) -> Vec<(String, String)> {
    moat_host::audit::verify(path, &audit_key()).unwrap();
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).unwrap();
            let field = |key: &str| event[key].as_str().unwrap_or_default().to_owned();
            (field("event"), field("outcome"))
        })
        .collect()
}

fn host() -> Host {
    Host::new(Some(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"),
    ))
    .unwrap()
}

/// The names the session exposes to the agent.
async fn exposed(session: &moat_host::gateway::AgentSession) -> Vec<String> {
    session
        .tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect()
}

// The 2026-07-28 answers besides a result, carried between an agent and the
// server that gave them. Two `rounds` servers behind one gateway, one under
// each launcher, each naming itself in its answers.

/// A gateway in front of `a` (the `rounds` guest as wasm) and `b` (the same
/// guest native).
fn rounds_gateway() -> Gateway {
    gateway(&rounds_servers())
}

fn rounds_servers() -> Vec<moat_host::ServerSpec> {
    [("a", Launcher::Wasm), ("b", Launcher::Native)]
        .into_iter()
        .map(|(name, launcher)| {
            let mut server = spec(launcher, guests::ROUNDS);
            server.name = name.into();
            server.env.values.insert("ROUNDS_NAME".into(), name.into());
            server
        })
        .collect()
}

type AgentClient = moat_host::rmcp::service::RunningService<
    moat_host::rmcp::RoleClient,
    moat_host::rmcp::model::ClientConfig,
>;

/// The gateway's end of an agent's connection, kept while the agent talks
/// (on 2026-07-28 it is up once the first request after `server/discover`
/// arrives, so it is not awaited here).
type Serving = tokio::task::JoinHandle<
    Result<
        moat_host::rmcp::service::RunningService<
            moat_host::rmcp::RoleServer,
            moat_host::gateway::AgentSession,
        >,
        moat_host::rmcp::service::ServerInitializeError,
    >,
>;

/// An agent on `session` on 2026-07-28 (`server/discover`), declaring the
/// tasks extension when `tasks`.
async fn rounds_agent(
    session: &moat_host::gateway::AgentSession,
    tasks: bool,
) -> (AgentClient, Serving) {
    use moat_host::rmcp::ServiceExt;
    use moat_host::rmcp::model::{ClientCapabilities, ClientConfig, ProtocolVersion};
    let (agent_io, gateway_io) = tokio::io::duplex(64 << 10);
    let serving = tokio::spawn(session.clone().serve(gateway_io));
    let mut info = ClientConfig::default();
    if tasks {
        info.capabilities = ClientCapabilities::builder().enable_tasks().build();
    }
    let lifecycle = moat_host::rmcp::ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    let client = moat_host::rmcp::ClientServiceExt::serve_with_lifecycle(info, agent_io, lifecycle)
        .await
        .unwrap();
    (client, serving)
}

fn call(name: &str, arguments: serde_json::Value) -> moat_host::rmcp::model::CallToolRequestParams {
    let mut params = moat_host::rmcp::model::CallToolRequestParams::new(name.to_owned());
    params.arguments = args(arguments);
    params
}

/// An agent on the initialize handshake (2025-11-25 unless `revision`
/// says otherwise) that answers every elicitation with `name`, or that does
/// not take elicitations at all.
/// An agent before 2026-07-28: answers elicitation with its name (if it
/// has one, else it declares none), speaks the revision given (else
/// rmcp's latest with `initialize`), and reports the resource updates and
/// resource list changes it hears (the uri, or `list_changed`).
struct Legacy(
    Option<&'static str>,
    Option<moat_host::rmcp::model::ProtocolVersion>,
    Option<tokio::sync::mpsc::UnboundedSender<String>>,
);

impl moat_host::rmcp::ClientHandler for Legacy {
    fn get_info(&self) -> moat_host::rmcp::model::ClientConfig {
        let mut info = moat_host::rmcp::model::ClientConfig::default();
        if let Some(revision) = &self.1 {
            info.protocol_version = revision.clone();
        }
        if self.0.is_some() {
            info.capabilities =
                serde_json::from_value(json!({"elicitation": {"form": {}}})).unwrap();
        }
        info
    }

    async fn create_elicitation(
        &self,
        _request: moat_host::rmcp::model::ElicitRequestParams,
        _context: moat_host::rmcp::service::RequestContext<moat_host::rmcp::RoleClient>,
    ) -> Result<moat_host::rmcp::model::ElicitResult, moat_host::rmcp::ErrorData> {
        Ok(
            serde_json::from_value(json!({"action": "accept", "content": {"name": self.0}}))
                .unwrap(),
        )
    }

    async fn on_resource_updated(
        &self,
        params: moat_host::rmcp::model::ResourceUpdatedNotificationParam,
        _context: moat_host::rmcp::service::NotificationContext<moat_host::rmcp::RoleClient>,
    ) {
        if let Some(heard) = &self.2 {
            let _ = heard.send(params.uri);
        }
    }

    async fn on_resource_list_changed(
        &self,
        _context: moat_host::rmcp::service::NotificationContext<moat_host::rmcp::RoleClient>,
    ) {
        if let Some(heard) = &self.2 {
            let _ = heard.send("list_changed".to_owned());
        }
    }
}

async fn agent_on(
    session: &moat_host::gateway::AgentSession,
    legacy: Legacy,
) -> (
    moat_host::rmcp::service::RunningService<moat_host::rmcp::RoleClient, Legacy>,
    Serving,
) {
    use moat_host::rmcp::ServiceExt;
    let (agent_io, gateway_io) = tokio::io::duplex(64 << 10);
    let serving = tokio::spawn(session.clone().serve(gateway_io));
    let client = moat_host::rmcp::ClientServiceExt::serve_with_lifecycle(
        legacy,
        agent_io,
        moat_host::rmcp::ClientLifecycleMode::Initialize,
    )
    .await
    .unwrap();
    (client, serving)
}

/// Polls task `id` until its status is `until`.
async fn task_until(
    agent: &AgentClient,
    id: &str,
    until: moat_host::rmcp::model::TaskStatus,
) -> moat_host::rmcp::model::GetTaskResult {
    loop {
        let found = agent
            .get_task(moat_host::rmcp::model::GetTaskParams::new(id))
            .await
            .unwrap();
        assert_eq!(found.task.task.task_id, id, "the agent's id, as issued");
        if found.task.task.status == until {
            return found;
        }
        assert!(
            !found.task.task.status.is_terminal(),
            "task {id} ended as {:?}, not {until:?}: {:?}",
            found.task.task.status,
            found.task.payload
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The `rounds` guest as a server of each revision, wasm and native mixed:
/// `n26` (2026-07-28, wasm), `n25` (2025-11-25, native), `n06`
/// (2025-06-18, wasm).
fn rounds_of_every_revision() -> Vec<moat_host::ServerSpec> {
    [
        ("n26", Launcher::Wasm, None),
        ("n25", Launcher::Native, Some("2025-11-25")),
        ("n06", Launcher::Wasm, Some("2025-06-18")),
    ]
    .into_iter()
    .map(|(name, launcher, revision)| {
        let mut server = spec(launcher, guests::ROUNDS);
        server.name = name.into();
        server.env.values.insert("ROUNDS_NAME".into(), name.into());
        if let Some(revision) = revision {
            server
                .env
                .values
                .insert("ROUNDS_REVISION".into(), revision.into());
        }
        server
    })
    .collect()
}

//! What `moat tools` and `moat inspect` show of a server, as data: its
//! identity (digest, evidence, measured files, where a pulled component
//! came from), its tools and their pins against the lock, its grants and
//! limits as configured, and the sandbox's rules as launched. Each report
//! is gathered by starting the server once; it serializes to the JSON the
//! CLI prints (through [`serde_json::to_value`], whose maps are sorted),
//! and the CLI prints the tables.

use std::path::{Path, PathBuf};

use serde::{Serialize, Serializer};

use crate::ServerKind;
use crate::config::Config;
use crate::host::ConnectError;
use crate::instance::Identity;
use crate::limits::Limits;
use crate::policy::ToolReport;
use crate::session::SessionError;
use crate::setup::SetupError;

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Reading the config or lock, building the host, or connecting.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// Starting the server under the lock.
    #[error(transparent)]
    Connect(Box<ConnectError>),
    /// Listing, checking or closing the server.
    #[error(transparent)]
    Session(Box<SessionError>),
}

impl From<ConnectError> for ReportError {
    fn from(error: ConnectError) -> Self {
        Self::Connect(Box::new(error))
    }
}

impl From<SessionError> for ReportError {
    fn from(error: SessionError) -> Self {
        Self::Session(Box::new(error))
    }
}

/// `moat tools`: one server's identity, tools and pins.
#[derive(Clone, Debug, Serialize)]
pub struct ToolsReport {
    pub server: String,
    /// For a component: `stdio` or `typed`.
    pub kind: Option<String>,
    /// For a component: the exported functions that are not tools.
    pub not_tools: Vec<String>,
    /// The digest of the measured bytes (for a component started from a
    /// snapshot, its source; `snapshot` is what runs), or `not measured`
    /// (empty when the launch reported no identity).
    pub sha256: String,
    /// For a component started from a snapshot of its initialised state:
    /// the snapshot's digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// For a pulled component: where from.
    pub oci: Option<OciReport>,
    /// The evidence class (empty when the launch reported no identity).
    pub evidence: String,
    /// The sandbox's rules as launched, one line each.
    pub sandbox: Vec<String>,
    /// Files measured into the identity.
    pub measured: Vec<MeasuredFile>,
    /// The tools as the server lists them.
    pub tools: Vec<rmcp::model::Tool>,
    /// Each tool against the lock, when one is enforced.
    #[serde(serialize_with = "pins")]
    pub pins: Option<Vec<ToolReport>>,
}

/// Where a pulled component came from.
#[derive(Clone, Debug, Serialize)]
pub struct OciReport {
    pub reference: String,
    pub manifest: String,
    pub layer: String,
}

/// A file measured into a server's identity.
#[derive(Clone, Debug, Serialize)]
pub struct MeasuredFile {
    pub path: PathBuf,
    pub sha256: String,
}

/// `moat inspect`: one server as configured and, when it starts, as
/// launched.
#[derive(Clone, Debug, Serialize)]
pub struct InspectReport {
    pub server: String,
    /// `wasm SOURCE`, `native COMMAND` or `remote URL`, with a component's
    /// kind in brackets.
    pub kind: String,
    pub limits: Limits,
    /// Each `dirs` grant: `HOST -> GUEST (MODE)`.
    pub dirs: Vec<String>,
    /// Each `net` grant.
    pub net: Vec<String>,
    /// The environment variables it gets, set and passed through.
    pub env: Vec<String>,
    /// The `sandbox` setting.
    pub sandbox: String,
    /// What the launch reported, when it reported an identity.
    #[serde(flatten)]
    pub launched: Option<Launched>,
    /// Each tool with its status (`unpinned` without a lock), when it
    /// started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolLine>>,
    /// Why it could not be started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a launch reported of a server, for `moat inspect`.
#[derive(Clone, Debug, Serialize)]
pub struct Launched {
    pub evidence: String,
    pub sha256: Option<String>,
    /// For a component started from a snapshot of its initialised state:
    /// the snapshot's digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The sandbox's rules, one line each.
    pub rules: Vec<String>,
    /// For a component: the exported functions that are not tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_tools: Option<Vec<String>>,
}

/// A tool's name and its status: `pinned`, `drifted`, `new`, `missing` or
/// `unpinned`.
#[derive(Clone, Debug, Serialize)]
pub struct ToolLine {
    pub name: String,
    pub status: String,
}

/// `moat tools`: starts `server` of the config at `config_path` (on a host
/// from [`crate::setup::host_for`], which hands `warn` what the lock pins
/// that could not be exposed) and reports its identity, tools and pins.
pub async fn tools(
    config_path: &Path,
    server: &str,
    locked: bool,
    warn: impl FnMut(&dyn std::error::Error),
) -> Result<ToolsReport, ReportError> {
    let session = crate::setup::connect(config_path, server, locked, warn).await?;
    let tools = session.list_tools().await;
    let pins = session.tool_reports().await;
    let identity = session.shared().identity();
    session.close().await?;
    let tools = tools?;
    let pins = pins?;
    let oci = identity
        .as_ref()
        .and_then(|i| i.oci.as_ref())
        .map(|o| OciReport {
            reference: o.reference.clone(),
            manifest: o.manifest.to_string(),
            layer: o.layer.to_string(),
        });
    let (sha256, evidence, measured, sandbox, component) = identity
        .map(|i| {
            (
                i.digest
                    .map(|d| d.to_string())
                    .unwrap_or_else(|| "not measured".into()),
                i.evidence.to_string(),
                i.measured,
                i.sandbox.lines(),
                i.component,
            )
        })
        .unwrap_or_default();
    Ok(ToolsReport {
        server: server.to_owned(),
        kind: component.as_ref().map(|c| c.kind.to_string()),
        snapshot: component
            .as_ref()
            .and_then(|c| c.snapshot)
            .map(|d| d.to_string()),
        not_tools: component.map(|c| c.not_tools).unwrap_or_default(),
        sha256,
        oci,
        evidence,
        sandbox,
        measured: measured
            .into_iter()
            .map(|(path, digest)| MeasuredFile {
                path,
                sha256: digest.to_string(),
            })
            .collect(),
        tools,
        pins,
    })
}

/// `moat inspect`: every server of the config at `config_path`, each
/// started once on a host from [`crate::setup::host_for`] (which hands
/// `warn` what the lock pins that could not be exposed). A server that
/// cannot start is reported with its error.
pub async fn inspect(
    config_path: &Path,
    warn: impl FnMut(&dyn std::error::Error),
) -> Result<Vec<InspectReport>, ReportError> {
    let config = Config::load(config_path).map_err(SetupError::from)?;
    let host = crate::setup::host_for(config_path, false, warn)?;
    let mut reports = Vec::new();
    for (name, spec) in &config.servers {
        let mut report = InspectReport {
            server: name.clone(),
            kind: match &spec.kind {
                ServerKind::Wasm { source, .. } => format!("wasm {source}"),
                ServerKind::Native { command, .. } => format!("native {command}"),
                ServerKind::Remote { url, .. } => format!("remote {url}"),
                ServerKind::Node {
                    node,
                    profile,
                    revision,
                } => format!(
                    "profile `{profile}` at {revision} on node `{}` ({})",
                    node.name, node.url
                ),
            },
            limits: spec.limits.clone(),
            dirs: spec
                .dirs
                .iter()
                .map(|d| format!("{} -> {} ({})", d.host.display(), d.guest, d.mode))
                .collect(),
            net: spec.net.iter().map(ToString::to_string).collect(),
            env: spec.env.names().map(str::to_owned).collect(),
            sandbox: spec.sandbox.to_string(),
            launched: None,
            tools: None,
            error: None,
        };
        match host.connect(spec).await {
            Ok(session) => {
                let identity = session.shared().identity();
                let pins = session.tool_reports().await;
                let live = session.list_tools().await;
                session.close().await?;
                if let Some(identity) = identity {
                    report.launched = Some(launched(&mut report.kind, identity));
                }
                report.tools = Some(match (pins?, live?) {
                    (Some(pins), _) => pins
                        .iter()
                        .map(|r| ToolLine {
                            name: r.name.clone(),
                            status: r.status.word().to_owned(),
                        })
                        .collect(),
                    (None, live) => live
                        .iter()
                        .map(|t| ToolLine {
                            name: t.name.to_string(),
                            status: "unpinned".to_owned(),
                        })
                        .collect(),
                });
            }
            Err(error) => report.error = Some(format!("{error}")),
        }
        reports.push(report);
    }
    Ok(reports)
}

/// What `identity` tells `moat inspect`; a component's kind is added to
/// `kind`.
fn launched(kind: &mut String, identity: Identity) -> Launched {
    let snapshot = identity
        .component
        .as_ref()
        .and_then(|c| c.snapshot)
        .map(|d| d.to_string());
    let not_tools = identity.component.map(|component| {
        *kind = format!("{kind} ({})", component.kind);
        component.not_tools
    });
    Launched {
        evidence: identity.evidence.to_string(),
        sha256: identity.digest.map(|d| d.to_string()),
        snapshot,
        rules: identity.sandbox.lines(),
        not_tools,
    }
}

/// Pins as `moat tools --json` shows them: name, status word and the
/// status in full.
fn pins<S: Serializer>(pins: &Option<Vec<ToolReport>>, serializer: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Pin<'a> {
        name: &'a str,
        status: &'static str,
        detail: String,
    }
    pins.as_ref()
        .map(|pins| {
            pins.iter()
                .map(|r| Pin {
                    name: &r.name,
                    status: r.status.word(),
                    detail: format!("{:?}", r.status),
                })
                .collect::<Vec<_>>()
        })
        .serialize(serializer)
}

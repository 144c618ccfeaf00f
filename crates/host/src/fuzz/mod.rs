//! Fuzzing an MCP server through the guest boundary: [`generate`] makes
//! cases from the tools' input schemas, the runner ([`Runner`]) runs them
//! against the server under its own limits, the oracle classifies what
//! happened, the campaign ([`fuzz`]) spends the budget and keeps the
//! findings, [`shrink`] reduces each finding to a minimal input, and
//! [`report`] writes case files and JSON / JUnit reports. This file holds
//! the vocabulary they share: classes, outcomes, options, findings and the
//! summary.
//!
//! The server is launched exactly as `moat serve` would launch it (same
//! launcher, identity check, capabilities and limits), but tool pins are not
//! enforced: the point is to send the server what pins would refuse.

pub(crate) mod generate;
pub mod report;
pub(crate) mod shrink;

mod campaign;
mod oracle;
mod runner;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::ServerSpec;
use crate::host::ConnectError;
use crate::session::SessionError;

pub use generate::{Call, Case, Generator, PROTOCOL_SUBJECT, ToolSchema};

/// How a case ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    /// A result.
    Ok,
    /// A result with `isError`: the tool refused, as it may.
    ToolError,
    /// A well-formed JSON-RPC invalid-params error (-32602).
    InvalidParams,
    /// A JSON-RPC error to an unknown method or malformed params: expected.
    Rejected,
    /// Any other JSON-RPC error to a tool call, or an answer the protocol
    /// does not allow.
    ProtocolError,
    /// The server exited or trapped.
    Crash,
    /// No answer within the deadline.
    Hang,
    /// A CPU, memory, output or other resource limit was hit.
    Limit,
    /// A result outside the tool's own outputSchema.
    OutputSchema,
    /// A panic message on stderr.
    Panic,
}

impl Class {
    /// Every class but ok, tool error, invalid params and expected
    /// rejections is a finding.
    pub fn is_finding(self) -> bool {
        !matches!(
            self,
            Self::Ok | Self::ToolError | Self::InvalidParams | Self::Rejected
        )
    }

    /// The class as written in reports.
    pub fn word(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ToolError => "tool-error",
            Self::InvalidParams => "invalid-params",
            Self::Rejected => "rejected",
            Self::ProtocolError => "protocol-error",
            Self::Crash => "crash",
            Self::Hang => "hang",
            Self::Limit => "limit",
            Self::OutputSchema => "output-schema",
            Self::Panic => "panic",
        }
    }
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.word())
    }
}

/// What a case did: its class and a description (the fault, the limit, the
/// schema violation, the panic message).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub class: Class,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// The most of a description an outcome keeps (a schema violation can quote
/// a megabyte of output).
const DETAIL_BYTES: usize = 2000;

impl Outcome {
    fn new(class: Class, detail: impl Into<String>) -> Self {
        Self {
            class,
            detail: report::excerpt(&detail.into(), DETAIL_BYTES),
        }
    }
}

/// Errors that stop a fuzz run (findings are not errors).
#[derive(Debug, thiserror::Error)]
pub enum FuzzError {
    #[error("fuzz: starting server `{server}` failed: {source}")]
    Start {
        server: String,
        #[source]
        source: Box<ConnectError>,
    },
    #[error("fuzz: listing the tools of server `{server}` failed: {source}")]
    ListTools {
        server: String,
        #[source]
        source: Box<SessionError>,
    },
    #[error("fuzz: server `{server}` has no tool `{tool}` (it lists: {listed})")]
    NoSuchTool {
        server: String,
        tool: String,
        listed: String,
    },
    #[error("fuzz: reading corpus {path}: {detail}")]
    Corpus { path: PathBuf, detail: String },
    #[error("fuzz: writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("fuzz: case file {path}: {detail}")]
    CaseFile { path: PathBuf, detail: String },
}

/// When a run stops generating cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    Time(Duration),
    Runs(u64),
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Time(d) => write!(f, "{} ms", d.as_millis()),
            Self::Runs(n) => write!(f, "{n} runs"),
        }
    }
}

/// How to fuzz.
#[derive(Clone, Debug)]
pub struct Options {
    /// Tools to fuzz; empty: every tool the server lists.
    pub tools: Vec<String>,
    pub budget: Budget,
    pub seed: u64,
    /// Inputs to mutate, and where findings are saved (`findings/`).
    pub corpus: PathBuf,
    /// A fresh instance for every case (else one is reused until it fails).
    pub fresh: bool,
    /// Lowers the server's `request_timeout_ms` for the run (never raises
    /// it): a case without an answer by then is a hang.
    pub case_timeout: Option<Duration>,
    /// Attempts to shrink each finding.
    pub shrink_attempts: u32,
    /// Time to shrink each finding.
    pub shrink_time: Duration,
    /// Instances running cases at once (each its own instance).
    pub jobs: usize,
}

/// What a run tells its caller as it goes.
pub enum Event<'a> {
    /// Case number `index` (from 0) was generated (in order, whatever
    /// order cases finish in).
    Generated { index: u64, case: &'a Case },
    /// Case number `index` ran.
    Case {
        index: u64,
        case: &'a Case,
        outcome: &'a Outcome,
        elapsed: Duration,
    },
    /// A new kind of finding (subject and class not seen before in the run).
    Finding(&'a Finding),
    /// Shrinking of a finding is starting.
    Shrinking(&'a Finding),
}

/// A finding: the first case of a subject (tool or protocol) and class, and
/// its shrunk form.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Finding {
    pub class: Class,
    pub subject: String,
    pub detail: String,
    /// The minimal case that still fails this way.
    pub case: Case,
    /// The case as generated.
    pub original: Case,
    pub case_index: u64,
    pub found_after_ms: u64,
    pub occurrences: u64,
    pub shrink: ShrinkStats,
    /// The case file in the corpus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
}

/// How shrinking went.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ShrinkStats {
    /// Candidate cases run.
    pub attempts: u32,
    /// Candidates kept (each a simplification).
    pub steps: u32,
    /// Whether the original failed the same way again on a fresh instance.
    pub reproduced: bool,
    /// The shrunk case's outcome detail.
    pub detail: String,
}

/// Counts of outcomes for one subject.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Tally {
    pub cases: u64,
    pub outcomes: BTreeMap<String, u64>,
}

/// The result of a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    pub server: String,
    pub launcher: String,
    pub sha256: Option<String>,
    pub seed: u64,
    pub budget: String,
    pub fresh: bool,
    pub request_timeout_ms: u64,
    pub cases: u64,
    pub fuzz_ms: u64,
    pub shrink_ms: u64,
    pub cases_per_second: f64,
    /// Instances started (the first included).
    pub instances: u64,
    /// Per tool, and [`PROTOCOL_SUBJECT`] for protocol cases.
    pub subjects: BTreeMap<String, Tally>,
    pub findings: Vec<Finding>,
    /// sha256 over every case in order: two runs with the same seed agree.
    pub cases_digest: String,
}

pub use campaign::fuzz;
pub use runner::Runner;

/// `wasm`, `native` or `remote`.
pub fn launcher_word(spec: &ServerSpec) -> &'static str {
    match spec.kind {
        crate::config::ServerKind::Wasm { .. } => "wasm",
        crate::config::ServerKind::Native { .. } => "native",
        crate::config::ServerKind::Remote { .. } => "remote",
        crate::config::ServerKind::Node { .. } => "node",
    }
}

/// The default corpus directory for `server`: `moat-fuzz/<server>`.
pub fn default_corpus(server: &str) -> PathBuf {
    Path::new("moat-fuzz").join(server)
}

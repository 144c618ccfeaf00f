//! Fuzzing an MCP server through the guest boundary: [`generate`] makes
//! cases from the tools' input schemas, this module runs them against the
//! server under its own limits and classifies what happened, [`shrink`]
//! reduces each finding to a minimal input, and [`report`] writes case files
//! and JSON / JUnit reports.
//!
//! The server is launched exactly as `moat serve` would launch it (same
//! launcher, identity check, capabilities and limits), but tool pins are not
//! enforced: the point is to send the server what pins would refuse.

pub mod generate;
pub mod report;
pub mod shrink;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::config::ServerSpec;
use crate::host::Host;
use crate::limits::LimitHit;
use crate::session::{ClientError, Session};
use crate::transport::{Fault, Shared};

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
        source: Box<ClientError>,
    },
    #[error("fuzz: listing the tools of server `{server}` failed: {source}")]
    ListTools {
        server: String,
        #[source]
        source: Box<ClientError>,
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

/// Runs cases against one server, starting instances as needed.
pub struct Runner {
    host: Host,
    spec: ServerSpec,
    fresh: bool,
    session: Option<Session>,
    outputs: BTreeMap<String, jsonschema::Validator>,
    tools: Vec<ToolSchema>,
    sha256: Option<String>,
    instances: u64,
}

/// How much of a panic message a finding carries.
const PANIC_MESSAGE_BYTES: usize = 400;

/// How much of stderr is searched for a panic after a case.
const STDERR_SEARCH_BYTES: usize = 16 << 10;

impl Runner {
    /// Starts `spec` once, lists its tools and keeps the instance. With
    /// `case_timeout`, the server's request deadline is lowered to it.
    pub async fn start(
        host: Host,
        mut spec: ServerSpec,
        fresh: bool,
        case_timeout: Option<Duration>,
    ) -> Result<Self, FuzzError> {
        if let Some(timeout) = case_timeout {
            let ms = u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1);
            spec.limits.request_timeout_ms = spec.limits.request_timeout_ms.min(ms);
        }
        let session = host
            .connect(&spec)
            .await
            .map_err(|source| FuzzError::Start {
                server: spec.name.clone(),
                source: Box::new(source),
            })?;
        let sha256 = session
            .identity()
            .and_then(|identity| identity.digest.map(|d| d.to_string()));
        let listed = session
            .list_tools()
            .await
            .map_err(|source| FuzzError::ListTools {
                server: spec.name.clone(),
                source: Box::new(source),
            })?;
        let mut outputs = BTreeMap::new();
        let mut tools = Vec::new();
        for tool in &listed {
            let name = tool.name.to_string();
            if let Some(schema) = &tool.output_schema {
                match jsonschema::validator_for(&Value::Object((**schema).clone())) {
                    Ok(validator) => {
                        outputs.insert(name.clone(), validator);
                    }
                    Err(error) => tracing::warn!(
                        server = %spec.name, tool = %name, %error,
                        "outputSchema is not a usable JSON Schema; results are not checked against it"
                    ),
                }
            }
            tools.push(ToolSchema {
                name,
                input_schema: Value::Object((*tool.input_schema).clone()),
            });
        }
        Ok(Self {
            host,
            spec,
            fresh,
            session: Some(session),
            outputs,
            tools,
            sha256,
            instances: 1,
        })
    }

    /// Another runner for the same server, with no instance yet.
    pub fn sibling(&self) -> Self {
        Self {
            host: self.host.clone(),
            spec: self.spec.clone(),
            fresh: self.fresh,
            session: None,
            outputs: self.outputs.clone(),
            tools: self.tools.clone(),
            sha256: self.sha256.clone(),
            instances: 0,
        }
    }

    /// The tools the server listed.
    pub fn tools(&self) -> &[ToolSchema] {
        &self.tools
    }

    /// The server's spec as run (with the lowered deadline).
    pub fn spec(&self) -> &ServerSpec {
        &self.spec
    }

    /// The digest of the bytes that ran.
    pub fn sha256(&self) -> Option<&str> {
        self.sha256.as_deref()
    }

    /// Instances started so far.
    pub fn instances(&self) -> u64 {
        self.instances
    }

    /// Runs `case` and classifies what happened. An instance that faulted
    /// is closed and replaced on the next case; with `fresh`, every case
    /// gets its own.
    pub async fn run(&mut self, case: &Case) -> Outcome {
        let fresh = self.fresh;
        self.run_on(case, fresh).await
    }

    /// Runs `case` on an instance of its own, as replay and shrinking do.
    pub async fn run_fresh(&mut self, case: &Case) -> Outcome {
        self.run_on(case, true).await
    }

    async fn run_on(&mut self, case: &Case, fresh: bool) -> Outcome {
        if fresh && let Some(old) = self.session.take() {
            let _ = old.close().await;
        }
        if self.session.is_none() {
            match self.host.connect(&self.spec).await {
                Ok(session) => {
                    self.instances += 1;
                    // As an agent would, list the tools first: a 2026-07-28
                    // server picks its lifecycle on the first request, and a
                    // cancellation that overtakes it (rmcp's client writes
                    // messages from separate tasks) would meet a server that
                    // has not started a session yet.
                    if let Err(error) = session.list_tools().await {
                        let _ = session.close().await;
                        return classify_error(&error, false);
                    }
                    self.session = Some(session);
                }
                Err(error) => {
                    return Outcome::new(
                        Class::Crash,
                        format!("the server did not start again: {error}"),
                    );
                }
            }
        }
        let Some(session) = self.session.as_ref() else {
            unreachable!("a session was just started");
        };
        let shared = session.shared().clone();
        let stderr_mark = shared.stderr().total_bytes();
        let mut outcome = execute(session, case, &self.outputs).await;
        // A crash or a limit ends the instance: a typed component's call
        // fails alone, but what it wrote to stderr is only all read once
        // the session closes, and must not be laid at the next case's door.
        // So does a cancelled call: its answer is the ping's, but the call
        // may still run on the server (a typed component's always runs to
        // its end), and whatever it writes or breaks is this case's, not
        // the next one's. Closing waits for it, bounded by the grace period.
        let ended = matches!(outcome.class, Class::Crash | Class::Limit | Class::Hang)
            || matches!(case, Case::CancelMidCall { .. });
        if shared.fault().is_some() || fresh || ended {
            // Closing awaits the stderr reader, so a panic message written
            // just before the end is in the buffer below.
            if let Some(session) = self.session.take() {
                let _ = session.close().await;
            }
        }
        if let Some(message) = panic_since(&shared, stderr_mark) {
            let underneath = if outcome.class == Class::Ok {
                String::new()
            } else {
                format!(" ({}: {})", outcome.class, outcome.detail)
            };
            outcome = Outcome::new(Class::Panic, format!("{message}{underneath}"));
        }
        outcome
    }

    /// Closes the instance, if one runs.
    pub async fn close(mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.close().await;
        }
    }
}

/// The panic message the server wrote to stderr since `mark` bytes, if any.
fn panic_since(shared: &Shared, mark: u64) -> Option<String> {
    let stderr = shared.stderr();
    let new = stderr.total_bytes().saturating_sub(mark);
    if new == 0 {
        return None;
    }
    let window = usize::try_from(new)
        .unwrap_or(usize::MAX)
        .min(STDERR_SEARCH_BYTES);
    let text = stderr.tail(window);
    let at = text.find("panicked at")?;
    // Rust writes `thread 'main' panicked at src/x.rs:1:2:` and then the
    // message on the next line.
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let mut lines = text[start..].lines();
    let mut message = lines.next().unwrap_or_default().to_owned();
    if let Some(next) = lines.next() {
        message.push(' ');
        message.push_str(next);
    }
    if message.len() > PANIC_MESSAGE_BYTES {
        let mut cut = PANIC_MESSAGE_BYTES;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    Some(message)
}

/// Sends `case` on `session` and classifies the answer.
async fn execute(
    session: &Session,
    case: &Case,
    outputs: &BTreeMap<String, jsonschema::Validator>,
) -> Outcome {
    match case {
        Case::Call { tool, arguments } => call(session, tool, arguments, outputs).await,
        Case::UnknownMethod { method, params } => {
            let answer = session.request_raw(method, params.clone()).await;
            expect_rejection_then_ping(session, answer).await
        }
        Case::MalformedParams { method, params } => {
            let answer = session.request_raw(method, Some(params.clone())).await;
            expect_rejection_then_ping(session, answer).await
        }
        Case::CancelMidCall { tool, arguments } => {
            let cancel = CancellationToken::new();
            cancel.cancel();
            let answer = session
                .call_tool_with(tool, arguments.as_object().cloned(), None, cancel, None)
                .await;
            match answer {
                Ok(_) | Err(ClientError::Cancelled { .. }) => ping(session).await,
                Err(error) => classify_error(&error, false),
            }
        }
        Case::Concurrent { calls } => {
            let answers = calls
                .iter()
                .map(|c| call(session, &c.tool, &c.arguments, outputs));
            let outcomes = futures::future::join_all(answers).await;
            outcomes
                .into_iter()
                .max_by_key(|o| (o.class.is_finding(), o.class))
                .unwrap_or_else(|| Outcome::new(Class::Ok, ""))
        }
    }
}

/// One `tools/call`: typed when the arguments are an object, raw otherwise.
async fn call(
    session: &Session,
    tool: &str,
    arguments: &Value,
    outputs: &BTreeMap<String, jsonschema::Validator>,
) -> Outcome {
    let answer = match arguments {
        Value::Object(map) => match session.call_tool(tool, Some(map.clone())).await {
            Ok(result) => serde_json::to_value(result).map_err(|e| ClientError::Protocol {
                server: session.server().to_owned(),
                operation: format!("tools/call `{tool}`"),
                detail: e.to_string(),
            }),
            Err(error) => Err(error),
        },
        other => {
            // Arguments that are not an object make the request itself
            // malformed: a JSON-RPC error is a right answer.
            let answer = session
                .request_raw(
                    "tools/call",
                    Some(json!({ "name": tool, "arguments": other })),
                )
                .await;
            return match answer {
                Ok(result) => classify_result(tool, &result, outputs),
                Err(error) => classify_error(&error, true),
            };
        }
    };
    match answer {
        Ok(result) => classify_result(tool, &result, outputs),
        Err(error) => classify_error(&error, false),
    }
}

/// A tool result: a tool error, a result outside the outputSchema, or ok.
fn classify_result(
    tool: &str,
    result: &Value,
    outputs: &BTreeMap<String, jsonschema::Validator>,
) -> Outcome {
    // A typed component's call that trapped or hit a limit is an error
    // result that says so (see `instance::FAULT_META`).
    if let Some(fault) = result
        .get("_meta")
        .and_then(|m| m.get(crate::instance::FAULT_META))
    {
        let detail = fault["detail"].as_str().unwrap_or_default();
        let class = match fault["class"].as_str() {
            Some("limit") => Class::Limit,
            Some("hang") => Class::Hang,
            _ => Class::Crash,
        };
        return Outcome::new(class, detail);
    }
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        return Outcome::new(Class::ToolError, "");
    }
    let Some(validator) = outputs.get(tool) else {
        return Outcome::new(Class::Ok, "");
    };
    match result.get("structuredContent") {
        None => Outcome::new(
            Class::OutputSchema,
            "no structuredContent, though the tool declares an outputSchema",
        ),
        Some(structured) => match crate::policy::first_violation(validator, structured) {
            Ok(()) => Outcome::new(Class::Ok, ""),
            Err(violation) => Outcome::new(
                Class::OutputSchema,
                format!("structuredContent {violation}"),
            ),
        },
    }
}

/// A protocol case: a JSON-RPC error is the right answer; then the server
/// must still answer a ping.
async fn expect_rejection_then_ping(
    session: &Session,
    answer: Result<Value, ClientError>,
) -> Outcome {
    match answer {
        Ok(_) => ping(session).await,
        Err(error @ ClientError::Server { .. }) => {
            let outcome = classify_error(&error, true);
            match ping(session).await {
                Outcome {
                    class: Class::Ok, ..
                } => outcome,
                failed => failed,
            }
        }
        Err(error) => classify_error(&error, true),
    }
}

/// Whether the server still answers: any answer to `ping` will do (a
/// 2026-07-28 server may answer that it does not know the method).
async fn ping(session: &Session) -> Outcome {
    match session.ping().await {
        Ok(()) | Err(ClientError::Server { .. }) => Outcome::new(Class::Ok, ""),
        Err(error) => {
            let mut outcome = classify_error(&error, false);
            outcome.detail = format!("the server stopped answering: {}", outcome.detail);
            outcome
        }
    }
}

fn classify_error(error: &ClientError, expect_rejection: bool) -> Outcome {
    match error {
        ClientError::Fault { fault, .. } => classify_fault(fault),
        ClientError::Server { code, message, .. } => {
            let detail = format!("error {code}: {message}");
            if expect_rejection {
                Outcome::new(Class::Rejected, detail)
            } else if *code == rmcp::model::ErrorCode::INVALID_PARAMS.0 {
                Outcome::new(Class::InvalidParams, detail)
            } else {
                Outcome::new(Class::ProtocolError, detail)
            }
        }
        other => Outcome::new(Class::ProtocolError, other.to_string()),
    }
}

fn classify_fault(fault: &Fault) -> Outcome {
    match fault {
        Fault::Limit {
            limit: LimitHit::Deadline { request_timeout_ms },
            ..
        } => Outcome::new(
            Class::Hang,
            format!("no answer within request_timeout_ms = {request_timeout_ms}"),
        ),
        Fault::Limit { limit, .. } => Outcome::new(Class::Limit, limit.to_string()),
        Fault::Exited { .. } | Fault::Crashed { .. } => {
            Outcome::new(Class::Crash, fault.to_string())
        }
        Fault::NotJsonRpc { .. }
        | Fault::Io { .. }
        | Fault::UnknownResponse { .. }
        | Fault::RequestFlood { .. } => Outcome::new(Class::ProtocolError, fault.to_string()),
    }
}

/// A fuzz run: generates cases until the budget is spent, records the first
/// case of each (subject, class) finding, then shrinks each on fresh
/// instances and saves it under `corpus/findings/`.
pub async fn fuzz(
    runner: Runner,
    options: &Options,
    mut on_event: impl FnMut(Event<'_>),
) -> Result<Summary, FuzzError> {
    use futures::StreamExt as _;

    let corpus = report::load_corpus(&options.corpus)?;
    let tools = select_tools(&runner, &options.tools)?;
    let mut generator = Generator::new(options.seed, tools, &corpus);
    let mut subjects: BTreeMap<String, Tally> = BTreeMap::new();
    for tool in generator.tools() {
        subjects.insert(tool.name.clone(), Tally::default());
    }
    subjects.insert(PROTOCOL_SUBJECT.to_owned(), Tally::default());
    let mut findings: Vec<Finding> = Vec::new();
    let mut digest = sha2::Sha256::default();
    let started = Instant::now();
    let mut index = 0u64;
    // One runner (one instance at a time) per job; a case waits for a free
    // runner, so a hang holds up one job, not the run.
    let mut idle: Vec<Runner> = (1..options.jobs.max(1)).map(|_| runner.sibling()).collect();
    let mut running = futures::stream::FuturesUnordered::new();
    let mut retired = 0u64;
    idle.push(runner);
    loop {
        while !idle.is_empty() {
            let more = match options.budget {
                Budget::Runs(n) => index < n,
                Budget::Time(limit) => started.elapsed() < limit,
            };
            if !more {
                break;
            }
            let Some(mut worker) = idle.pop() else { break };
            let case = generator.next_case();
            sha2::Digest::update(&mut digest, serde_json::to_vec(&case).unwrap_or_default());
            sha2::Digest::update(&mut digest, b"\n");
            on_event(Event::Generated { index, case: &case });
            let at = index;
            running.push(async move {
                let outcome = worker.run(&case).await;
                (worker, at, case, outcome)
            });
            index += 1;
        }
        let Some((worker, at, case, outcome)) = running.next().await else {
            break;
        };
        idle.push(worker);
        let elapsed = started.elapsed();
        let tally = subjects.entry(case.subject().to_owned()).or_default();
        tally.cases += 1;
        *tally
            .outcomes
            .entry(outcome.class.word().to_owned())
            .or_default() += 1;
        on_event(Event::Case {
            index: at,
            case: &case,
            outcome: &outcome,
            elapsed,
        });
        if outcome.class.is_finding() {
            match findings
                .iter_mut()
                .find(|f| f.class == outcome.class && f.subject == case.subject())
            {
                Some(known) => known.occurrences += 1,
                None => {
                    let finding = Finding {
                        class: outcome.class,
                        subject: case.subject().to_owned(),
                        detail: outcome.detail.clone(),
                        case: case.clone(),
                        original: case.clone(),
                        case_index: at,
                        found_after_ms: millis(elapsed),
                        occurrences: 1,
                        shrink: ShrinkStats::default(),
                        file: None,
                    };
                    on_event(Event::Finding(&finding));
                    findings.push(finding);
                }
            }
        }
    }
    drop(running);
    let mut runner = idle.pop().expect("every runner is back once nothing runs");
    for other in idle {
        retired += other.instances();
        other.close().await;
    }
    let fuzz_time = started.elapsed();
    for finding in &mut findings {
        on_event(Event::Shrinking(finding));
        shrink_finding(&mut runner, finding, options).await;
    }
    let mut findings = merge_shrunk(findings);
    for finding in &mut findings {
        let file = report::save_finding(
            &options.corpus,
            runner.spec(),
            runner.sha256(),
            finding,
            options.seed,
        )?;
        finding.file = Some(file);
    }
    let shrink_time = started.elapsed() - fuzz_time;
    let summary = Summary {
        server: runner.spec.name.clone(),
        launcher: launcher_word(&runner.spec).to_owned(),
        sha256: runner.sha256.clone(),
        seed: options.seed,
        budget: options.budget.to_string(),
        fresh: options.fresh,
        request_timeout_ms: runner.spec.limits.request_timeout_ms,
        cases: index,
        fuzz_ms: millis(fuzz_time),
        shrink_ms: millis(shrink_time),
        cases_per_second: if fuzz_time.is_zero() {
            0.0
        } else {
            index as f64 / fuzz_time.as_secs_f64()
        },
        instances: runner.instances() + retired,
        subjects,
        findings,
        cases_digest: hex::encode(sha2::Digest::finalize(digest)),
    };
    runner.close().await;
    Ok(summary)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `wasm`, `native` or `remote`.
pub fn launcher_word(spec: &ServerSpec) -> &'static str {
    match spec.kind {
        crate::config::ServerKind::Wasm { .. } => "wasm",
        crate::config::ServerKind::Native { .. } => "native",
        crate::config::ServerKind::Remote { .. } => "remote",
    }
}

fn select_tools(runner: &Runner, wanted: &[String]) -> Result<Vec<ToolSchema>, FuzzError> {
    if wanted.is_empty() {
        return Ok(runner.tools().to_vec());
    }
    wanted
        .iter()
        .map(|name| {
            runner
                .tools()
                .iter()
                .find(|t| &t.name == name)
                .cloned()
                .ok_or_else(|| FuzzError::NoSuchTool {
                    server: runner.spec.name.clone(),
                    tool: name.clone(),
                    listed: runner
                        .tools()
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
        })
        .collect()
}

/// A protocol case that shrank to a plain call of one tool is that tool's
/// finding: filed under the tool, and merged into the tool's own finding of
/// the same class when there is one.
fn merge_shrunk(findings: Vec<Finding>) -> Vec<Finding> {
    let mut merged: Vec<Finding> = Vec::new();
    let (tools, protocol): (Vec<Finding>, Vec<Finding>) = findings
        .into_iter()
        .partition(|f| f.subject != PROTOCOL_SUBJECT);
    merged.extend(tools);
    for mut finding in protocol {
        if let Case::Call { tool, .. } = &finding.case {
            finding.subject = tool.clone();
        }
        match merged
            .iter_mut()
            .find(|f| f.subject == finding.subject && f.class == finding.class)
        {
            Some(known) => known.occurrences += finding.occurrences,
            None => merged.push(finding),
        }
    }
    merged.sort_by_key(|f| f.found_after_ms);
    merged
}

/// Reruns the finding on a fresh instance, then greedily keeps the first
/// simpler candidate that fails with the same class, until none does or the
/// budget is spent.
async fn shrink_finding(runner: &mut Runner, finding: &mut Finding, options: &Options) {
    let started = Instant::now();
    let within_budget = |stats: &ShrinkStats| {
        stats.attempts < options.shrink_attempts && started.elapsed() < options.shrink_time
    };
    let mut stats = ShrinkStats::default();
    let first = runner.run_fresh(&finding.original).await;
    stats.attempts += 1;
    stats.reproduced = first.class == finding.class;
    if !stats.reproduced {
        finding.shrink = stats;
        return;
    }
    stats.detail = first.detail;
    let mut current = finding.original.clone();
    'outer: while within_budget(&stats) {
        for candidate in shrink::case_candidates(&current) {
            if !within_budget(&stats) {
                break 'outer;
            }
            stats.attempts += 1;
            let outcome = runner.run_fresh(&candidate).await;
            if outcome.class == finding.class {
                stats.steps += 1;
                stats.detail = outcome.detail;
                current = candidate;
                continue 'outer;
            }
        }
        break;
    }
    finding.case = current;
    finding.shrink = stats;
}

/// The default corpus directory for `server`: `moat-fuzz/<server>`.
pub fn default_corpus(server: &str) -> PathBuf {
    Path::new("moat-fuzz").join(server)
}

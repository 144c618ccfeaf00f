//! The runner: one server launched as `moat serve` would launch it, its
//! tools listed and its outputs' schemas compiled, and cases run on it (on
//! the instance kept, or on a fresh one each time), restarting after a
//! crash. What an answer means is [`super::oracle`]'s.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::oracle::{classify_error, execute, panic_since};
use super::{Case, Class, FuzzError, Outcome, ToolSchema};
use crate::config::ServerSpec;
use crate::host::Host;
use crate::session::Session;

/// Runs cases against one server, starting instances as needed.
pub struct Runner {
    host: Host,
    pub(super) spec: ServerSpec,
    fresh: bool,
    session: Option<Session>,
    outputs: BTreeMap<String, jsonschema::Validator>,
    tools: Vec<ToolSchema>,
    pub(super) sha256: Option<String>,
    instances: u64,
}

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

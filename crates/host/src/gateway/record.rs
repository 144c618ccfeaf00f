//! What a call's end is recorded as: the outcome for the audit log and
//! metrics, the limit that stopped it, the line a refusal adds, and the
//! error the agent gets; and the one sink a call's end goes to, for the
//! metrics, the trace and the audit log.

use super::error::CallError;
use super::session::SessionState;
use crate::audit::{AuditError, Event, Outcome};
use crate::host::ConnectError;
use crate::identity::Digest;
use crate::session::{Session, SessionError};
use rmcp::model::{CallToolResponse, ErrorData};
use std::time::Instant;

pub(super) fn evidence_of(child: &Session) -> String {
    child
        .identity()
        .map(|identity| identity.evidence.to_string())
        .unwrap_or_default()
}

/// The agent's error for a call refused because the audit log cannot be
/// written: the log, the OS error and what to do.
pub(super) fn unaudited(error: &AuditError) -> ErrorData {
    ErrorData::internal_error(error.to_string(), None)
}

/// What the audit log says of a failed call or close: Moat's words, and
/// only the digest of whatever text the server chose.
pub(super) fn outcome_of(error: &CallError) -> Outcome {
    match error {
        CallError::Session(error) => session_outcome(error),
        CallError::Connect(error) => connect_outcome(error),
        CallError::GaveUp { fault, .. } => Outcome::of_fault(fault),
        // Moat's own refusals, in its own words.
        CallError::CancelledByRevocation { .. } | CallError::Revoked { .. } => {
            Outcome::plain("revoked")
        }
        CallError::Stale { .. } => Outcome::plain("stale"),
        CallError::NotStarted { .. } => Outcome::plain("not-started"),
    }
}

/// [`outcome_of`] for what the server session said.
pub(super) fn session_outcome(error: &SessionError) -> Outcome {
    match error {
        SessionError::InvalidArguments { .. } => Outcome::plain("invalid-params"),
        SessionError::ToolUnavailable { .. } => Outcome::plain("unavailable"),
        SessionError::Cancelled { .. } => Outcome::plain("cancelled"),
        SessionError::Fault { fault, .. } => Outcome::of_fault(fault),
        SessionError::InvalidOutput { .. } => Outcome::plain("invalid-output"),
        SessionError::Launch(_) | SessionError::BadLock { .. } => Outcome::plain(error.to_string()),
        // The rest may quote the server (a JSON-RPC error's message, the
        // paths its stderr named).
        other => Outcome::with_server_text("error", Some(&other.to_string())),
    }
}

/// [`outcome_of`] for what starting the server under the lock said: Moat's
/// own words, or the session's.
pub(super) fn connect_outcome(error: &ConnectError) -> Outcome {
    match error {
        ConnectError::Session(error) => session_outcome(error),
        ConnectError::Revoked { .. } => Outcome::plain("revoked"),
        other => Outcome::plain(other.to_string()),
    }
}

/// `answer` (a tool's error) with one more text block when its text shows
/// the native sandbox refusing the server something (see
/// [`crate::session::refusal_seen`]), and that refusal for the audit log:
/// the agent's error carries the same line a failed start does. Only for a
/// server under a kernel-enforced sandbox.
pub(super) fn explained(
    child: &Session,
    server: &str,
    mut answer: rmcp::model::CallToolResult,
) -> (
    rmcp::model::CallToolResult,
    Option<crate::session::SeenRefusal>,
) {
    let Some(identity) = child.identity() else {
        return (answer, None);
    };
    if !identity.sandbox.kernel_filesystem {
        return (answer, None);
    }
    let text = answer
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect::<Vec<_>>()
        .join("\n");
    let seen = crate::session::refusal_seen(server, &text, &identity.sandbox.granted);
    if let Some(seen) = &seen {
        answer
            .content
            .push(rmcp::model::ContentBlock::text(seen.line(server)));
    }
    (answer, seen)
}

/// The limit that stopped a call, from its error.
pub(super) fn limit_of(error: &CallError) -> Option<&'static str> {
    let fault = match error {
        CallError::GaveUp { fault, .. } => fault,
        CallError::Session(error) => error.fault()?,
        _ => return None,
    };
    match fault {
        crate::transport::Fault::Limit { limit, .. } => Some(limit.name()),
        _ => None,
    }
}

/// The limit that stopped a call, as the launcher marked the result: only
/// where what answers is Moat's own code (see
/// [`crate::instance::Identity::marks_faults`]).
pub(super) fn typed_limit(
    child: &Session,
    answer: &rmcp::model::CallToolResult,
) -> Option<&'static str> {
    if !child
        .identity()
        .is_some_and(|identity| identity.marks_faults())
    {
        return None;
    }
    crate::instance::marked_limit(answer.meta.as_ref().map(|meta| &meta.0))
}

pub(super) fn cancelled(server: &str, tool: &str) -> ErrorData {
    to_error(SessionError::Cancelled {
        server: server.to_owned(),
        tool: tool.to_owned(),
    })
}

/// The agent's error for `error`: invalid params where the agent's call
/// was at fault, Moat's internal error otherwise.
pub(super) fn to_error(error: impl Into<CallError>) -> ErrorData {
    let error = error.into();
    match error.session() {
        Some(SessionError::InvalidArguments { .. } | SessionError::ToolUnavailable { .. }) => {
            ErrorData::invalid_params(error.to_string(), None)
        }
        _ => ErrorData::internal_error(error.to_string(), None),
    }
}

/// One tool call being recorded: what the audit log needs from its start.
pub(super) struct CallRecord<'s> {
    session: &'s SessionState,
    server: &'s str,
    tool: &'s str,
    /// The arguments as sent, when there is a log to record their digest.
    arguments_json: Option<Vec<u8>>,
    started: Instant,
}

impl<'s> CallRecord<'s> {
    /// Begins recording a call of `session` to `server`'s `tool`.
    pub(super) fn begin(
        session: &'s SessionState,
        server: &'s str,
        tool: &'s str,
        arguments: &Option<rmcp::model::JsonObject>,
    ) -> Self {
        // What the audit records of the call: only computed for a log.
        let arguments_json = session
            .gateway
            .audit
            .is_some()
            .then(|| serde_json::to_vec(arguments).unwrap_or_default());
        CallRecord {
            session,
            server,
            tool,
            arguments_json,
            started: Instant::now(),
        }
    }

    /// Records how the call ended at `child` (which burnt `fuel`): in the
    /// metrics, in `span`, and in the audit log, with the line a refusal by
    /// the sandbox adds to a tool's error. Fails closed: an answer that
    /// cannot be recorded is not given (the server did the work; the agent
    /// gets the log's error instead).
    pub(super) fn end(
        self,
        child: &Session,
        span: &tracing::Span,
        fuel: u64,
        result: Result<CallToolResponse, CallError>,
    ) -> Result<CallToolResponse, ErrorData> {
        let CallRecord {
            session,
            server,
            tool,
            arguments_json,
            started,
        } = self;
        // A tool's error that shows the sandbox refusing it says so.
        let (result, seen) = match result {
            Ok(CallToolResponse::Complete(answer)) if answer.is_error == Some(true) => {
                let (answer, seen) = explained(child, server, answer);
                (Ok(CallToolResponse::Complete(answer)), seen)
            }
            other => (other, None),
        };
        let elapsed = started.elapsed();
        let (outcome, limit) = match &result {
            Ok(CallToolResponse::Complete(answer)) if answer.is_error == Some(true) => {
                (Outcome::plain("tool-error"), typed_limit(child, answer))
            }
            Ok(CallToolResponse::Task(_)) => (Outcome::plain("task"), None),
            Ok(CallToolResponse::InputRequired(_)) => (Outcome::plain("input-required"), None),
            Ok(_) => (Outcome::plain("ok"), None),
            Err(error) => (outcome_of(error), limit_of(error)),
        };
        session
            .gateway
            .metrics
            .call(server, tool, &outcome.outcome, elapsed, fuel, limit);
        crate::trace::record_end(span, &outcome.outcome, elapsed, fuel, limit);
        // Without a log, the session's claim (when claims are signed) still
        // counts the call: its ledger is fed the same events, with no
        // digests worth computing.
        if arguments_json.is_none() && session.gateway.claims().is_none() {
            return result.map_err(to_error);
        }
        let arguments_json = arguments_json.unwrap_or_default();
        let result_json = result.as_ref().ok().and_then(|r| match r {
            CallToolResponse::Complete(r) => serde_json::to_vec(r).ok(),
            CallToolResponse::InputRequired(r) => serde_json::to_vec(r).ok(),
            CallToolResponse::Task(r) => serde_json::to_vec(r).ok(),
            _ => None,
        });
        if let Some(seen) = seen {
            session
                .audit(Event::SandboxRefused {
                    session: session.id.clone(),
                    server: server.to_owned(),
                    during: format!("tools/call {tool}"),
                    kind: seen.kind.to_owned(),
                    subject: seen.subject,
                })
                .map_err(|error| unaudited(&error))?;
        }
        session
            .audit(Event::ToolCall {
                session: session.id.clone(),
                server: server.to_owned(),
                tool: tool.to_owned(),
                arguments_sha256: Digest::of(&arguments_json).to_string(),
                arguments_bytes: arguments_json.len(),
                result_sha256: result_json.as_ref().map(|r| Digest::of(r).to_string()),
                result_bytes: result_json.as_ref().map_or(0, Vec::len),
                duration_ms: elapsed.as_millis() as u64,
                fuel,
                outcome,
            })
            .map_err(|error| unaudited(&error))?;
        result.map_err(to_error)
    }
}

//! The oracle: what counts as a finding. A case is sent on a session and
//! its answer, error, transport fault or stderr panic is classified into an
//! [`Outcome`]; unknown methods and malformed params must be rejected and
//! the server must still answer a ping after them.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{Case, Class, Outcome};
use crate::limits::LimitHit;
use crate::session::{Session, SessionError};
use crate::transport::{Fault, Shared};

/// How much of a panic message a finding carries.
const PANIC_MESSAGE_BYTES: usize = 400;

/// How much of stderr is searched for a panic after a case.
const STDERR_SEARCH_BYTES: usize = 16 << 10;

/// The panic message the server wrote to stderr since `mark` bytes, if any.
pub(super) fn panic_since(shared: &Shared, mark: u64) -> Option<String> {
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
pub(super) async fn execute(
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
                Ok(_) | Err(SessionError::Cancelled { .. }) => ping(session).await,
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
            Ok(result) => serde_json::to_value(result).map_err(|e| SessionError::Protocol {
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
    answer: Result<Value, SessionError>,
) -> Outcome {
    match answer {
        Ok(_) => ping(session).await,
        Err(error @ SessionError::Server { .. }) => {
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
        Ok(()) | Err(SessionError::Server { .. }) => Outcome::new(Class::Ok, ""),
        Err(error) => {
            let mut outcome = classify_error(&error, false);
            outcome.detail = format!("the server stopped answering: {}", outcome.detail);
            outcome
        }
    }
}

pub(super) fn classify_error(error: &SessionError, expect_rejection: bool) -> Outcome {
    match error {
        SessionError::Fault { fault, .. } => classify_fault(fault),
        SessionError::Server { code, message, .. } => {
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

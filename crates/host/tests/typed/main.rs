//! Typed tool components (no `wasi:cli/run`): each exported function is a
//! tool, named and shaped as Wassette derives it, with schemas that keep the
//! WIT types; calls convert JSON to component values and back, run under
//! the server's limits, and fail alone, in both instance modes.
//!
//! Tests by topic: `schemas`, `values`, `instances` and `languages`; this
//! file keeps the helpers they share.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

use common::{args, host, text};

use moat_host::ServerSpec;
use moat_host::config::{Instances, ServerKind};
use moat_host::rmcp::model::CallToolResult;
use moat_host::{Session, SessionError};
use moat_test_guests as guests;
use serde_json::{Value, json};

mod instances;
mod languages;
mod schemas;
mod values;

fn kinds(instances: Instances) -> ServerSpec {
    let mut spec = ServerSpec::wasm("kinds", guests::KINDS_WASM);
    spec.allow_unmeasured = true;
    if let ServerKind::Wasm {
        instances: mode, ..
    } = &mut spec.kind
    {
        *mode = instances;
    }
    spec
}

async fn connect(instances: Instances) -> Session {
    host()
        .connect(&kinds(instances))
        .await
        .expect("connect to kinds")
}

async fn call(session: &Session, tool: &str, arguments: Value) -> CallToolResult {
    session
        .call_tool(tool, args(arguments))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// The structured result of a successful call: the `result` it wraps.
async fn result(session: &Session, tool: &str, arguments: Value) -> Value {
    let answer = call(session, tool, arguments).await;
    assert_ne!(answer.is_error, Some(true), "{tool}: {answer:?}");
    let structured = answer
        .structured_content
        .clone()
        .expect("structured content");
    let value = structured["result"].clone();
    // The text is the value itself when it is a string, else compact JSON.
    let expected_text = match &value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    assert_eq!(text(&answer), expected_text, "{tool}");
    value
}

const SHAPES: &str = "moat_kinds_shapes_0_1_0_";

/// The message of a refused call.
async fn refused(session: &Session, tool: &str, arguments: Value) -> String {
    match session.call_tool(tool, args(arguments)).await {
        Err(SessionError::Server { code, message, .. }) => {
            assert_eq!(code, -32602, "{tool}: invalid params");
            message
        }
        other => panic!("{tool}: expected a refusal, got {other:?}"),
    }
}

/// The text of a call that failed alone.
async fn failed(session: &Session, tool: &str, arguments: Value) -> String {
    let answer = call(session, tool, arguments).await;
    assert_eq!(answer.is_error, Some(true), "{tool}: {answer:?}");
    assert!(answer.structured_content.is_none());
    text(&answer)
}

fn foreign(name: &str, wasm: &str) -> ServerSpec {
    let mut spec = ServerSpec::wasm(name, wasm);
    spec.allow_unmeasured = true;
    spec
}

//! Helpers shared by the integration tests.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use moat_host::rmcp::model::{CallToolResult, JsonObject};

/// A JSON object literal as tool arguments.
pub fn args(value: serde_json::Value) -> Option<JsonObject> {
    value.as_object().cloned()
}

/// The text content of a tool result, concatenated.
pub fn text(result: &CallToolResult) -> String {
    let content = serde_json::to_value(&result.content).unwrap();
    content
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect()
}

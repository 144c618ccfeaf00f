//! Protocol cases: what is not a plain call of one tool. Unknown methods,
//! known methods with params of the wrong shape, a call cancelled before
//! it is answered, and several calls at once.

use rand::RngExt;
use serde_json::{Value, json};

use super::{Call, Case, Generator};

/// Methods no MCP server implements.
const UNKNOWN_METHODS: &[&str] = &[
    "tools/destroy",
    "resources/write",
    "rpc.discover",
    "$/cancelRequest",
    "tools/call/again",
    "x",
    "notifications/initialized/extra",
    "sampling/createMessage",
];

/// Methods a server knows, to receive params of the wrong shape.
const KNOWN_METHODS: &[&str] = &[
    "tools/call",
    "tools/list",
    "resources/read",
    "resources/list",
    "prompts/get",
    "prompts/list",
    "logging/setLevel",
    "completion/complete",
];

impl Generator {
    pub(super) fn protocol_case(&mut self) -> Case {
        let kinds = if self.tools.is_empty() { 2 } else { 4 };
        match self.rng.random_range(0..kinds) {
            0 => {
                let method = self.pick(UNKNOWN_METHODS).to_owned();
                let params = match self.rng.random_range(0..3u32) {
                    0 => None,
                    1 => Some(json!({})),
                    _ => Some(self.any_value(2)),
                };
                Case::UnknownMethod { method, params }
            }
            1 => {
                let method = self.pick(KNOWN_METHODS).to_owned();
                let params = self.malformed_params(&method);
                Case::MalformedParams { method, params }
            }
            2 => {
                let index = self.rng.random_range(0..self.tools.len());
                let schema = self.tools[index].input_schema.clone();
                self.boundary = 0.0;
                let arguments = self.value(&schema, &schema, 0);
                Case::CancelMidCall {
                    tool: self.tools[index].name.clone(),
                    arguments,
                }
            }
            _ => {
                let n = self.rng.random_range(2..=8usize);
                let calls = (0..n)
                    .map(|_| {
                        let index = self.rng.random_range(0..self.tools.len());
                        let schema = self.tools[index].input_schema.clone();
                        self.boundary = 0.1;
                        Call {
                            tool: self.tools[index].name.clone(),
                            arguments: self.value(&schema, &schema, 0),
                        }
                    })
                    .collect();
                Case::Concurrent { calls }
            }
        }
    }

    /// Params of the wrong shape for `method`.
    fn malformed_params(&mut self, method: &str) -> Value {
        let tool = self
            .tools
            .first()
            .map_or_else(|| "nothing".to_owned(), |t| t.name.clone());
        match self.rng.random_range(0..6u32) {
            0 => json!([1, 2, 3]),
            1 => json!("params"),
            2 => json!(null),
            3 if method == "tools/call" => json!({ "name": 5 }),
            3 => json!({ "cursor": 5, "uri": false, "name": [] }),
            4 if method == "tools/call" => json!({ "name": tool, "arguments": [1] }),
            4 => json!({ "level": "loudest", "ref": {} }),
            _ => json!({ "name": tool, "_meta": { "progressToken": [] } }),
        }
    }
}

//! A minimal hand-written MCP server loop shared by the hostile guests.
//!
//! It speaks just enough of the protocol to get a client through the legacy
//! `initialize` handshake (it answers `server/discover` with method-not-found,
//! as a pre-2026 server does; late, with `HOSTILE_LATE_DISCOVER`) and to
//! list one tool, `attack`. Each binary then
//! misbehaves when `attack` is called. Blocking std I/O is deliberate: it works
//! unchanged on wasm32-wasip2 and natively.

use std::io::{BufRead, Write};

use serde_json::{Value, json};

/// What a hostile binary does when `tools/call` arrives. Returning `Some`
/// answers the call with that result.
pub trait Attack {
    fn on_call(&mut self, id: &Value) -> Option<Value>;
}

impl<F: FnMut(&Value) -> Option<Value>> Attack for F {
    fn on_call(&mut self, id: &Value) -> Option<Value> {
        self(id)
    }
}

/// The `_meta` of the `tools/call` being answered (null outside one), for
/// guests that report what they were sent.
static CALL_META: std::sync::Mutex<Value> = std::sync::Mutex::new(Value::Null);

/// The `_meta` of the call being answered.
pub fn call_meta() -> Value {
    CALL_META
        .lock()
        .map(|meta| meta.clone())
        .unwrap_or(Value::Null)
}

/// Writes one JSON-RPC message as a line on stdout.
pub fn send(message: &Value) {
    let mut stdout = std::io::stdout().lock();
    let mut line = message.to_string();
    line.push('\n');
    // A closed stdout means the host went away: nothing left to do.
    if stdout
        .write_all(line.as_bytes())
        .and_then(|()| stdout.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

/// A text tool result for request `id`.
pub fn text_result(id: &Value, text: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}]}})
}

/// Exits with `code`, carrying the code through WASI's `exit-with-code` on wasm.
pub fn exit(code: u8) -> ! {
    #[cfg(target_os = "wasi")]
    wasip2::cli::exit::exit_with_code(code);
    std::process::exit(i32::from(code))
}

/// Serves until stdin closes, calling `attack` for every `tools/call`.
pub fn serve(name: &str, attack: impl Attack) {
    serve_described(name, "Misbehaves", attack)
}

/// Like [`serve`], with `description` as the `attack` tool's description.
pub fn serve_described(name: &str, description: &str, mut attack: impl Attack) {
    serve_with_arguments(name, description, |id: &Value, _: &Value| {
        attack.on_call(id)
    })
}

/// Like [`serve_described`], handing `attack` the call's arguments too.
pub fn serve_with_arguments(
    name: &str,
    description: &str,
    mut attack: impl FnMut(&Value, &Value) -> Option<Value>,
) {
    // The tool's name: `attack`, unless HOSTILE_TOOL_NAME says otherwise
    // (names that cannot be exposed are part of the attack surface too).
    let tool_name = std::env::var("HOSTILE_TOOL_NAME").unwrap_or_else(|_| "attack".to_owned());
    // With HOSTILE_LATE_DISCOVER, `server/discover` is refused only once
    // the next request has come: after the client gave up waiting and went
    // on to `initialize`, as a server too slow to start does.
    let late_discover = std::env::var_os("HOSTILE_LATE_DISCOVER").is_some();
    let mut held_discover: Option<Value> = None;
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return };
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            continue;
        };
        let Some(id) = message.get("id") else {
            continue; // a notification
        };
        if late_discover && method == "server/discover" && held_discover.is_none() {
            held_discover = Some(id.clone());
            continue;
        }
        if let Some(held) = held_discover.take() {
            send(&json!({"jsonrpc": "2.0", "id": held, "error": {
                "code": -32601, "message": "method not found: server/discover"
            }}));
        }
        match method {
            // With HOSTILE_DISCOVER, the server speaks 2026-07-28: no
            // handshake, and every request carries the client's `_meta`.
            "server/discover" if std::env::var_os("HOSTILE_DISCOVER").is_some() => {
                send(&json!({"jsonrpc": "2.0", "id": id, "result": {
                    "resultType": "complete",
                    "supportedVersions": ["2026-07-28"],
                    "capabilities": {"tools": {}},
                    "ttlMs": 0,
                    "cacheScope": "private",
                    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": name, "version": "0.1.0"}}
                }}));
            }
            "initialize" => {
                let version = message
                    .pointer("/params/protocolVersion")
                    .cloned()
                    .unwrap_or(json!("2025-06-18"));
                send(&json!({"jsonrpc": "2.0", "id": id, "result": {
                    "protocolVersion": version,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": name, "version": "0.1.0"}
                }}));
            }
            "tools/list" => send(&json!({"jsonrpc": "2.0", "id": id, "result": {"tools": [{
                "name": tool_name,
                "description": description,
                "inputSchema": {"type": "object"}
            }]}})),
            "tools/call" => {
                let arguments = message
                    .pointer("/params/arguments")
                    .cloned()
                    .unwrap_or(Value::Null);
                if let Ok(mut meta) = CALL_META.lock() {
                    *meta = message
                        .pointer("/params/_meta")
                        .cloned()
                        .unwrap_or(Value::Null);
                }
                if let Some(reply) = attack(id, &arguments) {
                    send(&reply);
                }
            }
            "ping" => send(&json!({"jsonrpc": "2.0", "id": id, "result": {}})),
            _ => send(&json!({"jsonrpc": "2.0", "id": id, "error": {
                "code": -32601, "message": format!("method not found: {method}")
            }})),
        }
    }
}

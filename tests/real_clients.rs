//! MCP clients that nobody here wrote drive `moat serve`: the official
//! TypeScript SDK and the official Python SDK, over stdio, list tools across
//! a wasm and a native server, call both, receive progress, and cancel a
//! long call. The Python SDK also speaks 2026-07-28 to Moat (requests for
//! input and a subscription across servers), and both SDKs on 2025-11-25
//! are asked for a 2026-07-28 server's input with their own elicitation.

use std::path::Path;
use std::process::Command;

use moat_test_guests as guests;

mod common;
use common::serve_http;

/// A config with the `everything` guest as wasm and as native.
fn hybrid_config(dir: &Path) -> std::path::PathBuf {
    let config = dir.join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.wasm]\nwasm = {:?}\nallow_unmeasured = true\n[servers.native]\ncommand = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM,
            guests::EVERYTHING_NATIVE
        ),
    )
    .unwrap();
    config
}

/// What both agents report, checked the same way.
fn check_report(report: &serde_json::Value) {
    let tools: Vec<&str> = report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    assert!(
        tools.contains(&"wasm__echo") && tools.contains(&"native__echo"),
        "{tools:?}"
    );
    assert_eq!(report["wasm_add"], "42");
    assert_eq!(report["native_add"], "3");
    let progress: Vec<(f64, f64)> = report["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap()))
        .collect();
    assert_eq!(progress, [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)]);
    assert_eq!(report["progress_result"], "3 steps done");
    assert_eq!(report["cancelled"], true);
    assert_eq!(report["after_cancel"], "still here");
}

/// Moat cancelled the long call on the server, and says so in the audit log.
fn check_cancel_audited(audit: &Path) {
    moat_host::audit::verify(audit, &common::audit_key()).unwrap();
    let log = std::fs::read_to_string(audit).unwrap();
    let sleep = log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["event"] == "tool_call" && e["tool"] == "sleep")
        .expect("the sleep call is audited");
    assert_eq!(sleep["outcome"], "cancelled");
    assert!(sleep["duration_ms"].as_u64().unwrap() < 60_000);
}

#[test]
fn the_python_sdk_drives_moat_serve_over_stdio() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let site = root.join("target/py");
    assert!(
        site.join("mcp").exists(),
        "{} is missing: run `bash tests/setup.sh` (the README's test command does)",
        site.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let config = hybrid_config(dir.path());
    let audit = dir.path().join("audit.jsonl");
    // The agent starts `moat serve` itself, with --audit from MOAT_AUDIT.
    let output = common::py_client("py_agent.py", &config)
        .env("MOAT_AUDIT", &audit)
        .output()
        .expect("running python3");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the Python agent failed:\n{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));
    check_report(&report);
    check_cancel_audited(&audit);
}

#[test]
fn the_typescript_sdk_drives_moat_serve_over_stdio() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sdk = root.join("target/npm/node_modules/@modelcontextprotocol/sdk");
    assert!(
        sdk.join("package.json").exists(),
        "{} is missing: run `bash tests/setup.sh` (the README's test command does)",
        sdk.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let config = hybrid_config(dir.path());
    let audit = dir.path().join("audit.jsonl");
    let output = common::ts_client("ts_agent.mjs", &config)
        .env("MOAT_AUDIT", &audit)
        .output()
        .expect("running node");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the TypeScript agent failed:\n{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));
    check_report(&report);
    check_cancel_audited(&audit);
}

/// A raw HTTP/1.1 POST; returns the status code.
fn post_status(url: &str, host: &str, authorization: Option<&str>, origin: Option<&str>) -> u16 {
    use std::io::{Read, Write};
    let address = common::address_of(url);
    let address = address.as_str();
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let mut auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    if let Some(origin) = origin {
        auth.push_str(&format!("Origin: {origin}\r\n"));
    }
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[test]
fn the_typescript_sdk_drives_moat_serve_over_streamable_http() {
    let dir = tempfile::tempdir().unwrap();
    let config = hybrid_config(dir.path());
    let audit = dir.path().join("audit.jsonl");
    let (mut server, url) = serve_http(&config, "s3cret", &audit);
    let address = common::address_of(&url);

    // Without the token: 401. A foreign Host (DNS rebinding) or a browser
    // Origin that was not allowed: 403. The allowed Origin, or none: 200.
    let token = Some("Bearer s3cret");
    assert_eq!(post_status(&url, &address, None, None), 401);
    assert_eq!(post_status(&url, &address, Some("Bearer wrong"), None), 401);
    assert_eq!(post_status(&url, "evil.example", token, None), 403);
    assert_eq!(
        post_status(&url, &address, token, Some("http://evil.example")),
        403
    );
    assert_eq!(
        post_status(&url, &address, token, Some("http://app.example")),
        200
    );
    assert_eq!(post_status(&url, &address, token, None), 200);

    let output = ts_agent_against("ts_http_agent.mjs", &url);
    let _ = server.kill();
    let _ = server.wait();
    let report = agent_report(&output, "TypeScript");
    check_report(&report);
    check_cancel_audited(&audit);
}

/// Runs the TypeScript agent `script` against `moat serve --http` at `url`
/// (token `s3cret`).
fn ts_agent_against(script: &str, url: &str) -> std::process::Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sdk = root.join("target/npm/node_modules/@modelcontextprotocol/sdk");
    assert!(
        sdk.join("package.json").exists(),
        "run `bash tests/setup.sh`"
    );
    Command::new("node")
        .arg(root.join("tests/clients").join(script))
        .arg(&sdk)
        .arg(url)
        .arg("s3cret")
        .output()
        .expect("running node")
}

/// Runs the TypeScript agent `script` against a `moat serve --http` of
/// its own for `config`, which it stops afterwards.
fn ts_over_http(script: &str, config: &Path, audit: &Path) -> std::process::Output {
    let (mut server, url) = serve_http(config, "s3cret", audit);
    let output = ts_agent_against(script, &url);
    let _ = server.kill();
    let _ = server.wait();
    output
}

#[test]
fn serving_beyond_loopback_needs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let config = hybrid_config(dir.path());
    let output = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["serve", "--http", "0.0.0.0:0", "--config"])
        .arg(&config)
        .env_remove("MOAT_HTTP_TOKEN")
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("--http 0.0.0.0:0 is not a loopback address: set a bearer token"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The interpreter behind `python3`, as installed (pyenv, uv and the like
/// put it under the home directory, outside /usr).
fn python_executable() -> std::path::PathBuf {
    let output = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    std::path::PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// A config with the reference servers under `sandbox = "required"`:
/// mcp-server-time under this machine's Python, wherever it is installed,
/// and server-everything under node, each granted its package directory
/// and nothing else by hand.
fn reference_config(dir: &Path) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let site = root.join("target/py");
    let modules = root.join("target/npm/node_modules");
    assert!(
        site.join("mcp_server_time").exists() && modules.join("@modelcontextprotocol").exists(),
        "run `bash tests/setup.sh` (the README's test command does)"
    );
    let config = dir.join("moat.toml");
    let everything = modules.join("@modelcontextprotocol/server-everything/dist/index.js");
    std::fs::write(
        &config,
        format!(
            r#"[servers.time]
command = {python:?}
args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]
env = {{ PYTHONPATH = {site:?} }}
allow_unmeasured = true
sandbox = "required"
[[servers.time.dirs]]
host = {site:?}
mode = "ro"

[servers.everything]
command = "node"
args = [{everything:?}, "stdio"]
allow_unmeasured = true
sandbox = "required"
[[servers.everything.dirs]]
host = {modules:?}
mode = "ro"
"#,
            python = python_executable(),
        ),
    )
    .unwrap();
    config
}

/// What either SDK's reference agent reports, checked the same way.
fn check_reference_report(output: &std::process::Output, agent: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the {agent} agent failed:\n{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));
    let tools = report["tools"].as_array().unwrap();
    for tool in [
        "time__get_current_time",
        "time__convert_time",
        "everything__echo",
    ] {
        assert!(
            tools.contains(&serde_json::json!(tool)),
            "{tool} missing: {tools:?}"
        );
    }
    assert_eq!(report["time_error"], false, "{report}");
    assert_eq!(report["time"]["timezone"], "UTC", "{report}");
    assert!(
        report["echo"].as_str().unwrap().contains("through moat"),
        "{report}"
    );
}

/// The reference servers run under the required sandbox through `moat
/// serve`, driven by the official Python SDK.
#[test]
fn the_python_sdk_drives_the_reference_servers_under_the_required_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let config = reference_config(dir.path());
    let output = common::py_client("py_reference.py", &config)
        .output()
        .expect("running python3");
    check_reference_report(&output, "Python");
}

/// The same, driven by the official TypeScript SDK.
#[test]
fn the_typescript_sdk_drives_the_reference_servers_under_the_required_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let config = reference_config(dir.path());
    let output = common::ts_client("ts_reference.mjs", &config)
        .output()
        .expect("running node");
    check_reference_report(&output, "TypeScript");
}

/// The official TypeScript SDK drives `moat serve --locked` in front of
/// typed tool components in Rust, JavaScript and Python: it lists their
/// tools under Wassette's names and calls each. The SDK checks every
/// structured result against the tool's output schema, so a schema Moat
/// derives that does not match its own results fails here.
#[test]
fn the_typescript_sdk_calls_typed_components_in_three_languages() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.rs]\nwasm = {:?}\nallow_unmeasured = true\n\
             [servers.js]\nwasm = {:?}\nallow_unmeasured = true\n\
             [servers.py]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::KINDS_WASM,
            guests::JS_TOOLS_WASM,
            guests::PY_TOOLS_WASM
        ),
    )
    .unwrap();
    common::lock(&config);
    let calls = serde_json::json!([
        {"name": "rs__greet", "arguments": {"name": "SDK"}},
        {"name": "rs__moat_kinds_shapes_0_1_0_describe", "arguments": {"s": {"tag": "square", "val": {"x": 1, "y": 2}}}},
        {"name": "rs__checked-div", "arguments": {"a": 1, "b": 0}},
        {"name": "js__moat_js-tools_text_shout", "arguments": {"line": "hello"}},
        {"name": "js__reverse", "arguments": {"xs": [1, 2]}},
        {"name": "py__calculate", "arguments": {"expression": "6 * 7"}},
        {"name": "py__join", "arguments": {"words": ["x", "y"], "separator": "-"}},
        {"name": "rs__add", "arguments": {"a": 300, "b": 1}},
    ]);
    let output = common::ts_client("ts_calls.mjs", &config)
        .arg(calls.to_string())
        .output()
        .expect("running node");
    assert!(
        output.status.success(),
        "the TypeScript agent failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));
    let tools: Vec<&str> = report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    for name in [
        "rs__greet",
        "rs__moat_kinds_shapes_0_1_0_translate",
        "js__reverse",
        "js__moat_js-tools_text_count-words",
        "py__calculate",
        "py__join",
    ] {
        assert!(tools.contains(&name), "{name} in {tools:?}");
    }
    assert!(!tools.contains(&"py__exports_init"), "{tools:?}");
    let results: Vec<(bool, String)> = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["isError"].as_bool().unwrap(),
                r["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(results[0], (false, "Hello, SDK!".to_owned()));
    assert_eq!(results[1], (false, "a square at (1, 2)".to_owned()));
    assert_eq!(
        results[2],
        (true, r#"{"err":"cannot divide 1 by 0"}"#.to_owned())
    );
    assert_eq!(results[3], (false, "HELLO".to_owned()));
    assert_eq!(results[4], (false, "[2,1]".to_owned()));
    assert_eq!(results[5], (false, r#"{"ok":42}"#.to_owned()));
    assert_eq!(results[6], (false, "x-y".to_owned()));
    // 300 is not a u8: refused against the pinned schema before the call.
    assert!(results[7].0, "{:?}", results[7]);
    assert!(results[7].1.contains("300"), "{:?}", results[7]);
}

/// The `rounds` guest as wasm (`a`) and native (`b`), each naming itself.
fn rounds_config(dir: &Path) -> std::path::PathBuf {
    let config = dir.join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.a]\nwasm = {wasm:?}\nallow_unmeasured = true\nenv = {{ ROUNDS_NAME = \"a\" }}\n\
             [servers.b]\ncommand = {native:?}\nallow_unmeasured = true\nenv = {{ ROUNDS_NAME = \"b\" }}\n\
             [servers.c]\nwasm = {wasm:?}\nallow_unmeasured = true\n\
             env = {{ ROUNDS_NAME = \"c\", ROUNDS_REVISION = \"2025-06-18\" }}\n\
             [servers.d]\ncommand = {native:?}\nallow_unmeasured = true\n\
             env = {{ ROUNDS_NAME = \"d\", ROUNDS_REVISION = \"2025-11-25\" }}\n",
            wasm = guests::ROUNDS_WASM,
            native = guests::ROUNDS_NATIVE
        ),
    )
    .unwrap();
    config
}

/// What an agent script printed: its JSON report, once it exited well.
fn agent_report(output: &std::process::Output, agent: &str) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the {agent} agent failed:\n{stderr}"
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)))
}

/// The TypeScript SDK, which speaks 2025-11-25 at most, in front of
/// 2026-07-28 servers: a server's request for input reaches it as its own
/// `elicitation/create` (Moat asks on the server's behalf and calls the
/// server again with the answer), and a call the server makes a task of
/// comes back as the task's result. In front of older servers (`c` on
/// 2025-06-18, `d` on 2025-11-25): the server's own `elicitation/create`
/// is passed on, and `resources/subscribe` reaches the server, whose
/// update comes back.
#[test]
fn the_typescript_sdk_on_2025_11_25_is_asked_for_a_2026_servers_input() {
    let dir = tempfile::tempdir().unwrap();
    let config = rounds_config(dir.path());
    let output = common::ts_client("ts_rounds.mjs", &config)
        .output()
        .expect("running node");
    let report = agent_report(&output, "TypeScript");
    assert_eq!(
        report,
        serde_json::json!({
            "revision": "2025-11-25",
            "a_ask": "a: hello Ts (a:round-1)",
            "b_job": "b: job done",
            "c_ask": "c: hello Ts and Ts (elicited)",
            "d_touch": "d: touched 1",
            "updated": ["rounds://d/data"],
            "tasks_capability": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}},
            "task_support": ["optional"],
            "asked": ["Your name?", "Name 1?", "Name 2?", "Go on?"],
        })
        .as_object()
        .unwrap()
        .clone()
        .into_iter()
        .chain(tasks_2025_report())
        .collect::<serde_json::Value>()
    );
}

/// What ts_tasks.mjs reports of 2025-11-25's experimental tasks through
/// Moat: declared; a task of Moat's at a 2026-07-28 server (`b`, whose own
/// task Moat follows), a 2025-06-18 one that asks on the way (`c`, its
/// elicitation passed on to the agent) and a 2025-11-25 one (`d`), each
/// under an id naming its server; one cancelled; all four listed.
fn tasks_2025_report() -> serde_json::Map<String, serde_json::Value> {
    let seen = serde_json::json!(["taskCreated", "taskStatus", "result"]);
    serde_json::json!({
        "tasks_capability": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}},
        "task_support": ["optional"],
        "b__job": {"seen": seen, "id": true, "result": "b: job done"},
        "c__job": {"seen": seen, "id": true, "result": "c: job done after Ts"},
        "d__job": {"seen": seen, "id": true, "result": "d: job done inline"},
        "cancelled": "cancelled",
        "listed": ["cancelled", "completed", "completed", "completed"],
    })
    .as_object()
    .unwrap()
    .clone()
}

/// The TypeScript SDK on 2025-11-25 over streamable HTTP: the same tasks as
/// over stdio, the task requests renamed and the declarations added in
/// HTTP bodies (JSON or server-sent events), and the 2025-06-18 server's
/// elicitation reaching the agent on its stream while the task runs.
#[test]
fn the_typescript_sdk_follows_2025_11_25_tasks_over_streamable_http() {
    let dir = tempfile::tempdir().unwrap();
    let config = rounds_config(dir.path());
    let audit = dir.path().join("audit.jsonl");
    let output = ts_over_http("ts_http_tasks.mjs", &config, &audit);
    let report = agent_report(&output, "TypeScript");
    let mut expected = tasks_2025_report();
    expected.insert("asked".into(), serde_json::json!(["Go on?"]));
    assert_eq!(report, serde_json::Value::Object(expected));
}

/// The Python SDK on 2026-07-28 (`server/discover`) and on the initialize
/// handshake, in front of the `rounds` guest as wasm (`a`) and native
/// (`b`): a request for input answered by the SDK's own driver, or by Moat
/// asking the older agent with `elicitation/create`; a subscription that
/// opens a stream at each server and hears each resource from its own; a
/// task followed to its end for an agent that does not take tasks. Older
/// servers (`c` on 2025-06-18, `d` on 2025-11-25) too: their own
/// `elicitation/create` reaches the 2026-07-28 agent as a request for input
/// (the SDK's driver answers two rounds while the call waits at the
/// server) and the older agent as it was sent, and the subscription
/// reaches `d` as `resources/subscribe`.
#[test]
fn the_python_sdk_carries_2026_07_28_requests_for_input_and_subscriptions() {
    let dir = tempfile::tempdir().unwrap();
    let config = rounds_config(dir.path());
    let output = common::py_client("py_rounds.py", &config)
        .output()
        .expect("running python3");
    let report = agent_report(&output, "Python");
    assert_eq!(
        report["modern"],
        serde_json::json!({
            "revision": "2026-07-28",
            "a_ask": "a: hello Py (a:round-1)",
            "b_ask": "b: hello Py (b:round-1)",
            "c_ask": "c: hello Py and Py (elicited)",
            "d_ask": "d: hello Py (elicited)",
            "resources": [
                "rounds://a/data",
                "rounds://b/data",
                "rounds://c/data",
                "rounds://d/data"
            ],
            "caught_up": [
                ["listed"],
                ["updated", "rounds://b/data"],
                ["updated", "rounds://d/data"]
            ],
            "touched": ["a: touched 1", "b: touched 1", "d: touched 1"],
            "events": [
                ["listed"],
                ["updated", "rounds://b/data"],
                ["updated", "rounds://d/data"]
            ],
        })
    );
    assert_eq!(
        report["legacy"],
        serde_json::json!({
            "revision": "2025-11-25",
            "b_ask": "b: hello Py (b:round-1)",
            "d_ask": "d: hello Py (elicited)",
            "a_job": "a: job done",
        })
    );
}

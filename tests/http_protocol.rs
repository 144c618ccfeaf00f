//! `moat serve --http` on the 2026-07-28 revision, driven over raw HTTP as a
//! hostile or careless client would: a request whose routing headers
//! contradict its body is refused with -32020 before it reaches a server,
//! and a stateless request (no session, its `_meta` on the request) after a
//! reload reaches the new configuration; listings carry `resultType` and
//! never-cache hints; a multi round-trip request needs no session, and a
//! task is followed to its end rather than handed to a request that could
//! never find it again.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use moat_test_guests as guests;

const TOKEN: &str = "s3cret";

/// `[servers.NAME]` for the wasm `everything` guest.
fn server_table(name: &str) -> String {
    format!(
        "[servers.{name}]\nwasm = {:?}\nallow_unmeasured = true\n",
        guests::EVERYTHING_WASM
    )
}

/// A running `moat serve --http`, and its stderr line by line.
struct Server {
    child: std::process::Child,
    address: String,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Server {
    fn start(config: &Path, audit: &Path) -> Self {
        let (child, url, lines) = common::serve_http_logged(config, TOKEN, audit, &[]);
        let address = common::address_of(&url);
        Self {
            child,
            address,
            lines,
        }
    }

    /// The next stderr line that contains `text`.
    fn line_with(&self, text: &str) -> String {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(120))
                .expect("moat serve's stderr ended");
            if line.contains(text) {
                return line;
            }
        }
    }

    /// One stateless 2026-07-28 request: `method` with `params` (its
    /// `_meta` added), and the routing headers `headers`. The status and
    /// the JSON-RPC answer.
    fn request(
        &self,
        method: &str,
        params: serde_json::Value,
        headers: &[(&str, &str)],
    ) -> (u16, serde_json::Value) {
        let mut params = params;
        let mut meta = serde_json::json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        // What the caller put in `_meta` itself wins.
        if let Some(given) = params.get("_meta").and_then(|m| m.as_object()) {
            for (key, value) in given {
                meta[key] = value.clone();
            }
        }
        params["_meta"] = meta;
        let body = serde_json::json!({
            "jsonrpc": "2.0", "id": 7, "method": method, "params": params,
        })
        .to_string();
        let extra: String = headers
            .iter()
            .map(|(name, value)| format!("{name}: {value}\r\n"))
            .collect();
        let mut stream = TcpStream::connect(&self.address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        write!(
            stream,
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nMCP-Protocol-Version: 2026-07-28\r\n{extra}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.address,
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response);
        let (status, _, json) = common::http_answer(&response, "moat-replica");
        (status, json)
    }

    fn tool_names(&self) -> Vec<String> {
        let (status, answer) = self.request(
            "tools/list",
            serde_json::json!({}),
            &[("Mcp-Method", "tools/list")],
        );
        assert_eq!(status, 200, "{answer}");
        // Moat's listing changes with every reload and revocation and hides
        // what they refuse: never cacheable, whatever the servers say.
        assert_eq!(answer["result"]["resultType"], "complete", "{answer}");
        assert_eq!(answer["result"]["ttlMs"], 0, "{answer}");
        assert_eq!(answer["result"]["cacheScope"], "private", "{answer}");
        answer["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Header checks: `Mcp-Method` or `Mcp-Name` contradicting the body gets
/// HTTP 400 with JSON-RPC -32020 naming both, and the call never reaches
/// the server (the audit log has no tool call); the matching request is
/// answered.
#[test]
fn routing_headers_that_contradict_the_body_get_32020() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    let audit = dir.path().join("audit.jsonl");
    std::fs::write(&config, server_table("a")).unwrap();
    let server = Server::start(&config, &audit);
    let add = serde_json::json!({"name": "a__add", "arguments": {"a": 1, "b": 2}});
    for (headers, named) in [
        (
            [("Mcp-Method", "tools/list"), ("Mcp-Name", "a__add")],
            "Mcp-Method header `tools/list` does not match body method `tools/call`",
        ),
        (
            [("Mcp-Method", "tools/call"), ("Mcp-Name", "a__echo")],
            "Mcp-Name header `a__echo` does not match body value `a__add`",
        ),
    ] {
        let (status, answer) = server.request("tools/call", add.clone(), &headers);
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["code"], -32020, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(named), "{message}");
    }
    let calls = || {
        std::fs::read_to_string(&audit)
            .unwrap()
            .lines()
            .filter(|l| l.contains(r#""event":"tool_call""#))
            .count()
    };
    assert_eq!(calls(), 0, "refused before any server saw it");
    let (status, answer) = server.request(
        "tools/call",
        add,
        &[("Mcp-Method", "tools/call"), ("Mcp-Name", "a__add")],
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["content"][0]["text"], "3", "{answer}");
    assert_eq!(calls(), 1);
}

/// A stateless request after a reload reaches the new configuration: each
/// one is a session of its own in the generation current when it arrives.
#[test]
fn a_stateless_request_after_a_reload_reaches_the_new_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    let audit = dir.path().join("audit.jsonl");
    std::fs::write(&config, server_table("a")).unwrap();
    let server = Server::start(&config, &audit);
    let before = server.tool_names();
    assert!(before.contains(&"a__add".to_owned()), "{before:?}");
    assert!(!before.iter().any(|n| n.starts_with("b__")), "{before:?}");

    std::fs::write(&config, server_table("a") + &server_table("b")).unwrap();
    // SAFETY: kill(2) on the child's pid, which has not been reaped.
    assert_eq!(
        unsafe { libc::kill(server.child.id() as libc::pid_t, libc::SIGHUP) },
        0
    );
    let line = server.line_with("SIGHUP");
    assert!(
        line.starts_with("moat: SIGHUP: reloaded (generation 2, 2 servers)"),
        "{line}"
    );
    let after = server.tool_names();
    assert!(after.contains(&"b__add".to_owned()), "{after:?}");
    assert!(after.contains(&"a__add".to_owned()), "{after:?}");
}

/// Stateless requests and the answers 2026-07-28 adds: a request for input
/// comes back to the agent and its retry (another request, so another
/// session and another instance) reaches the server with the agent's
/// answers and the server's `requestState`; an older server's own
/// `elicitation/create` comes back as a request for input while the call
/// waits at the server, held past the request. A call that the server makes a
/// task of hands an agent that takes tasks an id that is a capability
/// (`server__` and 128 random bits), and the instance running the task
/// outlives the request: a later request names the id and follows the task
/// to its result, an id made up is refused before any server sees it, and
/// an agent that does not take tasks gets the task's result.
#[test]
fn stateless_requests_carry_requests_for_input_and_a_task_past_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    let audit = dir.path().join("audit.jsonl");
    std::fs::write(
        &config,
        format!(
            "[serve]\ntask_after_ms = 100\n\
             [servers.r]\nwasm = {wasm:?}\nallow_unmeasured = true\n[servers.r.env]\nROUNDS_NAME = \"r\"\n\
             [servers.o]\ncommand = {native:?}\nallow_unmeasured = true\n\
             [servers.o.env]\nROUNDS_NAME = \"o\"\nROUNDS_REVISION = \"2025-06-18\"\n",
            wasm = guests::ROUNDS_WASM,
            native = guests::ROUNDS_NATIVE,
        ),
    )
    .unwrap();
    let server = Server::start(&config, &audit);
    let routed = |name| [("Mcp-Method", "tools/call"), ("Mcp-Name", name)];
    let (status, asked) = server.request(
        "tools/call",
        serde_json::json!({"name": "r__ask", "arguments": {}}),
        &routed("r__ask"),
    );
    assert_eq!(status, 200, "{asked}");
    assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
    assert_eq!(asked["result"]["requestState"], "r:round-1", "{asked}");
    assert_eq!(
        asked["result"]["inputRequests"]["name"]["method"], "elicitation/create",
        "{asked}"
    );
    let (status, answer) = server.request(
        "tools/call",
        serde_json::json!({
            "name": "r__ask",
            "arguments": {},
            "inputResponses": {"name": {"action": "accept", "content": {"name": "Ada"}}},
            "requestState": asked["result"]["requestState"],
        }),
        &routed("r__ask"),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["result"]["content"][0]["text"], "r: hello Ada (r:round-1)",
        "{answer}"
    );

    // An older server's own elicitation/create, over two rounds: each
    // request is a session of its own, and the call waits at the server
    // in between, held under the requestState.
    let mut retry = serde_json::json!({"name": "o__ask", "arguments": {"times": 2}});
    for (round, name) in ["Ada", "Lin"].into_iter().enumerate() {
        let (status, asked) = server.request("tools/call", retry.clone(), &routed("o__ask"));
        assert_eq!(status, 200, "{asked}");
        assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
        let key = format!("moat-{}", round + 1);
        assert_eq!(
            asked["result"]["inputRequests"][&key]["params"]["message"],
            format!("Name {}?", round + 1),
            "{asked}"
        );
        retry["inputResponses"] =
            serde_json::json!({key: {"action": "accept", "content": {"name": name}}});
        retry["requestState"] = asked["result"]["requestState"].clone();
    }
    let (status, answer) = server.request("tools/call", retry, &routed("o__ask"));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["result"]["content"][0]["text"], "o: hello Ada and Lin (elicited)",
        "{answer}"
    );
    // One instance of `o` for the three requests: the retries took the call
    // up where it ran, and started none of their own.
    let launches = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .filter(|line| line.contains("\"server_launch\"") && line.contains("\"server\":\"o\""))
        .count();
    assert_eq!(launches, 1, "{}", std::fs::read_to_string(&audit).unwrap());

    let tasks = serde_json::json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let (status, created) = server.request(
        "tools/call",
        serde_json::json!({
            "name": "r__job",
            "arguments": {"ms": 20},
            "_meta": {"io.modelcontextprotocol/clientCapabilities": tasks},
        }),
        &routed("r__job"),
    );
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    let random = id.strip_prefix("r__").unwrap_or_else(|| panic!("{id}"));
    assert!(
        random.len() == 32 && random.chars().all(|c| c.is_ascii_hexdigit()),
        "{id}"
    );
    // Each tasks/get is a request (a session) of its own.
    let get = |id: &str| {
        server.request(
            "tasks/get",
            serde_json::json!({
                "taskId": id,
                "_meta": {"io.modelcontextprotocol/clientCapabilities": tasks},
            }),
            &[("Mcp-Method", "tasks/get"), ("Mcp-Name", id)],
        )
    };
    let done = loop {
        let (status, found) = get(&id);
        assert_eq!(status, 200, "{found}");
        match found["result"]["status"].as_str() {
            Some("completed") => break found,
            Some("working") => std::thread::sleep(Duration::from_millis(10)),
            _ => panic!("{found}"),
        }
    };
    assert_eq!(done["result"]["taskId"], id.as_str(), "{done}");
    assert_eq!(
        done["result"]["result"]["content"][0]["text"], "r: job done",
        "{done}"
    );
    let guessed = format!("r__{}", "0".repeat(32));
    let (_, refused) = get(&guessed);
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert_eq!(
        refused["error"]["message"],
        format!("no task {guessed:?} in this session"),
        "{refused}"
    );

    // A task of Moat's (`task_after_ms`) at the 2025-06-18 server, which
    // asks on the way: each tasks/get and the tasks/update are requests of
    // their own, and the call waits at the server in between.
    let (status, created) = server.request(
        "tools/call",
        serde_json::json!({
            "name": "o__job",
            "arguments": {"ms": 800, "confirm": true},
            "_meta": {"io.modelcontextprotocol/clientCapabilities": tasks},
        }),
        &routed("o__job"),
    );
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let random = id.strip_prefix("o__").unwrap_or_else(|| panic!("{id}"));
    assert!(
        random.len() == 32 && random.chars().all(|c| c.is_ascii_hexdigit()),
        "{id}"
    );
    let until = |status: &str| loop {
        let (code, found) = get(&id);
        assert_eq!(code, 200, "{found}");
        match found["result"]["status"].as_str() {
            Some(now) if now == status => break found,
            Some("working") => std::thread::sleep(Duration::from_millis(10)),
            _ => panic!("waiting for {status}: {found}"),
        }
    };
    let waiting = until("input_required");
    assert_eq!(
        waiting["result"]["inputRequests"]["moat-1"]["params"]["message"], "Go on?",
        "{waiting}"
    );
    let (status, updated) = server.request(
        "tasks/update",
        serde_json::json!({
            "taskId": id,
            "inputResponses": {"moat-1": {"action": "accept", "content": {"go": "yes"}}},
            "_meta": {"io.modelcontextprotocol/clientCapabilities": tasks},
        }),
        &[("Mcp-Method", "tasks/update"), ("Mcp-Name", id.as_str())],
    );
    assert_eq!(status, 200, "{updated}");
    let done = until("completed");
    assert_eq!(
        done["result"]["result"]["content"][0]["text"], "o: job done after yes",
        "{done}"
    );

    let (status, answer) = server.request(
        "tools/call",
        serde_json::json!({"name": "r__job", "arguments": {"ms": 20}}),
        &routed("r__job"),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"]["resultType"], "complete", "{answer}");
    assert_eq!(
        answer["result"]["content"][0]["text"], "r: job done",
        "{answer}"
    );
}

/// A parked call's `requestState` is held under its id as a stateless
/// task is, but it names no task: `tasks/get` and `tasks/cancel` naming it
/// get the plain refusal (they once recursed until the stack overflowed
/// and the process aborted), and the parked call is then taken up as if
/// nothing had happened.
#[test]
fn a_parked_calls_request_state_named_as_a_task_is_no_task_and_the_call_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    let audit = dir.path().join("audit.jsonl");
    std::fs::write(
        &config,
        format!(
            "[servers.o]\ncommand = {:?}\nallow_unmeasured = true\n\
             [servers.o.env]\nROUNDS_NAME = \"o\"\nROUNDS_REVISION = \"2025-06-18\"\n",
            guests::ROUNDS_NATIVE,
        ),
    )
    .unwrap();
    let server = Server::start(&config, &audit);
    let routed = [("Mcp-Method", "tools/call"), ("Mcp-Name", "o__ask")];
    let call = serde_json::json!({"name": "o__ask", "arguments": {"times": 1}});
    let (status, asked) = server.request("tools/call", call.clone(), &routed);
    assert_eq!(status, 200, "{asked}");
    let state = asked["result"]["requestState"]
        .as_str()
        .unwrap_or_else(|| panic!("{asked}"))
        .to_owned();
    assert!(state.starts_with("moat-parked:"), "{state}");
    let tasks = serde_json::json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    for method in ["tasks/get", "tasks/cancel"] {
        let (status, refused) = server.request(
            method,
            serde_json::json!({
                "taskId": state,
                "_meta": {"io.modelcontextprotocol/clientCapabilities": tasks},
            }),
            &[("Mcp-Method", method), ("Mcp-Name", state.as_str())],
        );
        assert_eq!(status, 200, "{method}: {refused}");
        assert_eq!(refused["error"]["code"], -32602, "{method}: {refused}");
        assert_eq!(
            refused["error"]["message"],
            format!("no task {state:?} in this session"),
            "{method}: {refused}"
        );
    }
    let mut retry = call;
    retry["inputResponses"] =
        serde_json::json!({"moat-1": {"action": "accept", "content": {"name": "Ada"}}});
    retry["requestState"] = serde_json::Value::String(state);
    let (status, answer) = server.request("tools/call", retry, &routed);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["result"]["content"][0]["text"], "o: hello Ada (elicited)",
        "{answer}"
    );
}

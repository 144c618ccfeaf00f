//! One `moat serve` in front of several servers: a wasm and a native server
//! behind one MCP server with namespaced tools and routed calls, agents on
//! older protocol revisions, a spinning guest beside other calls, and a typed
//! component served locked beside a stdio one.

use super::*;

#[tokio::test]
async fn one_server_in_front_of_a_wasm_and_a_native_server() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.wasm]\nwasm = {:?}\nallow_unmeasured = true\n[servers.native]\ncommand = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM,
            guests::EVERYTHING_NATIVE
        ),
    )
    .unwrap();
    let audit = dir.path().join("audit.jsonl");
    let mut child = serve_stdio(&config, &["--audit".as_ref(), audit.as_ref()]);
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    // An agent on 2026-07-28: `server/discover`, no initialize.
    let agent = rmcp::ClientServiceExt::serve_with_lifecycle(
        Agent,
        (stdout, stdin),
        rmcp::ClientLifecycleMode::Discover {
            preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
        },
    )
    .await
    .expect("server/discover with moat serve");
    let revision = agent
        .peer_info()
        .map(|info| info.protocol_version.to_string());
    assert_eq!(revision.as_deref(), Some("2026-07-28"));

    let mut names: Vec<String> = agent
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    assert!(names.contains(&"wasm__add".to_owned()), "{names:?}");
    assert!(names.contains(&"native__add".to_owned()), "{names:?}");
    assert_eq!(names.len(), 18, "{names:?}");

    for server in ["wasm", "native"] {
        let mut params = CallToolRequestParams::new(format!("{server}__add"));
        params.arguments = serde_json::json!({"a": 2, "b": 40}).as_object().cloned();
        let result = agent.call_tool(params).await.unwrap();
        let content = serde_json::to_value(&result.content).unwrap();
        assert_eq!(content[0]["text"], "42", "{server}");
    }
    let unknown = agent
        .call_tool(CallToolRequestParams::new("nope__add"))
        .await
        .unwrap_err();
    assert!(
        unknown
            .to_string()
            .contains(r#"-32602: no server "nope" behind tool "nope__add""#),
        "{unknown}"
    );

    // Prompts and resources of both servers, routed the same way.
    let mut prompts: Vec<String> = agent
        .list_all_prompts()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect();
    prompts.sort();
    assert_eq!(prompts, ["native__greet", "wasm__greet"]);
    let mut greet = rmcp::model::GetPromptRequestParams::new("wasm__greet");
    greet.arguments = serde_json::json!({"name": "Ada"}).as_object().cloned();
    let greeting = agent.get_prompt(greet).await.unwrap();
    let messages = serde_json::to_value(&greeting.messages).unwrap();
    assert_eq!(messages[0]["content"]["text"], "Hello, Ada!");
    // Both servers list the same resource URI: the gateway refuses to guess.
    let clash = agent.list_all_resources().await.unwrap_err();
    assert!(
        clash
            .to_string()
            .contains("resource moat://everything/readme is listed by both `native` and `wasm`"),
        "{clash}"
    );

    agent.cancel().await.unwrap();
    let status = child.wait().await.unwrap();
    assert!(status.success(), "moat serve exited with {status}");

    assert_eq!(
        moat_host::audit::verify(&audit, &common::audit_key())
            .unwrap()
            .lines,
        8
    );
    let log = std::fs::read_to_string(&audit).unwrap();
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "session_open",
            "server_launch",
            "server_launch",
            "tool_call",
            "tool_call",
            "server_exit",
            "server_exit",
            "session_close",
        ]
    );
    assert!(
        !log.contains("\"a\":2"),
        "arguments never reach the audit log"
    );
    assert_eq!(events[3]["outcome"], "ok");
    // Launch and exit carry the execution identity and the evidence.
    let of = |kind: &str, key: &str| {
        let mut values: Vec<String> = events
            .iter()
            .filter(|e| e["event"] == kind)
            .map(|e| e[key].as_str().unwrap().to_owned())
            .collect();
        values.sort();
        values
    };
    assert_eq!(
        of("server_launch", "identity"),
        of("server_exit", "identity")
    );
    assert_eq!(
        of("server_exit", "evidence"),
        ["native-unmeasured", "wasm-measured"]
    );
    assert_eq!(of("server_launch", "identity")[0].len(), 64);

    // `moat audit verify` on this real log; then one byte of line 4 (the
    // first tool call's duration) is changed, and the line is named; then
    // the log is cut after line 6, and the missing lines are named.
    let verify = |path: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_moat"))
            .args(["audit", "verify"])
            .arg(path)
            .env("MOAT_STATE_DIR", common::state_dir())
            .output()
            .unwrap()
    };
    let intact = verify(&audit);
    assert!(intact.status.success());
    assert!(
        String::from_utf8_lossy(&intact.stdout)
            .contains("8 lines, every MAC and the chain intact, anchored"),
        "{}",
        String::from_utf8_lossy(&intact.stdout)
    );
    let original: Vec<String> = log.lines().map(str::to_owned).collect();
    std::fs::write(&audit, original[..6].join("\n") + "\n").unwrap();
    let cut = verify(&audit);
    assert!(!cut.status.success());
    let stderr = String::from_utf8_lossy(&cut.stderr);
    assert!(
        stderr.contains(
            "truncated: its anchor records 8 lines but the log has 6; lines 7 to 8 are missing"
        ),
        "{stderr}"
    );
    let mut lines = original.clone();
    let at = lines[3].find("\"duration_ms\":").unwrap() + "\"duration_ms\":".len();
    let digit = lines[3].as_bytes()[at];
    let other = if digit == b'9' {
        '1'
    } else {
        (digit + 1) as char
    };
    lines[3].replace_range(at..=at, &other.to_string());
    std::fs::write(&audit, lines.join("\n") + "\n").unwrap();
    let broken = verify(&audit);
    assert!(!broken.status.success());
    let stderr = String::from_utf8_lossy(&broken.stderr);
    assert!(
        stderr.contains("line 4 was altered: its MAC does not match"),
        "{stderr}"
    );
}

/// Agents on older revisions speak `initialize`; Moat answers in their
/// revision and serves them the same tools. (The rmcp agents of the other
/// tests speak 2026-07-28, `server/discover`.)
#[test]
fn agents_on_2025_06_18_and_2025_11_25_are_served_in_their_revision() {
    use std::io::{BufRead, BufReader, Write};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.wasm]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM
        ),
    )
    .unwrap();
    for revision in ["2025-06-18", "2025-11-25"] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_moat"))
            .args(["serve", "--config", config.to_str().unwrap()])
            .env(
                "MOAT_CACHE_DIR",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
            )
            .env("MOAT_STATE_DIR", common::state_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("moat serve");
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut ask = |message: serde_json::Value| {
            writeln!(stdin, "{message}").unwrap();
            if message.get("id").is_none() {
                return serde_json::Value::Null;
            }
            let line = stdout.next().unwrap().unwrap();
            serde_json::from_str::<serde_json::Value>(&line).unwrap()
        };
        let initialized = ask(serde_json::json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {
                "protocolVersion": revision,
                "capabilities": {},
                "clientInfo": {"name": "old-agent", "version": "1.0"}
            }
        }));
        assert_eq!(
            initialized["result"]["protocolVersion"], revision,
            "{initialized}"
        );
        ask(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        let listed = ask(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
        let names: Vec<&str> = listed["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{listed}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"wasm__echo"), "{revision}: {names:?}");
        drop(stdin);
        assert!(child.wait().unwrap().success(), "{revision}");
    }
}

/// `moat serve` on stdio runs on one thread: a guest that spins without end
/// (until its fuel runs out) yields at every fuel interval, so a call to
/// another server in the same session is answered while it spins, and the
/// spinning call still ends with its limit.
#[tokio::test]
async fn a_spinning_guest_never_holds_the_sessions_other_calls() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.spin]\nwasm = {:?}\nallow_unmeasured = true\n[servers.spin.limits]\nfuel_per_request = 20000000000\nrequest_timeout_ms = 120000\n\
             [servers.everything]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::SPIN_WASM,
            guests::EVERYTHING_WASM
        ),
    )
    .unwrap();
    let mut child = serve_stdio(&config, &[]);
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let agent = std::sync::Arc::new(Agent.serve((stdout, stdin)).await.expect("initialize"));
    // Both servers started before the spin, so the answer below waits on
    // nothing but the runtime.
    let mut add = CallToolRequestParams::new("everything__add");
    add.arguments = serde_json::json!({"a": 1, "b": 2}).as_object().cloned();
    agent.call_tool(add.clone()).await.unwrap();
    let spinning = tokio::spawn({
        let agent = agent.clone();
        async move {
            agent
                .call_tool(CallToolRequestParams::new("spin__attack"))
                .await
        }
    });
    let result = agent.call_tool(add).await.unwrap();
    assert_eq!(
        serde_json::to_value(&result.content).unwrap()[0]["text"],
        "3"
    );
    assert!(
        !spinning.is_finished(),
        "the spin ended before the other call was answered"
    );
    let spun = format!("{:?}", spinning.await.unwrap());
    assert!(spun.contains("fuel_per_request"), "{spun}");
    drop(agent);
    assert!(child.wait().await.unwrap().success());
}

/// A typed tool component behind `moat serve`, locked, beside a stdio
/// component: its tools are namespaced and pinned like any other server's,
/// every structured result fits its pinned output schema, an `err` reaches
/// the agent as an error result, and a trap fails that call alone.
#[tokio::test]
async fn a_typed_component_is_served_locked_beside_a_stdio_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.kinds]\nwasm = {:?}\nallow_unmeasured = true\n\
             [servers.everything]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::KINDS_WASM,
            guests::EVERYTHING_WASM
        ),
    )
    .unwrap();
    common::lock(&config);
    let mut child = serve_stdio(&config, &["--locked".as_ref()]);
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let agent = Agent.serve((stdout, stdin)).await.expect("initialize");
    let tools = agent.list_all_tools().await.unwrap();
    let add = tools
        .iter()
        .find(|t| t.name == "kinds__add")
        .expect("kinds__add");
    assert_eq!(add.description.as_deref(), Some("Adds two small numbers."));
    assert_eq!(
        serde_json::Value::Object((*add.input_schema).clone())["properties"]["a"],
        serde_json::json!({"type": "integer", "minimum": 0, "maximum": 255})
    );
    let call = |name: &str, arguments: serde_json::Value| {
        let mut params = CallToolRequestParams::new(name.to_owned());
        params.arguments = arguments.as_object().cloned();
        agent.call_tool(params)
    };
    // Each result is checked against its pinned output schema by the
    // gateway before it reaches the agent.
    let calls = [
        (
            "kinds__greet",
            serde_json::json!({"name": "Ada"}),
            serde_json::json!("Hello, Ada!"),
        ),
        (
            "kinds__add",
            serde_json::json!({"a": 255, "b": 255}),
            serde_json::json!(510),
        ),
        (
            "kinds__scalars",
            serde_json::json!({"b": false, "small": 1, "short": 2, "int": 3, "long": 4, "word": 5,
                               "big": 6, "single": 0.5, "double": 0.25, "letter": "z"}),
            serde_json::json!([false, 1, 2, 3, 4, 5, 6, 0.5, 0.25, "z"]),
        ),
        (
            "kinds__maybe-double",
            serde_json::json!({"x": null}),
            serde_json::Value::Null,
        ),
        (
            "kinds__checked-div",
            serde_json::json!({"a": 9, "b": 3}),
            serde_json::json!({"ok": 3}),
        ),
        (
            "kinds__moat_kinds_shapes_0_1_0_grant-exec",
            serde_json::json!({"p": []}),
            serde_json::json!(["exec"]),
        ),
        (
            "kinds__moat_kinds_shapes_0_1_0_translate",
            serde_json::json!({"p": {"x": 0, "y": 0}, "dx": 1, "dy": 2}),
            serde_json::json!({"x": 1, "y": 2}),
        ),
    ];
    for (name, arguments, expected) in calls {
        let result = call(name, arguments)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(result.is_error, Some(false), "{name}: {result:?}");
        assert_eq!(
            result.structured_content,
            Some(serde_json::json!({"result": expected})),
            "{name}"
        );
    }
    let err = call("kinds__checked-div", serde_json::json!({"a": 1, "b": 0}))
        .await
        .unwrap();
    assert_eq!(err.is_error, Some(true));
    let trap = call("kinds__trap", serde_json::json!({})).await.unwrap();
    assert_eq!(trap.is_error, Some(true));
    let text = serde_json::to_value(&trap.content).unwrap()[0]["text"].clone();
    assert!(
        text.as_str()
            .unwrap()
            .contains("tool `trap` failed: wasm trap"),
        "{text}"
    );
    let add = call("everything__add", serde_json::json!({"a": 1, "b": 2}))
        .await
        .unwrap();
    assert_eq!(serde_json::to_value(&add.content).unwrap()[0]["text"], "3");
    let again = call("kinds__add", serde_json::json!({"a": 1, "b": 2}))
        .await
        .unwrap();
    assert_eq!(
        again.structured_content,
        Some(serde_json::json!({"result": 3}))
    );
    drop(agent);
    assert!(child.wait().await.unwrap().success());
}

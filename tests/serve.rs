//! `moat serve` on stdio, driven by an rmcp client over the child's pipes:
//! one wasm and one native server behind one MCP server, namespaced tools,
//! routed calls, and a verified audit chain that holds no arguments.

mod common;

use std::path::Path;
use std::process::Stdio;

use moat_test_guests as guests;
use rmcp::model::CallToolRequestParams;
use rmcp::{ClientHandler, ServiceExt};

#[derive(Clone, Default)]
struct Agent;
impl ClientHandler for Agent {}

/// `moat serve --config CONFIG EXTRA..` on piped stdio, with the tests'
/// component cache and state directory.
fn serve_stdio(config: &Path, extra: &[&std::ffi::OsStr]) -> tokio::process::Child {
    serve_stdio_with(config, extra, Stdio::inherit())
}

/// [`serve_stdio`], with moat's stderr going to `stderr`.
fn serve_stdio_with(
    config: &Path,
    extra: &[&std::ffi::OsStr],
    stderr: Stdio,
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_moat"))
        .arg("serve")
        .arg("--config")
        .arg(config)
        .args(extra)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", common::state_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("moat serve")
}

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

/// An agent that hears progress.
#[derive(Clone, Default)]
struct Listening {
    progress: std::sync::Arc<tokio::sync::Notify>,
}

impl ClientHandler for Listening {
    async fn on_progress(
        &self,
        _params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.progress.notify_one();
    }
}

#[tokio::test]
async fn sigterm_drains_the_call_in_flight_then_closes_everything() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[serve]\ndrain_timeout_ms = 30000\n[servers.slow]\ncommand = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_NATIVE
        ),
    )
    .unwrap();
    let audit = dir.path().join("audit.jsonl");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["serve", "--config", config.to_str().unwrap(), "--audit"])
        .arg(&audit)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("moat serve");
    let agent = Listening::default();
    let client = agent
        .clone()
        .serve((child.stdout.take().unwrap(), child.stdin.take().unwrap()))
        .await
        .expect("handshake with moat serve");
    let mut params = CallToolRequestParams::new("slow__progress");
    params.arguments = serde_json::json!({"steps": 5, "interval_ms": 100})
        .as_object()
        .cloned();
    params.meta = Some(rmcp::model::RequestMetaObject::with_progress_token(
        rmcp::model::ProgressToken(rmcp::model::NumberOrString::Number(7)),
    ));
    let peer = client.peer().clone();
    let call = tokio::spawn(async move { peer.call_tool(params).await });
    agent.progress.notified().await; // the call is in flight
    let pid = libc::pid_t::try_from(child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on our own child's pid, which has not been reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let result = call.await.unwrap().expect("the in-flight call is answered");
    assert_eq!(result.is_error, Some(false));
    let status = child.wait().await.unwrap();
    assert!(status.success(), "moat serve exited with {status}");
    let kinds: Vec<String> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["event"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "session_open",
            "server_launch",
            "tool_call",
            "server_exit",
            "session_close"
        ]
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

/// `moat serve` on stdio (with `extra`) in front of a locked config of the
/// wasm `everything` server, its stderr piped, with an agent connected
/// that has had one `everything__add` answered.
struct Revocable {
    config: std::path::PathBuf,
    child: tokio::process::Child,
    stderr: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
    agent: rmcp::service::RunningService<rmcp::RoleClient, Agent>,
    add: CallToolRequestParams,
}

impl Revocable {
    async fn start(dir: &Path, extra: &[&std::ffi::OsStr]) -> Self {
        use tokio::io::AsyncBufReadExt;
        let config = dir.join("moat.toml");
        std::fs::write(
            &config,
            format!(
                "[servers.everything]\nwasm = {:?}\nallow_unmeasured = true\n",
                guests::EVERYTHING_WASM
            ),
        )
        .unwrap();
        common::lock(&config);
        let mut child = serve_stdio_with(&config, extra, Stdio::piped());
        let stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let stdout = child.stdout.take().unwrap();
        let stdin = child.stdin.take().unwrap();
        let agent = Agent.serve((stdout, stdin)).await.expect("initialize");
        let mut add = CallToolRequestParams::new("everything__add");
        add.arguments = serde_json::json!({"a": 1, "b": 2}).as_object().cloned();
        agent.call_tool(add.clone()).await.unwrap();
        Self {
            config,
            child,
            stderr,
            agent,
            add,
        }
    }

    /// The next line on moat's stderr that contains `text`.
    async fn line_with(&mut self, text: &str) -> String {
        loop {
            let line = self
                .stderr
                .next_line()
                .await
                .unwrap()
                .expect("moat serve's stderr ended");
            if line.contains(text) {
                return line;
            }
        }
    }

    /// `moat revoke --reason REASON everything__add` on the config.
    fn revoke_add(&self, reason: &str) {
        let revoke = std::process::Command::new(env!("CARGO_BIN_EXE_moat"))
            .args(["revoke", "--reason", reason, "--config"])
            .arg(&self.config)
            .arg("everything__add")
            .output()
            .unwrap();
        assert!(revoke.status.success(), "{revoke:?}");
    }

    /// The agent's error for `everything__add`, as text.
    async fn add_refused(&self) -> String {
        format!(
            "{:?}",
            self.agent.call_tool(self.add.clone()).await.unwrap_err()
        )
    }

    /// Stdin EOF: moat serve must exit 0.
    async fn finish(mut self) {
        drop(self.agent);
        assert!(self.child.wait().await.unwrap().success());
    }
}

/// SIGHUP reloads the config and moat.lock: a tool `moat revoke` names is
/// refused in the session already running, its neighbour answers, and a
/// lock that no longer parses changes nothing and says so. (Each step waits
/// for moat's own line on stderr, never for time.)
#[tokio::test]
async fn sighup_puts_a_new_revocation_in_force_in_the_running_session() {
    let dir = tempfile::tempdir().unwrap();
    let mut served = Revocable::start(dir.path(), &["--locked".as_ref()]).await;
    let pid = served.child.id().unwrap() as libc::pid_t;
    served.revoke_add("returns wrong sums");
    let hangup = || {
        // SAFETY: kill(2) on the child's pid, which has not been reaped.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    };
    hangup();
    let line = served.line_with("SIGHUP").await;
    assert!(
        line.contains("1 revocations in force (1 new, 0 lifted)"),
        "{line}"
    );
    let refused = served.add_refused().await;
    assert!(
        refused.contains(
            "tool `add` on server `everything` is refused: `everything__add` was revoked by "
        ) && refused.contains(": returns wrong sums"),
        "{refused}"
    );
    let mut echo = CallToolRequestParams::new("everything__echo");
    echo.arguments = serde_json::json!({"message": "still here"})
        .as_object()
        .cloned();
    served.agent.call_tool(echo).await.unwrap();

    std::fs::write(dir.path().join("moat.lock"), "version = [").unwrap();
    hangup();
    let line = served.line_with("SIGHUP").await;
    assert!(
        line.starts_with("moat: error: SIGHUP: reload refused: ")
            && line.contains("moat.lock")
            && line.ends_with("still serving generation 2, unchanged"),
        "{line}"
    );
    served.add_refused().await;
    served.finish().await;
}

/// `--watch` reloads when moat.lock changes on disk, with no signal: the
/// tool `moat revoke` names is refused in the running session from the
/// reload on, and the reload is audited.
#[tokio::test]
async fn watch_reloads_when_the_lock_changes() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let args = ["--watch".as_ref(), "--audit".as_ref(), audit.as_os_str()];
    let mut served = Revocable::start(dir.path(), &args).await;
    served.revoke_add("");
    let line = served.line_with("moat: watch: ").await;
    assert!(
        line.starts_with("moat: watch: reloaded (generation 2, 1 servers): 1 revocations in force (1 new, 0 lifted)"),
        "{line}"
    );
    let refused = served.add_refused().await;
    assert!(
        refused.contains("`everything__add` was revoked by "),
        "{refused}"
    );
    served.finish().await;
    let reloads: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == "reload")
        .collect();
    assert_eq!(reloads.len(), 1, "{reloads:?}");
    assert_eq!(reloads[0]["source"], "watch");
    assert_eq!(reloads[0]["outcome"], "reloaded");
}

/// One writer per audit log: a second `moat serve` with the same command
/// line (two agent apps, say) is refused by name with the first one's pid,
/// before it writes anything, and the first keeps serving a log that
/// verifies.
#[tokio::test]
async fn a_second_moat_serve_on_one_audit_log_is_refused_with_the_holders_pid() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.native]\ncommand = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_NATIVE
        ),
    )
    .unwrap();
    let audit = dir.path().join("audit.jsonl");
    let args = ["--audit".as_ref(), audit.as_os_str()];
    let mut first = serve_stdio(&config, &args);
    let pid = first.id().unwrap();
    let agent = Agent
        .serve((first.stdout.take().unwrap(), first.stdin.take().unwrap()))
        .await
        .expect("the first moat serve");
    let add = || {
        let mut params = CallToolRequestParams::new("native__add");
        params.arguments = serde_json::json!({"a": 2, "b": 40}).as_object().cloned();
        params
    };
    let result = agent.call_tool(add()).await.unwrap();
    assert_eq!(
        serde_json::to_value(&result.content).unwrap()[0]["text"],
        "42"
    );

    // Its stdin at EOF: were it let in, it would serve nothing and exit 0.
    let second = tokio::process::Command::new(env!("CARGO_BIN_EXE_moat"))
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .args(args)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", common::state_dir())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(!second.status.success(), "{:?}", second.status);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains(&format!(
            "audit log {} is being written by another Moat (pid {pid}); two writers would break its chain: give each `moat serve` its own --audit file",
            audit.display()
        )),
        "{stderr}"
    );

    // The first goes on, and its log is one chain.
    let result = agent.call_tool(add()).await.unwrap();
    assert_eq!(
        serde_json::to_value(&result.content).unwrap()[0]["text"],
        "42"
    );
    agent.cancel().await.unwrap();
    assert!(first.wait().await.unwrap().success());
    let verified = moat_host::audit::verify(&audit, &common::audit_key()).unwrap();
    assert_eq!(verified.unanchored, 0);
    let calls = std::fs::read_to_string(&audit)
        .unwrap()
        .matches("\"event\":\"tool_call\"")
        .count();
    assert_eq!(calls, 2);
}

/// An agent that keeps the log notifications it hears.
#[derive(Clone, Default)]
struct Logged {
    messages: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    heard: std::sync::Arc<tokio::sync::Notify>,
}

#[allow(
    deprecated,
    reason = "log notifications are how an agent before 2026-07-28 hears of a server that cannot start"
)]
impl ClientHandler for Logged {
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.messages
            .lock()
            .unwrap()
            .push(params.data.as_str().unwrap_or_default().to_owned());
        self.heard.notify_one();
    }

    async fn on_tool_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.messages
            .lock()
            .unwrap()
            .push("notifications/tools/list_changed".to_owned());
        self.heard.notify_one();
    }
}

/// Issue 33: one server that cannot start (it exits at once, saying why
/// on stderr) and one tool whose exposed name cannot be served hide
/// nothing else: the healthy servers' tools are listed and called, the
/// broken server's calls get its reason, the agent hears of it in a log
/// notification, and the audit log records the failed start.
#[tokio::test]
async fn a_server_that_cannot_start_hides_no_other_servers_tools() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.native]\ncommand = {:?}\nallow_unmeasured = true\nenv_passthrough = [\"MOAT_TEST_UNSET_PASSTHROUGH\"]\n\
             [servers.broken]\ncommand = \"/bin/sh\"\nargs = [\"-c\", \"echo 'error: BROKEN_API_KEY is not set' >&2; exit 3\"]\nallow_unmeasured = true\n\
             [servers.shady]\nwasm = {:?}\nallow_unmeasured = true\nenv = {{ HOSTILE_TOOL_NAME = \"read file\" }}\n",
            guests::EVERYTHING_NATIVE,
            guests::SHADY_METADATA_WASM,
        ),
    )
    .unwrap();
    let audit = dir.path().join("audit.jsonl");
    let stderr_path = dir.path().join("stderr");
    let mut child = serve_stdio_with(
        &config,
        &["--audit".as_ref(), audit.as_ref()],
        std::fs::File::create(&stderr_path).unwrap().into(),
    );
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let logged = Logged::default();
    let agent = logged
        .clone()
        .serve((stdout, stdin))
        .await
        .expect("initialize");

    let names: Vec<String> = agent
        .list_all_tools()
        .await
        .expect("tools/list with one server that cannot start")
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(names.contains(&"native__add".to_owned()), "{names:?}");
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("broken__") || n == "shady__read file"),
        "{names:?}"
    );
    let mut params = CallToolRequestParams::new("native__add");
    params.arguments = serde_json::json!({"a": 2, "b": 40}).as_object().cloned();
    let result = agent.call_tool(params).await.unwrap();
    assert_eq!(
        serde_json::to_value(&result.content).unwrap()[0]["text"],
        "42"
    );
    let refused = agent
        .call_tool(CallToolRequestParams::new("broken__anything"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("server `broken`") && refused.contains("BROKEN_API_KEY is not set"),
        "{refused}"
    );
    // Issue 33 (6): it exited on its own, with no denial in its stderr: the
    // sandbox is not blamed.
    assert!(!refused.contains("sandbox may be the cause"), "{refused}");
    // The agent is told once in this session, whatever the timing of the
    // next try.
    while logged.messages.lock().unwrap().is_empty() {
        logged.heard.notified().await;
    }
    let messages = logged.messages.lock().unwrap().clone();
    assert!(
        messages[0].starts_with(
            "moat: server `broken` could not start, so its tools are left out (tried again in "
        ) && messages[0].contains("BROKEN_API_KEY is not set"),
        "{messages:?}"
    );

    agent.cancel().await.unwrap();
    let status = child.wait().await.unwrap();
    assert!(status.success(), "moat serve exited with {status}");
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(
        stderr.contains(
            "server `shady`, tool `read file`: the exposed name `shady__read file` does not match ^[a-zA-Z0-9_-]{1,64}$, so it is left out"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "server `native`: env_passthrough names MOAT_TEST_UNSET_PASSTHROUGH, which is not set in Moat's environment: the server starts without it"
        ),
        "{stderr}"
    );
    moat_host::audit::verify(&audit, &common::audit_key()).unwrap();
    let failed: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == "server_start_failed")
        .collect();
    assert!(
        !failed.is_empty() && failed.iter().all(|e| e["server"] == "broken"),
        "{failed:?}"
    );
    // It exited with no denial: no refusal is recorded.
    assert!(
        !std::fs::read_to_string(&audit)
            .unwrap()
            .contains("sandbox_refused")
    );
}

/// Issue 33 items 5 and 6: what Moat's egress refuses a native server is a
/// record in the audit chain (`egress_refused`, naming server, destination
/// and why): here an unlisted name asked of Moat's DNS, and the proxy asked
/// for an unlisted destination; each distinct refusal once. A refusal the
/// server's own error shows (a download that found no network, a write
/// to a read-only grant) is a `sandbox_refused` record.
#[tokio::test]
async fn egress_refusals_are_recorded_in_the_audit_log() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let notes = dir.path().canonicalize().unwrap().join("notes");
    std::fs::create_dir(&notes).unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.probe]\ncommand = {:?}\nallow_unmeasured = true\nnet = [\"127.0.0.1:9\"]\n\
             [[servers.probe.dirs]]\nhost = {:?}\nmode = \"ro\"\n\
             [servers.fetcher]\ncommand = \"/bin/sh\"\nallow_unmeasured = true\n\
             args = [\"-c\", \"echo 'getaddrinfo EAI_AGAIN pypi.org' >&2; exit 1\"]\n",
            guests::PROBE_NATIVE,
            notes.display().to_string(),
        ),
    )
    .unwrap();
    let audit = dir.path().join("audit.jsonl");
    let mut child = serve_stdio_with(
        &config,
        &["--audit".as_ref(), audit.as_ref()],
        Stdio::inherit(),
    );
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let agent = ().serve((stdout, stdin)).await.expect("initialize");
    // `fetcher` fails to start, reaching for the network at start-up.
    let names: Vec<String> = agent
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(
        names.contains(&"probe__attack".to_owned())
            && !names.iter().any(|n| n.starts_with("fetcher__")),
        "{names:?}"
    );
    let attempt = |arguments: serde_json::Value| {
        let agent = &agent;
        async move {
            let mut params = CallToolRequestParams::new("probe__attack");
            params.arguments = arguments.as_object().cloned();
            let result = agent.call_tool(params).await.unwrap();
            serde_json::to_value(&result.content).unwrap()[0]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    for _ in 0..2 {
        let resolved =
            attempt(serde_json::json!({"op": "resolve", "addr": "exfil.example:443"})).await;
        assert!(resolved.contains("Name or service not known"), "{resolved}");
    }
    let proxied = attempt(serde_json::json!({"op": "proxy", "addr": "203.0.113.9:443"})).await;
    assert!(proxied.contains("403 Forbidden"), "{proxied}");
    // Issue 33 items 6 and 10: a tool's error that shows a refusal (here a
    // download at run time that found no network) carries Moat's line.
    let mut params = CallToolRequestParams::new("probe__attack");
    params.arguments = serde_json::json!({"op": "exec", "tool_error": true, "argv": [
        "/bin/sh", "-c",
        "echo 'npm error request to https://registry.npmjs.org/turndown failed, reason: getaddrinfo EAI_AGAIN registry.npmjs.org' >&2; exit 1"
    ]})
    .as_object()
    .cloned();
    let failed = agent.call_tool(params).await.unwrap();
    assert_eq!(failed.is_error, Some(true));
    let texts: Vec<String> = failed
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(
        texts[1].starts_with("moat: the server tried to reach the network (registry.npmjs.org), which the native sandbox refuses"),
        "{texts:?}"
    );
    // A write refused under a read-only grant: the line names the entry to
    // change.
    let mut params = CallToolRequestParams::new("probe__attack");
    params.arguments = serde_json::json!({"op": "exec", "tool_error": true, "argv": [
        "/bin/sh", "-c",
        format!("echo \"Error: EROFS: read-only file system, open '{}/today.md'\" >&2; exit 1", notes.display())
    ]})
    .as_object()
    .cloned();
    let failed = agent.call_tool(params).await.unwrap();
    let texts: Vec<String> = failed
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    let read_only = format!(
        "{} is granted read-only: if the server is to write there, change that entry to `[[servers.probe.dirs]] host = {:?} mode = \"rw\"`",
        notes.display(),
        notes.display().to_string()
    );
    assert!(
        texts.len() == 2
            && texts[1].starts_with("moat: the native sandbox may be the cause")
            && texts[1].contains(&read_only),
        "{texts:?}"
    );
    // A tool's error that shows no refusal is left as the server wrote it.
    let mut params = CallToolRequestParams::new("probe__attack");
    params.arguments =
        serde_json::json!({"op": "read", "path": "relative/path", "tool_error": true})
            .as_object()
            .cloned();
    let plain = agent.call_tool(params).await.unwrap();
    assert_eq!((plain.is_error, plain.content.len()), (Some(true), 1));
    agent.cancel().await.unwrap();
    let status = child.wait().await.unwrap();
    assert!(status.success(), "moat serve exited with {status}");
    moat_host::audit::verify(&audit, &common::audit_key()).unwrap();
    let events: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .collect();
    // Each refusal a tool's error showed, once, and not the plain error.
    let seen: Vec<(String, String, String, String)> = events
        .iter()
        .filter(|e| e["event"] == "sandbox_refused")
        .map(|e| {
            let field = |name: &str| e[name].as_str().unwrap().to_owned();
            (
                field("server"),
                field("during"),
                field("kind"),
                field("subject"),
            )
        })
        .collect();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(
        seen[..2],
        [
            (
                "fetcher".to_owned(),
                "start".to_owned(),
                "network".to_owned(),
                "pypi.org".to_owned()
            ),
            (
                "probe".to_owned(),
                "tools/call attack".to_owned(),
                "network".to_owned(),
                "registry.npmjs.org".to_owned()
            )
        ]
    );
    assert!(
        seen[2].0 == "probe" && seen[2].2 == "filesystem" && seen[2].3.contains(&read_only),
        "{seen:?}"
    );
    let refused: Vec<(String, String, String)> = events
        .iter()
        .filter(|e| e["event"] == "egress_refused")
        .map(|e| {
            let field = |name: &str| e[name].as_str().unwrap().to_owned();
            (field("server"), field("destination"), field("reason"))
        })
        .collect();
    assert_eq!(
        refused,
        [
            (
                "probe".to_owned(),
                "exfil.example".to_owned(),
                "not in this server's net grants (DNS answered NXDOMAIN)".to_owned()
            ),
            (
                "probe".to_owned(),
                "203.0.113.9:443".to_owned(),
                "not in this server's net grants (proxy answered 403)".to_owned()
            ),
        ]
    );
}

/// Issue 33 item 2: a server that could not start is tried again by the
/// session when its next try is due, with no listing needed; once it
/// starts, the agent (which may keep its tool list) is told its tools
/// changed, and they are listed and called.
#[tokio::test]
async fn a_server_that_starts_on_a_later_try_is_announced_to_the_agent() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let ready = dir.join("ready");
    std::fs::create_dir(&ready).unwrap();
    let script = dir.join("late");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh
[ -e {marker} ] || {{ echo 'error: the database is not up yet' >&2; exit 3; }}
exec {server}
",
            marker = ready.join("up").display(),
            server = guests::EVERYTHING_NATIVE
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let guest_dir = Path::new(guests::EVERYTHING_NATIVE).parent().unwrap();
    let config = dir.join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.late]\ncommand = {:?}\nallow_unmeasured = true\n[[servers.late.dirs]]\nhost = {:?}\nmode = \"ro\"\n[[servers.late.dirs]]\nhost = {:?}\nmode = \"ro\"\n",
            script.display().to_string(),
            ready.display().to_string(),
            guest_dir.display().to_string(),
        ),
    )
    .unwrap();
    let mut child = serve_stdio(&config, &[]);
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let logged = Logged::default();
    let agent = logged
        .clone()
        .serve((stdout, stdin))
        .await
        .expect("initialize");
    let names = |tools: Vec<rmcp::model::Tool>| {
        tools
            .into_iter()
            .map(|t| t.name.to_string())
            .collect::<Vec<_>>()
    };
    assert!(names(agent.list_all_tools().await.unwrap()).is_empty());
    // Told it could not start; then the database comes up.
    while logged.messages.lock().unwrap().is_empty() {
        logged.heard.notified().await;
    }
    assert!(
        logged.messages.lock().unwrap()[0].contains("the database is not up yet"),
        "{:?}",
        logged.messages
    );
    std::fs::write(ready.join("up"), "").unwrap();
    // No listing from the agent: the session's own try starts it (the
    // timeout only keeps a regression from hanging the suite).
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while !logged
            .messages
            .lock()
            .unwrap()
            .iter()
            .any(|m| m == "notifications/tools/list_changed")
        {
            logged.heard.notified().await;
        }
    })
    .await
    .expect("the agent is told its tools changed once the server starts");
    let listed = names(agent.list_all_tools().await.unwrap());
    assert!(listed.contains(&"late__add".to_owned()), "{listed:?}");
    let mut params = CallToolRequestParams::new("late__add");
    params.arguments = serde_json::json!({"a": 2, "b": 40}).as_object().cloned();
    let result = agent.call_tool(params).await.unwrap();
    assert_eq!(
        serde_json::to_value(&result.content).unwrap()[0]["text"],
        "42"
    );
    agent.cancel().await.unwrap();
    let status = child.wait().await.unwrap();
    assert!(status.success(), "moat serve exited with {status}");
}

//! Issue 33: a server that cannot start hides no other server's tools, and
//! one that starts on a later try is announced to the agent.

use super::*;

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

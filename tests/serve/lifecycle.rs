//! The running session's lifecycle: SIGTERM drains the call in flight,
//! SIGHUP and `--watch` reload revocations into the running session, and a
//! second `moat serve` on one audit log is refused.

use super::*;

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

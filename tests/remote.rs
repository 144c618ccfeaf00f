//! Remote upstreams (`url = ...`): a hybrid deployment where one `moat serve`
//! fronts a local wasm server and a remote MCP server (here another `moat
//! serve --http`, bearer-token protected). The token reaches the endpoint and
//! nothing else: not the log at trace level, not the audit log, not the lock.
//! A redirect to another origin is refused before anything is sent there.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use moat_test_guests as guests;
use rmcp::model::CallToolRequestParams;
use rmcp::{ClientHandler, ServiceExt};

mod common;

const TOKEN: &str = "s3cret-token-for-the-remote-0451";

#[derive(Clone, Default)]
struct Agent;
impl ClientHandler for Agent {}

fn cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache")
}

/// A child process killed when the test ends, pass or fail.
struct Upstream(std::process::Child);

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The remote: `moat serve --http` in front of the `everything` guest.
fn remote(dir: &Path) -> (Upstream, String) {
    let config = dir.join("remote.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.everything]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM
        ),
    )
    .unwrap();
    let (child, url) = common::serve_http(&config, TOKEN, &dir.join("remote-audit.jsonl"));
    (Upstream(child), url)
}

/// A front config with one remote server at `url` and one local wasm server.
fn front(dir: &Path, url: &str) -> PathBuf {
    let config = dir.join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.up]\nurl = {url:?}\nbearer_token_env = \"UP_TOKEN\"\nsandbox = \"best-effort\"\n\n[servers.local]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM
        ),
    )
    .unwrap();
    config
}

fn moat(args: &[&str], token: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_moat"));
    command
        .args(args)
        .env("MOAT_CACHE_DIR", cache())
        .env("MOAT_STATE_DIR", common::state_dir())
        .env("RUST_LOG", "trace")
        .env_remove("UP_TOKEN");
    if let Some(token) = token {
        command.env("UP_TOKEN", token);
    }
    command.output().expect("running moat")
}

#[tokio::test]
async fn a_remote_server_is_served_beside_a_local_one_and_its_token_is_never_logged() {
    let dir = tempfile::tempdir().unwrap();
    let (_upstream, url) = remote(dir.path());
    let config = front(dir.path(), &url);
    let audit = dir.path().join("audit.jsonl");
    let log = dir.path().join("front.log");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["serve", "--config", config.to_str().unwrap(), "--audit"])
        .arg(&audit)
        .env("MOAT_CACHE_DIR", cache())
        .env("MOAT_STATE_DIR", common::state_dir())
        .env("UP_TOKEN", TOKEN)
        .env("RUST_LOG", "trace")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("moat serve");
    let agent = Agent
        .serve((child.stdout.take().unwrap(), child.stdin.take().unwrap()))
        .await
        .expect("handshake with moat serve");

    let names: Vec<String> = agent
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(
        names.contains(&"up__everything__add".to_owned()),
        "{names:?}"
    );
    assert!(names.contains(&"local__add".to_owned()), "{names:?}");
    for tool in ["up__everything__add", "local__add"] {
        let mut params = CallToolRequestParams::new(tool);
        params.arguments = serde_json::json!({"a": 2, "b": 40}).as_object().cloned();
        let result = agent.call_tool(params).await.unwrap();
        let content = serde_json::to_value(&result.content).unwrap();
        assert_eq!(content[0]["text"], "42", "{tool}");
    }
    agent.cancel().await.unwrap();
    assert!(child.wait().await.unwrap().success());

    let audit_text = std::fs::read_to_string(&audit).unwrap();
    moat_host::audit::verify(&audit, &common::audit_key()).unwrap();
    let launches: Vec<serde_json::Value> = audit_text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == "server_launch")
        .collect();
    let up = launches.iter().find(|e| e["server"] == "up").unwrap();
    assert_eq!(up["evidence"], "remote-unmeasured", "{up}");
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains("TRACE"),
        "the log ran at trace level: {} bytes",
        log_text.len()
    );
    assert!(!log_text.contains(TOKEN), "the token reached the log");
    assert!(
        !audit_text.contains(TOKEN),
        "the token reached the audit log"
    );

    // `moat lock` pins the remote's tools to its endpoint; no token, no digest.
    let locked = moat(&["lock", "--config", config.to_str().unwrap()], Some(TOKEN));
    assert!(
        locked.status.success(),
        "{}",
        String::from_utf8_lossy(&locked.stderr)
    );
    let lock = std::fs::read_to_string(dir.path().join("moat.lock")).unwrap();
    let lock: toml::Value = toml::from_str(&lock).unwrap();
    let up = &lock["servers"]["up"];
    assert_eq!(up["evidence"].as_str(), Some("remote-unmeasured"));
    assert!(up.get("sha256").is_none(), "{up}");
    assert!(!lock.to_string().contains(TOKEN));
    assert!(!String::from_utf8_lossy(&locked.stderr).contains(TOKEN));
    // ... and `moat tools --locked` serves them from the lock, as `remote`.
    let tools = moat(
        &[
            "tools",
            "--locked",
            "--json",
            "--config",
            config.to_str().unwrap(),
            "up",
        ],
        Some(TOKEN),
    );
    let report: serde_json::Value = serde_json::from_slice(&tools.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&tools.stderr)));
    assert_eq!(report["evidence"], "remote-unmeasured", "{report}");
}

#[test]
fn a_missing_or_wrong_token_fails_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let (_upstream, url) = remote(dir.path());
    let config = front(dir.path(), &url);
    let call = |token| {
        moat(
            &[
                "call",
                "--config",
                config.to_str().unwrap(),
                "up",
                "everything__add",
                r#"{"a":1,"b":2}"#,
            ],
            token,
        )
    };
    let missing = call(None);
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains(
            "server `up`: bearer_token_env names `UP_TOKEN`, which is not set (or not valid text) in Moat's environment"
        ),
        "{stderr}"
    );
    let wrong = call(Some("not-the-token"));
    assert!(!wrong.status.success());
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        stderr.contains("moat: error: handshake on server `up` failed: server `up` crashed: the remote endpoint ended the session: unexpected server response: HTTP 401 Unauthorized"),
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-token"), "{stderr}");
    let right = call(Some(TOKEN));
    assert!(
        right.status.success(),
        "{}",
        String::from_utf8_lossy(&right.stderr)
    );
    assert!(String::from_utf8_lossy(&right.stdout).contains('3'));
}

#[test]
fn a_redirect_to_another_origin_is_refused_and_nothing_reaches_it() {
    let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let elsewhere_url = format!("http://{}/mcp", elsewhere.local_addr().unwrap());
    let redirector = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", redirector.local_addr().unwrap());
    let location = elsewhere_url.clone();
    let serving = std::thread::spawn(move || {
        // Read one request (headers and body), answer it with a redirect.
        use std::io::{BufRead, Read};
        let (stream, _) = redirector.accept().unwrap();
        let mut reader = std::io::BufReader::new(stream);
        let mut length = 0;
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap() > 0 && line != "\r\n" {
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().unwrap();
            }
            line.clear();
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        write!(
            reader.get_mut(),
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        String::from_utf8(body).unwrap()
    });
    let dir = tempfile::tempdir().unwrap();
    let config = front(dir.path(), &url);
    let output = moat(
        &["tools", "--config", config.to_str().unwrap(), "up"],
        Some(TOKEN),
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "refused a redirect to {elsewhere_url}: Moat talks to the configured endpoint's origin only"
        )),
        "{stderr}"
    );
    let first = serving.join().unwrap();
    assert!(
        first.contains("\"initialize\"") || first.contains("server/discover"),
        "{first}"
    );
    elsewhere.set_nonblocking(true).unwrap();
    assert_eq!(
        elsewhere.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "nothing may connect to the other origin"
    );
    assert!(!stderr.contains(TOKEN));
}

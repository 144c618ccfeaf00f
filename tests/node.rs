//! Remote launch by profile (issue 35), front and node on loopback: `moat
//! node serve` holds a config and lock of its own, and a front's `moat
//! serve` names a node (its address, pinned certificate, pinned public
//! key, token), a profile and the revision it expects. What crosses the
//! wire is the profile and the revision; what the node launched comes back
//! signed, and the front records it as `remote-measured`. Each refusal
//! names what was refused: a stale revision (both digests), an unknown
//! profile, a field beyond profile and revision, a wrong certificate, a
//! wrong token. A node killed mid-call fails the call at once, naming the
//! node, and the front's other servers go on; closing the front ends the
//! process tree on the node.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::node::{HANG, Node, TOKEN, cache, certificate, moat, node_config, ok, start_node};
use moat_test_guests as guests;
use rmcp::model::CallToolRequestParams;
use rmcp::{ClientHandler, ServiceExt};

mod common;

#[derive(Clone, Default)]
struct Agent;
impl ClientHandler for Agent {}

/// A front config in `dir`: node `build` as `node` describes it (with
/// `cert_sha256` and `revision` as given), server `remote` (profile
/// `profile` on it), `remote_native` (profile `native`), and a local wasm
/// server `local`.
fn front_config(
    dir: &Path,
    node: &Node,
    cert_sha256: &str,
    profile: &str,
    revision: &str,
) -> PathBuf {
    let config = dir.join("front.toml");
    std::fs::write(
        &config,
        format!(
            "[nodes.build]\nurl = {:?}\ncert_sha256 = {cert_sha256:?}\npublic_key = {:?}\ntoken_env = \"BUILD_NODE_TOKEN\"\n\n\
             [servers.remote]\nnode = \"build\"\nprofile = {profile:?}\nrevision = {revision:?}\n\n\
             [servers.remote_native]\nnode = \"build\"\nprofile = \"native\"\nrevision = {:?}\n\n\
             [servers.local]\nwasm = {:?}\nallow_unmeasured = true\n",
            node.url,
            node.public_key,
            node.revision("native"),
            guests::EVERYTHING_WASM
        ),
    )
    .unwrap();
    config
}

fn front_state(dir: &Path) -> PathBuf {
    dir.join("front-state")
}

/// `moat call` on the front: server `server`, tool `tool`.
fn front_call(dir: &Path, config: &Path, server: &str, tool: &str, arguments: &str) -> Output {
    moat(
        &[
            "call",
            "--config",
            config.to_str().unwrap(),
            server,
            tool,
            arguments,
        ],
        &front_state(dir),
        &[("BUILD_NODE_TOKEN", TOKEN)],
    )
}

fn spawn_front(dir: &Path, config: &Path, extra: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["serve", "--config", config.to_str().unwrap()])
        .args(extra)
        .env("MOAT_CACHE_DIR", cache())
        .env("MOAT_STATE_DIR", front_state(dir))
        .env("BUILD_NODE_TOKEN", TOKEN)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("moat serve")
}

/// The front for `node` (profile `everything` at the revision it holds)
/// served by `moat serve` to an agent: its config, its process and the
/// agent.
async fn front_with_agent(
    dir: &Path,
    node: &Node,
) -> (
    PathBuf,
    tokio::process::Child,
    rmcp::service::RunningService<rmcp::RoleClient, Agent>,
) {
    let config = front_config(
        dir,
        node,
        &node.cert_sha256,
        "everything",
        node.revision("everything"),
    );
    let mut front = spawn_front(dir, &config, &[]);
    let agent = Agent
        .serve((front.stdout.take().unwrap(), front.stdin.take().unwrap()))
        .await
        .expect("handshake with moat serve");
    (config, front, agent)
}

fn text_of(result: &rmcp::model::CallToolResult) -> String {
    serde_json::to_value(&result.content).unwrap()[0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn add(tool: &str) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    params.arguments = serde_json::json!({"a": 2, "b": 40}).as_object().cloned();
    params
}

#[tokio::test(flavor = "multi_thread")]
async fn a_profile_on_a_node_is_launched_called_recorded_as_remote_measured_and_released() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &node_config(dir.path()), "node");
    let config = front_config(
        dir.path(),
        &node,
        &node.cert_sha256,
        "everything",
        node.revision("everything"),
    );
    let audit = dir.path().join("audit.jsonl");
    let claims = dir.path().join("claims");
    let mut front = spawn_front(
        dir.path(),
        &config,
        &[
            "--audit",
            audit.to_str().unwrap(),
            "--claims",
            claims.to_str().unwrap(),
        ],
    );
    let agent = Agent
        .serve((front.stdout.take().unwrap(), front.stdin.take().unwrap()))
        .await
        .expect("handshake with moat serve");
    let names: Vec<String> = agent
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(names.contains(&"remote__add".to_owned()), "{names:?}");
    assert!(names.contains(&"local__add".to_owned()), "{names:?}");
    for tool in ["remote__add", "local__add"] {
        let result = agent.call_tool(add(tool)).await.unwrap();
        assert_eq!(text_of(&result), "42", "{tool}");
    }
    let launched = node.wait_for("launched for a front");
    assert!(launched.contains("profile=everything"), "{launched}");
    agent.cancel().await.unwrap();
    assert!(front.wait().await.unwrap().success());
    // Closing the front released the launch on the node.
    let ended = node.wait_for("launch ended");
    assert!(ended.contains("the front released it"), "{ended}");

    // The front's audit log records the node's digest and the class of
    // evidence that a signed statement gives; so does its claim.
    moat_host::audit::verify(
        &audit,
        &moat_host::audit::key_in(&front_state(dir.path()), false).unwrap(),
    )
    .unwrap();
    let launch = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["event"] == "server_launch" && e["server"] == "remote")
        .expect("the remote server's launch is audited");
    assert_eq!(launch["evidence"], "remote-measured", "{launch}");
    let claim = std::fs::read_dir(&claims)
        .unwrap()
        .next()
        .expect("a claim of the session")
        .unwrap()
        .path();
    let claim: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(claim).unwrap()).unwrap();
    let ran = claim["claim"]["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "remote")
        .expect("the claim names the server on the node")
        .clone();
    assert_eq!(ran["evidence"], "remote-measured", "{ran}");
    assert_eq!(ran["endpoint"], node.url, "{ran}");
    let sandbox = ran["sandbox"].to_string();
    assert!(
        sandbox.contains("on node `build` (wasm-measured): "),
        "the node's sandbox report, said to hold there: {sandbox}"
    );
    // The lock the node holds pins the same bytes the front was told of.
    let lock: toml::Value =
        toml::from_str(&std::fs::read_to_string(dir.path().join("node/moat.lock")).unwrap())
            .unwrap();
    assert_eq!(
        ran["sha256"].as_str(),
        lock["servers"]["everything"]["sha256"].as_str(),
        "{ran}"
    );
}

#[test]
fn each_refusal_names_what_was_refused() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &node_config(dir.path()), "node");
    let held = node.revision("everything").to_owned();
    let call = |config: &Path| {
        let output = front_call(dir.path(), config, "remote", "add", r#"{"a":1,"b":2}"#);
        assert!(!output.status.success(), "refused");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };

    // A stale revision: both digests, and what to change.
    let stale = "sha256:00000000000000000000000000000000000000000000000000000000000000aa";
    let stderr = call(&front_config(
        dir.path(),
        &node,
        &node.cert_sha256,
        "everything",
        stale,
    ));
    assert!(
        stderr.contains(&format!(
            "server `remote`: node `build` refused the launch (409): profile `everything`: stale revision: the front expects {}, this node holds {} (update the front's `revision`, or the node's moat.lock, so that they agree)",
            stale.trim_start_matches("sha256:"),
            held.trim_start_matches("sha256:")
        )),
        "{stderr}"
    );

    // A profile the node does not have.
    let stderr = call(&front_config(
        dir.path(),
        &node,
        &node.cert_sha256,
        "gpu",
        &held,
    ));
    assert!(
        stderr.contains(
            "server `remote`: node `build` refused the launch (404): profile `gpu`: this node has no such profile (its config names: everything, native)"
        ),
        "{stderr}"
    );

    // Another certificate than the one pinned.
    let (other, _) = certificate(dir.path(), "other");
    let other_pin = moat_host::Digest::of(&rustls_der(&other));
    let stderr = call(&front_config(
        dir.path(),
        &node,
        &other_pin.to_string(),
        "everything",
        &held,
    ));
    assert!(
        stderr.contains(&format!(
            "node `build` presented the certificate {}, not the one pinned for it ({other_pin}): refused",
            node.cert_sha256.trim_start_matches("sha256:")
        )),
        "{stderr}"
    );
    assert_eq!(
        node.cert_sha256.trim_start_matches("sha256:"),
        moat_host::Digest::of(&rustls_der(&node.cert)).to_string(),
        "the pin the node announces is its certificate's sha256"
    );

    // The wrong token.
    let config = front_config(dir.path(), &node, &node.cert_sha256, "everything", &held);
    let output = moat(
        &[
            "call",
            "--config",
            config.to_str().unwrap(),
            "remote",
            "add",
            "{}",
        ],
        &front_state(dir.path()),
        &[("BUILD_NODE_TOKEN", "not-the-token")],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "server `remote`: node `build` refused the launch (401): this node serves fronts that present its token only"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-token"), "{stderr}");

    // The node survived every refusal and still launches what it holds.
    let output = front_call(dir.path(), &config, "remote", "add", r#"{"a":1,"b":2}"#);
    assert!(
        ok(&output, "a call after the refusals").contains('3'),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
}

/// The DER bytes of the PEM certificate at `path`.
fn rustls_der(path: &Path) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    CertificateDer::from_pem_file(path).unwrap().to_vec()
}

/// Every field a node's config would accept for a server, sent on the wire
/// by a client that is not Moat (Python's http.client over TLS, trusting
/// the node's certificate), is refused by name with 400; so is a request
/// with no nonce, and one with no token gets 401.
#[test]
fn a_launch_request_carrying_anything_beyond_profile_and_revision_is_refused_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &node_config(dir.path()), "node");
    let held = node.revision("everything").to_owned();
    let script = r#"
import http.client, json, ssl, sys
url, cafile, token, cases = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
host = url.removeprefix("https://")
context = ssl.create_default_context(cafile=cafile)
out = []
for case in cases:
    connection = http.client.HTTPSConnection(host, context=context, timeout=60)
    headers = {"content-type": "application/json"}
    if case.get("token", True):
        headers["authorization"] = "Bearer " + token
    if case.get("nonce", True):
        headers["moat-nonce"] = "0123456789abcdef0123"
    connection.request("POST", "/launch", body=json.dumps(case["body"]), headers=headers)
    answer = connection.getresponse()
    out.append({"status": answer.status, "body": json.loads(answer.read() or b"null")})
print(json.dumps(out))
"#;
    let fields = [
        "command",
        "args",
        "cwd",
        "env",
        "env_passthrough",
        "wasm",
        "url",
        "sha256",
        "allow_unmeasured",
        "measure",
        "dirs",
        "net",
        "limits",
        "sandbox",
        "package",
        "policy",
    ];
    let mut cases: Vec<serde_json::Value> = fields
        .iter()
        .map(|field| {
            let mut body = serde_json::json!({"profile": "everything", "revision": held});
            body[*field] = serde_json::json!(["/bin/sh", "-c", "id"]);
            serde_json::json!({"body": body})
        })
        .collect();
    let plain = serde_json::json!({"profile": "everything", "revision": held});
    cases.push(serde_json::json!({"body": plain, "nonce": false}));
    cases.push(serde_json::json!({"body": plain, "token": false}));
    let output = Command::new("python3")
        .args(["-c", script, &node.url])
        .arg(&node.cert)
        .arg(TOKEN)
        .arg(serde_json::Value::from(cases).to_string())
        .output()
        .expect("python3");
    let answers: Vec<serde_json::Value> =
        serde_json::from_str(&ok(&output, "the python client")).unwrap();
    for (field, answer) in fields.iter().zip(&answers) {
        assert_eq!(answer["status"], 400, "{field}: {answer}");
        assert_eq!(
            answer["body"]["error"],
            format!(
                "launch request: field `{field}` is not accepted: a front names a profile and its revision only; grants, limits, commands and policy are the node's own"
            ),
            "{field}"
        );
    }
    let no_nonce = &answers[fields.len()];
    assert_eq!(no_nonce["status"], 400, "{no_nonce}");
    assert!(
        no_nonce["body"]["error"]
            .as_str()
            .unwrap()
            .contains("the `moat-nonce` header must be"),
        "{no_nonce}"
    );
    let no_token = &answers[fields.len() + 1];
    assert_eq!(no_token["status"], 401, "{no_token}");
    // Nothing was launched for any of them.
    while let Ok(line) = node.log.try_recv() {
        assert!(!line.contains("launched for a front"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_killed_mid_call_fails_the_call_at_once_naming_the_node_and_the_rest_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start_node(dir.path(), &node_config(dir.path()), "node");
    let (_config, _front, agent) = front_with_agent(dir.path(), &node).await;
    let mut sleep = CallToolRequestParams::new("remote__sleep");
    sleep.arguments = serde_json::json!({"ms": 600_000}).as_object().cloned();
    let peer = agent.peer().clone();
    let call = tokio::spawn(async move { peer.call_tool(sleep).await });
    node.wait_for("a front's call");
    node.child.kill().unwrap();
    node.child.wait().unwrap();
    let killed = std::time::Instant::now();
    let answer = tokio::time::timeout(HANG, call)
        .await
        .expect("the call fails rather than hangs")
        .unwrap();
    let error = answer.expect_err("the node is gone").to_string();
    eprintln!(
        "the call failed {:?} after the kill: {error}",
        killed.elapsed()
    );
    assert!(error.contains("node `build`"), "{error}");

    // The front's other servers are untouched.
    let result = agent.call_tool(add("local__add")).await.unwrap();
    assert_eq!(text_of(&result), "42");
    // And the server on the node is refused with the same name while the
    // node is down, not left hanging.
    let again = tokio::time::timeout(HANG, agent.call_tool(add("remote__add")))
        .await
        .expect("refused rather than hung")
        .expect_err("the node is gone")
        .to_string();
    eprintln!("the next call: {again}");
    assert!(again.contains("node `build`"), "{again}");
    agent.cancel().await.unwrap();
}

/// The native profile's process, found by its executable (a copy of this
/// test's own, so no other test's process is taken for it).
fn process_running(executable: &Path) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let entry = entry.ok()?;
        let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
        let exe = std::fs::read_link(entry.path().join("exe")).ok()?;
        (exe == executable).then_some(pid)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn closing_the_front_ends_the_process_tree_on_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &node_config(dir.path()), "node");
    let (_, mut front, agent) = front_with_agent(dir.path(), &node).await;
    let result = agent.call_tool(add("remote_native__add")).await.unwrap();
    assert_eq!(text_of(&result), "42");
    let executable = std::fs::canonicalize(dir.path().join("node/everything-native")).unwrap();
    let pid = process_running(&executable).expect("the native profile runs on the node");
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // (or -1); nothing is borrowed.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    assert!(pidfd >= 0, "pidfd_open({pid})");
    let pidfd = pidfd as i32;

    agent.cancel().await.unwrap();
    assert!(front.wait().await.unwrap().success());
    // A pidfd turns readable when its process has exited.
    let mut poll = libc::pollfd {
        fd: pidfd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, its count, and a timeout in milliseconds.
    let ready = unsafe { libc::poll(&mut poll, 1, HANG.as_millis() as i32) };
    // SAFETY: the descriptor is ours and closed once.
    unsafe { libc::close(pidfd) };
    assert_eq!(ready, 1, "the native server on the node outlived the front");
    let ended = node.wait_for("launch ended");
    assert!(ended.contains("the front released it"), "{ended}");
}

#[test]
fn the_sdk_clients_drive_a_front_whose_server_runs_on_a_node() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &node_config(dir.path()), "node");
    let config = front_config(
        dir.path(),
        &node,
        &node.cert_sha256,
        "everything",
        node.revision("everything"),
    );
    ok(
        &moat(
            &["lock", "--config", config.to_str().unwrap()],
            &front_state(dir.path()),
            &[("BUILD_NODE_TOKEN", TOKEN)],
        ),
        "moat lock on the front",
    );
    let calls = serde_json::json!([
        {"name": "remote__add", "arguments": {"a": 20, "b": 22}},
        {"name": "remote__add", "arguments": {"a": "not a number", "b": 1}},
    ])
    .to_string();
    for (sdk, mut command) in [
        ("typescript", common::ts_client("ts_calls.mjs", &config)),
        ("python", common::py_client("py_calls.py", &config)),
    ] {
        let output = command
            .arg(&calls)
            .env("MOAT_STATE_DIR", front_state(dir.path()))
            .env("BUILD_NODE_TOKEN", TOKEN)
            .env("PASS_ENV", "BUILD_NODE_TOKEN")
            .output()
            .expect("the SDK client");
        let report: serde_json::Value = serde_json::from_str(&ok(&output, sdk))
            .unwrap_or_else(|e| panic!("{sdk}: {e}: {}", String::from_utf8_lossy(&output.stderr)));
        let tools = report["tools"].to_string();
        assert!(tools.contains("\"remote__add\""), "{sdk}: {tools}");
        assert_eq!(report["results"][0]["text"], "42", "{sdk}: {report}");
        // The arguments are checked against the pinned schema before the
        // call leaves the front.
        assert_eq!(report["results"][1]["isError"], true, "{sdk}: {report}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_profile_revoked_on_the_node_is_refused_there_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node_toml = node_config(dir.path());
    let node = start_node(dir.path(), &node_toml, "node");
    let (config, _front, agent) = front_with_agent(dir.path(), &node).await;
    let result = agent.call_tool(add("remote__add")).await.unwrap();
    assert_eq!(text_of(&result), "42");

    ok(
        &moat(
            &[
                "revoke",
                "--config",
                node_toml.to_str().unwrap(),
                "--reason",
                "compromised build",
                "everything",
            ],
            &node_toml.parent().unwrap().join("state"),
            &[],
        ),
        "moat revoke on the node",
    );
    // The launch that is running: its next call is refused, and it ends.
    let error = tokio::time::timeout(HANG, agent.call_tool(add("remote__add")))
        .await
        .expect("refused rather than hung")
        .expect_err("revoked")
        .to_string();
    assert!(
        error.contains("profile `everything`: revoked on this node: `everything` was revoked by "),
        "{error}"
    );
    assert!(error.contains("compromised build"), "{error}");
    let ended = node.wait_for("launch ended");
    assert!(ended.contains("its profile was revoked"), "{ended}");
    agent.cancel().await.unwrap();

    // A new launch of it is refused before anything starts.
    let output = front_call(dir.path(), &config, "remote", "add", r#"{"a":1,"b":2}"#);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "server `remote`: node `build` refused the launch (403): profile `everything`: revoked on this node: `everything` was revoked by "
        ),
        "{stderr}"
    );
    // The node's other profiles are untouched.
    let output = front_call(
        dir.path(),
        &config,
        "remote_native",
        "add",
        r#"{"a":1,"b":2}"#,
    );
    assert!(ok(&output, "the native profile").contains('3'));
}

#[tokio::test(flavor = "multi_thread")]
async fn launches_beyond_the_nodes_limit_are_refused_until_one_ends() {
    let dir = tempfile::tempdir().unwrap();
    let node_toml = node_config(dir.path());
    let mut text = std::fs::read_to_string(&node_toml).unwrap();
    text.push_str("\n[serve]\nmax_sessions = 1\n");
    std::fs::write(&node_toml, text).unwrap();
    let node = start_node(dir.path(), &node_toml, "node");
    let config = front_config(
        dir.path(),
        &node,
        &node.cert_sha256,
        "everything",
        node.revision("everything"),
    );
    // The agent's front holds one launch: `remote` alone.
    let held = dir.path().join("held.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let start = text.find("[servers.remote_native]").unwrap();
    let end = text.find("[servers.local]").unwrap();
    std::fs::write(&held, format!("{}{}", &text[..start], &text[end..])).unwrap();
    let mut front = spawn_front(dir.path(), &held, &[]);
    let agent = Agent
        .serve((front.stdout.take().unwrap(), front.stdin.take().unwrap()))
        .await
        .expect("handshake with moat serve");
    let result = agent.call_tool(add("remote__add")).await.unwrap();
    assert_eq!(text_of(&result), "42");

    let output = front_call(
        dir.path(),
        &config,
        "remote_native",
        "add",
        r#"{"a":1,"b":2}"#,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "server `remote_native`: node `build` refused the launch (503): this node holds as many launches as it may ([serve] max_sessions = 1): try again when one ends"
        ),
        "{stderr}"
    );

    agent.cancel().await.unwrap();
    assert!(front.wait().await.unwrap().success());
    node.wait_for("launch ended");
    let output = front_call(
        dir.path(),
        &config,
        "remote_native",
        "add",
        r#"{"a":1,"b":2}"#,
    );
    assert!(ok(&output, "a launch once the first ended").contains('3'));
}

/// A launch request whose body never ends holds no launch slot and is cut
/// off at `request_timeout_ms` with 408.
#[test]
fn a_launch_request_that_never_ends_holds_no_slot_and_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let node_toml = node_config(dir.path());
    let mut text = std::fs::read_to_string(&node_toml).unwrap();
    text.push_str("\n[serve]\nmax_sessions = 1\nrequest_timeout_ms = 1000\n");
    std::fs::write(&node_toml, text).unwrap();
    let node = start_node(dir.path(), &node_toml, "node");
    let config = front_config(
        dir.path(),
        &node,
        &node.cert_sha256,
        "everything",
        node.revision("everything"),
    );
    let script = r#"
import socket, ssl, sys
url, cafile, token = sys.argv[1], sys.argv[2], sys.argv[3]
host, port = url.removeprefix("https://").rsplit(":", 1)
context = ssl.create_default_context(cafile=cafile)
raw = socket.create_connection((host, int(port)), timeout=60)
tls = context.wrap_socket(raw, server_hostname=host)
tls.sendall((
    "POST /launch HTTP/1.1\r\nhost: node\r\nauthorization: Bearer " + token +
    "\r\nmoat-nonce: 0123456789abcdef0123\r\ncontent-type: application/json\r\n"
    "content-length: 100\r\n\r\n{").encode())
print("sent", flush=True)
answer = tls.recv(4096).decode(errors="replace")
print(answer.splitlines()[0])
print(answer.split("\r\n\r\n", 1)[1])
"#;
    let mut drip = Command::new("python3")
        .args(["-u", "-c", script, &node.url])
        .arg(&node.cert)
        .arg(TOKEN)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut lines = BufReader::new(drip.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "sent");
    // While it drips, the one slot is free for an honest front.
    let output = front_call(dir.path(), &config, "remote", "add", r#"{"a":1,"b":2}"#);
    assert!(ok(&output, "a launch beside the dripping request").contains('3'));
    assert_eq!(
        lines.next().unwrap().unwrap(),
        "HTTP/1.1 408 Request Timeout"
    );
    assert!(
        lines
            .next()
            .unwrap()
            .unwrap()
            .contains("the launch request did not arrive within request_timeout_ms")
    );
    assert!(drip.wait().unwrap().success());
}

//! `moat serve --http` under the limits of `[serve]` (issue 12, item 10):
//! each limit answers with its status and an audit event, a flood of idle
//! connections and abandoned sessions leaves a normal agent served and the
//! memory back where it was, and EMFILE on accept does not end the process.
//! Driven over raw HTTP/1.1, as a hostile client would.

#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use moat_test_guests as guests;

mod audit_failure;
mod descriptors;
mod no_delay;
mod requests;
mod single;

const TOKEN: &str = "s3cret";

/// A config for `everything` (wasm) with small limits.
fn config(dir: &Path, serve: &str) -> std::path::PathBuf {
    let path = dir.join("moat.toml");
    std::fs::write(
        &path,
        format!(
            "[serve]\n{serve}\n[servers.everything]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM
        ),
    )
    .unwrap();
    path
}

const SMALL: &str = "max_sessions = 4\nsession_idle_ms = 1500\nmax_connections = 64\nheader_timeout_ms = 400\nmax_body_bytes = 65536";

/// A running `moat serve --http` and its address.
struct Server {
    child: std::process::Child,
    address: String,
    audit: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(serve: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path(), serve);
        let audit = dir.path().join("audit.jsonl");
        let (child, url) = common::serve_http(&config, TOKEN, &audit);
        let address = common::address_of(&url);
        Self {
            child,
            address,
            audit,
            _dir: dir,
        }
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap()
    }

    /// The `http_refused` events of the audit log, as (reason, status).
    fn refusals(&self) -> Vec<(String, u64)> {
        std::fs::read_to_string(&self.audit)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["event"] == "http_refused")
            .map(|e| {
                (
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                    e["status"].as_u64().unwrap_or_default(),
                )
            })
            .collect()
    }

    fn audited(&self, event: &str) -> usize {
        std::fs::read_to_string(&self.audit)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&format!("\"event\":\"{event}\"")))
            .count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response: status, the session id if one was given, and the body.
struct Answer {
    status: u16,
    session: Option<String>,
    body: String,
}

/// One request on its own connection (`Connection: close`), read to EOF.
fn post(address: &str, session: Option<&str>, body: &str) -> Answer {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let session = session
        .map(|s| format!("Mcp-Session-Id: {s}\r\nMcp-Protocol-Version: 2025-06-18\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {TOKEN}\r\n{session}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Answer {
        status: head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        session: head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("mcp-session-id")
                .then(|| value.trim().to_owned())
        }),
        body: body.to_owned(),
    }
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

/// An agent session that calls `everything__echo` once (so it holds a
/// child) and is then left open: its session id, or the refusal's status.
fn session_with_a_child(address: &str) -> Result<String, u16> {
    let init = post(address, None, INITIALIZE);
    if init.status != 200 {
        return Err(init.status);
    }
    let id = init.session.expect("a session id");
    let initialized = post(
        address,
        Some(&id),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(initialized.status, 202, "{}", initialized.body);
    let call = post(
        address,
        Some(&id),
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"everything__echo","arguments":{"message":"still here"}}}"#,
    );
    assert_eq!(call.status, 200, "{}", call.body);
    assert!(call.body.contains("still here"), "{}", call.body);
    Ok(id)
}

/// Reads what the server sends until it closes, or 30 s pass.
fn read_until_closed(stream: &mut TcpStream) -> String {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

/// Polls `done` every 50 ms until it holds or `limit` passes.
fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

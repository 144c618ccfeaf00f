//! Helpers shared by the CLI-level tests.
#![allow(dead_code)] // each test binary uses its own subset

pub mod node;

use std::path::Path;
use std::process::Command;

/// `moat serve --http 127.0.0.1:0` with a token and an audit log; returns
/// the child and URL.
pub fn serve_http(config: &Path, token: &str, audit: &Path) -> (std::process::Child, String) {
    let (child, url, _stderr) = serve_http_logged(config, token, audit, &[]);
    (child, url)
}

/// [`serve_http`] with `extra` arguments, also returning the rest of its
/// stderr, line by line (read on a thread of its own, so the server never
/// blocks on it).
pub fn serve_http_logged(
    config: &Path,
    token: &str,
    audit: &Path,
    extra: &[&str],
) -> (
    std::process::Child,
    String,
    std::sync::mpsc::Receiver<String>,
) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--token",
            token,
            "--allow-origin",
            "http://app.example",
            "--config",
        ])
        .arg(config)
        .arg("--audit")
        .arg(audit)
        .args(extra)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", state_dir())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("moat serve --http");
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufReader::new(stderr).lines();
    let url = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("moat: serving MCP at ").map(str::to_owned))
        .expect("moat serve announces its URL");
    let (send, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            // Nobody listening: keep draining all the same.
            let _ = send.send(line);
        }
    });
    (child, url, received)
}

/// The `host:port` of a `http://host:port/mcp` URL.
pub fn address_of(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned()
}

/// The state directory (audit key) the CLI tests give `moat`.
pub fn state_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-state")
}

/// The audit key `moat` writes with under [`state_dir`].
pub fn audit_key() -> moat_host::Key {
    moat_host::audit::key_in(&state_dir(), true).unwrap()
}

/// `node tests/clients/SCRIPT SDK MOAT CONFIG`: the official TypeScript SDK
/// (installed by tests/setup.sh) driving `moat serve` over stdio, with the
/// CLI tests' cache and state directories. Callers add arguments after.
pub fn ts_client(script: &str, config: &Path) -> Command {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut command = Command::new("node");
    command
        .arg(root.join("tests/clients").join(script))
        .arg(root.join("target/npm/node_modules/@modelcontextprotocol/sdk"))
        .arg(env!("CARGO_BIN_EXE_moat"))
        .arg(config)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", state_dir());
    command
}

/// `python3 tests/clients/SCRIPT MOAT CONFIG` with the official Python SDK
/// (installed by tests/setup.sh into target/py) on its path, and the tests'
/// component cache and state directory.
pub fn py_client(script: &str, config: &Path) -> Command {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut command = Command::new("python3");
    command
        .arg(root.join("tests/clients").join(script))
        .arg(env!("CARGO_BIN_EXE_moat"))
        .arg(config)
        .env("PYTHONPATH", root.join("target/py"))
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", state_dir());
    command
}

/// `moat lock --config CONFIG` with the tests' component cache and state
/// directory; panics with its stderr when it fails.
pub fn lock(config: &Path) {
    let output = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["lock", "--config"])
        .arg(config)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", state_dir())
        .output()
        .expect("running moat lock");
    assert!(
        output.status.success(),
        "moat lock: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A whole raw HTTP/1.1 response to a JSON-RPC request: its status, the
/// value of the header `header` (lower case, as Moat writes it), and the
/// JSON-RPC answer (the JSON body, or the SSE event that carries it).
pub fn http_answer(response: &str, header: &str) -> (u16, Option<String>, serde_json::Value) {
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let prefix = format!("{header}: ");
    let value = head
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(str::to_owned);
    let json = body
        .lines()
        .find_map(|l| l.strip_prefix("data: ").or(l.starts_with('{').then_some(l)))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON-RPC answer in {response:?}"));
    (status, value, json)
}

//! `moat node serve` as the tests run it: a certificate from openssl, a
//! node started on loopback with what a front pins read off its stderr.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use moat_test_guests as guests;

pub const TOKEN: &str = "node-token-for-the-fronts-7731";
/// How long any one step may take before the test calls it a hang.
pub const HANG: Duration = Duration::from_secs(60);

pub fn cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache")
}

/// `moat ARGS` with the tests' cache, `state` as its state directory and
/// `env` set.
pub fn moat(args: &[&str], state: &Path, env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(args)
        .env("MOAT_CACHE_DIR", cache())
        .env("MOAT_STATE_DIR", state)
        .envs(env.iter().copied())
        .output()
        .expect("running moat")
}

pub fn ok(output: &Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A self-signed certificate for 127.0.0.1 and its key, as `NAME.pem` and
/// `NAME.key` in `dir`.
pub fn certificate(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    let output = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=moat test node",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("the openssl command (to make the node's certificate)");
    assert!(
        output.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (cert, key)
}

/// A running `moat node serve`, killed when dropped.
pub struct Node {
    pub child: Child,
    pub url: String,
    pub cert_sha256: String,
    pub public_key: String,
    /// Its stderr after the announcement, line by line.
    pub log: Receiver<String>,
    /// The revision of each profile (`moat node revisions`).
    pub revisions: Vec<(String, String)>,
    pub cert: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    pub fn revision(&self, profile: &str) -> &str {
        &self
            .revisions
            .iter()
            .find(|(p, _)| p == profile)
            .unwrap_or_else(|| panic!("no revision for {profile}: {:?}", self.revisions))
            .1
    }

    /// Waits for a line of the node's log holding `text`.
    pub fn wait_for(&self, text: &str) -> String {
        loop {
            let line = self
                .log
                .recv_timeout(HANG)
                .unwrap_or_else(|_| panic!("the node never logged {text:?}"));
            if line.contains(text) {
                return line;
            }
        }
    }
}

/// The node's config in `dir/node`: `everything` (wasm) and `native` (the
/// same server as a native executable, copied to a path of this test's
/// own), both locked.
pub fn node_config(dir: &Path) -> PathBuf {
    let home = dir.join("node");
    std::fs::create_dir_all(&home).unwrap();
    let native = home.join("everything-native");
    std::fs::copy(guests::EVERYTHING_NATIVE, &native).unwrap();
    let config = home.join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.everything]\nwasm = {:?}\nallow_unmeasured = true\n\n[servers.native]\ncommand = {native:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM
        ),
    )
    .unwrap();
    let state = home.join("state");
    ok(
        &moat(&["lock", "--config", config.to_str().unwrap()], &state, &[]),
        "moat lock on the node",
    );
    config
}

/// Starts `moat node serve` for `config` with the certificate `name` in
/// `dir`.
pub fn start_node(dir: &Path, config: &Path, name: &str) -> Node {
    let (cert, key) = certificate(dir, name);
    let state = config.parent().unwrap().join("state");
    let revisions = ok(
        &moat(
            &["node", "revisions", "--config", config.to_str().unwrap()],
            &state,
            &[],
        ),
        "moat node revisions",
    );
    let revisions = revisions
        .lines()
        .filter_map(|line| {
            let (profile, rest) = line.split_once(": revision = ")?;
            Some((profile.to_owned(), rest.trim_matches('"').to_owned()))
        })
        .collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["node", "serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .env("MOAT_CACHE_DIR", cache())
        .env("MOAT_STATE_DIR", &state)
        .env("MOAT_NODE_TOKEN", TOKEN)
        .env("RUST_LOG", "moat_host=debug")
        .stderr(Stdio::piped())
        .spawn()
        .expect("moat node serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut next = || lines.next().expect("moat node's stderr").unwrap();
    let url = loop {
        let line = next();
        if let Some(at) = line.split_once(" at ").map(|(_, at)| at.to_owned())
            && line.starts_with("moat node: serving ")
        {
            break at;
        }
    };
    let value = |line: String, key: &str| {
        line.trim()
            .strip_prefix(key)
            .and_then(|rest| rest.strip_prefix(" = "))
            .unwrap_or_else(|| panic!("{key} in {line:?}"))
            .trim_matches('"')
            .to_owned()
    };
    let cert_sha256 = value(next(), "cert_sha256");
    let public_key = value(next(), "public_key");
    let (send, log) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = send.send(line);
        }
    });
    Node {
        child,
        url,
        cert_sha256,
        public_key,
        log,
        revisions,
        cert,
    }
}

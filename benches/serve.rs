//! The outside view, as an agent sees it: a driver spawns a command, speaks
//! MCP over its stdio (`initialize`, `tools/list`, a first `tools/call`,
//! then 500 sequential calls of `echo`), and reads the peak RSS of the
//! process tree. One run prints, side by side:
//!
//! - `native`: the `everything` guest built natively and spawned directly
//!   (the floor);
//! - `serve → wasm`: `moat serve` in front of the same guest compiled to
//!   wasm32-wasip2, its component already in the cache, without and with a
//!   lock;
//! - `serve → native child`: `moat serve` in front of the native guest.
//!
//! Start is spawn → first call answered, the median of `STARTS` runs; calls
//! are p50 and p99 of `CALLS`; RSS is the sum of VmHWM over the process and
//! its children just before stdin closes. Ratios are against `native`.
//!
//! `cargo bench --bench serve`

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use moat_test_guests as guests;
use serde_json::{Value, json};

const STARTS: usize = 15;
const CALLS: usize = 500;

/// One MCP client over a child's stdio, line-delimited JSON-RPC.
struct Driver {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next: u64,
}

impl Driver {
    fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning the server");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
            next: 1,
        }
    }

    fn send(&mut self, message: &Value) {
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).expect("writing to the server");
    }

    /// Sends a request and reads until its response.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let mut line = String::new();
        loop {
            line.clear();
            let n = self
                .stdout
                .read_line(&mut line)
                .expect("reading the server");
            assert!(n > 0, "the server closed its stdout during {method}");
            let message: Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            if message["id"] == json!(id) {
                assert!(message.get("error").is_none(), "{method} failed: {message}");
                return message;
            }
        }
    }

    fn initialize(&mut self) {
        self.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "moat-bench", "version": "1"}}),
        );
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    }

    fn echo(&mut self, tool: &str) {
        let answer = self.request(
            "tools/call",
            json!({"name": tool, "arguments": {"message": "bench"}}),
        );
        assert_eq!(answer["result"]["content"][0]["text"], "bench", "{answer}");
    }

    /// Peak RSS in bytes of the child and every process below it.
    fn peak_rss(&self) -> u64 {
        fn tree(pid: u32, total: &mut u64) {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            *total += status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
                .unwrap_or(0)
                * 1024;
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten();
            for task in tasks.flatten() {
                let children =
                    std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
                for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                    tree(child, total);
                }
            }
        }
        let mut total = 0;
        tree(self.child.id(), &mut total);
        total
    }

    fn close(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

/// What one row measured.
struct Row {
    name: &'static str,
    start: Duration,
    p50: Duration,
    p99: Duration,
    rss: u64,
}

fn measure(name: &'static str, tool: &str, command: &dyn Fn() -> Command) -> Row {
    let mut starts = Vec::with_capacity(STARTS);
    for _ in 0..STARTS {
        let started = Instant::now();
        let mut driver = Driver::spawn(command());
        driver.initialize();
        driver.request("tools/list", json!({}));
        driver.echo(tool);
        starts.push(started.elapsed());
        driver.close();
    }
    starts.sort();
    let mut driver = Driver::spawn(command());
    driver.initialize();
    driver.request("tools/list", json!({}));
    let mut calls = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let started = Instant::now();
        driver.echo(tool);
        calls.push(started.elapsed());
    }
    calls.sort();
    let rss = driver.peak_rss();
    driver.close();
    Row {
        name,
        start: starts[STARTS / 2],
        p50: calls[CALLS / 2],
        p99: calls[CALLS * 99 / 100],
        rss,
    }
}

fn moat(config: &Path, cache: &Path, state: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_moat"));
    command
        .args(["serve", "--config"])
        .arg(config)
        .env("MOAT_CACHE_DIR", cache)
        .env("MOAT_STATE_DIR", state)
        .env("RUST_LOG", "error");
    command
}

fn write_config(dir: &Path, name: &str, body: &str) -> PathBuf {
    let sub = dir.join(name);
    std::fs::create_dir_all(&sub).unwrap();
    let path = sub.join("moat.toml");
    std::fs::write(&path, body).unwrap();
    path
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is ignored here.
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let state = dir.path().join("state");
    let digest = |path: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_moat"))
            .args(["digest", path])
            .output()
            .unwrap();
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    };
    let wasm = write_config(
        dir.path(),
        "wasm",
        &format!(
            "[servers.everything]\nwasm = {:?}\nsha256 = {:?}\n",
            guests::EVERYTHING_WASM,
            digest(guests::EVERYTHING_WASM)
        ),
    );
    let locked = write_config(
        dir.path(),
        "locked",
        &std::fs::read_to_string(&wasm).unwrap(),
    );
    let native = write_config(
        dir.path(),
        "native",
        &format!(
            "[servers.everything]\ncommand = {:?}\nsha256 = {:?}\n",
            guests::EVERYTHING_NATIVE,
            digest(guests::EVERYTHING_NATIVE)
        ),
    );
    // Warm the component cache, and lock one copy.
    let status = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["lock", "--config"])
        .arg(&locked)
        .env("MOAT_CACHE_DIR", &cache)
        .env("MOAT_STATE_DIR", &state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "moat lock");
    // The steady state: cache files older than the seal rule's settling
    // time, sealed by one start.
    std::thread::sleep(moat_host::seal::SETTLED + Duration::from_millis(200));
    for config in [&wasm, &locked] {
        let mut driver = Driver::spawn(moat(config, &cache, &state));
        driver.initialize();
        driver.close();
    }

    let rows = [
        measure("native", "echo", &|| {
            Command::new(guests::EVERYTHING_NATIVE)
        }),
        measure("serve → wasm", "everything__echo", &|| {
            moat(&wasm, &cache, &state)
        }),
        measure("serve → wasm, locked", "everything__echo", &|| {
            let mut command = moat(&locked, &cache, &state);
            command.arg("--locked");
            command
        }),
        measure("serve → native child", "everything__echo", &|| {
            moat(&native, &cache, &state)
        }),
    ];
    let floor = &rows[0];
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "\n{:<22} {:>22} {:>26} {:>18}",
        "outside driver", "spawn → first call", "call p50 / p99", "peak RSS"
    );
    for row in &rows {
        println!(
            "{:<22} {:>12.2} ms {:>6.2}× {:>8.0} / {:>5.0} µs {:>5.2}× {:>8.1} MB {:>5.2}×",
            row.name,
            row.start.as_secs_f64() * 1e3,
            ratio(row.start, floor.start),
            row.p50.as_secs_f64() * 1e6,
            row.p99.as_secs_f64() * 1e6,
            ratio(row.p50, floor.p50),
            row.rss as f64 / 1e6,
            row.rss as f64 / floor.rss as f64,
        );
    }
    println!(
        "(start: median of {STARTS} runs; calls: {CALLS} sequential `echo`; RSS: VmHWM of the process tree)"
    );
}

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
//! - `serve → native child`: `moat serve` in front of the native guest;
//! - `serve → native script`: the same, as a `#!` script whose interpreter
//!   is the native guest: what a script server adds at launch (the sealed
//!   copy of the script bound over its path in the server's root);
//! - `serve → typed, per call` and `serve → typed, session`: `moat serve` in
//!   front of the typed tool component `kinds` (calls of `greet`), a fresh
//!   instance per call and one per session, with their call p50 against the
//!   stdio component's;
//! - `…, pooled`: the stdio and per-call typed rows again with
//!   `[wasm] allocator = "pooling"`, the pooling allocator beside the
//!   default on-demand one;
//! - the compile cache: the first and second start in front of the
//!   JavaScript typed component, with an empty cache.
//!
//! Start is spawn → first call answered, the median of `STARTS` runs; calls
//! are p50 and p99 of `CALLS`; RSS is the sum of VmHWM over the process and
//! its children just before stdin closes. Ratios are against `native`.
//!
//! Over streamable HTTP (`moat serve --http`, driven by rmcp's HTTP client):
//!
//! - throughput: `AGENTS` agent sessions each make `CALLS_PER_AGENT`
//!   calls, all sessions at once, in front of the wasm guest and in front of
//!   the native guest (a child per session);
//! - idle sessions: `IDLE_SESSIONS` sessions (or `$MOAT_BENCH_IDLE_SESSIONS`)
//!   each call the wasm guest once and stay open; the bench prints
//!   `moat serve`'s RSS, PSS and memory mappings, and what one more
//!   session costs in each, on demand and pooled. The run stops at the
//!   first session that fails (and says why): each wasm instance holds
//!   several mappings, so the kernel's `vm.max_map_count` bounds the
//!   sessions a process can hold.
//!
//! `MOAT_BENCH_STDIO_ONLY=1` stops after the stdio table and the compile
//! cache (the start figures, without the HTTP runs).
//!
//! `MOAT_BENCH_BASELINE=PATH` measures another `moat` binary (an earlier
//! commit's, say) in the same run, each of its rows right before this
//! build's, and prints the two side by side with their ratios.
//!
//! `cargo bench --bench serve`; `MOAT_BENCH_MOAT=PATH` runs the same
//! bench against another `moat` binary (the `dist` profile's, say:
//! `cargo build --profile dist -p moat`, then
//! `MOAT_BENCH_MOAT=target/dist/moat cargo bench --bench serve`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use moat_test_guests as guests;
use serde_json::{Value, json};

const STARTS: usize = 15;
const CALLS: usize = 500;
/// Concurrent agent sessions in the throughput run.
const AGENTS: usize = 100;
/// Calls each of them makes.
const CALLS_PER_AGENT: usize = 50;
/// Sessions held open in the idle-memory run.
const IDLE_SESSIONS: usize = 10_000;

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

    /// Calls `tool` once: `echo` with `{"message": "bench"}` (answered
    /// "bench"), or a typed component's `greet` with `{"name": "bench"}`
    /// (answered "Hello, bench!").
    fn echo(&mut self, tool: &str) {
        let (arguments, expected) = if tool.ends_with("greet") {
            (json!({"name": "bench"}), "Hello, bench!")
        } else {
            (json!({"message": "bench"}), "bench")
        };
        let answer = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        assert_eq!(answer["result"]["content"][0]["text"], expected, "{answer}");
    }

    /// Peak RSS in bytes of the child and every process below it.
    fn peak_rss(&self) -> u64 {
        tree_rss(self.child.id(), "VmHWM:")
    }

    fn close(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

/// The sum of `field` (`VmHWM:` for the peak, `VmRSS:` for now) over `pid`
/// and every process below it, in bytes.
fn tree_rss(pid: u32, field: &str) -> u64 {
    fn tree(pid: u32, field: &str, total: &mut u64) {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        *total += kb_field(&status, field);
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                tree(child, field, total);
            }
        }
    }
    let mut total = 0;
    tree(pid, field, &mut total);
    total
}

/// The `NAME: N kB` line of a /proc file named by `field`, in bytes (0 when
/// absent).
fn kb_field(text: &str, field: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
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

/// The compile cache: spawn → first call answered through `moat serve` in
/// front of the JavaScript typed component (11 MB), with an empty cache
/// (it compiles) and then again (the cache hits).
fn compile_cache(cache: &Path, state: &Path, digest: &dyn Fn(&str) -> String) {
    let dir = cache.with_extension("config");
    let config = write_config(
        &dir,
        "js",
        &format!(
            "[servers.js]\nwasm = {:?}\nsha256 = {:?}\n",
            guests::JS_TOOLS_WASM,
            digest(guests::JS_TOOLS_WASM)
        ),
    );
    let start = || {
        let started = Instant::now();
        let mut driver = Driver::spawn(moat(&config, cache, state));
        driver.initialize();
        driver.request("tools/list", json!({}));
        let answer = driver.request(
            "tools/call",
            json!({"name": "js__moat_js-tools_text_shout", "arguments": {"line": "bench"}}),
        );
        assert_eq!(answer["result"]["content"][0]["text"], "BENCH", "{answer}");
        driver.close();
        started.elapsed()
    };
    let cold = start();
    let warm = start();
    println!(
        "compile cache, JavaScript typed component (11 MB): first start {:.0} ms (compiles), second {:.1} ms (cache hit), {:.0}× faster",
        cold.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3,
        cold.as_secs_f64() / warm.as_secs_f64()
    );
}

/// The `moat` being measured now: this build's (or `$MOAT_BENCH_MOAT`), or
/// `$MOAT_BENCH_BASELINE` while the baseline's rows are measured.
static BINARY: std::sync::Mutex<Option<std::ffi::OsString>> = std::sync::Mutex::new(None);

/// The `moat` under test: this build's, or `$MOAT_BENCH_MOAT`.
fn under_test() -> std::ffi::OsString {
    std::env::var_os("MOAT_BENCH_MOAT").unwrap_or_else(|| env!("CARGO_BIN_EXE_moat").into())
}

fn moat_binary() -> std::ffi::OsString {
    BINARY.lock().unwrap().clone().unwrap_or_else(under_test)
}

/// Runs `f` with `binary` as the `moat` every command spawns.
fn with_binary<T>(binary: &std::ffi::OsString, f: impl FnOnce() -> T) -> T {
    *BINARY.lock().unwrap() = Some(binary.clone());
    let out = f();
    *BINARY.lock().unwrap() = None;
    out
}

fn moat(config: &Path, cache: &Path, state: &Path) -> Command {
    let mut command = Command::new(moat_binary());
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

/// `moat serve --http` on a free loopback port.
struct HttpServe {
    child: Child,
    url: String,
}

impl HttpServe {
    fn spawn(mut command: Command) -> Self {
        command
            .args(["--http", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawning moat serve --http");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let url = loop {
            line.clear();
            let n = stderr.read_line(&mut line).expect("reading moat's stderr");
            assert!(n > 0, "moat serve --http ended before serving");
            if let Some(url) = line.trim().strip_prefix("moat: serving MCP at ") {
                break url.to_owned();
            }
        };
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Self { child, url }
    }

    /// What `moat serve` holds now: its RSS, its PSS (shared pages divided
    /// among their mappers: RSS counts a page of a component's memory image
    /// once in every instance that maps it, PSS once), and its number of
    /// memory mappings (bounded by `vm.max_map_count`).
    fn memory(&self) -> Memory {
        let pid = self.child.id();
        let rollup =
            std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
        Memory {
            rss: kb_field(&rollup, "Rss:"),
            pss: kb_field(&rollup, "Pss:"),
            maps: std::fs::read_to_string(format!("/proc/{pid}/maps"))
                .map(|maps| maps.lines().count() as u64)
                .unwrap_or(0),
        }
    }

    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for HttpServe {
    /// A bench that fails part way leaves no `moat serve` behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One reading of [`HttpServe::memory`].
struct Memory {
    rss: u64,
    pss: u64,
    maps: u64,
}

type Agent = rmcp::service::RunningService<rmcp::RoleClient, ()>;

async fn agent(url: &str) -> Agent {
    try_agent(url).await.expect("an agent session over HTTP")
}

async fn try_agent(url: &str) -> Result<Agent, String> {
    use rmcp::ServiceExt;
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_owned());
    ().serve(transport).await.map_err(|e| e.to_string())
}

async fn echo(agent: &Agent) {
    try_echo(agent).await.expect("tools/call");
}

async fn try_echo(agent: &Agent) -> Result<(), String> {
    let mut params = rmcp::model::CallToolRequestParams::new("everything__echo");
    params.arguments = json!({"message": "bench"}).as_object().cloned();
    match agent.call_tool(params).await {
        Ok(result) if result.is_error != Some(true) => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// Calls per second with `AGENTS` sessions calling at once, each session
/// opened (and its server started) before the clock starts.
fn throughput(runtime: &tokio::runtime::Runtime, serve: &HttpServe) -> f64 {
    runtime.block_on(async {
        let mut agents = Vec::with_capacity(AGENTS);
        for _ in 0..AGENTS {
            let agent = agent(&serve.url).await;
            echo(&agent).await;
            agents.push(std::sync::Arc::new(agent));
        }
        let started = Instant::now();
        let mut calls = tokio::task::JoinSet::new();
        for agent in &agents {
            let agent = agent.clone();
            calls.spawn(async move {
                for _ in 0..CALLS_PER_AGENT {
                    echo(&agent).await;
                }
            });
        }
        while let Some(done) = calls.join_next().await {
            done.expect("an agent's calls");
        }
        let rate = (AGENTS * CALLS_PER_AGENT) as f64 / started.elapsed().as_secs_f64();
        for agent in agents {
            if let Ok(agent) = std::sync::Arc::try_unwrap(agent) {
                let _ = agent.cancel().await;
            }
        }
        rate
    })
}

/// `moat serve`'s memory with no session, then with up to `sessions` idle
/// sessions that have each called the wasm guest once; how many were held
/// (fewer when one failed, whose error is printed).
fn idle_sessions(
    runtime: &tokio::runtime::Runtime,
    serve: &HttpServe,
    sessions: usize,
) -> (Memory, Memory, usize) {
    let before = serve.memory();
    let agents = runtime.block_on(async {
        let mut agents = Vec::with_capacity(sessions);
        for n in 0..sessions {
            let agent = match try_agent(&serve.url).await {
                Ok(agent) => agent,
                Err(error) => {
                    eprintln!("  session {} could not start: {error}", n + 1);
                    break;
                }
            };
            if let Err(error) = try_echo(&agent).await {
                eprintln!("  session {}'s call failed: {error}", n + 1);
                break;
            }
            agents.push(agent);
            if (n + 1) % 1000 == 0 {
                eprintln!("  {} idle sessions open", n + 1);
            }
        }
        agents
    });
    let held = agents.len();
    let after = serve.memory();
    runtime.block_on(async {
        for agent in agents {
            let _ = agent.cancel().await;
        }
    });
    (before, after, held)
}

/// Raises this process's open-file limit to its hard limit: every idle
/// session holds connections on both ends.
fn raise_open_files() {
    let output = Command::new("sh")
        .args(["-c", "ulimit -Hn"])
        .output()
        .expect("ulimit");
    let hard: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap_or(1024);
    // `prlimit` on our own pid: no unsafe and no libc binding needed.
    let _ = Command::new("prlimit")
        .arg(format!("--pid={}", std::process::id()))
        .arg(format!("--nofile={hard}:{hard}"))
        .status();
}

/// The configs one `moat` binary is measured with, each in its own
/// directory with its own cache and state (a baseline binary may not read
/// this build's cache).
struct Configs {
    cache: PathBuf,
    state: PathBuf,
    wasm: PathBuf,
    locked: PathBuf,
    typed_call: PathBuf,
    typed_session: PathBuf,
    wasm_pooled: PathBuf,
    typed_call_pooled: PathBuf,
    native: PathBuf,
    native_script: PathBuf,
}

fn digest(path: &str) -> String {
    let output = Command::new(moat_binary())
        .args(["digest", path])
        .output()
        .unwrap();
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

fn pooled(config: &Path, name: &str, instances: usize) -> PathBuf {
    let dir = config.parent().unwrap().parent().unwrap();
    write_config(
        dir,
        name,
        &format!(
            "{}
[wasm]
allocator = \"pooling\"\npool_instances = {instances}\n",
            std::fs::read_to_string(config).unwrap()
        ),
    )
}

/// Writes the configs under `dir`, locks one, and warms the component
/// cache, all with the current binary.
fn prepare(dir: &Path) -> Configs {
    let cache = dir.join("cache");
    let state = dir.join("state");
    let wasm = write_config(
        dir,
        "wasm",
        &format!(
            "[servers.everything]\nwasm = {:?}\nsha256 = {:?}\n",
            guests::EVERYTHING_WASM,
            digest(guests::EVERYTHING_WASM)
        ),
    );
    let locked = write_config(dir, "locked", &std::fs::read_to_string(&wasm).unwrap());
    // The typed tool component `kinds`, a fresh instance per call and one
    // per session.
    let typed = |name: &str, instance: &str| {
        write_config(
            dir,
            name,
            &format!(
                "[servers.kinds]\nwasm = {:?}\nsha256 = {:?}\ninstance = {instance:?}\n",
                guests::KINDS_WASM,
                digest(guests::KINDS_WASM)
            ),
        )
    };
    let typed_call = typed("typed-call", "call");
    let typed_session = typed("typed-session", "session");
    let wasm_pooled = pooled(&wasm, "wasm-pooled", 1000);
    let typed_call_pooled = pooled(&typed_call, "typed-call-pooled", 1000);
    let native = write_config(
        dir,
        "native",
        &format!(
            "[servers.everything]\ncommand = {:?}\nsha256 = {:?}\n",
            guests::EVERYTHING_NATIVE,
            digest(guests::EVERYTHING_NATIVE)
        ),
    );
    // A `#!` script run by the native guest (which ignores its argv).
    let script = dir.join("everything-script");
    std::fs::write(&script, format!("#!{}\n", guests::EVERYTHING_NATIVE)).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let native_script = write_config(
        dir,
        "native-script",
        &format!(
            "[servers.everything]\ncommand = {:?}\nsha256 = {:?}\n",
            script.to_str().unwrap(),
            digest(script.to_str().unwrap())
        ),
    );
    // Warm the component cache, and lock one copy.
    let status = Command::new(moat_binary())
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
    for config in [
        &wasm,
        &locked,
        &typed_call,
        &typed_session,
        &wasm_pooled,
        &typed_call_pooled,
    ] {
        let mut driver = Driver::spawn(moat(config, &cache, &state));
        driver.initialize();
        driver.request("tools/list", json!({}));
        driver.close();
    }
    Configs {
        cache,
        state,
        wasm,
        locked,
        typed_call,
        typed_session,
        wasm_pooled,
        typed_call_pooled,
        native,
        native_script,
    }
}

/// The stdio rows after the floor, for each binary with its configs: one
/// row is measured with every binary before the next row, so drift on the
/// machine falls on each alike. `[binary][row]`.
fn serve_rows(runs: &[(&std::ffi::OsString, &Configs)]) -> Vec<Vec<Row>> {
    type Pick = fn(&Configs) -> &PathBuf;
    let specs: [(&'static str, &str, Pick, bool); 8] = [
        ("serve → wasm", "everything__echo", |c| &c.wasm, false),
        (
            "serve → wasm, locked",
            "everything__echo",
            |c| &c.locked,
            true,
        ),
        (
            "serve → native child",
            "everything__echo",
            |c| &c.native,
            false,
        ),
        (
            "serve → native script",
            "everything__echo",
            |c| &c.native_script,
            false,
        ),
        (
            "serve → typed, per call",
            "kinds__greet",
            |c| &c.typed_call,
            false,
        ),
        (
            "serve → typed, session",
            "kinds__greet",
            |c| &c.typed_session,
            false,
        ),
        (
            "serve → wasm, pooled",
            "everything__echo",
            |c| &c.wasm_pooled,
            false,
        ),
        (
            "serve → typed/call, pooled",
            "kinds__greet",
            |c| &c.typed_call_pooled,
            false,
        ),
    ];
    let mut out: Vec<Vec<Row>> = runs.iter().map(|_| Vec::new()).collect();
    for (name, tool, pick, locked) in specs {
        for (rows, (binary, c)) in out.iter_mut().zip(runs) {
            rows.push(with_binary(binary, || {
                measure(name, tool, &|| {
                    let mut command = moat(pick(c), &c.cache, &c.state);
                    if locked {
                        command.arg("--locked");
                    }
                    command
                })
            }));
        }
    }
    out
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is ignored here.
    let current = under_test();
    let baseline = std::env::var_os("MOAT_BENCH_BASELINE");
    println!("moat under test: {}", current.to_string_lossy());
    if let Some(baseline) = &baseline {
        println!("baseline: {}", baseline.to_string_lossy());
    }
    let dir = tempfile::tempdir().unwrap();
    let configs = with_binary(&current, || prepare(&dir.path().join("current")));
    let before = baseline
        .as_ref()
        .map(|b| (b, with_binary(b, || prepare(&dir.path().join("baseline")))));

    let floor = measure("native", "echo", &|| {
        Command::new(guests::EVERYTHING_NATIVE)
    });
    let mut rows = vec![floor];
    // With a baseline, each row is measured with it right before this
    // build.
    let mut runs: Vec<(&std::ffi::OsString, &Configs)> = Vec::new();
    if let Some((binary, configs)) = &before {
        runs.push((binary, configs));
    }
    runs.push((&current, &configs));
    let mut measured = serve_rows(&runs);
    rows.extend(measured.pop().unwrap());
    let base_rows = measured.pop();
    let floor = &rows[0];
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "\n{:<26} {:>22} {:>26} {:>18}",
        "outside driver", "spawn → first call", "call p50 / p99", "peak RSS"
    );
    for row in &rows {
        println!(
            "{:<26} {:>12.2} ms {:>6.2}× {:>8.0} / {:>5.0} µs {:>5.2}× {:>8.1} MB {:>5.2}×",
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
        "(start: median of {STARTS} runs; calls: {CALLS} sequential `echo`, or `greet` for typed; RSS: VmHWM of the process tree)"
    );
    let stdio = &rows[1];
    for typed in [&rows[5], &rows[6], &rows[8]] {
        println!(
            "{}: call p50 {:.2}× the stdio component's (target ≤ 2×)",
            typed.name,
            ratio(typed.p50, stdio.p50)
        );
    }
    if let Some(base_rows) = &base_rows {
        println!(
            "\n{:<26} {:>30} {:>30} {:>24}",
            "baseline → this build", "spawn → first call", "call p50", "peak RSS"
        );
        for (before, after) in base_rows.iter().zip(&rows[1..]) {
            println!(
                "{:<26} {:>8.2} → {:>7.2} ms {:>5.2}× {:>8.0} → {:>7.0} µs {:>5.2}× {:>6.1} → {:>5.1} MB {:>5.2}×",
                after.name,
                before.start.as_secs_f64() * 1e3,
                after.start.as_secs_f64() * 1e3,
                ratio(after.start, before.start),
                before.p50.as_secs_f64() * 1e6,
                after.p50.as_secs_f64() * 1e6,
                ratio(after.p50, before.p50),
                before.rss as f64 / 1e6,
                after.rss as f64 / 1e6,
                after.rss as f64 / before.rss as f64,
            );
        }
        println!("(ratios are this build over the baseline: below 1 is better)");
    }
    with_binary(&current, || {
        compile_cache(&dir.path().join("cold-cache"), &configs.state, &digest)
    });
    if std::env::var_os("MOAT_BENCH_STDIO_ONLY").is_some_and(|v| v != "0") {
        return;
    }

    // Over streamable HTTP.
    raise_open_files();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let idle: usize = std::env::var("MOAT_BENCH_IDLE_SESSIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(IDLE_SESSIONS);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runs = Vec::new();
    if let Some((binary, configs)) = &before {
        runs.push(("baseline", *binary, configs));
    }
    runs.push(("this build", &current, &configs));
    for (label, binary, configs) in runs {
        with_binary(binary, || http_runs(label, configs, &runtime, idle));
    }
}

/// Throughput and idle sessions over streamable HTTP, with the current
/// binary.
fn http_runs(label: &str, c: &Configs, runtime: &tokio::runtime::Runtime, idle: usize) {
    let room = idle.max(AGENTS) + 1;
    let serve_settings = format!(
        "\n[serve]\nmax_sessions = {room}\nmax_connections = {}\n",
        4 * room
    );
    let dir = c.wasm.parent().unwrap().parent().unwrap();
    let wasm_http = write_config(
        dir,
        "wasm-http",
        &(std::fs::read_to_string(&c.wasm).unwrap() + &serve_settings),
    );
    let native_http = write_config(
        dir,
        "native-http",
        &(std::fs::read_to_string(&c.native).unwrap() + &serve_settings),
    );
    let rate = |config: &Path| {
        let serve = HttpServe::spawn(moat(config, &c.cache, &c.state));
        let rate = throughput(runtime, &serve);
        serve.stop();
        rate
    };
    let wasm_rate = rate(&wasm_http);
    let native_rate = rate(&native_http);
    println!(
        "\n{label}: throughput over HTTP, {AGENTS} agent sessions × {CALLS_PER_AGENT} calls at once:\n\
         serve → wasm          {wasm_rate:>8.0} calls/s {:>5.2}×\n\
         serve → native child  {native_rate:>8.0} calls/s",
        wasm_rate / native_rate
    );
    let wasm_http_pooled = pooled(&wasm_http, "wasm-http-pooled", room);
    let pooled_rate = rate(&wasm_http_pooled);
    println!(
        "serve → wasm, pooled  {pooled_rate:>8.0} calls/s {:>5.2}×",
        pooled_rate / native_rate
    );
    for (allocator, config) in [("on demand", &wasm_http), ("pooled", &wasm_http_pooled)] {
        let serve = HttpServe::spawn(moat(config, &c.cache, &c.state));
        let (before, after, held) = idle_sessions(runtime, &serve, idle);
        serve.stop();
        let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / 1e3 / held.max(1) as f64;
        let max_map_count =
            std::fs::read_to_string("/proc/sys/vm/max_map_count").unwrap_or_default();
        println!(
            "\n{label}: {held} of {idle} idle wasm sessions held over HTTP (each called once), {allocator}:\n\
         RSS {:.1} MB → {:.1} MB, {:.0} KB a session\n\
         PSS {:.1} MB → {:.1} MB, {:.0} KB a session\n\
         mappings {} → {}, {:.1} a session (vm.max_map_count {})",
            before.rss as f64 / 1e6,
            after.rss as f64 / 1e6,
            per(after.rss, before.rss),
            before.pss as f64 / 1e6,
            after.pss as f64 / 1e6,
            per(after.pss, before.pss),
            before.maps,
            after.maps,
            after.maps.saturating_sub(before.maps) as f64 / held.max(1) as f64,
            max_map_count.trim(),
        );
    }
}

//! Over streamable HTTP: `moat serve --http` under concurrent agent sessions
//! (throughput) and under many idle sessions (RSS, PSS and mappings per
//! session).

use super::*;

/// `moat serve --http` on a free loopback port.
pub(super) struct HttpServe {
    pub(super) child: Child,
    pub(super) url: String,
}

impl HttpServe {
    pub(super) fn spawn(mut command: Command) -> Self {
        command
            .args(["--http", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawning moat serve --http");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut said = String::new();
        let url = loop {
            let mut line = String::new();
            let n = stderr.read_line(&mut line).expect("reading moat's stderr");
            assert!(
                n > 0,
                "moat serve --http ended before serving; it said:\n{said}"
            );
            if let Some(url) = line.trim().strip_prefix("moat: serving MCP at ") {
                break url.to_owned();
            }
            said.push_str(&line);
        };
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Self { child, url }
    }

    /// What `moat serve` holds now: its RSS, its PSS (shared pages divided
    /// among their mappers: RSS counts a page of a component's memory image
    /// once in every instance that maps it, PSS once), and its number of
    /// memory mappings (bounded by `vm.max_map_count`).
    pub(super) fn memory(&self) -> Memory {
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

    pub(super) fn stop(mut self) {
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
pub(super) struct Memory {
    pub(super) rss: u64,
    pub(super) pss: u64,
    pub(super) maps: u64,
}

pub(super) type Agent = rmcp::service::RunningService<rmcp::RoleClient, ()>;

pub(super) async fn agent(url: &str) -> Agent {
    try_agent(url).await.expect("an agent session over HTTP")
}

pub(super) async fn try_agent(url: &str) -> Result<Agent, String> {
    use rmcp::ServiceExt;
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_owned());
    ().serve(transport).await.map_err(|e| e.to_string())
}

/// How the bench's agents hold their connections.
#[derive(Clone, Copy)]
pub(super) enum Agents {
    /// rmcp's client as it ships: no connection kept between requests, so
    /// every request opens a TCP connection of its own.
    Fresh,
    /// rmcp's client over a reqwest client that keeps its connections (as
    /// the TypeScript SDK's `fetch` does): a connection serves the next
    /// request once its answer has been read to the end.
    Kept,
}

async fn agent_of(url: &str, agents: Agents) -> Agent {
    use rmcp::ServiceExt;
    match agents {
        Agents::Fresh => agent(url).await,
        Agents::Kept => {
            let config =
                rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                    url.to_owned(),
                );
            let transport = rmcp::transport::StreamableHttpClientTransport::with_client(
                reqwest::Client::new(),
                config,
            );
            ().serve(transport)
                .await
                .expect("an agent session over HTTP")
        }
    }
}

pub(super) async fn echo(agent: &Agent) {
    try_echo(agent).await.expect("tools/call");
}

pub(super) async fn try_echo(agent: &Agent) -> Result<(), String> {
    let mut params = rmcp::model::CallToolRequestParams::new("everything__echo");
    params.arguments = json!({"message": "bench"}).as_object().cloned();
    match agent.call_tool(params).await {
        Ok(result) if result.is_error != Some(true) => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// One throughput run: its rate, and the CPU time a call cost in each
/// process while the clock ran.
pub(super) struct Throughput {
    pub(super) rate: f64,
    /// `moat serve` itself (with the wasm guests, which run inside it).
    pub(super) moat: Duration,
    /// The processes below `moat serve` (native servers and their sandbox).
    pub(super) servers: Duration,
    /// This bench's agents (the HTTP clients), which share the cores.
    pub(super) agents: Duration,
}

impl Throughput {
    /// The gateway's CPU time a call: `moat serve` and its servers.
    pub(super) fn gateway(&self) -> Duration {
        self.moat + self.servers
    }
}

/// Calls per second with `AGENTS` sessions calling at once, each session
/// opened (and its server started) before the clock starts; with the CPU
/// time of the gateway and of the agents, read from `/proc` at the start
/// and the end.
pub(super) fn throughput(
    runtime: &tokio::runtime::Runtime,
    serve: &HttpServe,
    kind: Agents,
) -> Throughput {
    let calls_per_agent = calls_per_agent();
    runtime.block_on(async {
        let mut agents = Vec::with_capacity(AGENTS);
        for _ in 0..AGENTS {
            let agent = agent_of(&serve.url, kind).await;
            echo(&agent).await;
            agents.push(std::sync::Arc::new(agent));
        }
        let moat = serve.child.id();
        let servers = |pids: &[u32]| pids.iter().skip(1).map(|&pid| cpu_ticks(pid)).sum::<u64>();
        // The servers are all running by now (each agent has called), and
        // stay until the agents are gone.
        let pids = tree(moat);
        let before = (
            cpu_ticks(moat),
            servers(&pids),
            cpu_ticks(std::process::id()),
        );
        let started = Instant::now();
        let mut calls = tokio::task::JoinSet::new();
        for agent in &agents {
            let agent = agent.clone();
            calls.spawn(async move {
                for _ in 0..calls_per_agent {
                    echo(&agent).await;
                }
            });
        }
        while let Some(done) = calls.join_next().await {
            done.expect("an agent's calls");
        }
        let elapsed = started.elapsed();
        let after = (
            cpu_ticks(moat),
            servers(&pids),
            cpu_ticks(std::process::id()),
        );
        let n = (AGENTS * calls_per_agent) as f64;
        let per_call = |ticks: u64| Duration::from_secs_f64(ticks as f64 * tick() / n);
        let run = Throughput {
            rate: n / elapsed.as_secs_f64(),
            moat: per_call(after.0.saturating_sub(before.0)),
            servers: per_call(after.1.saturating_sub(before.1)),
            agents: per_call(after.2.saturating_sub(before.2)),
        };
        for agent in agents {
            if let Ok(agent) = std::sync::Arc::try_unwrap(agent) {
                let _ = agent.cancel().await;
            }
        }
        run
    })
}

/// `CALLS_PER_AGENT`, or `$MOAT_BENCH_CALLS_PER_AGENT`.
fn calls_per_agent() -> usize {
    std::env::var("MOAT_BENCH_CALLS_PER_AGENT")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(CALLS_PER_AGENT)
}

/// `moat serve`'s memory with no session, then with up to `sessions` idle
/// sessions that have each called the wasm guest once; how many were held
/// (fewer when one failed, whose error is printed).
pub(super) fn idle_sessions(
    runtime: &tokio::runtime::Runtime,
    serve: &HttpServe,
    sessions: usize,
    settle: std::time::Duration,
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
    // A bench, not a test: time for idle servers to be stopped (and the
    // freed memory trimmed, a second after) before memory is read.
    std::thread::sleep(settle);
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
pub(super) fn raise_open_files() {
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

/// Throughput and idle sessions over streamable HTTP, with the current
/// binary.
pub(super) fn http_runs(label: &str, c: &Configs, runtime: &tokio::runtime::Runtime, idle: usize) {
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
    let rate = |config: &Path, kind: Agents| {
        let serve = HttpServe::spawn(moat(config, &c.cache, &c.state));
        let run = throughput(runtime, &serve, kind);
        serve.stop();
        run
    };
    let wasm_http_pooled = pooled(&wasm_http, "wasm-http-pooled", room);
    for (kind, about) in [
        (
            Agents::Fresh,
            "rmcp's client as it ships, a new connection for every request",
        ),
        (
            Agents::Kept,
            "rmcp's client over a reqwest client that keeps its connections",
        ),
    ] {
        let wasm = rate(&wasm_http, kind);
        let native = rate(&native_http, kind);
        let pooled = rate(&wasm_http_pooled, kind);
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "\n{label}: throughput over HTTP, {AGENTS} agent sessions × {} calls at once; agents: {about}\n\
             {:<22} {:>14} {:>8} {:>22} {:>14}",
            calls_per_agent(),
            "",
            "calls/s",
            "ratio",
            "gateway CPU a call",
            "agents' CPU"
        );
        for (name, run) in [
            ("serve → wasm", &wasm),
            ("serve → native child", &native),
            ("serve → wasm, pooled", &pooled),
        ] {
            let servers = if run.servers.is_zero() {
                String::new()
            } else {
                format!(" ({:.0} in servers)", us(run.servers))
            };
            println!(
                "{name:<22} {:>14.0} {:>7.2}× {:>10.0} µs {:>5.2}×{servers} {:>10.0} µs",
                run.rate,
                run.rate / native.rate,
                us(run.gateway()),
                native.gateway().as_secs_f64() / run.gateway().as_secs_f64(),
                us(run.agents),
            );
        }
    }
    println!(
        "(ratios against native children: calls/s, and the gateway's CPU time a call, \
         `moat serve` and every process below it, native over this row; the agents \
         share the cores)"
    );
    // The server stopped after a second idle (`idle_stop_ms`), which a
    // build before it does not know: this build's run only.
    let wasm_http_idle_stop = write_config(
        dir,
        "wasm-http-idle-stop",
        &(std::fs::read_to_string(&wasm_http).unwrap()
            + "\n[servers.everything.limits]\nidle_stop_ms = 1000\n"),
    );
    let mut idle_rows = vec![
        ("on demand", &wasm_http, Duration::ZERO),
        ("pooled", &wasm_http_pooled, Duration::ZERO),
    ];
    if label == "this build" {
        idle_rows.push((
            "on demand, idle_stop_ms = 1000, read 2.5 s after the last call",
            &wasm_http_idle_stop,
            Duration::from_millis(2500),
        ));
    }
    for (allocator, config, settle) in idle_rows {
        let serve = HttpServe::spawn(moat(config, &c.cache, &c.state));
        let (before, after, held) = idle_sessions(runtime, &serve, idle, settle);
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

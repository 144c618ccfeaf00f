//! The stdio driver: spawns a command, speaks MCP over its pipes, times the
//! start and the calls, and reads the peak RSS of the process tree (`Row`);
//! and the compile cache's first and second start.

use super::*;

/// One MCP client over a child's stdio, line-delimited JSON-RPC.
pub(super) struct Driver {
    pub(super) child: Child,
    pub(super) stdin: ChildStdin,
    pub(super) stdout: BufReader<ChildStdout>,
    pub(super) next: u64,
}

impl Driver {
    pub(super) fn spawn(mut command: Command) -> Self {
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

    pub(super) fn send(&mut self, message: &Value) {
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).expect("writing to the server");
    }

    /// Sends a request and reads until its response.
    pub(super) fn request(&mut self, method: &str, params: Value) -> Value {
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

    pub(super) fn initialize(&mut self) {
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
    pub(super) fn echo(&mut self, tool: &str) {
        let (arguments, expected) = if tool.ends_with("greet") {
            (json!({"name": "bench"}), "Hello, bench!")
        } else {
            (json!({"message": "bench"}), "bench")
        };
        let answer = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        assert_eq!(answer["result"]["content"][0]["text"], expected, "{answer}");
    }

    /// Peak RSS in bytes of the child and every process below it.
    pub(super) fn peak_rss(&self) -> u64 {
        tree_rss(self.child.id(), "VmHWM:")
    }

    pub(super) fn close(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

/// `pid` and every process below it, `pid` first.
pub(super) fn tree(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    let mut next = 0;
    while let Some(&pid) = pids.get(next) {
        next += 1;
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            pids.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    pids
}

/// The sum of `field` (`VmHWM:` for the peak, `VmRSS:` for now) over `pid`
/// and every process below it, in bytes.
pub(super) fn tree_rss(pid: u32, field: &str) -> u64 {
    tree(pid)
        .into_iter()
        .map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            kb_field(&status, field)
        })
        .sum()
}

/// The CPU time (user and system, all threads) `pid` has used so far, in
/// clock ticks (0 when it is gone).
pub(super) fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's name, which may hold spaces: state is
    // the first, utime the 12th and stime the 13th.
    let Some((_, after)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| {
        fields
            .get(n)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// Seconds in a clock tick of `/proc/PID/stat`.
pub(super) fn tick() -> f64 {
    // SAFETY: sysconf reads a configuration value and has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    1.0 / hz.max(1) as f64
}

/// The `NAME: N kB` line of a /proc file named by `field`, in bytes (0 when
/// absent).
pub(super) fn kb_field(text: &str, field: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// What one row measured.
pub(super) struct Row {
    pub(super) name: &'static str,
    pub(super) start: Duration,
    pub(super) p50: Duration,
    pub(super) p99: Duration,
    pub(super) rss: u64,
}

pub(super) fn measure(name: &'static str, tool: &str, command: &dyn Fn() -> Command) -> Row {
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
pub(super) fn compile_cache(cache: &Path, state: &Path, digest: &dyn Fn(&str) -> String) {
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

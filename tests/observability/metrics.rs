//! Prometheus metrics: they count exactly what the audit log records, and
//! stdio serving serves them on loopback only.

use super::*;

#[test]
fn metrics_count_exactly_what_the_audit_log_records() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.wasm]\nwasm = {:?}\nallow_unmeasured = true\n\
             [servers.native]\ncommand = {:?}\nallow_unmeasured = true\n\
             [servers.typed]\nwasm = {:?}\nallow_unmeasured = true\n\
             [servers.typed.limits]\nfuel_per_request = 50000000\n\
             [servers.crash]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM,
            guests::EVERYTHING_NATIVE,
            guests::KINDS_WASM,
            guests::EXIT_MID_CALL_WASM,
        ),
    )
    .unwrap();
    let audit = dir.path().join("audit.jsonl");
    let token = "s3cret";
    let (server, url) = common::serve_http(&config, token, &audit);
    // Stopped however the test ends.
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let server = Stop(server);
    let address = common::address_of(&url);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let first = agent(&url, token).await;
        let second = agent(&url, token).await;
        for agent in [&first, &second] {
            for _ in 0..3 {
                let echo = json!({"message": "hi"});
                assert_eq!(call(agent, "wasm__echo", echo.clone()).await, Ok(true));
                assert_eq!(call(agent, "native__echo", echo).await, Ok(true));
            }
        }
        let greet = json!({"name": "metrics"});
        assert_eq!(call(&first, "typed__greet", greet).await, Ok(true));
        // A limit hit: the typed call fails alone.
        assert_eq!(call(&first, "typed__spin", json!({})).await, Ok(false));
        // A crash, then a restart that crashes again.
        for _ in 0..2 {
            let crashed = call(&first, "crash__attack", json!({})).await;
            assert!(
                crashed
                    .as_ref()
                    .is_err_and(|e| e.contains("exited with code 3")),
                "{crashed:?}"
            );
        }
        second.cancel().await.unwrap();
        first.cancel().await.unwrap();
    });
    // Both sessions closed: read the metrics once the audit log has both
    // closes (recorded as the server ends each session, after the agent's
    // DELETE is answered).
    let samples = loop {
        let samples = scrape(&address, token);
        let open = samples
            .iter()
            .find(|(name, _, _)| name == "moat_sessions_open")
            .map(|s| s.2);
        let audited_closes = std::fs::read_to_string(&audit)
            .unwrap()
            .lines()
            .filter(|l| l.contains("\"event\":\"session_close\""))
            .count();
        if open == Some(0.0) && audited_closes == 2 {
            break samples;
        }
        std::thread::yield_now();
    };
    drop(server);

    let events: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |kind: &'static str| events.iter().filter(move |e| e["event"] == kind);
    let value = |name: &str, wanted: &BTreeMap<String, String>| {
        samples
            .iter()
            .filter(|(n, l, _)| n == name && l == wanted)
            .map(|s| s.2)
            .sum::<f64>()
    };

    // Calls: by server, tool and outcome class, as audited.
    let mut audited: BTreeMap<(String, String, String), f64> = BTreeMap::new();
    for call in of("tool_call") {
        let outcome = moat_host::outcome_class(call["outcome"].as_str().unwrap());
        *audited
            .entry((
                call["server"].as_str().unwrap().to_owned(),
                call["tool"].as_str().unwrap().to_owned(),
                outcome.to_owned(),
            ))
            .or_default() += 1.0;
    }
    let counted: BTreeMap<(String, String, String), f64> = samples
        .iter()
        .filter(|(n, _, _)| n == "moat_tool_calls_total")
        .map(|(_, l, v)| {
            (
                (l["server"].clone(), l["tool"].clone(), l["outcome"].clone()),
                *v,
            )
        })
        .collect();
    assert_eq!(counted, audited);
    assert_eq!(
        audited[&("wasm".into(), "echo".into(), "ok".into())],
        6.0,
        "{audited:?}"
    );
    assert_eq!(
        audited[&("crash".into(), "attack".into(), "fault".into())],
        2.0
    );
    let total_calls = of("tool_call").count() as f64;
    let histogram_count: f64 = samples
        .iter()
        .filter(|(n, _, _)| n == "moat_tool_call_duration_seconds_count")
        .map(|s| s.2)
        .sum();
    assert_eq!(histogram_count, total_calls);

    // The limit hit, and the fuel the audit log says was used.
    assert_eq!(
        value(
            "moat_limit_hits_total",
            &labels(&[("server", "typed"), ("limit", "fuel_per_request")])
        ),
        1.0
    );
    for server in ["wasm", "typed"] {
        let fuel: f64 = of("tool_call")
            .filter(|e| e["server"] == server)
            .map(|e| e["fuel"].as_f64().unwrap())
            .sum();
        assert!(fuel > 0.0, "{server}");
        assert_eq!(
            value("moat_fuel_consumed_total", &labels(&[("server", server)])),
            fuel,
            "{server}"
        );
    }

    // Sessions, launches (first starts and the restart) and exits.
    assert_eq!(
        value("moat_sessions_total", &BTreeMap::new()),
        of("session_open").count() as f64
    );
    assert_eq!(value("moat_sessions_open", &BTreeMap::new()), 0.0);
    for server in ["wasm", "native", "typed", "crash"] {
        let launches = of("server_launch")
            .filter(|e| e["server"] == server)
            .count();
        assert_eq!(
            value("moat_server_launches_total", &labels(&[("server", server)])),
            launches as f64,
            "{server}"
        );
        let exits = of("server_exit").filter(|e| e["server"] == server).count();
        let counted_exits: f64 = samples
            .iter()
            .filter(|(n, l, _)| n == "moat_server_exits_total" && l["server"] == server)
            .map(|s| s.2)
            .sum();
        assert_eq!(counted_exits, exits as f64, "{server}");
        assert_eq!(
            value("moat_server_instances", &labels(&[("server", server)])),
            0.0,
            "{server}"
        );
    }
    assert_eq!(
        of("server_launch")
            .filter(|e| e["server"] == "crash")
            .count(),
        2,
        "the crash server was restarted once"
    );
}

#[test]
fn stdio_serving_serves_metrics_on_loopback_only() {
    use std::io::{BufRead as _, Write as _};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.wasm]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM
        ),
    )
    .unwrap();
    let moat = |metrics: &str| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_moat"));
        command
            .args(["serve", "--metrics", metrics, "--config"])
            .arg(&config)
            .env(
                "MOAT_CACHE_DIR",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
            )
            .env("MOAT_STATE_DIR", common::state_dir());
        command
    };
    let refused = moat("0.0.0.0:0").output().unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains(
            "is not a loopback address: beside stdio serving, metrics are served on loopback only"
        ),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let mut child = moat("127.0.0.1:0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let address = stderr
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            l.strip_prefix("moat: serving metrics at http://")
                .map(|rest| rest.trim_end_matches("/metrics").to_owned())
        })
        .expect("moat serve announces its metrics address");
    std::thread::spawn(move || for _ in stderr {});
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut request = |id: u64, method: &str, params: Value| {
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{message}").unwrap();
        stdout
            .by_ref()
            .map_while(Result::ok)
            .map(|l| serde_json::from_str::<Value>(&l).unwrap())
            .find(|m| m["id"] == id)
            .expect("an answer")
    };
    request(
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    let answer = request(
        2,
        "tools/call",
        json!({"name": "wasm__echo", "arguments": {"message": "hi"}}),
    );
    assert_eq!(answer["result"]["isError"], Value::Bool(false), "{answer}");
    // No token on this listener: any value is ignored.
    let samples = scrape(&address, "unused");
    let value = |name: &str, wanted: &BTreeMap<String, String>| {
        samples
            .iter()
            .find(|(n, l, _)| n == name && l == wanted)
            .map(|s| s.2)
    };
    assert_eq!(
        value(
            "moat_tool_calls_total",
            &labels(&[("server", "wasm"), ("tool", "echo"), ("outcome", "ok")])
        ),
        Some(1.0)
    );
    assert_eq!(value("moat_sessions_open", &BTreeMap::new()), Some(1.0));
    let _ = child.kill();
    let _ = child.wait();
}

/// Beside `--http` (whose `/metrics` needs the token), `--metrics` may be
/// any address, the pod's say: a scraper that holds no token reads the
/// counters there, and nothing else is served on it.
#[test]
fn http_serving_serves_metrics_on_a_listener_of_their_own_without_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.wasm]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM
        ),
    )
    .unwrap();
    let audit = dir.path().join("audit.jsonl");
    let (mut child, url, stderr) = common::serve_http_logged(
        &config,
        "metrics-token-5521",
        &audit,
        &["--metrics", "0.0.0.0:0"],
    );
    let announced = stderr
        .iter()
        .find_map(|l| {
            l.strip_prefix("moat: serving metrics at http://0.0.0.0:")
                .map(|rest| rest.trim_end_matches("/metrics").to_owned())
        })
        .expect("moat serve announces its metrics listener on every address");
    let address = format!("127.0.0.1:{announced}");
    let samples = scrape(&address, "not-the-token");
    assert!(
        samples
            .iter()
            .any(|(name, _, _)| name == "moat_sessions_open"),
        "{samples:?}"
    );
    // The agents' listener still wants the token for /metrics, and the
    // metrics listener serves no MCP.
    let status = |address: &str, path: &str| {
        use std::io::{Read as _, Write as _};
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        // A connection beyond the probes' limit is closed, or reset if our
        // request was already in: either way no answer.
        let _ = write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        );
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response);
        response
            .split_whitespace()
            .nth(1)
            .unwrap_or("closed")
            .to_owned()
    };
    assert_eq!(status(&common::address_of(&url), "/metrics"), "401");
    assert_eq!(status(&address, "/mcp"), "404");
    assert_eq!(status(&address, "/healthz"), "200");

    // No flood holds more than its 64 connections: the next is closed as
    // it comes, and the agents' listener is untouched.
    let held: Vec<std::net::TcpStream> = (0..moat_host::front::http::PROBE_CONNECTIONS)
        .map(|_| std::net::TcpStream::connect(&address).unwrap())
        .collect();
    let mut extra = std::net::TcpStream::connect(&address).unwrap();
    extra
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(
        match std::io::Read::read(&mut extra, &mut byte) {
            Ok(0) => true,
            Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        },
        "the connection beyond the probes' limit is closed at once"
    );
    assert_eq!(status(&common::address_of(&url), "/healthz"), "200");
    drop(held);
    let began = std::time::Instant::now();
    while status(&address, "/healthz") != "200" {
        assert!(began.elapsed() < std::time::Duration::from_secs(60));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

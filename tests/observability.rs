//! `moat serve --http`'s metrics against its audit log: a run of calls
//! across wasm, native and typed servers, with a limit hit and a restart,
//! scraped from `/metrics` and parsed by the Prometheus project's own
//! Python client (`prometheus_client`'s OpenMetrics parser, installed by
//! tests/setup.sh), must count exactly what the audit log records.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use moat_test_guests as guests;
use serde_json::{Value, json};

type Agent = rmcp::service::RunningService<rmcp::RoleClient, ()>;

async fn agent(url: &str, token: &str) -> Agent {
    use rmcp::ServiceExt;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            url.to_owned(),
        )
        .auth_header(token.to_owned());
    let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
    ().serve(transport)
        .await
        .expect("an agent session over HTTP")
}

async fn call(agent: &Agent, tool: &str, arguments: Value) -> Result<bool, String> {
    let mut params = rmcp::model::CallToolRequestParams::new(tool.to_owned());
    params.arguments = arguments.as_object().cloned();
    match agent.call_tool(params).await {
        Ok(result) => Ok(result.is_error != Some(true)),
        Err(error) => Err(error.to_string()),
    }
}

/// `/metrics`, parsed by prometheus_client: every sample as
/// `(name, labels, value)`.
fn scrape(address: &str, token: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let parser = r#"
import json, sys, urllib.request
from prometheus_client.openmetrics.parser import text_string_to_metric_families
request = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
with urllib.request.urlopen(request) as response:
    assert response.headers["Content-Type"].startswith("application/openmetrics-text"), response.headers["Content-Type"]
    text = response.read().decode()
samples = [[s.name, s.labels, s.value] for family in text_string_to_metric_families(text) for s in family.samples]
json.dump(samples, sys.stdout)
"#;
    let output = Command::new("python3")
        .args(["-c", parser, &format!("http://{address}/metrics"), token])
        .env("PYTHONPATH", root.join("target/py"))
        .output()
        .expect("python3");
    assert!(
        output.status.success(),
        "prometheus_client (run `bash tests/setup.sh`): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice::<Vec<(String, BTreeMap<String, String>, f64)>>(&output.stdout).unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

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

/// What the collector received: each request's path and JSON body.
type Received = std::sync::Arc<std::sync::Mutex<Vec<(String, Value)>>>;

/// An OTLP/HTTP collector in the test process: answers every POST with 200
/// and keeps `(path, JSON body)`.
fn collector() -> (String, Received) {
    use std::io::{BufRead, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let kept = kept.clone();
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(stream);
                // Requests on one connection, one after another.
                loop {
                    let mut request_line = String::new();
                    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = request_line
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or_default()
                        .to_owned();
                    let mut length = 0;
                    loop {
                        let mut header = String::new();
                        reader.read_line(&mut header).unwrap();
                        let header = header.trim_end();
                        if header.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    let body = serde_json::from_slice(&body).unwrap_or_else(|e| {
                        panic!("not OTLP JSON ({e}): {}", String::from_utf8_lossy(&body))
                    });
                    kept.lock().unwrap().push((path, body));
                    let answer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
                    reader.get_mut().write_all(answer.as_bytes()).unwrap();
                }
            });
        }
    });
    (format!("http://{address}"), received)
}

/// An OTLP attribute's value, as a string.
fn attribute(span: &Value, key: &str) -> Option<String> {
    span["attributes"].as_array()?.iter().find_map(|a| {
        (a["key"] == key).then(|| {
            let value = &a["value"];
            value["stringValue"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| value["intValue"].as_str().map(str::to_owned))
                .or_else(|| value["intValue"].as_i64().map(|v| v.to_string()))
                .unwrap_or_else(|| value.to_string())
        })
    })
}

/// Traces: `moat serve --otlp` sends a span per tool call to an OTLP
/// collector (here in the test process), across wasm and native servers
/// with a limit hit and a restart: one span for each call the audit log
/// records, with its server, tool and outcome, the limit named on the
/// call that hit it, and the agent's `traceparent` as the parent of the
/// call that carried one.
#[tokio::test]
async fn spans_reach_an_otlp_collector_one_per_audited_call() {
    use rmcp::ServiceExt;
    let (endpoint, received) = collector();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.wasm]\nwasm = {:?}\nallow_unmeasured = true\n\
             [servers.native]\ncommand = {:?}\nallow_unmeasured = true\n\
             [servers.spin]\nwasm = {:?}\nallow_unmeasured = true\n\
             [servers.spin.limits]\nfuel_per_request = 50000000\n\
             [servers.crash]\nwasm = {:?}\nallow_unmeasured = true\n\
             [servers.report]\ncommand = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM,
            guests::EVERYTHING_NATIVE,
            guests::SPIN_WASM,
            guests::EXIT_MID_CALL_WASM,
            guests::REPORT_NATIVE,
        ),
    )
    .unwrap();
    let audit = dir.path().join("audit.jsonl");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["serve", "--otlp", &endpoint, "--config"])
        .arg(&config)
        .arg("--audit")
        .arg(&audit)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", common::state_dir())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let transport = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let agent = ().serve(transport).await.expect("initialize");
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_id = "00f067aa0ba902b7";
    let mut traced = rmcp::model::CallToolRequestParams::new("wasm__echo");
    traced.arguments = json!({"message": "traced"}).as_object().cloned();
    traced.meta = Some(rmcp::model::RequestMetaObject::new());
    traced
        .meta
        .as_mut()
        .unwrap()
        .set_traceparent(format!("00-{trace_id}-{parent_id}-01"));
    agent.call_tool(traced.clone()).await.unwrap();
    // The report server answers with the `_meta` it was sent.
    traced.name = "report__attack".into();
    traced.arguments = None;
    let reported = agent.call_tool(traced).await.unwrap();
    let reported: Value = serde_json::from_str(
        reported.content[0]
            .as_text()
            .map(|t| t.text.as_str())
            .unwrap(),
    )
    .unwrap();
    for (tool, arguments) in [
        ("wasm__echo", json!({"message": "hi"})),
        ("native__echo", json!({"message": "hi"})),
        ("spin__attack", json!({})),
        ("crash__attack", json!({})),
        ("crash__attack", json!({})),
    ] {
        let mut params = rmcp::model::CallToolRequestParams::new(tool);
        params.arguments = arguments.as_object().cloned();
        let _ = agent.call_tool(params).await;
    }
    drop(agent);
    assert!(child.wait().await.unwrap().success());

    let calls: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] == "tool_call")
        .collect();
    assert_eq!(calls.len(), 7);
    let received = received.lock().unwrap().clone();
    assert!(received.iter().all(|(path, _)| path == "/v1/traces"));
    let spans: Vec<Value> = received
        .iter()
        .flat_map(|(_, body)| {
            body["resourceSpans"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .inspect(|resource| {
            assert_eq!(
                attribute(&resource["resource"], "service.name").as_deref(),
                Some("moat")
            );
        })
        .flat_map(|resource| {
            resource["scopeSpans"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|scope| scope["spans"].as_array().cloned().unwrap_or_default())
        .collect();
    let summary = |server: &str, tool: &str, outcome: &str| format!("{server}__{tool} {outcome}");
    let mut spanned: Vec<String> = spans
        .iter()
        .map(|s| {
            summary(
                &attribute(s, "mcp.server").unwrap_or_default(),
                &attribute(s, "mcp.tool").unwrap_or_default(),
                &attribute(s, "mcp.outcome").unwrap_or_default(),
            )
        })
        .collect();
    let mut audited: Vec<String> = calls
        .iter()
        .map(|c| {
            summary(
                c["server"].as_str().unwrap(),
                c["tool"].as_str().unwrap(),
                c["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    spanned.sort();
    audited.sort();
    assert_eq!(spanned, audited, "one span per audited call: {spans:#?}");
    let spin = spans
        .iter()
        .find(|s| attribute(s, "mcp.server").as_deref() == Some("spin"))
        .unwrap();
    assert_eq!(
        attribute(spin, "mcp.limit").as_deref(),
        Some("fuel_per_request"),
        "{spin:#}"
    );
    let traced: Vec<&Value> = spans.iter().filter(|s| s["traceId"] == trace_id).collect();
    assert_eq!(traced.len(), 2, "{spans:#?}");
    assert!(
        traced.iter().all(|s| s["parentSpanId"] == parent_id),
        "{traced:#?}"
    );
    assert_eq!(traced[0]["name"], "tools/call wasm__echo");
    assert_eq!(
        spans.iter().filter(|s| s["traceId"] != trace_id).count(),
        5,
        "the others start traces of their own"
    );
    // The server was sent Moat's span as its parent, in the agent's trace.
    let report_span = traced
        .iter()
        .find(|s| s["name"] == "tools/call report__attack")
        .unwrap();
    assert_eq!(
        reported["meta"]["traceparent"],
        format!(
            "00-{trace_id}-{}-01",
            report_span["spanId"].as_str().unwrap()
        ),
        "{reported}"
    );
}

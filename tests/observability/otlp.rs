//! Tracing: spans reach an OTLP collector, one per audited call.

use super::*;

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

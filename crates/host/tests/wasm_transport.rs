//! The wasm transport end to end: real guests built from source, driven
//! through the one client transport.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use moat_host::rmcp::model::{CallToolResult, JsonObject};
use moat_host::transport::TransportError;
use moat_host::wasm::{CacheOutcome, WasmError};
use moat_host::{
    ClientError, Digest, Expectation, Fault, Handshake, Host, LaunchError, LimitHit, ServerSpec,
    Session,
};
use moat_test_guests as guests;
use serde_json::json;

/// One host for the whole test binary, with an on-disk component cache, as a
/// long-running `moat serve` would have.
fn host() -> &'static Host {
    static HOST: OnceLock<Host> = OnceLock::new();
    HOST.get_or_init(|| {
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache");
        Host::new(Some(cache)).expect("host")
    })
}

fn spec(name: &str, path: &str) -> ServerSpec {
    let mut spec = ServerSpec::wasm(name, path);
    spec.allow_unmeasured = true;
    spec
}

fn args(value: serde_json::Value) -> Option<JsonObject> {
    value.as_object().cloned()
}

fn text(result: &CallToolResult) -> String {
    let content = serde_json::to_value(&result.content).unwrap();
    content
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect()
}

async fn connect(spec: &ServerSpec) -> Session {
    host().connect(spec).await.expect("connect")
}

/// After any hostile case, the same host process serves a fresh instance.
async fn host_still_serves_everything() {
    let session = connect(&spec("everything", guests::EVERYTHING_WASM)).await;
    let result = session
        .call_tool("add", args(json!({"a": 2, "b": 40})))
        .await
        .expect("add");
    assert_eq!(text(&result), "42");
    session.close().await.expect("close");
}

fn fault_of(error: ClientError) -> Fault {
    match error {
        ClientError::Fault { fault, .. } => fault,
        other => panic!("expected a transport fault, got {other:?}"),
    }
}

#[tokio::test]
async fn handshake_on_initialize_and_on_server_discover() {
    let everything = spec("everything", guests::EVERYTHING_WASM);
    let legacy = host()
        .connect_with(&everything, Handshake::Initialize)
        .await
        .expect("initialize handshake");
    assert_eq!(legacy.protocol_version().as_deref(), Some("2025-11-25"));
    legacy.close().await.unwrap();

    let modern = host()
        .connect_with(&everything, Handshake::Discover)
        .await
        .expect("server/discover handshake");
    assert_eq!(modern.protocol_version().as_deref(), Some("2026-07-28"));
    modern.close().await.unwrap();

    // A server that only knows `initialize` (it answers server/discover with
    // method-not-found) is reached through the automatic fallback.
    let old_server = connect(&spec("non-json", guests::NON_JSON_WASM)).await;
    assert_eq!(old_server.protocol_version().as_deref(), Some("2025-11-25"));
    let tools = old_server.list_tools().await.unwrap();
    assert_eq!(tools[0].name, "attack");
    old_server.close().await.unwrap();
}

#[tokio::test]
async fn tools_list_and_calls_go_through() {
    let session = connect(&spec("everything", guests::EVERYTHING_WASM)).await;
    let mut names: Vec<String> = session
        .list_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["add", "blob", "echo", "fail", "progress", "sleep"]);

    let add = session
        .call_tool("add", args(json!({"a": 2, "b": 40})))
        .await
        .unwrap();
    assert_eq!(text(&add), "42");
    let echo = session
        .call_tool("echo", args(json!({"message": "héllo\nworld"})))
        .await
        .unwrap();
    assert_eq!(text(&echo), "héllo\nworld");
    let fail = session
        .call_tool("fail", args(json!({"message": "planned"})))
        .await
        .unwrap();
    assert_eq!(fail.is_error, Some(true));
    assert_eq!(text(&fail), "planned");
    let blob = session
        .call_tool("blob", args(json!({"n": 300_000})))
        .await
        .unwrap();
    assert_eq!(text(&blob).len(), 300_000);
    let slept = session
        .call_tool("sleep", args(json!({"ms": 20})))
        .await
        .unwrap();
    assert_eq!(text(&slept), "slept 20 ms");
    // Bad arguments are the server's own tool error, not a transport fault.
    let bad = session
        .call_tool("add", args(json!({"a": "two"})))
        .await
        .unwrap();
    assert_eq!(bad.is_error, Some(true));
    assert!(text(&bad).contains("expected i64"), "{}", text(&bad));
    // An unknown tool is a JSON-RPC error from the server.
    match session.call_tool("nope", None).await {
        Err(ClientError::Server { code, .. }) => assert_eq!(code, -32602),
        other => panic!("expected invalid params, got {other:?}"),
    }
    session.close().await.unwrap();
}

#[tokio::test]
async fn progress_notifications_arrive_in_order() {
    let mut session = connect(&spec("everything", guests::EVERYTHING_WASM)).await;
    let mut progress = session.take_progress().unwrap();
    let result = session
        .call_tool("progress", args(json!({"steps": 5})))
        .await
        .unwrap();
    assert_eq!(text(&result), "5 steps done");
    let mut seen = Vec::new();
    while let Ok(note) = progress.try_recv() {
        seen.push((note.progress, note.total));
    }
    assert_eq!(
        seen,
        (1..=5)
            .map(|i| (f64::from(i), Some(5.0)))
            .collect::<Vec<_>>()
    );
    session.close().await.unwrap();
}

#[tokio::test]
async fn resource_read_and_prompt_get() {
    let session = connect(&spec("everything", guests::EVERYTHING_WASM)).await;
    let resources = session.list_resources().await.unwrap();
    assert_eq!(resources.len(), 1);
    let read = session.read_resource(&resources[0].uri).await.unwrap();
    let contents = serde_json::to_value(&read.contents).unwrap();
    assert_eq!(contents[0]["text"], "everything: a test server for Moat");
    let prompt = session
        .get_prompt("greet", args(json!({"name": "Ada"})))
        .await
        .unwrap();
    let messages = serde_json::to_value(&prompt.messages).unwrap();
    assert_eq!(messages[0]["content"]["text"], "Hello, Ada!");
    session.close().await.unwrap();
}

#[tokio::test]
async fn spinning_guest_hits_the_cpu_limit_within_the_deadline() {
    let mut spin = spec("spin", guests::SPIN_WASM);
    spin.limits.fuel_per_request = 200_000_000;
    spin.limits.request_timeout_ms = 60_000;
    let session = connect(&spin).await;
    let started = Instant::now();
    let fault = fault_of(session.call_tool("attack", None).await.unwrap_err());
    assert!(started.elapsed() < Duration::from_millis(spin.limits.request_timeout_ms));
    assert_eq!(
        fault,
        Fault::Limit {
            server: "spin".into(),
            limit: LimitHit::Fuel {
                fuel_per_request: 200_000_000
            }
        }
    );
    assert!(fault.to_string().contains("fuel_per_request = 200000000"));
    session.close().await.unwrap();
    host_still_serves_everything().await;
}

/// On a current-thread runtime a guest that never yielded would starve every
/// other task; fuel's async yield keeps the heartbeat ticking.
#[tokio::test(flavor = "current_thread")]
async fn heartbeat_keeps_ticking_while_a_guest_spins() {
    let mut spin = spec("spin", guests::SPIN_WASM);
    spin.limits.fuel_per_request = 1_000_000_000;
    let session = connect(&spin).await;
    let ticks = Arc::new(AtomicU64::new(0));
    let heartbeat = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            let mut interval = tokio::time::interval(Duration::from_millis(1));
            loop {
                interval.tick().await;
                ticks.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let before = ticks.load(Ordering::SeqCst);
    let error = session.call_tool("attack", None).await.unwrap_err();
    let during = ticks.load(Ordering::SeqCst) - before;
    heartbeat.abort();
    assert!(matches!(
        error.fault(),
        Some(Fault::Limit {
            limit: LimitHit::Fuel { .. },
            ..
        })
    ));
    assert!(
        during >= 5,
        "heartbeat ticked only {during} times during the spin"
    );
    session.close().await.unwrap();
}

#[tokio::test]
async fn growing_memory_hits_the_memory_limit() {
    let mut grow = spec("grow-memory", guests::GROW_MEMORY_WASM);
    grow.limits.memory_bytes = 32 << 20;
    let session = connect(&grow).await;
    let fault = fault_of(session.call_tool("attack", None).await.unwrap_err());
    assert_eq!(
        fault,
        Fault::Limit {
            server: "grow-memory".into(),
            limit: LimitHit::Memory {
                memory_bytes: 32 << 20
            }
        }
    );
    session.close().await.unwrap();
    host_still_serves_everything().await;
}

fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[tokio::test]
async fn endless_line_is_a_framing_error_with_host_memory_bounded() {
    let mut endless = spec("endless-line", guests::ENDLESS_LINE_WASM);
    endless.limits.max_line_bytes = 1 << 20;
    let session = connect(&endless).await;
    let before = peak_rss_bytes();
    let fault = fault_of(session.call_tool("attack", None).await.unwrap_err());
    assert_eq!(
        fault,
        Fault::Limit {
            server: "endless-line".into(),
            limit: LimitHit::LineLength {
                max_line_bytes: 1 << 20
            }
        }
    );
    let grown = peak_rss_bytes().saturating_sub(before);
    assert!(grown < 128 << 20, "peak RSS grew by {grown} bytes");
    session.close().await.unwrap();
    host_still_serves_everything().await;
}

#[tokio::test]
async fn non_json_line_is_a_framing_error() {
    let session = connect(&spec("non-json", guests::NON_JSON_WASM)).await;
    let fault = fault_of(session.call_tool("attack", None).await.unwrap_err());
    match fault {
        Fault::NotJsonRpc {
            server, excerpt, ..
        } => {
            assert_eq!(server, "non-json");
            assert_eq!(excerpt, "this line is not JSON-RPC");
        }
        other => panic!("expected a framing fault, got {other:?}"),
    }
    session.close().await.unwrap();
    host_still_serves_everything().await;
}

#[tokio::test]
async fn exit_mid_call_carries_the_code_and_a_sanitised_stderr_tail() {
    let session = connect(&spec("exit-mid-call", guests::EXIT_MID_CALL_WASM)).await;
    let fault = fault_of(session.call_tool("attack", None).await.unwrap_err());
    match fault {
        Fault::Exited {
            server,
            code,
            stderr_tail,
        } => {
            assert_eq!(server, "exit-mid-call");
            assert_eq!(code, 3);
            assert_eq!(stderr_tail, "fatal: planted failure in attack");
        }
        other => panic!("expected an exit fault, got {other:?}"),
    }
    session.close().await.unwrap();
    host_still_serves_everything().await;
}

#[tokio::test]
async fn stderr_flood_keeps_the_protocol_working_and_the_buffer_bounded() {
    let mut flood = spec("stderr-flood", guests::STDERR_FLOOD_WASM);
    flood.limits.stderr_buffer_bytes = 4096;
    let session = connect(&flood).await;
    for _ in 0..3 {
        let result = session.call_tool("attack", None).await.unwrap();
        assert_eq!(text(&result), "flooded");
    }
    let stderr = session.shared().stderr();
    assert_eq!(stderr.capacity(), 4096);
    assert_eq!(stderr.len(), 4096);
    // Each call wrote 4 MiB; the drain keeps pace (the reply follows the flood).
    assert!(
        stderr.total_bytes() >= 3 * (4 << 20),
        "{}",
        stderr.total_bytes()
    );
    session.close().await.unwrap();
    host_still_serves_everything().await;
}

#[tokio::test]
async fn deadline_fails_the_call_and_stops_the_instance() {
    let mut slow = spec("everything", guests::EVERYTHING_WASM);
    slow.limits.request_timeout_ms = 300;
    let session = connect(&slow).await;
    let tracker = session.shared().tracker().clone();
    let fault = fault_of(
        session
            .call_tool("sleep", args(json!({"ms": 60_000})))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        fault,
        Fault::Limit {
            server: "everything".into(),
            limit: LimitHit::Deadline {
                request_timeout_ms: 300
            }
        }
    );
    session.close().await.unwrap();
    assert_eq!(tracker.live(), 0);
}

#[tokio::test]
async fn a_transport_connects_once_and_leaves_no_task_after_close() {
    let transport = host()
        .transport(&spec("everything", guests::EVERYTHING_WASM))
        .unwrap();
    let tracker = transport.shared().tracker().clone();
    let connected = transport.connect().await.expect("first connect");
    match transport.connect().await {
        Err(LaunchError::Transport(TransportError::AlreadyConnected { server })) => {
            assert_eq!(server, "everything")
        }
        Err(other) => panic!("expected AlreadyConnected, got {other}"),
        Ok(_) => panic!("a second connect must fail"),
    }
    // instance + stdout reader + stderr drain + watchdog
    assert_eq!(tracker.live(), 4);
    drop(connected);

    let transport = host()
        .transport(&spec("everything", guests::EVERYTHING_WASM))
        .unwrap();
    let tracker = transport.shared().tracker().clone();
    let session = Session::connect(transport, Handshake::Auto).await.unwrap();
    assert!(tracker.live() > 0);
    session.close().await.unwrap();
    assert_eq!(tracker.live(), 0, "tasks left running after close");
}

#[tokio::test]
async fn a_connect_cancelled_part_way_leaves_nothing_behind() {
    let transport = host()
        .transport(&spec("everything", guests::EVERYTHING_WASM))
        .unwrap();
    let tracker = transport.shared().tracker().clone();
    tokio::select! {
        biased;
        _ = tracker.wait_started() => {}
        result = Session::connect(transport, Handshake::Auto) => {
            panic!("connect finished before the instance started: {}", result.is_ok())
        }
    }
    // The connect future is dropped: the instance started and must be gone.
    assert!(tracker.started() > 0);
    tokio::time::timeout(Duration::from_secs(30), tracker.wait_idle())
        .await
        .expect("tasks of a cancelled connect never ended");
    assert_eq!(tracker.live(), 0);
}

fn temp_copy(source: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guest.wasm");
    std::fs::copy(source, &path).unwrap();
    (dir, path)
}

#[tokio::test]
async fn a_component_with_one_byte_changed_is_refused() {
    let original = std::fs::read(guests::EVERYTHING_WASM).unwrap();
    let pinned = Digest::of(&original);
    let (_dir, path) = temp_copy(guests::EVERYTHING_WASM);
    let mut bytes = original.clone();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();

    let mut tampered = ServerSpec::wasm("everything", &path);
    tampered.sha256 = Some(pinned);
    match host().connect(&tampered).await {
        Err(ClientError::Launch(LaunchError::Wasm(WasmError::Digest { mismatch, .. }))) => {
            assert_eq!(mismatch.expected, pinned);
            assert_eq!(mismatch.actual, Digest::of(&bytes));
        }
        Err(other) => panic!("expected a digest error, got {other}"),
        Ok(_) => panic!("a tampered component must not launch"),
    }
    // The same pin admits the original bytes.
    let mut genuine = ServerSpec::wasm("everything", guests::EVERYTHING_WASM);
    genuine.sha256 = Some(pinned);
    host()
        .connect(&genuine)
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
}

#[tokio::test]
async fn an_unpinned_component_needs_consent() {
    let unpinned = ServerSpec::wasm("everything", guests::EVERYTHING_WASM);
    match host().connect(&unpinned).await {
        Err(ClientError::Launch(LaunchError::Unmeasured { server })) => {
            assert_eq!(server, "everything")
        }
        Err(other) => panic!("expected an unmeasured refusal, got {other}"),
        Ok(_) => panic!("an unpinned component must not launch without consent"),
    }
}

#[tokio::test]
async fn a_corrupt_or_foreign_cache_file_is_recompiled_not_loaded() {
    let cache = tempfile::tempdir().unwrap();
    let path = Path::new(guests::NON_JSON_WASM);
    let digest = Digest::of(&std::fs::read(path).unwrap());
    let fresh = || Host::new(Some(cache.path().to_owned())).unwrap();

    let first = fresh()
        .wasm()
        .prepare(path, Expectation::Unpinned)
        .await
        .unwrap();
    assert_eq!(first.cache_outcome(), CacheOutcome::Compiled);
    let engine = fresh();
    let cache_file = engine.wasm().cache_path(digest).unwrap();
    let second = engine
        .wasm()
        .prepare(path, Expectation::Unpinned)
        .await
        .unwrap();
    assert_eq!(second.cache_outcome(), CacheOutcome::Hit);
    let again = engine
        .wasm()
        .prepare(path, Expectation::Unpinned)
        .await
        .unwrap();
    assert_eq!(again.cache_outcome(), CacheOutcome::Memory);

    // One flipped byte in the compiled payload.
    let mut file = std::fs::read(&cache_file).unwrap();
    let middle = file.len() / 2;
    file[middle] ^= 0xff;
    std::fs::write(&cache_file, &file).unwrap();
    let third = fresh()
        .wasm()
        .prepare(path, Expectation::Unpinned)
        .await
        .unwrap();
    assert_eq!(third.cache_outcome(), CacheOutcome::Recompiled);
    assert_eq!(
        fresh()
            .wasm()
            .prepare(path, Expectation::Unpinned)
            .await
            .unwrap()
            .cache_outcome(),
        CacheOutcome::Hit,
        "the corrupt file was rewritten"
    );

    // A file whose recorded digest matches its payload, but the payload is
    // not wasmtime's: refused by the engine, recompiled.
    let garbage = b"not a compiled component".to_vec();
    let mut foreign = b"MOAT-CWASM1\n".to_vec();
    foreign.extend_from_slice(Digest::of(&garbage).as_bytes());
    foreign.extend_from_slice(&garbage);
    std::fs::write(&cache_file, &foreign).unwrap();
    let fourth = fresh()
        .wasm()
        .prepare(path, Expectation::Unpinned)
        .await
        .unwrap();
    assert_eq!(fourth.cache_outcome(), CacheOutcome::Recompiled);

    // And the recompiled component runs.
    let mut spec = ServerSpec::wasm("non-json", path);
    spec.allow_unmeasured = true;
    let session = fresh().connect(&spec).await.unwrap();
    assert_eq!(session.list_tools().await.unwrap().len(), 1);
    session.close().await.unwrap();
}

/// An idle guest parks in `wasi:io/poll`: a 300 ms sleep inside the guest
/// costs a handful of host calls and almost no fuel, where busy polling would
/// cost thousands of calls and hundreds of millions of fuel units.
#[tokio::test]
async fn an_idle_guest_burns_no_fuel_and_makes_no_busy_host_calls() {
    let session = connect(&spec("everything", guests::EVERYTHING_WASM)).await;
    session
        .call_tool("add", args(json!({"a": 1, "b": 1})))
        .await
        .unwrap();
    let metrics = session.shared().metrics();
    let (calls, fuel) = (metrics.hostcalls(), metrics.fuel_consumed());
    assert!(calls > 0 && fuel > 0, "the counters count");
    let slept = session
        .call_tool("sleep", args(json!({"ms": 300})))
        .await
        .unwrap();
    assert_eq!(text(&slept), "slept 300 ms");
    let calls = metrics.hostcalls() - calls;
    let fuel = metrics.fuel_consumed() - fuel;
    assert!(calls < 200, "{calls} host calls during a 300 ms idle sleep");
    assert!(
        fuel < 20_000_000,
        "{fuel} fuel used during a 300 ms idle sleep"
    );
    session.close().await.unwrap();
}

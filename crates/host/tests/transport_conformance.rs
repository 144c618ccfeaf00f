//! The transport conformance suite: every test is written once and runs
//! against both launchers, wasm and native, with the same guests built from
//! the same source. Launcher-specific checks live in `wasm_launch.rs` and
//! `native_launch.rs`.

#[macro_use]
mod common;

use common::{
    Launcher, args, connect, fault_of, host, host_still_serves_everything, peak_rss_bytes, spec,
    text,
};

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use moat_host::TransportError;
use moat_host::{
    ConnectError, Evidence, Fault, Handshake, LaunchError, LimitHit, Session, SessionError,
};
use moat_test_guests as guests;
use serde_json::json;

both_launchers!(
    handshake_on_initialize_and_on_server_discover,
    tools_list_and_calls_go_through,
    progress_notifications_arrive_in_order,
    resource_read_and_prompt_get,
    argv_and_environment_arrive_exactly,
    a_call_carries_the_meta_rmcp_gives_a_request,
    spinning_guest_hits_the_cpu_limit_within_the_deadline,
    heartbeat_keeps_ticking_while_a_guest_spins,
    growing_memory_hits_the_memory_limit,
    endless_line_is_a_framing_error_with_host_memory_bounded,
    non_json_line_is_a_framing_error,
    exit_mid_call_carries_the_code_and_a_sanitised_stderr_tail,
    stderr_flood_keeps_the_protocol_working_and_the_buffer_bounded,
    deadline_fails_the_call_and_stops_the_server,
    a_transport_connects_once_and_leaves_no_task_after_close,
    a_connect_cancelled_part_way_leaves_nothing_behind,
    an_unpinned_server_needs_consent,
);

/// One host for the whole test binary, with an on-disk component cache, as a
/// long-running `moat serve` would have.
async fn handshake_on_initialize_and_on_server_discover(launcher: Launcher) {
    let everything = spec(launcher, guests::EVERYTHING);
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
    let old_server = connect(&spec(launcher, guests::NON_JSON)).await;
    assert_eq!(old_server.protocol_version().as_deref(), Some("2025-11-25"));
    let tools = old_server.list_tools().await.unwrap();
    assert_eq!(tools[0].name, "attack");
    old_server.close().await.unwrap();

    // One too slow to refuse it: rmcp gives up on discover (after its 10 s)
    // and sends initialize; the refusal that comes after is an answer to
    // nothing and is dropped, not taken for initialize's.
    let mut slow = spec(launcher, guests::NON_JSON);
    slow.env
        .values
        .insert("HOSTILE_LATE_DISCOVER".into(), "1".into());
    let slow = connect(&slow).await;
    assert_eq!(slow.protocol_version().as_deref(), Some("2025-11-25"));
    assert_eq!(slow.list_tools().await.unwrap()[0].name, "attack");
    slow.close().await.unwrap();
}

async fn tools_list_and_calls_go_through(launcher: Launcher) {
    let session = connect(&spec(launcher, guests::EVERYTHING)).await;
    let mut names: Vec<String> = session
        .list_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "add", "blob", "calls", "drift", "echo", "fail", "progress", "shape", "sleep"
        ]
    );

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
        Err(SessionError::Server { code, .. }) => assert_eq!(code, -32602),
        other => panic!("expected invalid params, got {other:?}"),
    }
    session.close().await.unwrap();
}

async fn progress_notifications_arrive_in_order(launcher: Launcher) {
    let mut session = connect(&spec(launcher, guests::EVERYTHING)).await;
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

async fn resource_read_and_prompt_get(launcher: Launcher) {
    let session = connect(&spec(launcher, guests::EVERYTHING)).await;
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

async fn spinning_guest_hits_the_cpu_limit_within_the_deadline(launcher: Launcher) {
    let mut spin = spec(launcher, guests::SPIN);
    spin.limits.fuel_per_request = 200_000_000;
    spin.limits.cpu_seconds = 1;
    spin.limits.request_timeout_ms = 60_000;
    let session = connect(&spin).await;
    let started = Instant::now();
    let fault = fault_of(session.call_tool("attack", None).await.unwrap_err());
    assert!(started.elapsed() < Duration::from_millis(spin.limits.request_timeout_ms));
    let (limit, named) = cpu_limit(launcher);
    assert_eq!(
        fault,
        Fault::Limit {
            server: "spin".into(),
            limit
        }
    );
    assert!(fault.to_string().contains(named), "{fault}");
    session.close().await.unwrap();
    host_still_serves_everything(launcher).await;
}

/// The CPU limit each launcher enforces, as the tests configure it, and how
/// its error names it.
fn cpu_limit(launcher: Launcher) -> (LimitHit, &'static str) {
    match launcher {
        Launcher::Wasm => (
            LimitHit::Fuel {
                fuel_per_request: 200_000_000,
            },
            "fuel_per_request = 200000000",
        ),
        Launcher::Native => (LimitHit::CpuSeconds { cpu_seconds: 1 }, "cpu_seconds = 1"),
    }
}

/// The suite runs on a current-thread runtime: a wasm guest that never
/// yielded would starve every other task; fuel's async yield lets the
/// heartbeat run between slices of the spin (200,000,000 fuel, a yield every
/// 1,000,000: 200 slices). A native guest runs in its own process.
///
/// The heartbeat counts scheduling turns, not time: it wakes itself and
/// goes to the back of the run queue, as the guest's yield does, so each
/// slice of the spin gives it a turn however fast the machine is. (A timer
/// fires only when the runtime polls its driver, every 61 turns, which a
/// fast machine reaches only a few times in the spin.)
async fn heartbeat_keeps_ticking_while_a_guest_spins(launcher: Launcher) {
    let mut spin = spec(launcher, guests::SPIN);
    spin.limits.fuel_per_request = 200_000_000;
    spin.limits.cpu_seconds = 1;
    let session = connect(&spin).await;
    let ticks = Arc::new(AtomicU64::new(0));
    let heartbeat = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            loop {
                turn().await;
                ticks.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let before = ticks.load(Ordering::SeqCst);
    let error = session.call_tool("attack", None).await.unwrap_err();
    let during = ticks.load(Ordering::SeqCst) - before;
    heartbeat.abort();
    match error.fault() {
        Some(Fault::Limit { limit, .. }) => assert_eq!(*limit, cpu_limit(launcher).0),
        other => panic!("expected the CPU limit, got {other:?}"),
    }
    assert!(
        during >= 100,
        "the heartbeat had only {during} turns during the spin"
    );
    session.close().await.unwrap();
}

/// One scheduling turn: wakes itself and yields, so the task goes to the
/// back of the run queue at once (unlike `tokio::task::yield_now`, which
/// waits for the next driver poll).
async fn turn() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if std::mem::replace(&mut yielded, true) {
            std::task::Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await;
}

async fn growing_memory_hits_the_memory_limit(launcher: Launcher) {
    let mut grow = spec(launcher, guests::GROW_MEMORY);
    grow.limits.memory_bytes = 32 << 20;
    grow.limits.address_space_bytes = 256 << 20;
    let session = connect(&grow).await;
    let fault = fault_of(session.call_tool("attack", None).await.unwrap_err());
    let limit = match launcher {
        Launcher::Wasm => LimitHit::Memory {
            memory_bytes: 32 << 20,
        },
        Launcher::Native => LimitHit::AddressSpace {
            address_space_bytes: 256 << 20,
        },
    };
    assert_eq!(
        fault,
        Fault::Limit {
            server: "grow-memory".into(),
            limit
        }
    );
    session.close().await.unwrap();
    host_still_serves_everything(launcher).await;
}

async fn endless_line_is_a_framing_error_with_host_memory_bounded(launcher: Launcher) {
    let mut endless = spec(launcher, guests::ENDLESS_LINE);
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
    host_still_serves_everything(launcher).await;
}

async fn non_json_line_is_a_framing_error(launcher: Launcher) {
    let session = connect(&spec(launcher, guests::NON_JSON)).await;
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
    host_still_serves_everything(launcher).await;
}

async fn exit_mid_call_carries_the_code_and_a_sanitised_stderr_tail(launcher: Launcher) {
    let session = connect(&spec(launcher, guests::EXIT_MID_CALL)).await;
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
    host_still_serves_everything(launcher).await;
}

async fn stderr_flood_keeps_the_protocol_working_and_the_buffer_bounded(launcher: Launcher) {
    let mut flood = spec(launcher, guests::STDERR_FLOOD);
    flood.limits.stderr_buffer_bytes = 4096;
    let session = connect(&flood).await;
    for _ in 0..3 {
        let result = session.call_tool("attack", None).await.unwrap();
        assert_eq!(text(&result), "flooded");
    }
    let stderr = session.stderr();
    assert_eq!(stderr.capacity(), 4096);
    assert_eq!(stderr.len(), 4096);
    // Each call wrote 4 MiB; the drain keeps pace (the reply follows the flood).
    assert!(
        stderr.total_bytes() >= 3 * (4 << 20),
        "{}",
        stderr.total_bytes()
    );
    session.close().await.unwrap();
    host_still_serves_everything(launcher).await;
}

async fn deadline_fails_the_call_and_stops_the_server(launcher: Launcher) {
    let mut slow = spec(launcher, guests::EVERYTHING);
    slow.limits.request_timeout_ms = 300;
    let session = connect(&slow).await;
    let tracker = session.tracker().clone();
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

async fn a_transport_connects_once_and_leaves_no_task_after_close(launcher: Launcher) {
    let transport = host()
        .transport(&spec(launcher, guests::EVERYTHING))
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
    // the server (instance or waiter) + stdout reader + stderr drain + watchdog
    assert_eq!(tracker.live(), 4);
    drop(connected);

    let transport = host()
        .transport(&spec(launcher, guests::EVERYTHING))
        .unwrap();
    let tracker = transport.shared().tracker().clone();
    let session = Session::connect(transport, Handshake::Auto).await.unwrap();
    assert!(tracker.live() > 0);
    session.close().await.unwrap();
    assert_eq!(tracker.live(), 0, "tasks left running after close");
}

async fn a_connect_cancelled_part_way_leaves_nothing_behind(launcher: Launcher) {
    let transport = host()
        .transport(&spec(launcher, guests::EVERYTHING))
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

/// A `tools/call` is sent past rmcp's client service, but the server gets
/// the `_meta` rmcp gives each of its own requests: the revision, client
/// info and capabilities a server without a handshake (2026-07-28) reads
/// on every request, and a progress token of the call's own. The same
/// call sent through rmcp is the reference.
async fn a_call_carries_the_meta_rmcp_gives_a_request(launcher: Launcher) {
    for current in [false, true] {
        let mut report = spec(launcher, guests::REPORT);
        if current {
            report
                .env
                .values
                .insert("HOSTILE_DISCOVER".into(), "1".into());
        }
        let session = connect(&report).await;
        assert_eq!(session.is_current(), current);
        let meta = |seen: &str| {
            let seen: serde_json::Value = serde_json::from_str(seen).unwrap();
            seen["meta"].as_object().cloned().unwrap()
        };
        let direct = meta(&text(&session.call_tool("attack", None).await.unwrap()));
        let through_rmcp = session
            .request_raw("tools/call", Some(json!({"name": "attack"})))
            .await
            .unwrap();
        let through_rmcp = meta(through_rmcp["content"][0]["text"].as_str().unwrap());
        assert_eq!(
            direct.contains_key("io.modelcontextprotocol/protocolVersion"),
            current,
            "{direct:?}"
        );
        let keys = |meta: &serde_json::Map<String, serde_json::Value>| {
            meta.keys().cloned().collect::<Vec<_>>()
        };
        assert_eq!(keys(&direct), keys(&through_rmcp));
        for (key, value) in &direct {
            if key != "progressToken" {
                assert_eq!(Some(value), through_rmcp.get(key), "{key}");
            }
        }
        // Each call has a token of its own, never one of rmcp's.
        assert_ne!(direct["progressToken"], through_rmcp["progressToken"]);
        session.close().await.unwrap();
    }
}

async fn argv_and_environment_arrive_exactly(launcher: Launcher) {
    let dir = tempfile::tempdir().unwrap();
    let hostile_args: Vec<String> = [
        "$(touch X)",
        "`touch Y`",
        "a; touch Z",
        "--",
        "--flag=1",
        "",
        "two words",
        "ünï\tcødé",
        "'quoted' \"double\"",
    ]
    .map(String::from)
    .to_vec();
    let mut report = spec(launcher, guests::REPORT);
    report.args = hostile_args.clone();
    report.env.values.insert("GREETING".into(), "hello".into());
    report.env.passthrough = vec!["PATH".into(), "MOAT_SURELY_UNSET".into()];
    if let moat_host::ServerKind::Native { cwd, .. } = &mut report.kind {
        *cwd = dir.path().to_owned();
    }
    let session = connect(&report).await;
    let result = session.call_tool("attack", None).await.unwrap();
    // Both launchers report the grant the same way, by name only: the
    // config's names, after the native base (which PATH replaces here).
    let sandbox = session.identity().unwrap().sandbox.lines();
    let environment: Vec<&String> = sandbox
        .iter()
        .filter(|l| l.starts_with("enforced: environment: "))
        .collect();
    let config = "the config's GREETING, PATH; nothing else of Moat's environment";
    let [line] = environment[..] else {
        panic!("one environment line: {sandbox:?}")
    };
    match launcher {
        Launcher::Wasm => assert_eq!(*line, format!("enforced: environment: {config}")),
        Launcher::Native => assert!(
            line.contains(" LANG=C.UTF-8 ") && line.ends_with(&format!(", and {config}")),
            "{line}"
        ),
    }
    assert!(!line.contains("hello"), "{line}");
    session.close().await.unwrap();
    let seen: serde_json::Value = serde_json::from_str(&text(&result)).unwrap();
    let argv: Vec<String> = serde_json::from_value(seen["argv"].clone()).unwrap();
    assert_eq!(
        argv[1..],
        hostile_args[..],
        "argv after argv[0], byte for byte"
    );
    let argv0 = match launcher {
        Launcher::Wasm => "report".to_owned(),
        // argv[0] stays as configured, not /proc/self/fd/N.
        Launcher::Native => guests::REPORT_NATIVE.to_owned(),
    };
    assert_eq!(argv[0], argv0);
    let mut names: Vec<&str> = seen["env"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    names.sort();
    // A native server also gets the documented base (issue 33): HOME,
    // LANG, TMPDIR, and a PATH that the pass-through replaces here.
    let expected: &[&str] = match launcher {
        Launcher::Wasm => &["GREETING", "PATH"],
        Launcher::Native => &["GREETING", "HOME", "LANG", "PATH", "TMPDIR"],
    };
    assert_eq!(names, expected, "the environment is exact");
    assert_eq!(seen["env"]["GREETING"], "hello");
    assert_eq!(
        seen["env"]["PATH"].as_str(),
        std::env::var("PATH").ok().as_deref()
    );
    if launcher == Launcher::Native {
        assert_eq!(
            Path::new(seen["cwd"].as_str().unwrap()),
            dir.path().canonicalize().unwrap()
        );
    }
    for file in ["X", "Y", "Z"] {
        assert!(
            !dir.path().join(file).exists(),
            "a shell ran: {file} exists"
        );
        assert!(!Path::new(file).exists(), "a shell ran: {file} exists");
    }
}

async fn an_unpinned_server_needs_consent(launcher: Launcher) {
    let mut unpinned = spec(launcher, guests::EVERYTHING);
    unpinned.allow_unmeasured = false;
    match host().connect(&unpinned).await {
        Err(ConnectError::Launch(LaunchError::Unmeasured { server })) => {
            assert_eq!(server, "everything")
        }
        Err(other) => panic!("expected an unmeasured refusal, got {other}"),
        Ok(_) => panic!("an unpinned server must not launch without consent"),
    }
    // With consent it runs, and reports what it is.
    let session = connect(&spec(launcher, guests::EVERYTHING)).await;
    let identity = session.identity().unwrap();
    let expected = match launcher {
        Launcher::Wasm => Evidence::WasmMeasured,
        Launcher::Native => Evidence::NativeUnmeasured,
    };
    assert_eq!(identity.evidence, expected);
    session.close().await.unwrap();
}

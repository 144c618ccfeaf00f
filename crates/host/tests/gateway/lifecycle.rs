//! A session's servers from start to stop: the instance the name check
//! started serves the first session, a slow start holds only its own launch
//! slot, close drains then cancels, and crash restarts are bounded per
//! session and stay in the session that crashed.

use super::*;

both_launchers!(
    a_crashing_server_is_restarted_a_bounded_number_of_times,
    close_lets_in_flight_calls_finish_then_refuses_new_ones,
    close_cancels_calls_still_running_at_the_drain_timeout,
    a_crash_in_one_session_leaves_the_identical_server_of_another_mid_call,
    the_name_checks_instance_serves_the_first_session,
    a_slow_start_never_holds_the_sessions_calls_to_other_servers,
);

/// Start-up never pays for an instance it throws away: the instance the
/// name check started (no lock) serves the first session that needs that
/// server; the next session starts its own.
async fn the_name_checks_instance_serves_the_first_session(launcher: Launcher) {
    let host = host();
    let config = Config {
        path: "moat.toml".into(),
        servers: [("everything".to_owned(), spec(launcher, guests::EVERYTHING))].into(),
        serve: Default::default(),
        wasm: Default::default(),
        nodes: Default::default(),
    };
    let gateway = Gateway::new(host.clone(), config, None);
    gateway.check_names().await;
    assert_eq!(host.launches(), 1);
    let first = gateway.session();
    let result = first.call("everything__calls", None).await.unwrap();
    assert_eq!(
        text(&result),
        "1",
        "the same instance, fresh: its first call"
    );
    assert_eq!(host.launches(), 1, "adopted, not started again");
    let second = gateway.session();
    second.tools().await.unwrap();
    assert_eq!(host.launches(), 2, "the next session starts its own");
    assert!(first.close().await.is_empty());
    assert!(second.close().await.is_empty());
    assert!(gateway.close_all().await.is_empty());
}

/// A server that never finishes starting holds only its own launch slot:
/// the session's calls to another server are answered meanwhile, and close
/// cancels the start at the drain timeout.
async fn a_slow_start_never_holds_the_sessions_calls_to_other_servers(launcher: Launcher) {
    let host = host();
    let config = Config {
        path: "moat.toml".into(),
        servers: [
            ("mute".to_owned(), spec(launcher, guests::MUTE)),
            ("everything".to_owned(), spec(launcher, guests::EVERYTHING)),
        ]
        .into(),
        serve: moat_host::config::ServeSettings {
            drain_timeout_ms: 100,
            ..Default::default()
        },
        wasm: Default::default(),
        nodes: Default::default(),
    };
    let gateway = Gateway::new(host.clone(), config, None);
    let session = gateway.session();
    let stuck = {
        let session = session.clone();
        tokio::spawn(async move { session.call("mute__anything", None).await })
    };
    // The mute server's start has begun: it answers nothing, so its
    // handshake waits out the 30 s request timeout.
    while host.launches() < 1 {
        tokio::task::yield_now().await;
    }
    let result = session
        .call("everything__add", args(json!({"a": 1, "b": 2})))
        .await
        .unwrap();
    assert_eq!(text(&result), "3");
    assert!(!stuck.is_finished(), "the mute server is still starting");
    assert!(session.close().await.is_empty());
    let error = stuck.await.unwrap().unwrap_err();
    assert_eq!(
        error.message,
        "tool `anything` on server `mute`: the call was cancelled"
    );
}

/// Starts `server__progress` with `steps` notifications `interval_ms` apart
/// and returns once the first notification arrived: the call is in flight.
async fn call_in_flight(
    session: &moat_host::gateway::AgentSession,
    server: &str,
    steps: u32,
    interval_ms: u64,
) -> tokio::task::JoinHandle<
    Result<moat_host::rmcp::model::CallToolResult, moat_host::rmcp::ErrorData>,
> {
    let (progress, mut notes) = tokio::sync::mpsc::unbounded_channel();
    let caller = session.clone();
    let tool = format!("{server}__progress");
    let call = tokio::spawn(async move {
        caller
            .call_forwarding(
                &tool,
                args(json!({"steps": steps, "interval_ms": interval_ms})),
                Some(progress),
                CancellationToken::new(),
                None,
            )
            .await
    });
    notes.recv().await.expect("first progress notification");
    tokio::spawn(async move { while notes.recv().await.is_some() {} });
    call
}

async fn close_lets_in_flight_calls_finish_then_refuses_new_ones(launcher: Launcher) {
    let mut slow = spec(launcher, guests::EVERYTHING);
    slow.name = "slow".into();
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let gateway = gateway_audited(&[slow], 30_000, Some(&audit));
    let session = gateway.session();
    let call = call_in_flight(&session, "slow", 4, 50).await;
    assert!(session.close().await.is_empty());
    // close returned only after the call had finished, and finished well.
    assert!(call.is_finished());
    let result = call.await.unwrap().expect("the in-flight call completes");
    assert_eq!(result.is_error, Some(false));
    let refused = session
        .call("slow__add", args(json!({"a": 1, "b": 2})))
        .await
        .unwrap_err();
    assert_eq!(
        refused.message,
        format!("session {} is closing: no new calls", session.id())
    );
    let events = audited(&audit);
    let kinds: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "session_open",
            "server_launch",
            "tool_call",
            "server_exit",
            "session_close"
        ]
    );
    assert_eq!(events[2].1, "ok", "drained: the call finished");
}

async fn close_cancels_calls_still_running_at_the_drain_timeout(launcher: Launcher) {
    let mut slow = spec(launcher, guests::EVERYTHING);
    slow.name = "slow".into();
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let gateway = gateway_audited(&[slow], 100, Some(&audit));
    let session = gateway.session();
    // 10,000 steps 50 ms apart: far longer than the 100 ms drain.
    let call = call_in_flight(&session, "slow", 10_000, 50).await;
    assert!(session.close().await.is_empty(), "the child still closes");
    let error = call.await.unwrap().unwrap_err();
    assert!(error.message.contains("cancelled"), "{}", error.message);
    let events = audited(&audit);
    assert_eq!(events[2], ("tool_call".to_owned(), "cancelled".to_owned()));
    assert_eq!(events[3], ("server_exit".to_owned(), "closed".to_owned()));
}

async fn a_crashing_server_is_restarted_a_bounded_number_of_times(launcher: Launcher) {
    let mut crash = spec(launcher, guests::EXIT_MID_CALL);
    crash.name = "crash".into();
    let mut well = spec(launcher, guests::EVERYTHING);
    well.name = "well".into();
    let gateway = gateway(&[crash, well]);
    let session = gateway.session();
    for attempt in 0..=MAX_RESTARTS {
        let error = session.call("crash__attack", None).await.unwrap_err();
        assert!(
            error.message.contains("exited with code 3"),
            "attempt {attempt}: {}",
            error.message
        );
    }
    let error = session.call("crash__attack", None).await.unwrap_err();
    assert!(
        error.message.contains(&format!(
            "after {MAX_RESTARTS} restarts in this session; giving up"
        )),
        "{}",
        error.message
    );
    // The other server of the session is unaffected, and another session
    // starts afresh.
    let ok = session
        .call("well__add", args(json!({"a": 2, "b": 40})))
        .await
        .unwrap();
    assert_eq!(text(&ok), "42");
    let fresh = gateway.session();
    let error = fresh.call("crash__attack", None).await.unwrap_err();
    assert!(
        error.message.contains("exited with code 3"),
        "{}",
        error.message
    );
    assert!(session.close().await.is_empty());
    assert!(fresh.close().await.is_empty());
}

async fn a_crash_in_one_session_leaves_the_identical_server_of_another_mid_call(
    launcher: Launcher,
) {
    let mut x = spec(launcher, guests::EVERYTHING);
    x.name = "x".into();
    x.limits.memory_bytes = 64 << 20;
    x.limits.address_space_bytes = 1 << 30;
    let gateway = gateway(&[x]);
    let (a, b) = (gateway.session(), gateway.session());
    let call = call_in_flight(&a, "x", 4, 50).await;
    // b's identical server allocates past its limit and dies mid-call.
    let crash = b
        .call("x__blob", args(json!({"n": 2_000_000_000u64})))
        .await
        .unwrap_err();
    let expected = match launcher {
        Launcher::Wasm => "server `x` hit its memory limit: memory_bytes = 67108864 exceeded",
        Launcher::Native => {
            "server `x` hit its memory limit: address_space_bytes = 1073741824 exhausted"
        }
    };
    assert!(crash.message.contains(expected), "{}", crash.message);
    // a's call, on a's own instance, finishes as if nothing happened.
    let result = call.await.unwrap().expect("a's call completes");
    assert_eq!(result.is_error, Some(false));
    assert_eq!(text(&a.call("x__calls", None).await.unwrap()), "2");
    assert!(a.close().await.is_empty());
    assert!(b.close().await.is_empty());
}

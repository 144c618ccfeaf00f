//! The gateway's agent sessions, in process: namespaced tools across both
//! launchers, children per session reused by execution identity, crash
//! restarts bounded per session, close that drains then cancels, and
//! `list_changed` passed to the agent after the pin check.

#[macro_use]
mod common;

use std::path::Path;

use common::{Launcher, args, spec, text};
use moat_host::gateway::{Gateway, MAX_RESTARTS};
use moat_host::{Config, Host};
use moat_test_guests as guests;
use serde_json::json;
use tokio_util::sync::CancellationToken;

both_launchers!(
    a_crashing_server_is_restarted_a_bounded_number_of_times,
    close_lets_in_flight_calls_finish_then_refuses_new_ones,
    close_cancels_calls_still_running_at_the_drain_timeout,
    one_child_serves_names_of_the_same_execution_identity_within_a_session,
    tool_list_changes_reach_the_agent_after_the_pin_check,
    concurrent_sessions_have_their_own_children_and_answers,
    a_crash_in_one_session_leaves_the_identical_server_of_another_mid_call,
    servers_on_one_binary_with_other_tokens_and_grants_never_share_a_child,
    the_name_checks_instance_serves_the_first_session,
    a_slow_start_never_holds_the_sessions_calls_to_other_servers,
    a_tool_revoked_in_the_lock_is_hidden_and_refused_while_its_neighbours_answer,
    a_digest_revoked_while_serving_is_refused_where_it_already_runs,
    a_server_revoked_in_the_lock_at_start_launches_once_lifted,
    a_digest_revoked_under_load_drains_or_cancels_its_calls_and_stops_its_children,
    a_reload_gives_new_sessions_the_new_config_and_open_ones_keep_theirs,
    a_reloaded_lock_that_no_longer_matches_a_running_server_stops_it,
    the_agents_traceparent_reaches_the_server_and_a_bad_one_does_not,
    a_call_that_cannot_be_audited_gets_no_result_and_nothing_more_is_admitted,
);

fn gateway(servers: &[moat_host::ServerSpec]) -> Gateway {
    gateway_audited(servers, 30_000, None)
}

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

fn gateway_audited(
    servers: &[moat_host::ServerSpec],
    drain_timeout_ms: u64,
    audit: Option<&Path>,
) -> Gateway {
    let config = Config {
        path: "moat.toml".into(),
        servers: servers
            .iter()
            .map(|s| (s.name.clone(), s.clone()))
            .collect(),
        serve: moat_host::config::ServeSettings {
            drain_timeout_ms,
            ..Default::default()
        },
        wasm: Default::default(),
    };
    let audit = audit.map(|path| {
        std::sync::Arc::new(moat_host::audit::AuditLog::open(path, audit_key()).unwrap())
    });
    Gateway::new(host(), config, audit)
}

/// The audit key these tests write and verify with.
fn audit_key() -> moat_host::Key {
    moat_host::audit::key_in(
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("audit-key"),
        true,
    )
    .unwrap()
}

/// The audit log's events as (event, outcome) pairs.
fn audited(path: &Path) -> Vec<(String, String)> {
    moat_host::audit::verify(path, &audit_key()).unwrap();
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).unwrap();
            let field = |key: &str| event[key].as_str().unwrap_or_default().to_owned();
            (field("event"), field("outcome"))
        })
        .collect()
}

fn host() -> Host {
    Host::new(Some(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"),
    ))
    .unwrap()
}

/// Fails closed: once the audit log (here its anchor) cannot be written,
/// the call whose record failed gets the log's error instead of its result,
/// and every later call, in that session or a new one, is refused before
/// any server sees it; the log ends where it failed.
async fn a_call_that_cannot_be_audited_gets_no_result_and_nothing_more_is_admitted(
    launcher: Launcher,
) {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let gateway = gateway_audited(&[spec(launcher, guests::EVERYTHING)], 30_000, Some(&audit));
    let session = gateway.session();
    let add = || args(json!({"a": 1, "b": 2}));
    let result = session.call("everything__add", add()).await.unwrap();
    assert_eq!(text(&result), "3");
    assert!(gateway.audit_failure().is_none());

    // The anchor cannot be replaced: its temporary name is a directory.
    let tmp = dir.path().join("audit.jsonl.anchor.tmp");
    std::fs::create_dir(&tmp).unwrap();
    let expected = format!(
        "audit log {} cannot be written ({}: Is a directory (os error 21)): Moat admits no calls until it can record them; free space (or fix the error) and restart Moat",
        audit.display(),
        moat_host::audit::anchor_path(&audit).display()
    );
    let error = session.call("everything__add", add()).await.unwrap_err();
    assert_eq!(error.message, expected, "the answer is withheld");
    std::fs::remove_dir(&tmp).unwrap();

    // Nothing more is admitted, though the anchor could be written again.
    let launches = gateway.host().launches();
    let again = session.call("everything__add", add()).await.unwrap_err();
    assert_eq!(again.message, expected);
    let other = gateway.session();
    let refused = other.call("everything__add", add()).await.unwrap_err();
    assert_eq!(refused.message, expected);
    assert_eq!(gateway.host().launches(), launches, "no server started");
    assert_eq!(
        gateway.audit_failure().map(|e| e.to_string()),
        Some(expected)
    );
    assert!(other.close().await.is_empty());
    assert!(session.close().await.is_empty());

    // The failed call's line got in, the anchor did not move, and nothing
    // was written after it.
    assert_eq!(
        moat_host::audit::verify(&audit, &audit_key()).unwrap(),
        moat_host::audit::Verified {
            lines: 4,
            unanchored: 1
        }
    );
    let kinds: Vec<String> = audited(&audit).into_iter().map(|(e, _)| e).collect();
    assert_eq!(
        kinds,
        ["session_open", "server_launch", "tool_call", "tool_call"]
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

async fn one_child_serves_names_of_the_same_execution_identity_within_a_session(
    launcher: Launcher,
) {
    let named = |name: &str| {
        let mut spec = spec(launcher, guests::EVERYTHING);
        spec.name = name.into();
        spec
    };
    let mut other_env = named("c");
    other_env.env.insert("EXTRA".into(), "1".into());
    let gateway = gateway(&[named("a"), named("b"), other_env]);
    let calls = |session: moat_host::gateway::AgentSession, server: &'static str| async move {
        let result = session
            .call(&format!("{server}__calls"), None)
            .await
            .unwrap();
        text(&result)
    };
    let first = gateway.session();
    assert_eq!(calls(first.clone(), "a").await, "1");
    // A native server's argv[0] is its command, so `a` and `b` have one
    // execution identity and share a child. A wasm server's argv[0] is its
    // server name: `b` is a different execution and gets its own instance.
    let shared = calls(first.clone(), "b").await;
    match launcher {
        Launcher::Native => assert_eq!(shared, "2", "b reused a's child"),
        Launcher::Wasm => assert_eq!(shared, "1", "argv[0] differs: not the same identity"),
    }
    // Other environment values: another child, whatever the launcher.
    assert_eq!(calls(first.clone(), "c").await, "1");
    // Never shared across sessions.
    let second = gateway.session();
    assert_eq!(calls(second.clone(), "b").await, "1");
    assert!(first.close().await.is_empty());
    assert!(second.close().await.is_empty());
}

/// An agent that counts `notifications/tools/list_changed`.
#[derive(Clone, Default)]
struct Agent {
    changed: std::sync::Arc<tokio::sync::Notify>,
}

impl moat_host::rmcp::ClientHandler for Agent {
    async fn on_tool_list_changed(
        &self,
        _context: moat_host::rmcp::service::NotificationContext<moat_host::rmcp::RoleClient>,
    ) {
        self.changed.notify_one();
    }
}

async fn tool_list_changes_reach_the_agent_after_the_pin_check(launcher: Launcher) {
    use moat_host::lock::{LOCK_VERSION, Lock};
    use moat_host::rmcp::ServiceExt;
    let mut x = spec(launcher, guests::EVERYTHING);
    x.name = "x".into();
    let locked = host().measure(&x).await.unwrap();
    let lock = Lock {
        version: LOCK_VERSION,
        revoked: Vec::new(),
        servers: [("x".to_owned(), locked)].into(),
    };
    let config = Config {
        path: "moat.toml".into(),
        servers: [("x".to_owned(), x)].into(),
        serve: Default::default(),
        wasm: Default::default(),
    };
    let gateway = Gateway::new(host().with_lock(lock, "moat.lock".into()), config, None);
    let session = gateway.session();
    let (agent_io, gateway_io) = tokio::io::duplex(64 << 10);
    let serving = tokio::spawn(session.clone().serve(gateway_io));
    let agent = Agent::default();
    let client = agent.clone().serve(agent_io).await.unwrap();
    let _server = serving.await.unwrap().unwrap();
    let names = |tools: Vec<moat_host::rmcp::model::Tool>| {
        tools
            .into_iter()
            .map(|t| t.name.to_string())
            .collect::<Vec<_>>()
    };
    assert!(names(client.list_all_tools().await.unwrap()).contains(&"x__echo".to_owned()));
    let mut drift = moat_host::rmcp::model::CallToolRequestParams::new("x__drift");
    drift.arguments = args(json!({"on": true}));
    client.call_tool(drift).await.unwrap();
    agent.changed.notified().await;
    // By the time the agent hears of it, the drifted tool is withdrawn.
    let now = names(client.list_all_tools().await.unwrap());
    assert!(!now.contains(&"x__echo".to_owned()), "{now:?}");
    assert!(now.contains(&"x__add".to_owned()), "{now:?}");
    client.cancel().await.unwrap();
    assert!(session.close().await.is_empty());
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

async fn concurrent_sessions_have_their_own_children_and_answers(launcher: Launcher) {
    let mut e = spec(launcher, guests::EVERYTHING);
    e.name = "e".into();
    let mut r = spec(launcher, guests::REPORT);
    r.name = "r".into();
    let gateway = gateway(&[e, r]);
    let (a, b) = (gateway.session(), gateway.session());
    // Both sessions call at once, 20 times each, each with its own words.
    let chatter = |session: moat_host::gateway::AgentSession, who: &'static str| async move {
        let mut calls = Vec::new();
        for i in 0..20 {
            let session = session.clone();
            calls.push(tokio::spawn(async move {
                let message = format!("{who}-{i}");
                let result = session
                    .call("e__echo", args(json!({"message": message})))
                    .await
                    .unwrap();
                assert_eq!(text(&result), message, "an answer crossed sessions");
            }));
        }
        for call in calls {
            call.await.unwrap();
        }
        text(&session.call("e__calls", None).await.unwrap())
    };
    let (seen_a, seen_b) = tokio::join!(chatter(a.clone(), "a"), chatter(b.clone(), "b"));
    // Each session's instance counted only its own calls.
    assert_eq!((seen_a.as_str(), seen_b.as_str()), ("21", "21"));
    let report = |session: moat_host::gateway::AgentSession| async move {
        let result = session.call("r__attack", None).await.unwrap();
        serde_json::from_str::<serde_json::Value>(&text(&result)).unwrap()
    };
    let (report_a, report_b) = (report(a.clone()).await, report(b.clone()).await);
    match launcher {
        Launcher::Native => {
            // Each server is PID 1 of its own namespace: told apart, and
            // found on the host, by that namespace.
            let (ns_a, ns_b) = (
                report_a["pid_ns"].as_str().unwrap().to_owned(),
                report_b["pid_ns"].as_str().unwrap().to_owned(),
            );
            assert_ne!(ns_a, ns_b, "one process served two sessions");
            let alive = |ns: &str| {
                std::fs::read_dir("/proc").unwrap().any(|entry| {
                    let path = entry.unwrap().path().join("ns/pid");
                    std::fs::read_link(path).is_ok_and(|link| link == Path::new(ns))
                })
            };
            assert!(alive(&ns_a));
            assert!(a.close().await.is_empty());
            // a's child is gone (reaped), b's is still there and answering.
            assert!(!alive(&ns_a));
            assert!(alive(&ns_b));
        }
        Launcher::Wasm => {
            assert!(report_a["pid"].is_null());
            assert!(a.close().await.is_empty());
        }
    }
    assert_eq!(text(&b.call("e__calls", None).await.unwrap()), "22");
    assert!(a.call("e__calls", None).await.is_err(), "a is closed");
    assert!(b.close().await.is_empty());
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

/// `github-work` and `github-personal`: one binary, one argv, two tokens and
/// two grants. After the agent lists the tools (which starts both), each
/// call runs in its own server's process, with its own token and its own
/// directory, and the audit log names the server the agent asked for.
async fn servers_on_one_binary_with_other_tokens_and_grants_never_share_a_child(
    launcher: Launcher,
) {
    use moat_host::config::{DirGrant, DirMode};
    let dir = tempfile::tempdir().unwrap();
    let server = |name: &str| {
        let data = dir.path().join(name);
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("secret"), format!("{name}'s file")).unwrap();
        let mut spec = spec(launcher, guests::PROBE);
        spec.name = name.into();
        spec.env.insert("TOKEN".into(), format!("{name}-token"));
        spec.dirs = vec![DirGrant {
            host: data.clone(),
            guest: data.display().to_string(),
            mode: DirMode::Ro,
            inode: None,
        }];
        spec
    };
    let work = server("work");
    let personal = server("personal");
    let audit = dir.path().join("audit.jsonl");
    let gateway = gateway_audited(&[work, personal], 30_000, Some(&audit));
    let session = gateway.session();
    let names = exposed(&session).await;
    assert_eq!(names, ["personal__attack", "work__attack"]);
    let probe = |server: &'static str, arguments: serde_json::Value| {
        let session = session.clone();
        async move {
            let result = session
                .call(&format!("{server}__attack"), args(arguments))
                .await
                .unwrap();
            serde_json::from_str::<serde_json::Value>(&text(&result)).unwrap()
        }
    };
    for (me, other) in [("work", "personal"), ("personal", "work")] {
        let token = probe(me, json!({"op": "env", "name": "TOKEN"})).await;
        assert_eq!(token, json!({"ok": true, "data": format!("{me}-token")}));
        let mine = dir.path().join(me).join("secret");
        let read = probe(me, json!({"op": "read", "path": mine})).await;
        assert_eq!(read, json!({"ok": true, "data": format!("{me}'s file")}));
        let theirs = dir.path().join(other).join("secret");
        let denied = probe(me, json!({"op": "read", "path": theirs})).await;
        assert_eq!(
            denied["ok"],
            json!(false),
            "{me} read {other}'s file: {denied}"
        );
    }
    assert!(session.close().await.is_empty());
    let calls: Vec<(String, String)> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|event| event["event"] == "tool_call")
        .map(|event| {
            let token = |key: &str| event[key].as_str().unwrap_or_default().to_owned();
            (token("server"), token("tool"))
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("work".to_owned(), "attack".to_owned()),
            ("work".to_owned(), "attack".to_owned()),
            ("work".to_owned(), "attack".to_owned()),
            ("personal".to_owned(), "attack".to_owned()),
            ("personal".to_owned(), "attack".to_owned()),
            ("personal".to_owned(), "attack".to_owned()),
        ]
    );
    let launches = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .filter(|line| line.contains("\"server_launch\""))
        .count();
    assert_eq!(launches, 2, "one child per server");
}

/// A `[[revoked]]` tool in moat.lock: hidden from the agent's list, each
/// call refused with who revoked it and why (before it reaches the server),
/// while the same server's other tools answer.
async fn a_tool_revoked_in_the_lock_is_hidden_and_refused_while_its_neighbours_answer(
    launcher: Launcher,
) {
    use moat_host::lock::{LOCK_VERSION, Lock};
    let mut x = spec(launcher, guests::EVERYTHING);
    x.name = "x".into();
    let locked = host().measure(&x).await.unwrap();
    let target: moat_host::revoke::Target = "x__echo".parse().unwrap();
    let lock = Lock {
        version: LOCK_VERSION,
        revoked: vec![moat_host::revoke::revocation(&target, "leaks its input")],
        servers: [("x".to_owned(), locked)].into(),
    };
    let config = Config {
        path: "moat.toml".into(),
        servers: [("x".to_owned(), x)].into(),
        serve: Default::default(),
        wasm: Default::default(),
    };
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let log = std::sync::Arc::new(moat_host::audit::AuditLog::open(&audit, audit_key()).unwrap());
    let gateway = Gateway::new(
        host().with_lock(lock.clone(), "moat.lock".into()),
        config,
        Some(log),
    );
    let session = gateway.session();
    let names = exposed(&session).await;
    assert!(!names.contains(&"x__echo".to_owned()), "{names:?}");
    assert!(names.contains(&"x__add".to_owned()), "{names:?}");
    let refused = session
        .call("x__echo", args(json!({"text": "secret"})))
        .await
        .unwrap_err();
    assert_eq!(
        refused.message,
        format!(
            "tool `echo` on server `x` is refused: {}",
            moat_host::revoke::describe(&lock.revoked[0])
        )
    );
    assert!(refused.message.ends_with(": leaks its input"));
    let result = session
        .call("x__add", args(json!({"a": 1, "b": 2})))
        .await
        .unwrap();
    assert_eq!(text(&result), "3");
    assert!(session.close().await.is_empty());
    let calls: Vec<String> = audited(&audit)
        .into_iter()
        .filter(|(event, _)| event == "tool_call")
        .map(|(_, outcome)| outcome)
        .collect();
    assert_eq!(calls, ["ok"], "a refused call never reached the server");
}

/// Revocations read again while serving (SIGHUP) are in force in every
/// session from its next call, also where the revoked digest already runs;
/// the other server answers throughout, and lifting the revocation lets the
/// server run again. Both changes are audited.
async fn a_digest_revoked_while_serving_is_refused_where_it_already_runs(launcher: Launcher) {
    use moat_host::revoke::Revoked;
    let mut x = spec(launcher, guests::EVERYTHING);
    x.name = "x".into();
    let other = other_than(launcher);
    let mut y = spec(other, guests::EVERYTHING);
    y.name = "y".into();
    let digest = host().measure(&x).await.unwrap().sha256;
    if matches!(launcher, Launcher::Native) {
        // Only a measured launch has a digest to match: a native server
        // run without a pin is revoked by name.
        x.sha256 = Some(digest.parse().unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let gateway = gateway_audited(&[x, y], 30_000, Some(&audit));
    let session = gateway.session();
    let add = args(json!({"a": 1, "b": 2}));
    assert_eq!(
        text(&session.call("x__add", add.clone()).await.unwrap()),
        "3"
    );
    let (lock, enforced) = revoke_digest(&gateway, &digest).await;
    let target = &lock.revoked[0].target;
    assert_eq!((enforced.added, enforced.stopped), (1, 1), "{enforced:?}");
    let expected = format!(
        "server `x` is refused: {}",
        moat_host::revoke::describe(&lock.revoked[0])
    );
    let refused = session.call("x__add", add.clone()).await.unwrap_err();
    assert_eq!(refused.message, expected, "refused where it already runs");
    assert_eq!(
        text(&session.call("y__add", add.clone()).await.unwrap()),
        "3"
    );
    let names = exposed(&session).await;
    assert!(names.iter().all(|n| n.starts_with("y__")), "{names:?}");
    let fresh = gateway.session();
    let refused = fresh.call("x__add", add.clone()).await.unwrap_err();
    assert_eq!(refused.message, expected, "and in a new session");
    let enforced = gateway.set_revocations(Revoked::default(), "test").await;
    assert_eq!((enforced.added, enforced.lifted), (0, 1), "lifted");
    assert_eq!(text(&fresh.call("x__add", add).await.unwrap()), "3");
    assert!(session.close().await.is_empty());
    assert!(fresh.close().await.is_empty());
    let revokes: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == "revoke")
        .collect();
    assert_eq!(revokes.len(), 2, "{revokes:?}");
    assert_eq!(revokes[0]["target"], target.to_string());
    assert_eq!(revokes[0]["lifted"], false);
    assert_eq!(revokes[0]["reason"], "compromised build");
    assert_eq!(revokes[1]["lifted"], true);
}

/// The names the session exposes to the agent.
async fn exposed(session: &moat_host::gateway::AgentSession) -> Vec<String> {
    session
        .tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect()
}

/// A server revoked by name in the lock the gateway started with is never
/// launched (the host refuses it); once moat.lock is read again without the
/// entry, the same gateway launches it.
async fn a_server_revoked_in_the_lock_at_start_launches_once_lifted(launcher: Launcher) {
    use moat_host::lock::{LOCK_VERSION, Lock};
    let mut x = spec(launcher, guests::EVERYTHING);
    x.name = "x".into();
    let locked = host().measure(&x).await.unwrap();
    let lock = Lock {
        version: LOCK_VERSION,
        revoked: vec![moat_host::revoke::revocation(&"x".parse().unwrap(), "")],
        servers: [("x".to_owned(), locked)].into(),
    };
    let config = Config {
        path: "moat.toml".into(),
        servers: [("x".to_owned(), x)].into(),
        serve: Default::default(),
        wasm: Default::default(),
    };
    let host = host().with_lock(lock, "moat.lock".into());
    let gateway = Gateway::new(host.clone(), config, None);
    let session = gateway.session();
    let add = args(json!({"a": 1, "b": 2}));
    let refused = session.call("x__add", add.clone()).await.unwrap_err();
    assert!(
        refused
            .message
            .starts_with("tool `add` on server `x` is refused: `x` was revoked by "),
        "{}",
        refused.message
    );
    assert_eq!(host.launches(), 0, "nothing started");
    gateway
        .set_revocations(moat_host::revoke::Revoked::default(), "test")
        .await;
    assert_eq!(text(&session.call("x__add", add).await.unwrap()), "3");
    assert!(session.close().await.is_empty());
}

/// The kill switch under load: 10 agent sessions, 100 calls. With 30 calls
/// in flight (per session: a 60 s sleep and a 1 s sleep on the server about
/// to be revoked, a 1 s sleep on its neighbour), its digest is revoked: the
/// short calls end within the drain timeout, the long ones are cancelled
/// with an error that names the revocation, none is lost or left
/// unanswered, its ten children stop (none runs afterwards), later calls
/// are refused, and the neighbour (the other launcher) answers throughout.
async fn a_digest_revoked_under_load_drains_or_cancels_its_calls_and_stops_its_children(
    launcher: Launcher,
) {
    const SESSIONS: usize = 10;
    // Unique to this test: the host (and /proc) are shared with the others.
    let marker = format!("revoked-under-load-{launcher:?}-{}", std::process::id());
    let mut doomed = spec(launcher, guests::EVERYTHING);
    doomed.name = "doomed".into();
    doomed.env.insert("MOAT_TEST_MARKER".into(), marker.clone());
    let other = other_than(launcher);
    let mut kept = spec(other, guests::EVERYTHING);
    kept.name = "kept".into();
    let digest = host().measure(&doomed).await.unwrap().sha256;
    // A native server is matched by digest only when it is pinned.
    doomed.sha256 = Some(digest.parse().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let gateway = gateway_audited(&[doomed, kept], 2_500, Some(&audit));
    let sessions: Vec<_> = (0..SESSIONS).map(|_| gateway.session()).collect();
    let add = args(json!({"a": 1, "b": 2}));
    let sleep = |ms: u64| args(json!({ "ms": ms }));
    let mut answered = 0;
    // Before: 20 calls, each session starting its two children.
    for session in &sessions {
        for tool in ["doomed__add", "kept__add"] {
            assert_eq!(text(&session.call(tool, add.clone()).await.unwrap()), "3");
            answered += 1;
        }
    }
    assert_eq!(gateway.host().running("doomed"), SESSIONS);
    // During: 30 calls in flight.
    let mut long = Vec::new();
    let mut short = Vec::new();
    let mut neighbour = Vec::new();
    for session in &sessions {
        for (calls, tool, ms) in [
            (&mut long, "doomed__sleep", 60_000),
            (&mut short, "doomed__sleep", 1_000),
            (&mut neighbour, "kept__sleep", 1_000),
        ] {
            let session = session.clone();
            let arguments = sleep(ms);
            calls.push(tokio::spawn(
                async move { session.call(tool, arguments).await },
            ));
        }
    }
    while gateway.calls_in_flight() < 3 * SESSIONS {
        assert!(
            !short.iter().chain(&neighbour).any(|c| c.is_finished()),
            "a 1 s call ended before the 30 calls were in flight"
        );
        tokio::task::yield_now().await;
    }
    let (lock, enforced) = revoke_digest(&gateway, &digest).await;

    let refusal = format!(
        "server `doomed` is refused: {}",
        moat_host::revoke::describe(&lock.revoked[0])
    );
    let cancelled =
        format!("tool `sleep` on server `doomed`: the call was cancelled in flight: {refusal}");
    assert_eq!(enforced.added, 1);
    assert_eq!(enforced.stopped, SESSIONS, "{enforced:?}");
    assert_eq!(
        enforced.drained + enforced.cancelled,
        2 * SESSIONS,
        "every call in flight to it counted once: {enforced:?}"
    );
    assert!(enforced.cancelled >= SESSIONS, "{enforced:?}");
    assert_eq!(
        gateway.host().running("doomed"),
        0,
        "no instance of the revoked server runs"
    );
    if launcher == Launcher::Native {
        assert_eq!(processes_with_env("MOAT_TEST_MARKER", &marker), 0);
    }
    for call in long {
        let error = call.await.unwrap().unwrap_err();
        assert_eq!(error.message, cancelled);
        answered += 1;
    }
    for call in short {
        match call.await.unwrap() {
            Ok(result) => assert_eq!(text(&result), "slept 1000 ms"),
            Err(error) => assert_eq!(error.message, cancelled),
        }
        answered += 1;
    }
    for call in neighbour {
        assert_eq!(text(&call.await.unwrap().unwrap()), "slept 1000 ms");
        answered += 1;
    }
    // After: 50 calls; the revoked server is refused, its neighbour answers.
    for session in &sessions {
        for tool in [
            "doomed__add",
            "kept__add",
            "doomed__echo",
            "kept__add",
            "kept__add",
        ] {
            let arguments = match tool {
                "doomed__echo" => args(json!({"message": "hi"})),
                _ => add.clone(),
            };
            match session.call(tool, arguments).await {
                Ok(result) => {
                    assert!(tool.starts_with("kept__"), "{tool} answered");
                    assert_eq!(text(&result), "3");
                }
                Err(error) => {
                    assert!(tool.starts_with("doomed__"), "{tool}: {}", error.message);
                    assert_eq!(error.message, refusal);
                }
            }
            answered += 1;
        }
    }
    assert_eq!(answered, 100);
    assert_eq!(
        gateway.host().running("doomed"),
        0,
        "refused calls start nothing"
    );
    for session in &sessions {
        assert!(session.close().await.is_empty());
    }
    let events: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let exits = events
        .iter()
        .filter(|e| e["event"] == "server_exit" && e["server"] == "doomed")
        .map(|e| e["outcome"].as_str().unwrap_or_default().to_owned())
        .collect::<Vec<_>>();
    assert_eq!(exits, vec!["revoked"; SESSIONS], "{exits:?}");
    let revokes = events.iter().filter(|e| e["event"] == "revoke").count();
    assert_eq!(revokes, 1);
}

/// Processes whose environment holds `name=value`.
fn processes_with_env(name: &str, value: &str) -> usize {
    let wanted = format!("{name}={value}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|entry| {
            std::fs::read(entry.path().join("environ")).is_ok_and(|environ| {
                environ
                    .split(|b| *b == 0)
                    .any(|var| var == wanted.as_bytes())
            })
        })
        .count()
}

/// The `[servers.NAME]` table that runs `guest` under `launcher`, unpinned.
fn server_toml(name: &str, launcher: Launcher, guest: moat_test_guests::Guest) -> String {
    let (key, path) = match launcher {
        Launcher::Wasm => ("wasm", guest.wasm),
        Launcher::Native => ("command", guest.native),
    };
    format!("[servers.{name}]\n{key} = {path:?}\nallow_unmeasured = true\n")
}

/// A gateway on the config at `path` (and the moat.lock beside it, if
/// any), audited to `audit`, as `moat serve` starts one.
async fn gateway_on_disk(path: &Path, audit: &Path) -> Gateway {
    let config = Config::load(path).unwrap();
    let mut host = host();
    if let Some(lock) = moat_host::lock::Lock::load(&moat_host::lock::Lock::path_for(path)).unwrap()
    {
        host = host.with_lock(lock, moat_host::lock::Lock::path_for(path));
    }
    let audit = std::sync::Arc::new(moat_host::audit::AuditLog::open(audit, audit_key()).unwrap());
    let gateway = Gateway::new(host, config, Some(audit));
    if !gateway.host().is_locked() {
        gateway.check_names().await;
    }
    gateway
}

/// The audit log's events of `kind`.
fn events_of(audit: &Path, kind: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == kind)
        .collect()
}

/// Reload (SIGHUP, --watch): a session opened after it sees the new
/// config's servers, the session opened before keeps its own and goes on
/// answering; a config that no longer parses changes nothing, names the
/// file and line, and is audited.
async fn a_reload_gives_new_sessions_the_new_config_and_open_ones_keep_theirs(launcher: Launcher) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moat.toml");
    let audit = dir.path().join("audit.jsonl");
    std::fs::write(&path, server_toml("a", launcher, guests::EVERYTHING)).unwrap();
    let gateway = gateway_on_disk(&path, &audit).await;
    let before = gateway.session();
    let add = args(json!({"a": 1, "b": 2}));
    assert_eq!(
        text(&before.call("a__add", add.clone()).await.unwrap()),
        "3"
    );

    std::fs::write(
        &path,
        server_toml("a", launcher, guests::EVERYTHING)
            + &server_toml("b", launcher, guests::EVERYTHING),
    )
    .unwrap();
    let reloaded = gateway.reload("test").await.unwrap();
    assert_eq!((reloaded.generation, reloaded.servers), (2, 2));
    assert_eq!(reloaded.enforced.stopped, 0, "nothing stale: no lock");
    let after = gateway.session();
    assert_eq!(text(&after.call("b__add", add.clone()).await.unwrap()), "3");
    let names = exposed(&after).await;
    assert!(names.contains(&"a__add".to_owned()) && names.contains(&"b__add".to_owned()));
    let refused = before.call("b__add", add.clone()).await.unwrap_err();
    assert_eq!(refused.message, r#"no server "b" behind tool "b__add""#);
    assert_eq!(
        text(&before.call("a__add", add.clone()).await.unwrap()),
        "3"
    );
    assert!(exposed(&before).await.iter().all(|n| n.starts_with("a__")));

    std::fs::write(&path, "[servers.a\n").unwrap();
    let error = gateway.reload("test").await.unwrap_err().to_string();
    assert!(
        error.starts_with(&format!("{}:1:", path.display())),
        "{error}"
    );
    assert_eq!(gateway.generation(), 2, "unchanged");
    let later = gateway.session();
    assert_eq!(text(&later.call("b__add", add).await.unwrap()), "3");
    let reloads = events_of(&audit, "reload");
    assert_eq!(reloads.len(), 2, "{reloads:?}");
    assert_eq!(reloads[0]["outcome"], "reloaded");
    assert_eq!(reloads[0]["generation"], 2);
    assert_eq!(reloads[1]["outcome"], "refused");
    assert_eq!(reloads[1]["error"], error.as_str());
    for session in [before, after, later] {
        assert!(session.close().await.is_empty());
    }
    assert!(gateway.close_all().await.is_empty());
}

/// A reloaded lock that no longer matches what a session runs (the server
/// was re-pinned with another environment, so another execution identity)
/// stops it in that session at once, as a revocation does, and refuses it
/// there from then on, saying why; a new session runs the newly pinned
/// server, and a server whose entry did not change keeps running.
async fn a_reloaded_lock_that_no_longer_matches_a_running_server_stops_it(launcher: Launcher) {
    use moat_host::lock::Lock;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moat.toml");
    let audit = dir.path().join("audit.jsonl");
    let lock_path = Lock::path_for(&path);
    let write = |extra_env: &str| {
        let mut text = server_toml("a", launcher, guests::EVERYTHING);
        text.push_str(extra_env);
        text.push_str(&server_toml("b", launcher, guests::EVERYTHING));
        // Not one child for both names: b differs from a in more than its name.
        text.push_str("env = { SERVER = \"b\" }\n");
        std::fs::write(&path, &text).unwrap();
        text
    };
    let relock = async || {
        let config = Config::load(&path).unwrap();
        let mut lock = Lock::load(&lock_path).unwrap().unwrap_or_default();
        lock.version = moat_host::lock::LOCK_VERSION;
        for (name, spec) in &config.servers {
            lock.servers
                .insert(name.clone(), host().measure(spec).await.unwrap());
        }
        lock.write(&lock_path).unwrap();
    };
    write("");
    relock().await;
    let gateway = gateway_on_disk(&path, &audit).await;
    let before = gateway.session();
    let add = args(json!({"a": 1, "b": 2}));
    for tool in ["a__add", "b__add"] {
        assert_eq!(text(&before.call(tool, add.clone()).await.unwrap()), "3");
    }
    assert_eq!(gateway.host().running("a"), 1);

    write("env = { EVERYTHING_DRIFT = \"0\" }\n");
    relock().await;
    let reloaded = gateway.reload("test").await.unwrap();
    assert_eq!(reloaded.enforced.stopped, 1, "{reloaded:?}");
    assert_eq!(gateway.host().running("a"), 0, "a's child stopped");
    let refused = before.call("a__add", add.clone()).await.unwrap_err();
    assert_eq!(
        refused.message,
        "server `a` is refused in this session: moat.lock was reloaded and no longer matches what this session runs (its execution identity changed in the lock); a new session runs what the lock pins now"
    );
    assert_eq!(
        text(&before.call("b__add", add.clone()).await.unwrap()),
        "3"
    );
    let after = gateway.session();
    assert_eq!(text(&after.call("a__add", add).await.unwrap()), "3");
    let exits: Vec<_> = events_of(&audit, "server_exit")
        .into_iter()
        .filter(|e| e["server"] == "a")
        .map(|e| e["outcome"].clone())
        .collect();
    assert_eq!(exits, vec![serde_json::json!("stale")]);

    // What a reload may not do changes nothing, and says why.
    let good = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("[wasm]\npool_instances = 7\n{good}")).unwrap();
    let error = gateway.reload("test").await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{}: the [wasm] table changed, and the engine cannot change while serving: restart `moat serve` to apply it",
            path.display()
        )
    );
    std::fs::write(&path, &good).unwrap();
    std::fs::remove_file(&lock_path).unwrap();
    let error = gateway.reload("test").await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{} is gone: a reload never drops the pins of a gateway that enforces a lock (restart `moat serve` to run without one)",
            lock_path.display()
        )
    );
    assert_eq!(gateway.generation(), 2);
    assert!(gateway.host().is_locked());
    let refusals = events_of(&audit, "reload")
        .iter()
        .filter(|e| e["outcome"] == "refused")
        .count();
    assert_eq!(refusals, 2);
    for session in [before, after] {
        assert!(session.close().await.is_empty());
    }
    assert!(gateway.close_all().await.is_empty());
}

/// Trace context: the `traceparent` in an agent's `_meta` is passed on in
/// the `_meta` of the call the server gets (unchanged, as no exporter runs
/// in this process); one that is not a valid W3C traceparent is dropped.
async fn the_agents_traceparent_reaches_the_server_and_a_bad_one_does_not(launcher: Launcher) {
    let mut report = spec(launcher, guests::REPORT);
    report.name = "r".into();
    let gateway = gateway(&[report]);
    let session = gateway.session();
    let sent = |traceparent: Option<&'static str>| {
        let session = session.clone();
        async move {
            let result = session
                .call_forwarding(
                    "r__attack",
                    None,
                    None,
                    CancellationToken::new(),
                    traceparent,
                )
                .await
                .unwrap();
            serde_json::from_str::<serde_json::Value>(&text(&result)).unwrap()["meta"].clone()
        }
    };
    let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    assert_eq!(sent(Some(good)).await["traceparent"], good);
    let bad = sent(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-zz-01")).await;
    assert!(bad.get("traceparent").is_none(), "{bad}");
    assert!(sent(None).await.get("traceparent").is_none());
    assert!(session.close().await.is_empty());
}

/// The launcher a neighbour runs under: the other one.
fn other_than(launcher: Launcher) -> Launcher {
    match launcher {
        Launcher::Wasm => Launcher::Native,
        Launcher::Native => Launcher::Wasm,
    }
}

/// Revokes `sha256:DIGEST` ("compromised build") as a re-read moat.lock
/// would: the lock holding the revocation, and what putting it in force did.
async fn revoke_digest(
    gateway: &Gateway,
    digest: &str,
) -> (moat_host::lock::Lock, moat_host::gateway::Enforced) {
    use moat_host::lock::{LOCK_VERSION, Lock};
    let target = format!("sha256:{digest}").parse().unwrap();
    let lock = Lock {
        version: LOCK_VERSION,
        revoked: vec![moat_host::revoke::revocation(&target, "compromised build")],
        ..Lock::default()
    };
    let enforced = gateway.set_revocations(lock.revocations(), "test").await;
    (lock, enforced)
}

// The 2026-07-28 answers besides a result, carried between an agent and the
// server that gave them. Two `rounds` servers behind one gateway, one under
// each launcher, each naming itself in its answers.

/// A gateway in front of `a` (the `rounds` guest as wasm) and `b` (the same
/// guest native).
fn rounds_gateway() -> Gateway {
    gateway(&rounds_servers())
}

fn rounds_servers() -> Vec<moat_host::ServerSpec> {
    [("a", Launcher::Wasm), ("b", Launcher::Native)]
        .into_iter()
        .map(|(name, launcher)| {
            let mut server = spec(launcher, guests::ROUNDS);
            server.name = name.into();
            server.env.insert("ROUNDS_NAME".into(), name.into());
            server
        })
        .collect()
}

type AgentClient = moat_host::rmcp::service::RunningService<
    moat_host::rmcp::RoleClient,
    moat_host::rmcp::model::ClientConfig,
>;

/// The gateway's end of an agent's connection, kept while the agent talks
/// (on 2026-07-28 it is up once the first request after `server/discover`
/// arrives, so it is not awaited here).
type Serving = tokio::task::JoinHandle<
    Result<
        moat_host::rmcp::service::RunningService<
            moat_host::rmcp::RoleServer,
            moat_host::gateway::AgentSession,
        >,
        moat_host::rmcp::service::ServerInitializeError,
    >,
>;

/// An agent on `session` on 2026-07-28 (`server/discover`), declaring the
/// tasks extension when `tasks`.
async fn rounds_agent(
    session: &moat_host::gateway::AgentSession,
    tasks: bool,
) -> (AgentClient, Serving) {
    use moat_host::rmcp::ServiceExt;
    use moat_host::rmcp::model::{ClientCapabilities, ClientConfig, ProtocolVersion};
    let (agent_io, gateway_io) = tokio::io::duplex(64 << 10);
    let serving = tokio::spawn(session.clone().serve(gateway_io));
    let mut info = ClientConfig::default();
    if tasks {
        info.capabilities = ClientCapabilities::builder().enable_tasks().build();
    }
    let lifecycle = moat_host::rmcp::ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    let client = moat_host::rmcp::ClientServiceExt::serve_with_lifecycle(info, agent_io, lifecycle)
        .await
        .unwrap();
    (client, serving)
}

fn call(name: &str, arguments: serde_json::Value) -> moat_host::rmcp::model::CallToolRequestParams {
    let mut params = moat_host::rmcp::model::CallToolRequestParams::new(name.to_owned());
    params.arguments = args(arguments);
    params
}

/// A multi round-trip request: the server's request for input reaches an
/// agent on 2026-07-28 as the server worded it, and the agent's retry (its
/// answers and the server's `requestState`, unchanged) reaches the server
/// that asked. An older agent is asked with its own requests instead, if it
/// takes them.
#[tokio::test]
async fn a_multi_round_trip_request_comes_back_to_the_server_that_asked() {
    use moat_host::rmcp::model::CallToolResponse;
    let gateway = rounds_gateway();
    let session = gateway.session();
    let (agent, _serving) = rounds_agent(&session, false).await;
    for server in ["a", "b"] {
        let asked = match agent
            .call_tool_once(call(&format!("{server}__ask"), json!({})))
            .await
        {
            Ok(CallToolResponse::InputRequired(asked)) => asked,
            other => panic!("{server}: {other:?}"),
        };
        assert_eq!(
            asked.request_state.as_deref(),
            Some(&*format!("{server}:round-1"))
        );
        let requests = serde_json::to_value(asked.input_requests.as_ref().unwrap()).unwrap();
        assert_eq!(
            requests["name"]["method"], "elicitation/create",
            "{requests}"
        );
        assert_eq!(
            requests["name"]["params"]["message"], "Your name?",
            "{requests}"
        );

        let mut retry = call(&format!("{server}__ask"), json!({}));
        retry.input_responses = Some(
            [(
                "name".to_owned(),
                json!({"action": "accept", "content": {"name": "Ada"}}),
            )]
            .into(),
        );
        retry.request_state = asked.request_state.clone();
        let answer = match agent.call_tool_once(retry).await {
            Ok(CallToolResponse::Complete(result)) => result,
            other => panic!("{server}: {other:?}"),
        };
        assert_eq!(
            text(&answer),
            format!("{server}: hello Ada ({server}:round-1)")
        );
    }
    agent.cancel().await.unwrap();

    // An agent on 2025-11-25 that takes elicitations is asked with its own
    // `elicitation/create`, and Moat calls the server again with its answer.
    let legacy = gateway.session();
    let (agent, _serving) = legacy_agent(&legacy, Some("Bob")).await;
    let answer = agent.call_tool(call("b__ask", json!({}))).await.unwrap();
    assert_eq!(text(&answer), "b: hello Bob (b:round-1)");
    agent.cancel().await.unwrap();
    // One that does not take them gets an error that says why, and the
    // session goes on.
    let (agent, _serving) = legacy_agent(&legacy, None).await;
    let error = agent
        .call_tool(call("a__ask", json!({})))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains(
            "tool `ask` on server `a` asks the caller for input, which this caller cannot give (an agent on 2026-07-28 can)"
        ),
        "{error}"
    );
    let done = agent.call_tool(call("b__job", json!({}))).await.unwrap();
    assert_eq!(text(&done), "b: job done");
    agent.cancel().await.unwrap();
    assert!(session.close().await.is_empty());
    assert!(legacy.close().await.is_empty());
}

/// An agent on the initialize handshake (2025-11-25 unless `revision`
/// says otherwise) that answers every elicitation with `name`, or that does
/// not take elicitations at all.
/// An agent before 2026-07-28: answers elicitation with its name (if it
/// has one, else it declares none), speaks the revision given (else
/// rmcp's latest with `initialize`), and reports the resource updates and
/// resource list changes it hears (the uri, or `list_changed`).
struct Legacy(
    Option<&'static str>,
    Option<moat_host::rmcp::model::ProtocolVersion>,
    Option<tokio::sync::mpsc::UnboundedSender<String>>,
);

impl moat_host::rmcp::ClientHandler for Legacy {
    fn get_info(&self) -> moat_host::rmcp::model::ClientConfig {
        let mut info = moat_host::rmcp::model::ClientConfig::default();
        if let Some(revision) = &self.1 {
            info.protocol_version = revision.clone();
        }
        if self.0.is_some() {
            info.capabilities =
                serde_json::from_value(json!({"elicitation": {"form": {}}})).unwrap();
        }
        info
    }

    async fn create_elicitation(
        &self,
        _request: moat_host::rmcp::model::ElicitRequestParams,
        _context: moat_host::rmcp::service::RequestContext<moat_host::rmcp::RoleClient>,
    ) -> Result<moat_host::rmcp::model::ElicitResult, moat_host::rmcp::ErrorData> {
        Ok(
            serde_json::from_value(json!({"action": "accept", "content": {"name": self.0}}))
                .unwrap(),
        )
    }

    async fn on_resource_updated(
        &self,
        params: moat_host::rmcp::model::ResourceUpdatedNotificationParam,
        _context: moat_host::rmcp::service::NotificationContext<moat_host::rmcp::RoleClient>,
    ) {
        if let Some(heard) = &self.2 {
            let _ = heard.send(params.uri);
        }
    }

    async fn on_resource_list_changed(
        &self,
        _context: moat_host::rmcp::service::NotificationContext<moat_host::rmcp::RoleClient>,
    ) {
        if let Some(heard) = &self.2 {
            let _ = heard.send("list_changed".to_owned());
        }
    }
}

async fn legacy_agent(
    session: &moat_host::gateway::AgentSession,
    name: Option<&'static str>,
) -> (
    moat_host::rmcp::service::RunningService<moat_host::rmcp::RoleClient, Legacy>,
    Serving,
) {
    agent_on(session, Legacy(name, None, None)).await
}

async fn agent_on(
    session: &moat_host::gateway::AgentSession,
    legacy: Legacy,
) -> (
    moat_host::rmcp::service::RunningService<moat_host::rmcp::RoleClient, Legacy>,
    Serving,
) {
    use moat_host::rmcp::ServiceExt;
    let (agent_io, gateway_io) = tokio::io::duplex(64 << 10);
    let serving = tokio::spawn(session.clone().serve(gateway_io));
    let client = moat_host::rmcp::ClientServiceExt::serve_with_lifecycle(
        legacy,
        agent_io,
        moat_host::rmcp::ClientLifecycleMode::Initialize,
    )
    .await
    .unwrap();
    (client, serving)
}

/// Polls task `id` until its status is `until`.
async fn task_until(
    agent: &AgentClient,
    id: &str,
    until: moat_host::rmcp::model::TaskStatus,
) -> moat_host::rmcp::model::GetTaskResult {
    loop {
        let found = agent
            .get_task(moat_host::rmcp::model::GetTaskParams::new(id))
            .await
            .unwrap();
        assert_eq!(found.task.task.task_id, id, "the agent's id, as issued");
        if found.task.task.status == until {
            return found;
        }
        assert!(
            !found.task.task.status.is_terminal(),
            "task {id} ended as {:?}, not {until:?}: {:?}",
            found.task.task.status,
            found.task.payload
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Tasks: an agent that declared the extension gets the server's task
/// under an id of Moat's (`server__id`), and `tasks/get`, `tasks/update`
/// and `tasks/cancel` reach the server that made it; another session
/// cannot name it, and an agent without tasks gets the task's result.
#[tokio::test]
async fn tasks_are_routed_to_the_server_that_made_them_and_to_no_other_session() {
    use moat_host::rmcp::model::{CallToolResponse, TaskPayload, TaskStatus, UpdateTaskParams};
    let gateway = rounds_gateway();
    let session = gateway.session();
    let (agent, _serving) = rounds_agent(&session, true).await;
    let mut issued = Vec::new();
    for server in ["a", "b"] {
        let created = match agent
            .call_tool_once(call(&format!("{server}__job"), json!({"ms": 20})))
            .await
        {
            Ok(CallToolResponse::Task(created)) => created,
            other => panic!("{server}: {other:?}"),
        };
        let id = created.task.task_id.clone();
        assert!(id.starts_with(&format!("{server}__")), "{id}");
        issued.push((server, id));
    }
    for (server, id) in &issued {
        let done = task_until(&agent, id, TaskStatus::Completed).await;
        let TaskPayload::Completed { result } = done.task.payload else {
            panic!("{done:?}")
        };
        assert_eq!(result["content"][0]["text"], format!("{server}: job done"));
    }

    // A task that asks for input on the way, answered by tasks/update.
    let created = match agent
        .call_tool_once(call("b__job", json!({"confirm": true})))
        .await
    {
        Ok(CallToolResponse::Task(created)) => created,
        other => panic!("{other:?}"),
    };
    let id = created.task.task_id;
    let waiting = task_until(&agent, &id, TaskStatus::InputRequired).await;
    let TaskPayload::InputRequired { input_requests } = &waiting.task.payload else {
        panic!("{waiting:?}")
    };
    assert!(input_requests.contains_key("go"), "{input_requests:?}");
    agent
        .update_task(UpdateTaskParams::new(
            id.clone(),
            [(
                "go".to_owned(),
                json!({"action": "accept", "content": {"go": "yes"}}),
            )]
            .into(),
        ))
        .await
        .unwrap();
    let done = task_until(&agent, &id, TaskStatus::Completed).await;
    let TaskPayload::Completed { result } = done.task.payload else {
        panic!("{done:?}")
    };
    assert_eq!(result["content"][0]["text"], "b: job done after yes");

    // Cancelled at the server that runs it.
    let created = match agent
        .call_tool_once(call("a__job", json!({"confirm": true})))
        .await
    {
        Ok(CallToolResponse::Task(created)) => created,
        other => panic!("{other:?}"),
    };
    let id = created.task.task_id;
    task_until(&agent, &id, TaskStatus::InputRequired).await;
    agent
        .cancel_task(moat_host::rmcp::model::CancelTaskParams::new(id.clone()))
        .await
        .unwrap();
    task_until(&agent, &id, TaskStatus::Cancelled).await;

    // Ids that this session did not issue: refused, and nothing is sent.
    let other = gateway.session();
    let (stranger, _serving_stranger) = rounds_agent(&other, true).await;
    for unknown in [issued[0].1.as_str(), "a__no-such-task", "nope"] {
        let error = stranger
            .get_task(moat_host::rmcp::model::GetTaskParams::new(unknown))
            .await
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains(&format!("-32602: no task {unknown:?} in this session")),
            "{error}"
        );
    }
    // An agent that did not declare tasks gets the result: Moat follows the
    // task the server made (the server made one: its answer is not the
    // inline one it gives a caller without tasks).
    stranger.cancel().await.unwrap();
    let (plain, _serving_plain) = rounds_agent(&other, false).await;
    let done = plain
        .call_tool(call("a__job", json!({"ms": 20})))
        .await
        .unwrap();
    assert_eq!(text(&done), "a: job done");
    plain.cancel().await.unwrap();
    agent.cancel().await.unwrap();
    assert!(session.close().await.is_empty());
    assert!(other.close().await.is_empty());
}

/// `subscriptions/listen`, merged: one stream from the agent opens one at
/// each server (then Moat says that what it listens to may have changed, as
/// rmcp acknowledged the agent's stream before those opened), a resource's
/// updates come from the server that lists it and only for what the agent
/// subscribed to, list changes from every server, and ending the agent's
/// stream ends the servers' streams. A stream outlives the servers'
/// per-request deadline: it is not a request awaiting its answer.
#[tokio::test]
async fn a_subscription_is_merged_across_servers_and_ends_at_each() {
    use moat_host::rmcp::model::{ServerNotification, SubscriptionFilter};
    const DEADLINE_MS: u64 = 1_500;
    let mut servers = rounds_servers();
    for server in &mut servers {
        server.limits.request_timeout_ms = DEADLINE_MS;
    }
    let gateway = gateway(&servers);
    let session = gateway.session();
    let (agent, _serving) = rounds_agent(&session, false).await;
    let mut uris: Vec<String> = agent
        .list_all_resources()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.uri.clone())
        .collect();
    uris.sort();
    assert_eq!(uris, ["rounds://a/data", "rounds://b/data"]);
    let mut subscription = agent
        .peer()
        .listen(
            SubscriptionFilter::builder()
                .resources_list_changed()
                .resource_subscription("rounds://a/data")
                .resource_subscription("rounds://nobody/data")
                .build(),
        )
        .await
        .unwrap();
    assert_eq!(
        subscription
            .acknowledged()
            .resource_subscriptions
            .as_deref(),
        Some(&["rounds://a/data".to_owned()][..]),
        "a resource no server lists is not accepted"
    );
    // Once the servers' streams are open, Moat says what may have changed.
    let mut caught_up = Vec::new();
    while caught_up.len() < 2 {
        caught_up.push(match subscription.next().await.unwrap().unwrap() {
            ServerNotification::ResourceUpdatedNotification(update) => update.params.uri,
            ServerNotification::ResourceListChangedNotification(_) => "listed".to_owned(),
            other => panic!("{other:?}"),
        });
    }
    assert_eq!(caught_up, ["listed", "rounds://a/data"]);
    // Past the deadline the servers' streams are still open (nothing is
    // awaited here: the time passing is what is tested).
    tokio::time::sleep(std::time::Duration::from_millis(DEADLINE_MS * 3 / 2)).await;
    for server in ["b", "a"] {
        let touched = agent
            .call_tool(call(&format!("{server}__touch"), json!({})))
            .await
            .unwrap();
        assert_eq!(text(&touched), format!("{server}: touched 1"));
    }
    let (mut updated, mut listed) = (Vec::new(), 0);
    while listed < 2 || updated.is_empty() {
        match subscription.next().await.unwrap().unwrap() {
            ServerNotification::ResourceUpdatedNotification(update) => {
                updated.push(update.params.uri)
            }
            ServerNotification::ResourceListChangedNotification(_) => listed += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        updated,
        ["rounds://a/data"],
        "b's resource was not subscribed to"
    );
    subscription.cancel().await.unwrap();
    // The servers' own streams end with the agent's.
    for server in ["a", "b"] {
        let mut tries = 0;
        loop {
            let touched = agent
                .call_tool(call(&format!("{server}__touch"), json!({})))
                .await
                .unwrap();
            if text(&touched) == format!("{server}: touched 0") {
                break;
            }
            tries += 1;
            assert!(
                tries < 1_000,
                "{server}'s stream is still open: {}",
                text(&touched)
            );
            tokio::task::yield_now().await;
        }
    }
    agent.cancel().await.unwrap();
    assert!(session.close().await.is_empty());
}

/// What `server__touch` says, called by `agent`.
async fn touch(
    agent: &moat_host::rmcp::service::Peer<moat_host::rmcp::RoleClient>,
    server: &str,
) -> String {
    text(
        &agent
            .call_tool(call(&format!("{server}__touch"), json!({})))
            .await
            .unwrap(),
    )
}

/// The `rounds` guest as a server of each revision, wasm and native mixed:
/// `n26` (2026-07-28, wasm), `n25` (2025-11-25, native), `n06`
/// (2025-06-18, wasm).
fn rounds_of_every_revision() -> Vec<moat_host::ServerSpec> {
    [
        ("n26", Launcher::Wasm, None),
        ("n25", Launcher::Native, Some("2025-11-25")),
        ("n06", Launcher::Wasm, Some("2025-06-18")),
    ]
    .into_iter()
    .map(|(name, launcher, revision)| {
        let mut server = spec(launcher, guests::ROUNDS);
        server.name = name.into();
        server.env.insert("ROUNDS_NAME".into(), name.into());
        if let Some(revision) = revision {
            server.env.insert("ROUNDS_REVISION".into(), revision.into());
        }
        server
    })
    .collect()
}

/// The protocol matrix: agents on 2025-06-18, 2025-11-25 and 2026-07-28
/// against servers on each of them, all in one gateway (wasm and native
/// mixed). Every agent reaches every server in the server's own revision;
/// a request for input reaches every agent in the form its revision has,
/// from every server in the form the server's has (handed on, bridged, or
/// parked while the agent answers); a task of the 2026-07-28 server
/// reaches every agent (handed on, or its result); a subscription from
/// every agent reaches every server, as `subscriptions/listen` or
/// `resources/subscribe`, whichever each side speaks.
#[tokio::test]
async fn every_agent_revision_meets_every_server_revision_in_one_gateway() {
    use moat_host::rmcp::model::{
        CallToolResponse, GetTaskParams, InputRequest, ProtocolVersion, ServerNotification,
        SubscriptionFilter, TaskPayload, TaskStatus,
    };
    let servers: Vec<_> = rounds_of_every_revision()
        .into_iter()
        .map(|mut server| {
            // Shorter than the agent takes to answer below: the deadline
            // bounds the server's work, not the agent's answer.
            server.limits.request_timeout_ms = 1_000;
            server
        })
        .collect();
    let gateway = gateway(&servers);
    // Each server as it answers: in its own revision, whatever the agent's.
    let in_own_revision = [
        ("n26", "n26: 2026-07-28"),
        ("n25", "n25: 2025-11-25"),
        ("n06", "n06: 2025-06-18"),
    ];
    let data = [
        "rounds://n26/data",
        "rounds://n25/data",
        "rounds://n06/data",
    ];
    let accept = |name: &str| json!({"action": "accept", "content": {"name": name}});

    // 2026-07-28, declaring tasks.
    let session = gateway.session();
    let (agent, _serving) = rounds_agent(&session, true).await;
    for (server, expected) in in_own_revision {
        let answer = agent
            .call_tool(call(&format!("{server}__revision"), json!({})))
            .await
            .unwrap();
        assert_eq!(text(&answer), expected, "an agent on 2026-07-28");
        let shape = serde_json::to_value(&answer).unwrap();
        assert_eq!(shape["resultType"], "complete", "{server}: {shape}");
    }
    let asked = match agent.call_tool_once(call("n26__ask", json!({}))).await {
        Ok(CallToolResponse::InputRequired(asked)) => asked,
        other => panic!("{other:?}"),
    };
    let mut retry = call("n26__ask", json!({}));
    retry.input_responses = Some([("name".to_owned(), accept("Ada"))].into());
    retry.request_state = asked.request_state;
    match agent.call_tool_once(retry).await {
        Ok(CallToolResponse::Complete(result)) => {
            assert_eq!(text(&result), "n26: hello Ada (n26:round-1)")
        }
        other => panic!("{other:?}"),
    }
    // An older server's own elicitation/create, as a request for input: the
    // call waits at the server, round after round, and is run once.
    for (server, names) in [("n25", vec!["Ada", "Lin"]), ("n06", vec!["Ada"])] {
        let arguments = json!({"times": names.len()});
        let mut retry = call(&format!("{server}__ask"), arguments.clone());
        for (round, name) in names.iter().enumerate() {
            let asked = match agent.call_tool_once(retry).await {
                Ok(CallToolResponse::InputRequired(asked)) => asked,
                other => panic!("{server}, round {round}: {other:?}"),
            };
            let requests = asked.input_requests.unwrap();
            let key = format!("moat-{}", round + 1);
            let Some(InputRequest::Elicitation(elicit)) = requests.get(&key) else {
                panic!("{server}: {requests:?}")
            };
            let wording = serde_json::to_value(elicit).unwrap();
            assert_eq!(
                wording["params"]["message"],
                format!("Name {}?", round + 1),
                "as the server worded it"
            );
            let state = asked.request_state.unwrap();
            if round == 0 {
                // Longer than the server's deadline: it is not the server
                // that is slow.
                tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
                // Not another tool's, nor a made-up one.
                let mut wrong = call(&format!("{server}__revision"), json!({}));
                wrong.request_state = Some(state.clone());
                let refused = agent.call_tool_once(wrong).await.unwrap_err();
                assert!(
                    refused.to_string().contains(&format!(
                        "requestState {state:?} names no call of this tool waiting for input in this session"
                    )),
                    "{refused}"
                );
            }
            retry = call(&format!("{server}__ask"), arguments.clone());
            retry.input_responses = Some([(key, accept(name))].into());
            retry.request_state = Some(state);
        }
        match agent.call_tool_once(retry).await {
            Ok(CallToolResponse::Complete(result)) => assert_eq!(
                text(&result),
                format!("{server}: hello {} (elicited)", names.join(" and "))
            ),
            other => panic!("{server}: {other:?}"),
        }
    }
    // A prompt and a resource that ask: the 2026-07-28 server's request
    // for input comes to the agent as it is, and its retry goes back.
    use moat_host::rmcp::model::{
        GetPromptRequestParams, GetPromptResponse, ReadResourceRequestParams, ReadResourceResponse,
    };
    let asked = match agent
        .get_prompt_once(GetPromptRequestParams::new("n26__greet"))
        .await
    {
        Ok(GetPromptResponse::InputRequired(asked)) => asked,
        other => panic!("{other:?}"),
    };
    let mut retry = GetPromptRequestParams::new("n26__greet");
    retry.input_responses = Some([("name".to_owned(), accept("Ada"))].into());
    retry.request_state = asked.request_state;
    match agent.get_prompt_once(retry).await {
        Ok(GetPromptResponse::Complete(prompt)) => {
            let said = serde_json::to_value(&prompt.messages[0].content).unwrap();
            assert_eq!(said["text"], "n26: hello Ada");
        }
        other => panic!("{other:?}"),
    }
    agent.list_resources(None).await.unwrap();
    let asked = match agent
        .read_resource_once(ReadResourceRequestParams::new(data[0]))
        .await
    {
        Ok(ReadResourceResponse::InputRequired(asked)) => asked,
        other => panic!("{other:?}"),
    };
    let mut retry = ReadResourceRequestParams::new(data[0]);
    retry.input_responses = Some([("name".to_owned(), accept("Ada"))].into());
    retry.request_state = asked.request_state;
    match agent.read_resource_once(retry).await {
        Ok(ReadResourceResponse::Complete(read)) => {
            let said = serde_json::to_value(&read.contents[0]).unwrap();
            assert_eq!(said["text"], "n26: data for Ada");
        }
        other => panic!("{other:?}"),
    }
    // A prompt of an older server that asks: not carried to an agent on
    // 2026-07-28 (README, "Not built yet"); the server is told so.
    let refused = agent
        .get_prompt(moat_host::rmcp::model::GetPromptRequestParams::new(
            "n25__greet",
        ))
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("prompt `greet` on server `n25` asked for input that its caller cannot give"),
        "{refused}"
    );
    let id = match agent
        .call_tool_once(call("n26__job", json!({"ms": 5})))
        .await
    {
        Ok(CallToolResponse::Task(created)) => created.task.task_id,
        other => panic!("{other:?}"),
    };
    let done = task_until(&agent, &id, TaskStatus::Completed).await;
    let TaskPayload::Completed { result } = done.task.payload else {
        panic!("{done:?}")
    };
    assert_eq!(result["content"][0]["text"], "n26: job done");
    assert!(agent.get_task(GetTaskParams::new(id)).await.is_ok());
    // A subscription to every server's resource: a stream at the
    // 2026-07-28 server, resources/subscribe at the older ones.
    agent.list_resources(None).await.unwrap();
    let mut filter = SubscriptionFilter::builder().resources_list_changed();
    for uri in data {
        filter = filter.resource_subscription(uri.to_owned());
    }
    let mut subscription = agent.peer().listen(filter.build()).await.unwrap();
    for (server, uri) in ["n26", "n25", "n06"].into_iter().zip(data) {
        assert_eq!(
            touch(agent.peer(), server).await,
            format!("{server}: touched 1")
        );
        loop {
            match subscription.next().await.unwrap() {
                Some(ServerNotification::ResourceUpdatedNotification(updated))
                    if updated.params.uri == uri =>
                {
                    break;
                }
                Some(ServerNotification::ResourceUpdatedNotification(updated)) => {
                    // The catch-up names every resource once.
                    assert!(data.contains(&updated.params.uri.as_str()), "{updated:?}")
                }
                Some(_) => {}
                None => panic!("the stream ended before {uri}'s update"),
            }
        }
    }
    subscription.cancel().await.unwrap();
    agent.cancel().await.unwrap();
    let closed = session.close().await;
    assert!(closed.is_empty(), "{closed:?}");

    // 2025-11-25 and 2025-06-18: the same servers; the request for input
    // bridged or passed on, the task's result, resources/subscribe.
    for revision in [ProtocolVersion::V_2025_11_25, ProtocolVersion::V_2025_06_18] {
        let session = gateway.session();
        let (heard, mut hearing) = tokio::sync::mpsc::unbounded_channel();
        let (agent, _serving) = agent_on(
            &session,
            Legacy(Some("Bob"), Some(revision.clone()), Some(heard)),
        )
        .await;
        let negotiated = agent.peer_info().unwrap().protocol_version.to_string();
        assert_eq!(negotiated, revision.to_string());
        for (server, expected) in in_own_revision {
            let answer = agent
                .call_tool(call(&format!("{server}__revision"), json!({})))
                .await
                .unwrap();
            assert_eq!(text(&answer), expected, "an agent on {negotiated}");
        }
        let answer = agent.call_tool(call("n26__ask", json!({}))).await.unwrap();
        assert_eq!(
            text(&answer),
            "n26: hello Bob (n26:round-1)",
            "{negotiated}"
        );
        for server in ["n25", "n06"] {
            let answer = agent
                .call_tool(call(&format!("{server}__ask"), json!({"times": 2})))
                .await
                .unwrap();
            assert_eq!(
                text(&answer),
                format!("{server}: hello Bob and Bob (elicited)"),
                "{negotiated}"
            );
        }
        let answer = agent
            .call_tool(call("n26__job", json!({"ms": 5})))
            .await
            .unwrap();
        assert_eq!(text(&answer), "n26: job done", "{negotiated}");
        // A prompt that asks: bridged from the 2026-07-28 server's request
        // for input, passed on from the older servers' elicitation/create.
        for server in ["n26", "n25", "n06"] {
            let prompt = agent
                .get_prompt(moat_host::rmcp::model::GetPromptRequestParams::new(
                    format!("{server}__greet"),
                ))
                .await
                .unwrap();
            let said = serde_json::to_value(&prompt.messages[0].content).unwrap();
            assert_eq!(said["text"], format!("{server}: hello Bob"), "{negotiated}");
        }
        agent.list_resources(None).await.unwrap();
        // A resource that asks who reads it, the same way.
        for (server, uri) in ["n26", "n25", "n06"].into_iter().zip(data) {
            let read = agent
                .read_resource(moat_host::rmcp::model::ReadResourceRequestParams::new(uri))
                .await
                .unwrap();
            let said = serde_json::to_value(&read.contents[0]).unwrap();
            assert_eq!(
                said["text"],
                format!("{server}: data for Bob"),
                "{negotiated}"
            );
        }
        #[allow(deprecated, reason = "the legacy request is what is tested")]
        for uri in data {
            agent
                .subscribe(moat_host::rmcp::model::SubscribeRequestParams::new(uri))
                .await
                .unwrap();
        }
        // The 2026-07-28 server has two streams open: the subscription's,
        // and one that brings its list changes to this older agent.
        for ((server, uri), streams) in ["n26", "n25", "n06"].into_iter().zip(data).zip([2, 1, 1]) {
            assert_eq!(
                touch(agent.peer(), server).await,
                format!("{server}: touched {streams}")
            );
            // The update, and the list change each server sends with it.
            let mut heard = vec![hearing.recv().await.unwrap(), hearing.recv().await.unwrap()];
            heard.sort();
            assert_eq!(heard, ["list_changed", uri], "{negotiated}: {server}");
        }
        #[allow(deprecated, reason = "the legacy request is what is tested")]
        for uri in data {
            agent
                .unsubscribe(moat_host::rmcp::model::UnsubscribeRequestParams::new(uri))
                .await
                .unwrap();
        }
        // The list-change stream stays.
        for (server, streams) in ["n26", "n25", "n06"].into_iter().zip([1, 0, 0]) {
            assert_eq!(
                touch(agent.peer(), server).await,
                format!("{server}: touched {streams}"),
                "{negotiated}"
            );
        }
        #[allow(deprecated, reason = "the legacy request is what is tested")]
        let refused = agent
            .unsubscribe(moat_host::rmcp::model::UnsubscribeRequestParams::new(
                data[0],
            ))
            .await
            .unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("resource rounds://n26/data is not subscribed in this session"),
            "{refused}"
        );
        agent.cancel().await.unwrap();
        let closed = session.close().await;
        assert!(closed.is_empty(), "{negotiated}: {closed:?}");
    }

    // A caller that cannot be asked (in-process): the older server's own
    // request is refused, and the server says so in its answer.
    let session = gateway.session();
    let answer = session.call("n25__ask", None).await.unwrap();
    assert!(
        text(&answer)
            .contains("tool `ask` on server `n25` asked for input that its caller cannot give"),
        "{}",
        text(&answer)
    );
    let closed = session.close().await;
    assert!(closed.is_empty(), "{closed:?}");
}

/// Answers `yes` to the `Go on?` that task `id` asks under `key`, and
/// returns the task's result once it completes.
async fn go_on(agent: &AgentClient, id: &str, key: &str) -> moat_host::rmcp::model::JsonObject {
    use moat_host::rmcp::model::{TaskPayload, TaskStatus, UpdateTaskParams};
    let answer = json!({"action": "accept", "content": {"go": "yes"}});
    agent
        .update_task(UpdateTaskParams::new(id, [(key.to_owned(), answer)].into()))
        .await
        .unwrap();
    let done = task_until(agent, id, TaskStatus::Completed).await;
    let TaskPayload::Completed { result } = done.task.payload else {
        panic!("{done:?}")
    };
    result
}

/// `[serve] task_after_ms`: a call of an agent that declared the tasks
/// extension which is still running after that long becomes a task of
/// Moat's, at a server of any revision (here the two before tasks, wasm and
/// native): the agent gets the task at once and its result through
/// `tasks/get`; an older server's own elicitation/create leaves the task
/// `input_required` until `tasks/update` brings the answer (the call waits
/// at the server meanwhile and runs once); `tasks/cancel` stops the call
/// at the server; another session cannot name the task; a call that ends
/// sooner, or an agent without tasks, gets its answer in place.
#[tokio::test]
async fn a_call_still_running_after_task_after_ms_becomes_a_task_of_moats_at_any_server() {
    use moat_host::rmcp::model::{
        CallToolResponse, CancelTaskParams, GetTaskParams, InputRequest, TaskPayload, TaskStatus,
        UpdateTaskParams,
    };
    let servers = rounds_of_every_revision();
    let config = Config {
        path: "moat.toml".into(),
        servers: servers
            .iter()
            .map(|s| (s.name.clone(), s.clone()))
            .collect(),
        serve: moat_host::config::ServeSettings {
            task_after_ms: std::num::NonZeroU64::new(100),
            ..Default::default()
        },
        wasm: Default::default(),
    };
    let gateway = Gateway::new(host(), config, None);
    let session = gateway.session();
    let (agent, _serving) = rounds_agent(&session, true).await;
    let task_of = |answer| match answer {
        Ok(CallToolResponse::Task(created)) => created.task,
        other => panic!("{other:?}"),
    };
    for server in ["n25", "n06"] {
        // Running for 800 ms: a task after 100.
        let task = task_of(
            agent
                .call_tool_once(call(&format!("{server}__job"), json!({"ms": 800})))
                .await,
        );
        assert!(task.task_id.starts_with(&format!("{server}__")), "{task:?}");
        assert_eq!(task.status, TaskStatus::Working);
        assert_eq!(task.ttl_ms, Some(3_600_000));
        let done = task_until(&agent, &task.task_id, TaskStatus::Completed).await;
        let TaskPayload::Completed { result } = done.task.payload else {
            panic!("{done:?}")
        };
        assert_eq!(
            result["content"][0]["text"],
            format!("{server}: job done inline")
        );
        assert_eq!(result["resultType"], "complete");

        // Asking on the way: the task waits for tasks/update.
        let task = task_of(
            agent
                .call_tool_once(call(
                    &format!("{server}__job"),
                    json!({"ms": 300, "confirm": true}),
                ))
                .await,
        );
        let waiting = task_until(&agent, &task.task_id, TaskStatus::InputRequired).await;
        let TaskPayload::InputRequired { input_requests } = &waiting.task.payload else {
            panic!("{waiting:?}")
        };
        let Some(InputRequest::Elicitation(elicit)) = input_requests.get("moat-1") else {
            panic!("{input_requests:?}")
        };
        assert_eq!(
            serde_json::to_value(elicit).unwrap()["params"]["message"],
            "Go on?",
            "as the server worded it"
        );
        let result = go_on(&agent, &task.task_id, "moat-1").await;
        assert_eq!(
            result["content"][0]["text"],
            format!("{server}: job done after yes"),
            "the server ran once and got the answer"
        );
        let again = agent
            .update_task(UpdateTaskParams::new(
                task.task_id.clone(),
                Default::default(),
            ))
            .await
            .unwrap_err();
        assert!(
            again.to_string().contains(&format!(
                "task {:?} is not waiting for input (it is completed)",
                task.task_id
            )),
            "{again}"
        );

        // Cancelled: the call stops at the server, which goes on serving.
        let task = task_of(
            agent
                .call_tool_once(call(&format!("{server}__job"), json!({"ms": 600_000})))
                .await,
        );
        agent
            .cancel_task(CancelTaskParams::new(task.task_id.clone()))
            .await
            .unwrap();
        task_until(&agent, &task.task_id, TaskStatus::Cancelled).await;
        // Cancelled while asking: the parked call is let go.
        let task = task_of(
            agent
                .call_tool_once(call(
                    &format!("{server}__job"),
                    json!({"ms": 300, "confirm": true}),
                ))
                .await,
        );
        task_until(&agent, &task.task_id, TaskStatus::InputRequired).await;
        agent
            .cancel_task(CancelTaskParams::new(task.task_id.clone()))
            .await
            .unwrap();
        task_until(&agent, &task.task_id, TaskStatus::Cancelled).await;
        let answer = agent
            .call_tool(call(&format!("{server}__revision"), json!({})))
            .await
            .unwrap();
        assert!(
            text(&answer).starts_with(&format!("{server}: 2025-")),
            "{answer:?}"
        );

        // Not another session's to name.
        let other = gateway.session();
        let (stranger, _other_serving) = rounds_agent(&other, true).await;
        let unknown = stranger
            .get_task(GetTaskParams::new(task.task_id.clone()))
            .await
            .unwrap_err();
        assert!(
            unknown.to_string().contains(&format!(
                "-32602: no task {:?} in this session",
                task.task_id
            )),
            "{unknown}"
        );
        stranger.cancel().await.unwrap();
        other.close().await;

        // An agent without tasks waits for the answer.
        let plain = gateway.session();
        let (without, _plain_serving) = rounds_agent(&plain, false).await;
        match without
            .call_tool_once(call(&format!("{server}__job"), json!({"ms": 300})))
            .await
        {
            Ok(CallToolResponse::Complete(result)) => {
                assert_eq!(text(&result), format!("{server}: job done inline"))
            }
            other => panic!("{other:?}"),
        }
        without.cancel().await.unwrap();
        plain.close().await;
    }
    // A 2026-07-28 server that makes its own task, but only after Moat
    // made one: the agent follows the server's under Moat's id, input and
    // all.
    let task = task_of(
        agent
            .call_tool_once(call(
                "n26__job",
                json!({"before_ms": 400, "ms": 5, "confirm": true}),
            ))
            .await,
    );
    let waiting = task_until(&agent, &task.task_id, TaskStatus::InputRequired).await;
    let TaskPayload::InputRequired { input_requests } = &waiting.task.payload else {
        panic!("{waiting:?}")
    };
    assert!(
        input_requests.contains_key("go"),
        "the server's own key: {input_requests:?}"
    );
    let result = go_on(&agent, &task.task_id, "go").await;
    assert_eq!(result["content"][0]["text"], "n26: job done after yes");
    agent.cancel().await.unwrap();
    let failures = session.close().await;
    assert!(failures.is_empty(), "{failures:?}");
}

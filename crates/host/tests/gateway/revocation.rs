//! Revocation in moat.lock: a revoked tool hidden and refused, a digest
//! revoked while serving refused where it already runs (also under load,
//! where its calls drain or are cancelled and its children stop), and a
//! server revoked at start launched once the revocation is lifted.

use super::*;

both_launchers!(
    a_tool_revoked_in_the_lock_is_hidden_and_refused_while_its_neighbours_answer,
    a_digest_revoked_while_serving_is_refused_where_it_already_runs,
    a_server_revoked_in_the_lock_at_start_launches_once_lifted,
    a_digest_revoked_under_load_drains_or_cancels_its_calls_and_stops_its_children,
);

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
        nodes: Default::default(),
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
        nodes: Default::default(),
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
    doomed
        .env
        .values
        .insert("MOAT_TEST_MARKER".into(), marker.clone());
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

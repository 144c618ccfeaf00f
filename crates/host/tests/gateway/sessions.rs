//! Which child serves which name: one child per execution identity within
//! a session, concurrent sessions with children and answers of their own,
//! servers on one binary with other tokens and grants never sharing a child,
//! and `list_changed` reaching the agent after the pin check.

use super::*;

both_launchers!(
    one_child_serves_names_of_the_same_execution_identity_within_a_session,
    tool_list_changes_reach_the_agent_after_the_pin_check,
    concurrent_sessions_have_their_own_children_and_answers,
    servers_on_one_binary_with_other_tokens_and_grants_never_share_a_child,
);

async fn one_child_serves_names_of_the_same_execution_identity_within_a_session(
    launcher: Launcher,
) {
    let named = |name: &str| {
        let mut spec = spec(launcher, guests::EVERYTHING);
        spec.name = name.into();
        spec
    };
    let mut other_env = named("c");
    other_env.env.values.insert("EXTRA".into(), "1".into());
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
        nodes: Default::default(),
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
        spec.env
            .values
            .insert("TOKEN".into(), format!("{name}-token"));
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

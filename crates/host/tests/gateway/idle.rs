//! `idle_stop_ms`: a server idle that long is stopped (its exit recorded
//! as `idle`) and started afresh at its next use; one without it is kept
//! for the session's life; a call longer than the idle time is never cut.

use super::*;
use std::time::Duration;

both_launchers!(
    an_idle_server_is_stopped_and_started_afresh_at_its_next_use,
    a_call_longer_than_the_idle_time_is_not_cut,
);

/// `everything` as `name`, stopped after `idle_stop_ms` idle (0: never).
fn everything(launcher: Launcher, name: &str, idle_stop_ms: u64) -> moat_host::ServerSpec {
    let mut server = spec(launcher, guests::EVERYTHING);
    server.name = name.into();
    server.limits.idle_stop_ms = idle_stop_ms;
    server
}

/// The audit log's events as (event, server, outcome).
fn events(path: &Path) -> Vec<(String, String, String)> {
    events_of(path, None)
}

/// The audit log's events as (event, server, outcome), of one session or
/// all.
fn events_of(path: &Path, session: Option<&str>) -> Vec<(String, String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).unwrap();
            let field = |key: &str| event[key].as_str().unwrap_or_default().to_owned();
            session
                .is_none_or(|id| field("session") == id)
                .then(|| (field("event"), field("server"), field("outcome")))
        })
        .collect()
}

/// Waits (up to 30 s) until the audit log records `server`'s exit.
async fn exit_of(path: &Path, server: &str) -> (String, String, String) {
    exit_in(path, None, server).await
}

/// Waits (up to 30 s) until the audit log records `server`'s exit in
/// `session` (or any).
async fn exit_in(path: &Path, session: Option<&str>, server: &str) -> (String, String, String) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(exit) = events_of(path, session)
            .into_iter()
            .find(|(event, s, _)| event == "server_exit" && s == server)
        {
            return exit;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no exit of {server}: {:?}",
            events(path)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Grant and denial in one session: `kept` (no idle stop) is used first,
/// then `idle` (200 ms). When `idle` has been stopped, `kept` has sat
/// idle longer, and still runs.
async fn an_idle_server_is_stopped_and_started_afresh_at_its_next_use(launcher: Launcher) {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let gateway = gateway_audited(
        &[
            everything(launcher, "kept", 0),
            everything(launcher, "idle", 200),
        ],
        30_000,
        Some(&audit),
    );
    let session = gateway.session();
    let add = || args(json!({"a": 1, "b": 2}));
    assert_eq!(text(&session.call("kept__add", add()).await.unwrap()), "3");
    assert_eq!(text(&session.call("idle__add", add()).await.unwrap()), "3");
    assert_eq!(gateway.host().launches(), 2);

    let (_, _, outcome) = exit_of(&audit, "idle").await;
    assert_eq!(outcome, "idle");
    let exits: Vec<String> = events(&audit)
        .into_iter()
        .filter(|(event, _, _)| event == "server_exit")
        .map(|(_, server, _)| server)
        .collect();
    assert_eq!(exits, ["idle"], "`kept` has no idle stop");

    // The next use starts it afresh, and it answers.
    assert_eq!(text(&session.call("idle__add", add()).await.unwrap()), "3");
    assert_eq!(gateway.host().launches(), 3);
    assert_eq!(text(&session.call("kept__add", add()).await.unwrap()), "3");
    assert_eq!(gateway.host().launches(), 3, "`kept` was still running");
    assert!(session.close().await.is_empty());
    let launches: Vec<String> = events(&audit)
        .into_iter()
        .filter(|(event, _, _)| event == "server_launch")
        .map(|(_, server, _)| server)
        .collect();
    assert_eq!(launches, ["kept", "idle", "idle"]);
    moat_host::audit::verify(&audit, &audit_key()).unwrap();
}

/// A call of 800 ms to a server stopped after 100 ms idle answers in full;
/// the server is stopped only after it.
async fn a_call_longer_than_the_idle_time_is_not_cut(launcher: Launcher) {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let gateway = gateway_audited(&[everything(launcher, "idle", 100)], 30_000, Some(&audit));
    let session = gateway.session();
    let slept = session
        .call("idle__sleep", args(json!({"ms": 800})))
        .await
        .unwrap();
    assert_eq!(text(&slept), "slept 800 ms");
    let (_, _, outcome) = exit_of(&audit, "idle").await;
    assert_eq!(outcome, "idle");
    let kinds: Vec<String> = events(&audit).into_iter().map(|(e, _, _)| e).collect();
    assert_eq!(
        kinds,
        ["session_open", "server_launch", "tool_call", "server_exit"]
    );
    assert_eq!(gateway.host().launches(), 1);
    assert!(session.close().await.is_empty());
}

/// An agent's open subscription holds the server: a session whose agent
/// listens keeps it past the idle time, while another session's copy of
/// the same server, used later, is stopped; once the agent stops
/// listening, its server is stopped too.
#[tokio::test]
async fn an_agents_subscription_keeps_its_server_from_being_stopped_idle() {
    use moat_host::rmcp::model::SubscriptionFilter;
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let mut servers = rounds_servers();
    servers.retain(|s| s.name == "a");
    servers[0].limits.idle_stop_ms = 200;
    let gateway = gateway_audited(&servers, 30_000, Some(&audit));
    let listening = gateway.session();
    let (agent, _serving) = rounds_agent(&listening, false).await;
    agent.list_all_resources().await.unwrap();
    let mut subscription = agent
        .peer()
        .listen(
            SubscriptionFilter::builder()
                .resource_subscription("rounds://a/data")
                .build(),
        )
        .await
        .unwrap();
    let touched = agent.call_tool(call("a__touch", json!({}))).await.unwrap();
    assert_eq!(text(&touched), "a: touched 1");

    // Another session's `a`, used after this one's, is stopped first.
    let other = gateway.session();
    other.call("a__touch", args(json!({}))).await.unwrap();
    let (_, _, outcome) = exit_in(&audit, Some(other.id()), "a").await;
    assert_eq!(outcome, "idle");
    assert!(
        !events_of(&audit, Some(listening.id()))
            .iter()
            .any(|(event, _, _)| event == "server_exit"),
        "the listening session's server was stopped"
    );
    let touched = agent.call_tool(call("a__touch", json!({}))).await.unwrap();
    assert_eq!(
        text(&touched),
        "a: touched 1",
        "the same server, still listened to"
    );

    subscription.cancel().await.unwrap();
    let (_, _, outcome) = exit_in(&audit, Some(listening.id()), "a").await;
    assert_eq!(outcome, "idle");
    assert!(other.close().await.is_empty());
}

//! Trace context: the agent's `traceparent` reaches the server, a bad one
//! does not.

use super::*;

both_launchers!(the_agents_traceparent_reaches_the_server_and_a_bad_one_does_not,);

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

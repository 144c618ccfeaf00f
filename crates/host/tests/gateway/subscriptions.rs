//! `subscriptions/listen` merged across servers: one agent stream opens
//! one at each server, updates come from the server that lists the
//! resource, and ending the agent's stream ends each server's.

use super::*;

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

//! The protocol matrix: agents on every revision against servers on every
//! revision in one gateway, wasm and native mixed.

use super::*;

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

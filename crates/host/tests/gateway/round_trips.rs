//! Multi round-trip requests (2026-07-28): the server's request for input
//! reaches the agent, and the agent's retry comes back to the server that
//! asked; an older agent is asked with its own requests.

use super::*;

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

async fn legacy_agent(
    session: &moat_host::gateway::AgentSession,
    name: Option<&'static str>,
) -> (
    moat_host::rmcp::service::RunningService<moat_host::rmcp::RoleClient, Legacy>,
    Serving,
) {
    agent_on(session, Legacy(name, None, None)).await
}

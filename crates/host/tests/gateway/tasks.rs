//! Tasks: a server's task routed to the server that made it and to no
//! other session, and a call still running after `task_after_ms` becoming a
//! task of Moat's at a server of any revision.

use super::*;

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
        nodes: Default::default(),
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

//! `rounds`: a 2026-07-28 MCP server on rmcp that answers in the shapes that
//! revision adds, so tests can check that Moat carries them between an agent
//! and the server that issued them:
//!
//! - `ask` answers a first call with an `InputRequiredResult` (multi
//!   round-trip request): one elicitation, keyed `name`, and a
//!   `requestState`. The retry carries the agent's `inputResponses` and the
//!   state back, and the answer names both.
//! - `job` becomes a task (the tasks extension) when the caller declared
//!   tasks, else runs inline. With `confirm`, the task asks for input
//!   (`input_required`, answered by `tasks/update`) before it completes;
//!   with `before_ms`, it answers with the task only after that long.
//!   As an older server it runs in the call for `ms` milliseconds, and
//!   with `confirm` asks with `elicitation/create` after that.
//!
//! - `touch` sends `notifications/resources/updated` for the server's one
//!   resource (`rounds://NAME/data`) and `notifications/resources/list_changed`
//!   on every open `subscriptions/listen` stream, and says how many it
//!   reached (a stream that accepts neither is not counted).
//!
//! - `revision` says which protocol revision the request reached it in.
//!
//! - The prompt `greet` asks for a name as `ask` does, then greets it;
//!   reading the resource does the same, and the text names the reader.
//!
//! As a server before 2026-07-28 (`ROUNDS_REVISION`), it does what that
//! revision does instead: `ask` asks its client with `elicitation/create`
//! while the call waits (`times` questions, default 1; it refuses a client
//! that did not declare elicitation, as such servers do), and `touch`
//! sends `notifications/resources/updated` for a resource its client
//! subscribed with `resources/subscribe`, and
//! `notifications/resources/list_changed`, to the client.
//!
//! Every answer names the server as `ROUNDS_NAME` says (default `rounds`),
//! so a test with several of them behind one gateway sees which one
//! answered. `ROUNDS_REVISION` (a revision such as `2025-06-18`) makes it a
//! server of that revision only, as an older server is on the wire: it
//! refuses `server/discover` as unknown, and `initialize` agrees to that
//! revision whatever the client proposes. The same source builds for wasm32-wasip2 and natively.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::{
    ErrorData, RoleServer, ServerHandler, ServiceExt,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
        CreateTaskResult, DiscoverRequestMethod, DiscoverResult, ElicitRequest,
        ElicitRequestParams, ElicitationSchema, GetTaskParams, GetTaskResult, InputRequest,
        InputRequiredResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
        ProtocolVersion, Resource, ResourceListChangedNotification, ResourceUpdatedNotification,
        ResourceUpdatedNotificationParam, ServerCapabilities, ServerConfig, ServerNotification,
        SubscriptionFilter, Tool, UpdateTaskParams,
    },
    service::{RequestContext, SubscriptionContext, SubscriptionSink},
    task_manager::{TaskExit, TaskManager, TaskOptions},
};

/// The one revision `ROUNDS_REVISION` names, if it names a known one.
fn revision() -> Option<ProtocolVersion> {
    let only = std::env::var("ROUNDS_REVISION").ok()?;
    ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .find(|known| known.as_str() == only)
        .cloned()
}

fn name() -> String {
    std::env::var("ROUNDS_NAME").unwrap_or_else(|_| "rounds".to_owned())
}

fn schema(value: serde_json::Value) -> std::sync::Arc<serde_json::Map<String, serde_json::Value>> {
    match value {
        serde_json::Value::Object(map) => std::sync::Arc::new(map),
        _ => unreachable!("schemas here are objects"),
    }
}

fn text(message: String) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(message)])
}

fn elicitation(message: &str, field: &str) -> InputRequest {
    let requested = ElicitationSchema::builder()
        .required_string(field)
        .build()
        .expect("a one-field schema");
    InputRequest::Elicitation(ElicitRequest::new(
        ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: message.to_owned(),
            requested_schema: requested,
        },
    ))
}

/// The accepted content's `field`, from an elicitation's answer.
fn answered(response: &serde_json::Value, field: &str) -> Option<String> {
    (response.get("action")? == "accept")
        .then(|| {
            response
                .get("content")?
                .get(field)?
                .as_str()
                .map(str::to_owned)
        })
        .flatten()
}

/// Asks the client for `field` with its own `elicitation/create`, as a
/// server before 2026-07-28 does while a call waits.
async fn elicit_older(
    context: &RequestContext<RoleServer>,
    message: &str,
    field: &str,
) -> Result<String, String> {
    let InputRequest::Elicitation(asked) = elicitation(message, field) else {
        unreachable!("elicitation() makes an elicitation")
    };
    // As sent raw: rmcp's typed helper needs a feature this guest does
    // without.
    let sent = context
        .peer
        .send_request(rmcp::model::ServerRequest::ElicitRequest(asked));
    let answer = match sent.await {
        Ok(answer) => serde_json::to_value(answer).unwrap_or_default(),
        Err(error) => return Err(format!("elicitation/create failed: {error}")),
    };
    answered(&answer, field).ok_or_else(|| format!("no accepted `{field}`"))
}

/// A name the caller gave, or the request for input that asks for it.
enum Named {
    Who(String),
    Ask(InputRequiredResult),
}

/// Asks the caller for a name, saying `message`: on 2026-07-28 with a
/// request for input (answered by `responses` on the retry), before it
/// with the server's own `elicitation/create` while the request waits.
async fn named(
    message: &str,
    responses: Option<&rmcp::model::InputResponses>,
    context: &RequestContext<RoleServer>,
) -> Result<Named, ErrorData> {
    let who = if revision().is_some() {
        let InputRequest::Elicitation(asked) = elicitation(message, "name") else {
            unreachable!("elicitation() makes an elicitation")
        };
        let answer = context
            .peer
            .send_request(rmcp::model::ServerRequest::ElicitRequest(asked))
            .await
            .map_err(|e| {
                ErrorData::internal_error(format!("elicitation/create failed: {e}"), None)
            })?;
        answered(&serde_json::to_value(answer).unwrap_or_default(), "name")
    } else {
        let Some(responses) = responses else {
            let mut requests = BTreeMap::new();
            requests.insert("name".to_owned(), elicitation(message, "name"));
            return Ok(Named::Ask(InputRequiredResult::new(
                Some(requests),
                Some(format!("{}:named", name())),
            )));
        };
        responses.get("name").and_then(|r| answered(r, "name"))
    };
    who.map(Named::Who)
        .ok_or_else(|| ErrorData::invalid_params("no accepted `name`", None))
}

fn data_uri() -> String {
    format!("rounds://{}/data", name())
}

#[derive(Default)]
struct Rounds {
    tasks: TaskManager,
    /// The open `subscriptions/listen` streams.
    listening: Arc<Mutex<Vec<SubscriptionSink>>>,
    /// Resources subscribed with `resources/subscribe` (before 2026-07-28).
    subscribed: Arc<Mutex<std::collections::BTreeSet<String>>>,
}

impl Rounds {
    fn ask(&self, request: &CallToolRequestParams) -> CallToolResponse {
        let Some(responses) = &request.input_responses else {
            let mut requests = BTreeMap::new();
            requests.insert("name".to_owned(), elicitation("Your name?", "name"));
            return InputRequiredResult::new(Some(requests), Some(format!("{}:round-1", name())))
                .into();
        };
        let Some(state) = &request.request_state else {
            return CallToolResult::error(vec![ContentBlock::text(
                "a retry without its requestState",
            )])
            .into();
        };
        match responses.get("name").and_then(|r| answered(r, "name")) {
            Some(who) => text(format!("{}: hello {who} ({state})", name())).into(),
            None => CallToolResult::error(vec![ContentBlock::text("no accepted `name`")]).into(),
        }
    }

    async fn job(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let arguments = request.arguments.clone().unwrap_or_default();
        let ms = arguments.get("ms").and_then(|v| v.as_u64()).unwrap_or(0);
        let confirm = arguments
            .get("confirm")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let server = name();
        let tasks = context
            .client_capabilities()
            .is_some_and(|caps| caps.supports_tasks());
        if revision().is_some() {
            // An older server has no tasks: the job runs in the call, and
            // asks with its own elicitation/create.
            moat_wit::time::sleep(Duration::from_millis(ms)).await;
            if !confirm {
                return text(format!("{server}: job done inline")).into();
            }
            return match elicit_older(context, "Go on?", "go").await {
                Ok(said) => text(format!("{server}: job done after {said}")).into(),
                Err(error) => CallToolResult::error(vec![ContentBlock::text(error)]).into(),
            };
        }
        if !tasks {
            return text(format!("{server}: job done inline")).into();
        }
        // A server that takes its time to decide on a task.
        let before = arguments
            .get("before_ms")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        moat_wit::time::sleep(Duration::from_millis(before)).await;
        let task = self
            .tasks
            .spawn(TaskOptions::new().with_poll_interval_ms(10), move |task| {
                Box::pin(async move {
                    moat_wit::time::sleep(Duration::from_millis(ms)).await;
                    let mut said = String::new();
                    if confirm {
                        let answer = task
                            .request_input("go", elicitation("Go on?", "go"))
                            .await?;
                        said = answered(&answer, "go").ok_or_else(|| {
                            TaskExit::Error(ErrorData::invalid_params("no accepted `go`", None))
                        })?;
                        said = format!(" after {said}");
                    }
                    Ok(text(format!("{server}: job done{said}")))
                })
            });
        CallToolResponse::Task(CreateTaskResult::new(task))
    }
}

impl Rounds {
    /// `ask` as a server before 2026-07-28: its own `elicitation/create`,
    /// `times` times, while the call waits.
    async fn ask_older(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let elicits = context
            .peer
            .peer_info()
            .is_some_and(|info| info.capabilities.elicitation.is_some());
        if !elicits {
            return CallToolResult::error(vec![ContentBlock::text(
                "the client did not declare elicitation",
            )])
            .into();
        }
        let times = request
            .arguments
            .as_ref()
            .and_then(|arguments| arguments.get("times"))
            .and_then(|times| times.as_u64())
            .unwrap_or(1);
        let mut names = Vec::new();
        for round in 1..=times {
            match elicit_older(context, &format!("Name {round}?"), "name").await {
                Ok(who) => names.push(who),
                Err(error) => {
                    return CallToolResult::error(vec![ContentBlock::text(format!(
                        "{error} in round {round}"
                    ))])
                    .into();
                }
            }
        }
        text(format!(
            "{}: hello {} (elicited)",
            name(),
            names.join(" and ")
        ))
        .into()
    }

    async fn touch(&self, context: &RequestContext<RoleServer>) -> CallToolResponse {
        if revision().is_some() {
            let subscribed = self.subscribed.lock().unwrap().clone();
            let mut reached = 0;
            for uri in subscribed {
                if context
                    .peer
                    .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                    .await
                    .is_ok()
                {
                    reached += 1;
                }
            }
            let _ = context.peer.notify_resource_list_changed().await;
            return text(format!("{}: touched {reached}", name())).into();
        }
        let sinks = self.listening.lock().unwrap().clone();
        let mut reached = 0;
        for sink in sinks {
            let updated = ServerNotification::ResourceUpdatedNotification(
                ResourceUpdatedNotification::new(ResourceUpdatedNotificationParam::new(data_uri())),
            );
            let listed = ServerNotification::ResourceListChangedNotification(
                ResourceListChangedNotification::default(),
            );
            if sink.send(updated).await.is_ok() | sink.send(listed).await.is_ok() {
                reached += 1;
            }
        }
        text(format!("{}: touched {reached}", name())).into()
    }
}

impl ServerHandler for Rounds {
    /// With `ROUNDS_REVISION`, that revision, and 2026-07-28 only so that
    /// rmcp lets `server/discover` reach [`Self::discover`], which refuses
    /// it as a server that does not know it does.
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        match revision() {
            Some(only) => std::borrow::Cow::Owned(vec![only, ProtocolVersion::V_2026_07_28]),
            None => std::borrow::Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS),
        }
    }

    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        if revision().is_some() {
            return Err(ErrorData::method_not_found::<DiscoverRequestMethod>());
        }
        let _ = context;
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        ))
    }

    fn get_info(&self) -> ServerConfig {
        // What `initialize` falls back to for a revision it does not have.
        let mut info = ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .enable_resources()
                .enable_resources_list_changed()
                .enable_resources_subscribe()
                .enable_tasks()
                .build(),
        );
        if let Some(only) = revision() {
            info.protocol_version = only;
        }
        info
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::builder().resources_list_changed();
        if requested
            .resource_subscriptions
            .as_ref()
            .is_some_and(|uris| uris.contains(&data_uri()))
        {
            accepted = accepted.resource_subscription(data_uri());
        }
        Some(accepted.build())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        self.listening.lock().unwrap().push(context.sink().clone());
        context.cancelled().await;
        let id = context.sink().id().clone();
        self.listening
            .lock()
            .unwrap()
            .retain(|sink| *sink.id() != id);
        Ok(())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, ErrorData> {
        Ok(rmcp::model::ListPromptsResult::with_all_items(vec![
            rmcp::model::Prompt::new(
                "greet",
                Some("Asks the caller's name, then greets it"),
                None,
            ),
        ]))
    }

    /// `greet` asks for a name as `ask` does: a request for input on
    /// 2026-07-28, its own `elicitation/create` before.
    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, ErrorData> {
        if request.name != "greet" {
            return Err(ErrorData::invalid_params(
                format!("no prompt {}", request.name),
                None,
            ));
        }
        let who = match named("Prompt name?", request.input_responses.as_ref(), &context).await? {
            Named::Who(who) => who,
            Named::Ask(asked) => return Ok(asked.into()),
        };
        Ok(
            rmcp::model::GetPromptResult::new(vec![rmcp::model::PromptMessage::new_text(
                rmcp::model::Role::User,
                format!("{}: hello {who}", name()),
            )])
            .into(),
        )
    }

    /// The resource's text names the reader, asked for as `greet` asks.
    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, ErrorData> {
        if request.uri != data_uri() {
            return Err(ErrorData::resource_not_found(
                format!("no resource {}", request.uri),
                None,
            ));
        }
        let who = match named("Reader name?", request.input_responses.as_ref(), &context).await? {
            Named::Who(who) => who,
            Named::Ask(asked) => return Ok(asked.into()),
        };
        Ok(
            rmcp::model::ReadResourceResult::new(vec![rmcp::model::ResourceContents::text(
                format!("{}: data for {who}", name()),
                data_uri(),
            )])
            .into(),
        )
    }

    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if request.uri != data_uri() {
            return Err(ErrorData::resource_not_found(
                format!("no resource {}", request.uri),
                None,
            ));
        }
        self.subscribed.lock().unwrap().insert(request.uri);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscribed.lock().unwrap().remove(&request.uri);
        Ok(())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::with_all_items(vec![Resource::new(
            data_uri(),
            "data",
        )]))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new(
                "ask",
                "Asks the caller for a name (a multi round-trip request), then greets it",
                schema(serde_json::json!({
                    "type": "object",
                    "properties": {"times": {"type": "integer", "minimum": 1, "maximum": 10}}
                })),
            ),
            Tool::new(
                "revision",
                "Says which protocol revision this request reached the server in",
                schema(serde_json::json!({"type": "object", "properties": {}})),
            ),
            Tool::new(
                "touch",
                "Tells every open subscription that its resource changed",
                schema(serde_json::json!({"type": "object", "properties": {}})),
            ),
            Tool::new(
                "job",
                "Runs as a task for ms milliseconds; with confirm, asks to go on first",
                schema(serde_json::json!({
                    "type": "object",
                    "properties": {
                        "ms": {"type": "integer", "minimum": 0},
                        "confirm": {"type": "boolean"}
                    }
                })),
            ),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match request.name.as_ref() {
            "ask" if revision().is_some() => Ok(self.ask_older(&request, &context).await),
            "ask" => Ok(self.ask(&request)),
            "job" => Ok(self.job(&request, &context).await),
            "touch" => Ok(self.touch(&context).await),
            "revision" => {
                let revision = context
                    .protocol_version()
                    .map_or_else(|| "none".to_owned(), |v| v.to_string());
                Ok(text(format!("{}: {revision}", name())).into())
            }
            other => Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        }
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.tasks
            .get_task(&request.task_id)
            .map(GetTaskResult::new)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks
            .update_task(&request.task_id, request.input_responses)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.cancel_task(&request.task_id)
    }
}

fn main() -> std::io::Result<()> {
    moat_wit::block_on(async {
        let service = Rounds::default()
            .serve(moat_wit::stdio())
            .await
            .map_err(std::io::Error::other)?;
        service.waiting().await.map_err(std::io::Error::other)?;
        Ok(())
    })
}

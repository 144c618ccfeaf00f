//! `everything`: a well-behaved MCP server built on rmcp that exercises what
//! Moat carries: tools (`echo`, `add`, `sleep`, `fail`, `blob`, `progress`,
//! `calls`, `shape`), progress notifications, one resource and one prompt.
//!
//! Switches for tests: `calls` answers how many `tools/call` requests the
//! server has received (so a test can prove a call never arrived);
//! `EVERYTHING_DRIFT=1` in its environment, or the `drift` tool at run time
//! (which then sends `notifications/tools/list_changed`), changes `echo`'s
//! description (so a test can make a pinned tool drift); `EVERYTHING_DRIFT=1`
//! also changes the `greet` prompt's description and the resource's name.
//!
//! The same source builds for wasm32-wasip2 and natively; `main` uses
//! `moat_wit::block_on` and `moat_wit::transport` (rmcp's line transport,
//! with a `tools/call` decoded at once) so that it runs on both. `rounds`
//! keeps `moat_wit::stdio`, so both ways are tested.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rmcp::{
    ErrorData, Peer, RoleServer, ServerHandler, ServiceExt,
    handler::server::{
        router::prompt::PromptRouter,
        tool::{ToolCallContext, ToolRouter},
        wrapper::Parameters,
    },
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListResourcesResult,
        ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, PromptMessage,
        ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, RequestMetaObject,
        Resource, ResourceContents, Role, ServerCapabilities, ServerConfig, Tool,
    },
    prompt, prompt_handler, prompt_router,
    service::RequestContext,
    tool, tool_handler, tool_router,
};
use schemars::JsonSchema;
use serde::Deserialize;

const README_URI: &str = "moat://everything/readme";
const README_TEXT: &str = "everything: a test server for Moat";

#[derive(Deserialize, JsonSchema)]
struct EchoArgs {
    /// Text to send back.
    message: String,
}

#[derive(Deserialize, JsonSchema)]
struct AddArgs {
    a: i64,
    b: i64,
}

#[derive(Deserialize, JsonSchema)]
struct SleepArgs {
    /// Milliseconds to wait before answering.
    ms: u64,
}

#[derive(Deserialize, JsonSchema)]
struct FailArgs {
    /// The error text the tool reports.
    message: String,
}

#[derive(Deserialize, JsonSchema)]
struct BlobArgs {
    /// Number of bytes of text to return.
    n: usize,
}

#[derive(Deserialize, JsonSchema)]
struct ProgressArgs {
    /// Number of progress notifications to send before answering.
    steps: u32,
    /// Milliseconds to wait after each notification (default 0).
    #[serde(default)]
    interval_ms: u64,
}

#[derive(Deserialize, JsonSchema)]
struct ShapeArgs {
    /// true: structured output that fits the declared outputSchema;
    /// false: output that does not.
    valid: bool,
}

#[derive(Deserialize, JsonSchema)]
struct GreetArgs {
    /// Who to greet.
    name: String,
}

#[derive(Clone)]
struct Everything {
    tool_router: ToolRouter<Self>,
    prompt_router: PromptRouter<Self>,
    /// `tools/call` requests received, whether or not their arguments parse.
    calls: Arc<AtomicU64>,
    /// Whether `echo` describes itself differently.
    drift: Arc<AtomicBool>,
}

#[derive(Deserialize, JsonSchema)]
struct DriftArgs {
    /// Whether `echo`'s description drifts.
    on: bool,
}

const DRIFTED_ECHO: &str = "Returns its message unchanged (drifted)";

#[tool_router]
impl Everything {
    /// The routers as built from the source alone: what a snapshot of the
    /// initialised guest holds (`moat_wit::preinit!` below). Nothing here
    /// reads the environment.
    fn routers() -> (ToolRouter<Self>, PromptRouter<Self>) {
        let mut tool_router = Self::tool_router();
        if let Some(shape) = tool_router.map.get_mut("shape") {
            let schema = serde_json::json!({
                "type": "object",
                "properties": {"count": {"type": "integer"}},
                "required": ["count"]
            });
            if let serde_json::Value::Object(schema) = schema {
                shape.attr.output_schema = Some(Arc::new(schema));
            }
        }
        (tool_router, Self::prompt_router())
    }

    fn new() -> Self {
        let (tool_router, mut prompt_router) = moat_wit::preinitialized(Self::routers);
        let drift = std::env::var("EVERYTHING_DRIFT").is_ok_and(|v| v == "1");
        if drift && let Some(greet) = prompt_router.map.get_mut("greet") {
            // Under EVERYTHING_DRIFT=1 the prompt and the resource drift too.
            greet.attr.description = Some("Greets someone by name (drifted)".into());
        }
        Self {
            tool_router,
            prompt_router,
            calls: Arc::default(),
            drift: Arc::new(AtomicBool::new(drift)),
        }
    }

    /// A tool as listed now (with `echo` drifted when the switch is on).
    fn listed(&self, mut tool: Tool) -> Tool {
        if tool.name == "echo" && self.drift.load(Ordering::SeqCst) {
            tool.description = Some(DRIFTED_ECHO.into());
        }
        tool
    }

    #[tool(
        description = "Turns the drift of echo's description on or off, then announces notifications/tools/list_changed"
    )]
    async fn drift(
        &self,
        Parameters(args): Parameters<DriftArgs>,
        client: Peer<RoleServer>,
    ) -> Result<String, ErrorData> {
        self.drift.store(args.on, Ordering::SeqCst);
        client
            .notify_tool_list_changed()
            .await
            .map_err(|error| ErrorData::internal_error(error.to_string(), None))?;
        Ok(format!("drift {}", args.on))
    }

    #[tool(description = "Returns structured output declared by an outputSchema")]
    async fn shape(&self, Parameters(args): Parameters<ShapeArgs>) -> CallToolResult {
        let count = if args.valid {
            serde_json::json!(3)
        } else {
            serde_json::json!("three")
        };
        let mut result = CallToolResult::success(vec![ContentBlock::text(count.to_string())]);
        result.structured_content = Some(serde_json::json!({ "count": count }));
        result
    }

    #[tool(description = "How many tools/call requests this server has received")]
    async fn calls(&self) -> String {
        self.calls.load(Ordering::SeqCst).to_string()
    }

    #[tool(description = "Returns its message unchanged")]
    async fn echo(&self, Parameters(args): Parameters<EchoArgs>) -> String {
        args.message
    }

    #[tool(description = "Adds two integers")]
    async fn add(&self, Parameters(args): Parameters<AddArgs>) -> Result<String, ErrorData> {
        args.a
            .checked_add(args.b)
            .map(|sum| sum.to_string())
            .ok_or_else(|| ErrorData::invalid_params("a + b overflows i64", None))
    }

    #[tool(description = "Waits for ms milliseconds, then answers")]
    async fn sleep(&self, Parameters(args): Parameters<SleepArgs>) -> String {
        moat_wit::time::sleep(Duration::from_millis(args.ms)).await;
        format!("slept {} ms", args.ms)
    }

    #[tool(description = "Fails with the given message as a tool error")]
    async fn fail(&self, Parameters(args): Parameters<FailArgs>) -> CallToolResult {
        CallToolResult::error(vec![ContentBlock::text(args.message)])
    }

    #[tool(description = "Returns n bytes of text")]
    async fn blob(&self, Parameters(args): Parameters<BlobArgs>) -> String {
        "x".repeat(args.n)
    }

    #[tool(description = "Sends steps progress notifications, then answers")]
    async fn progress(
        &self,
        Parameters(args): Parameters<ProgressArgs>,
        meta: RequestMetaObject,
        client: Peer<RoleServer>,
    ) -> Result<String, ErrorData> {
        if let Some(token) = meta.get_progress_token() {
            for step in 1..=args.steps {
                client
                    .notify_progress(
                        ProgressNotificationParam::new(token.clone(), f64::from(step))
                            .with_total(f64::from(args.steps))
                            .with_message(format!("step {step}")),
                    )
                    .await
                    .map_err(|error| ErrorData::internal_error(error.to_string(), None))?;
                if args.interval_ms > 0 {
                    moat_wit::time::sleep(Duration::from_millis(args.interval_ms)).await;
                }
            }
        }
        Ok(format!("{} steps done", args.steps))
    }
}

#[prompt_router]
impl Everything {
    #[prompt(name = "greet", description = "Greets someone by name")]
    async fn greet(&self, Parameters(args): Parameters<GreetArgs>) -> Vec<PromptMessage> {
        vec![PromptMessage::new_text(
            Role::User,
            format!("Hello, {}!", args.name),
        )]
    }
}

#[tool_handler(router = self.tool_router)]
#[prompt_handler(router = self.prompt_router)]
impl ServerHandler for Everything {
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let call = ToolCallContext::new(self, request, context);
        self.tool_router.call(call).await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.tool_router
                .list_all()
                .into_iter()
                .map(|tool| self.listed(tool))
                .collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tool_router
            .get(name)
            .cloned()
            .map(|tool| self.listed(tool))
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .enable_resources()
                .build(),
        )
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let name = if std::env::var("EVERYTHING_DRIFT").is_ok_and(|v| v == "1") {
            "readme (drifted)"
        } else {
            "readme"
        };
        Ok(ListResourcesResult::with_all_items(vec![Resource::new(
            README_URI, name,
        )]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if request.uri == README_URI {
            Ok(
                ReadResourceResult::new(vec![ResourceContents::text(README_TEXT, README_URI)])
                    .into(),
            )
        } else {
            Err(ErrorData::resource_not_found(
                format!("no resource {}", request.uri),
                None,
            ))
        }
    }
}

moat_wit::preinit!(Everything::routers);

fn main() -> std::io::Result<()> {
    moat_wit::block_on(async {
        let service = Everything::new()
            .serve(moat_wit::transport())
            .await
            .map_err(std::io::Error::other)?;
        service.waiting().await.map_err(std::io::Error::other)?;
        Ok(())
    })
}

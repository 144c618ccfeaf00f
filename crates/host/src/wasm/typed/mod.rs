//! Typed tool components: a component that does not export `wasi:cli/run`
//! exports plain WIT functions, and each becomes an MCP tool (the model of
//! Wassette). This module owns the tool server that stands in for such a
//! component's stdio: it speaks MCP on in-memory pipes, so the one transport
//! and everything above it treat it like any other server, and it answers
//! `tools/call` by converting the arguments ([`value`]), calling the export
//! in an instance under the server's fuel, memory and deadline, and
//! converting the result back.
//!
//! Instances: by default a fresh one for every call (no state crosses
//! calls; a trap stays within its call), or one per session
//! (`instance = "session"`), replaced after a call that fails. Either way a
//! call that traps or hits a limit fails alone: the server keeps answering.
//! Instances come from the component's pre-instantiation, so a call pays
//! only for instantiating.

pub mod schema;
pub mod value;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;
use wasmtime::component::{Component, ComponentExportIndex, Instance, InstancePre, Type, Val};
use wasmtime::{Engine, Store};

use super::{HostState, InstanceSetup, PIPE_BYTES, Runner, WasmLaunch, classify, pipe};
use crate::config::Instances;
use crate::instance::{Exit, Identity, Launched, Tracker};
use crate::limits::LimitHit;
use schema::{PackageDocs, Skipped, ToolShape};

/// A typed component, pre-instantiated, with its tools derived once.
pub struct TypedComponent {
    pre: InstancePre<HostState>,
    tools: Vec<TypedTool>,
    skipped: Vec<Skipped>,
}

/// One tool: its shape, the export it calls, and its MCP definition.
struct TypedTool {
    shape: ToolShape,
    index: ComponentExportIndex,
    tool: Tool,
}

impl TypedComponent {
    /// Derives the tools of `component` (see [`schema`]), with descriptions
    /// from `docs`, and finds each one's export.
    pub fn new(
        pre: InstancePre<HostState>,
        component: &Component,
        engine: &Engine,
        docs: Option<PackageDocs>,
    ) -> Result<Self, String> {
        let shapes = schema::derive(component, engine, docs.as_ref());
        let mut skipped = shapes.skipped;
        let mut tools: Vec<TypedTool> = Vec::with_capacity(shapes.tools.len());
        for shape in shapes.tools {
            if let Some(taken) = tools.iter().find(|t| t.shape.name == shape.name) {
                skipped.push(Skipped {
                    reason: format!(
                        "its tool name `{}` is already that of {}",
                        shape.name, taken.shape.export
                    ),
                    export: shape.export,
                });
                continue;
            }
            let index = match &shape.export.interface {
                None => component.get_export_index(None, &shape.export.function),
                Some(interface) => component
                    .get_export_index(None, interface)
                    .and_then(|i| component.get_export_index(Some(&i), &shape.export.function)),
            }
            .ok_or_else(|| format!("export {} has no index", shape.export))?;
            let mut tool = Tool::new(
                shape.name.clone(),
                shape.description.clone(),
                Arc::new(shape.input_schema.clone()),
            );
            tool.output_schema = shape.output_schema.clone().map(Arc::new);
            tools.push(TypedTool { shape, index, tool });
        }
        Ok(Self {
            pre,
            tools,
            skipped,
        })
    }

    /// The exported functions that are not tools, and why.
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }

    /// The tools, in export order.
    pub fn tools(&self) -> impl Iterator<Item = &ToolShape> {
        self.tools.iter().map(|t| &t.shape)
    }

    fn tool(&self, name: &str) -> Option<&TypedTool> {
        self.tools.iter().find(|t| t.shape.name == name)
    }
}

/// Starts the tool server of `component` on its own task, speaking MCP on
/// in-memory pipes. Guests' stdout and stderr both reach the transport's
/// stderr (diagnostics); their stdin is empty.
pub(crate) fn launch(
    component: Arc<TypedComponent>,
    launch: &WasmLaunch,
    setup: InstanceSetup,
    runner: Runner,
    identity: Identity,
    tracker: &Arc<Tracker>,
) -> Launched {
    let (stdin_host, stdin_server) = pipe::pipe(PIPE_BYTES);
    let (stdout_server, stdout_host) = pipe::pipe(PIPE_BYTES);
    let (stderr_guest, stderr_host) = pipe::pipe(PIPE_BYTES);
    let metrics = setup.metrics.clone();
    let server = ToolServer {
        inner: Arc::new(Inner {
            component,
            setup,
            runner,
            stderr: stderr_guest,
            session: tokio::sync::Mutex::new(None),
        }),
    };
    let name = launch.spec.name.clone();
    let started = crate::instance::InProcess {
        stdin: Box::new(stdin_host),
        stdout: Box::new(stdout_host),
        stderr: Box::new(stderr_host),
        identity,
        metrics,
        // Every call has its own budget.
        on_request: None,
        terminate: None,
        answers_deadlines: true,
    };
    started.spawn(&launch.spec.name, "typed tool server", tracker, async move {
        match rmcp::serve_server(server, (stdin_server, stdout_server)).await {
            Ok(running) => match running.waiting().await {
                Ok(_) => Exit::Code(0),
                Err(error) => Exit::Crashed(format!("the tool server's task failed: {error}")),
            },
            // The client went away before the handshake ended.
            Err(error) => {
                tracing::debug!(server = %name, %error, "typed tool server ended before serving");
                Exit::Code(0)
            }
        }
    })
}

/// The MCP server in front of one typed component, for one session.
#[derive(Clone)]
struct ToolServer {
    inner: Arc<Inner>,
}

struct Inner {
    component: Arc<TypedComponent>,
    setup: InstanceSetup,
    runner: Runner,
    /// Where instances' stdout and stderr go.
    stderr: pipe::PipeWriter,
    /// The session's instance (`instance = "session"`), while it is sound.
    session: tokio::sync::Mutex<Option<Held>>,
}

/// A live instance and its store.
struct Held {
    store: Store<HostState>,
    instance: Instance,
}

impl Inner {
    /// The server's name.
    fn name(&self) -> &str {
        &self.setup.launch.spec.name
    }

    async fn instantiate(&self) -> Result<Held, Exit> {
        let (closed, stdin) = pipe::pipe(1);
        drop(closed);
        let state = self
            .setup
            .state(
                stdin,
                self.stderr.clone(),
                self.stderr.clone(),
                Arc::new(AtomicU64::new(0)),
            )
            .map_err(|e| Exit::Crashed(e.to_string()))?;
        let mut store = self.runner.store(state)?;
        match self.component.pre.instantiate_async(&mut store).await {
            Ok(instance) => Ok(Held { store, instance }),
            Err(error) => Err(classify(&error, &store, &self.runner.limits)),
        }
    }

    /// Calls `tool` in an instance: a fresh one, or the session's.
    async fn invoke(&self, tool: &TypedTool, params: Vec<Val>) -> Result<Vec<Val>, Exit> {
        match self.setup.launch.instances() {
            Instances::Call => {
                self.instantiate()
                    .await?
                    .call(tool, &params, &self.runner)
                    .await
            }
            Instances::Session => {
                let mut slot = self.session.lock().await;
                let mut held = match slot.take() {
                    Some(held) => held,
                    None => self.instantiate().await?,
                };
                // A fresh CPU budget from the next transition into the guest.
                held.store.data().requests.fetch_add(1, Ordering::SeqCst);
                let result = held.call(tool, &params, &self.runner).await;
                // A failed call leaves the instance unsound: the next call
                // gets a new one. (A call cancelled by its deadline drops
                // `held` with this future.)
                if result.is_ok() {
                    *slot = Some(held);
                }
                result
            }
        }
    }
}

impl Held {
    async fn call(
        &mut self,
        tool: &TypedTool,
        params: &[Val],
        runner: &Runner,
    ) -> Result<Vec<Val>, Exit> {
        let func = self
            .instance
            .get_func(&mut self.store, tool.index)
            .ok_or_else(|| {
                Exit::Crashed(format!("the instance has no export {}", tool.shape.export))
            })?;
        self.store.data_mut().limiter.hit = None;
        let mut results = vec![Val::Bool(false); tool.shape.results.len()];
        match func.call_async(&mut self.store, params, &mut results).await {
            Ok(()) => Ok(results),
            Err(error) => Err(classify(&error, &self.store, &runner.limits)),
        }
    }
}

/// The result of a call in Wassette's shape: `structuredContent` is
/// `{"result": V}`, the text is V itself when V is a string and compact JSON
/// otherwise; an `err` of a `result` return sets `isError` (Wassette leaves
/// it false).
fn answer(tool: &TypedTool, results: &[Val]) -> CallToolResult {
    let Some(first) = results.first() else {
        return CallToolResult::success(vec![ContentBlock::text("null")]);
    };
    let value = value::to_json(first);
    let text = match &value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let failed = matches!(tool.shape.results.first(), Some(Type::Result(_)))
        && matches!(first, Val::Result(Err(_)));
    let mut result = if failed {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    result.structured_content = Some(serde_json::json!({ "result": value }));
    result
}

pub use crate::instance::FAULT_META;

/// A call that trapped, hit a limit or could not start: an error result
/// naming the tool and the reason, for this call only, marked with
/// [`FAULT_META`].
fn failure(server: &str, tool: &str, exit: &Exit) -> CallToolResult {
    let (class, reason) = match exit {
        Exit::Limit(hit @ LimitHit::Deadline { .. }) => ("hang", format!("hit its {hit}")),
        Exit::Limit(hit) => ("limit", format!("hit its {hit}")),
        Exit::Crashed(reason) => ("crash", format!("failed: {reason}")),
        Exit::Code(code) => ("crash", format!("exited with code {code}")),
        Exit::Stopped => ("crash", "was stopped".to_owned()),
    };
    tracing::info!(%server, %tool, %reason, "typed call failed");
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
        "server `{server}`: tool `{tool}` {reason}; the server still answers other calls"
    ))]);
    let mut meta = rmcp::model::MetaObject::new();
    let mut fault = serde_json::json!({"class": class, "detail": reason});
    if let Exit::Limit(hit) = exit {
        fault["limit"] = hit.name().into();
    }
    meta.insert(FAULT_META.to_owned(), fault);
    result.meta = Some(meta);
    result
}

impl ServerHandler for ToolServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new(self.inner.name().to_owned(), env!("CARGO_PKG_VERSION")),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.inner
                .component
                .tools
                .iter()
                .map(|t| t.tool.clone())
                .collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let inner = &self.inner;
        let Some(tool) = inner.component.tool(&request.name) else {
            return Err(ErrorData::invalid_params(
                format!("server `{}` has no tool `{}`", inner.name(), request.name),
                None,
            ));
        };
        let arguments = request.arguments.unwrap_or_default();
        let params = value::to_params(&arguments, &tool.shape.params).map_err(|e| {
            ErrorData::invalid_params(format!("tool `{}`: {e}", tool.shape.name), None)
        })?;
        let limits = &inner.runner.limits;
        let outcome = tokio::time::timeout(limits.request_timeout(), inner.invoke(tool, params))
            .await
            .unwrap_or(Err(Exit::Limit(LimitHit::Deadline {
                request_timeout_ms: limits.request_timeout_ms,
            })));
        Ok(match outcome {
            Ok(results) => answer(tool, &results),
            Err(exit) => failure(inner.name(), &tool.shape.name, &exit),
        }
        .into())
    }
}

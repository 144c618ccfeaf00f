//! Start-to-initialized and tool-call round trip through the wasm transport,
//! side by side with an in-process rmcp baseline (client and server over an
//! in-memory duplex) in the same run.
//!
//! `cargo bench --bench transport`

use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use moat_host::{Handshake, Host, ServerSpec, Session};
use moat_test_guests as guests;
use rmcp::handler::server::{tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolRequestParams, ServerCapabilities, ServerConfig};
use rmcp::{ClientHandler, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use serde::Deserialize;

#[derive(Deserialize, schemars::JsonSchema)]
struct AddArgs {
    a: i64,
    b: i64,
}

/// The in-process baseline: the same `add` tool the `everything` guest has.
#[derive(Clone)]
struct InProcess {
    #[expect(dead_code, reason = "read by the tool_handler macro")]
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl InProcess {
    fn new() -> Self {
        Self {
            tool_router: Self::tool_router(),
        }
    }

    #[tool(description = "Adds two integers")]
    async fn add(&self, Parameters(args): Parameters<AddArgs>) -> String {
        (args.a + args.b).to_string()
    }
}

#[tool_handler]
impl ServerHandler for InProcess {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[derive(Clone, Default)]
struct BenchClient;
impl ClientHandler for BenchClient {}

fn spec() -> ServerSpec {
    let mut spec = ServerSpec::wasm("everything", guests::EVERYTHING_WASM);
    spec.allow_unmeasured = true;
    spec
}

fn add_args() -> Option<rmcp::model::JsonObject> {
    serde_json::json!({"a": 2, "b": 40}).as_object().cloned()
}

async fn start_and_close(host: &Host) {
    let session = host
        .connect_with(&spec(), Handshake::Initialize)
        .await
        .expect("connect");
    session.close().await.expect("close");
}

async fn in_process_session() -> rmcp::service::RunningService<rmcp::RoleClient, BenchClient> {
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(server) = InProcess::new().serve(server_io).await {
            let _ = server.waiting().await;
        }
    });
    BenchClient
        .serve(client_io)
        .await
        .expect("in-process client")
}

fn start_to_initialized(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let warm = Host::new(Some(cache.path().to_owned())).unwrap();
    runtime.block_on(start_and_close(&warm));

    let mut group = c.benchmark_group("start_to_initialized");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.bench_function("wasm_cold_compile", |b| {
        b.to_async(&runtime).iter(|| async {
            let host = Host::new(None).unwrap();
            start_and_close(&host).await;
        })
    });
    group.finish();

    let mut group = c.benchmark_group("start_to_initialized");
    group.bench_function("wasm_from_disk_cache", |b| {
        b.to_async(&runtime).iter(|| async {
            let host = Host::new(Some(cache.path().to_owned())).unwrap();
            start_and_close(&host).await;
        })
    });
    group.bench_function("wasm_pre_instantiated", |b| {
        b.to_async(&runtime).iter(|| start_and_close(&warm))
    });
    group.bench_function("in_process_rmcp", |b| {
        b.to_async(&runtime).iter(|| async {
            let client = in_process_session().await;
            client.cancel().await.unwrap();
        })
    });
    group.finish();
}

fn tool_call_round_trip(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let host = Host::new(Some(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-cache"),
    ))
    .unwrap();
    let session: Session = runtime
        .block_on(host.connect_with(&spec(), Handshake::Initialize))
        .unwrap();
    let baseline = runtime.block_on(in_process_session());

    let mut group = c.benchmark_group("tool_call_round_trip");
    group.bench_function("wasm", |b| {
        b.to_async(&runtime)
            .iter(|| async { session.call_tool("add", add_args()).await.unwrap() })
    });
    group.bench_function("in_process_rmcp", |b| {
        b.to_async(&runtime).iter(|| async {
            let mut params = CallToolRequestParams::new("add");
            params.arguments = add_args();
            baseline.call_tool(params).await.unwrap()
        })
    });
    group.finish();
    runtime.block_on(async {
        session.close().await.unwrap();
        baseline.cancel().await.unwrap();
    });
}

criterion_group!(benches, start_to_initialized, tool_call_round_trip);
criterion_main!(benches);

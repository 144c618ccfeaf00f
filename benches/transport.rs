//! Start-to-initialized and tool-call round trip through the one transport,
//! wasm and native (the same guest built both ways), side by side with an in-process rmcp baseline (client and server over an
//! in-memory duplex) in the same run.
//!
//! Native start-up is measured twice: through Moat (measured, in its own
//! namespaces, Landlock, seccomp, no capabilities) and as a bare child of
//! the same binary, so the cost of containment is read off one run.
//!
//! Each group runs on a current-thread and on a multi-thread tokio runtime.
//! `cpu_limits` compares the wasm engine's CPU metering (fuel, epoch, none)
//! on the same calls.
//!
//! `cargo bench --bench transport`

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use moat_host::wasm::WasmLaunch;
use moat_host::{Digest, Expectation, Handshake, Host, ServerSpec, Session};
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

/// The same guest built natively, pinned (so the launch hashes it).
fn native_spec() -> ServerSpec {
    let mut spec = ServerSpec::native("everything", guests::EVERYTHING_NATIVE);
    spec.sha256 = Some(Digest::of(
        &std::fs::read(guests::EVERYTHING_NATIVE).unwrap(),
    ));
    spec
}

fn add_args() -> Option<rmcp::model::JsonObject> {
    serde_json::json!({"a": 2, "b": 40}).as_object().cloned()
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

/// The native guest spawned plainly, with rmcp's client on its stdio.
async fn bare_child_session() -> (
    rmcp::service::RunningService<rmcp::RoleClient, BenchClient>,
    tokio::process::Child,
) {
    let mut child = tokio::process::Command::new(guests::EVERYTHING_NATIVE)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let client = BenchClient
        .serve((stdout, stdin))
        .await
        .expect("bare child client");
    (client, child)
}

/// Times `connect` alone; closing happens outside the measurement.
async fn time_connects(host: &Host, iters: u64) -> Duration {
    time_connects_to(host, &spec(), iters).await
}

async fn time_connects_to(host: &Host, spec: &ServerSpec, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let started = Instant::now();
        let session = host
            .connect_with(spec, Handshake::Initialize)
            .await
            .expect("connect");
        total += started.elapsed();
        session.close().await.expect("close");
    }
    total
}

fn runtimes() -> [(&'static str, tokio::runtime::Runtime); 2] {
    [
        (
            "current_thread",
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        ),
        ("multi_thread", tokio::runtime::Runtime::new().unwrap()),
    ]
}

fn start_to_initialized(c: &mut Criterion) {
    let cache = tempfile::tempdir().unwrap();
    for (flavor, runtime) in runtimes() {
        let warm = Host::new(Some(cache.path().to_owned())).unwrap();
        runtime.block_on(time_connects(&warm, 1));

        let mut group = c.benchmark_group(format!("start_to_initialized/{flavor}"));
        group.sample_size(10);
        group.measurement_time(Duration::from_secs(15));
        group.bench_function("wasm_cold_compile", |b| {
            b.to_async(&runtime).iter_custom(|iters| async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    // A fresh engine without a cache: compile every time.
                    total += time_connects(&Host::new(None).unwrap(), 1).await;
                }
                total
            })
        });
        group.finish();

        let mut group = c.benchmark_group(format!("start_to_initialized/{flavor}"));
        group.bench_function("wasm_from_disk_cache", |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let cache = cache.path().to_owned();
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let host = Host::new(Some(cache.clone())).unwrap();
                        total += time_connects(&host, 1).await;
                    }
                    total
                }
            })
        });
        group.bench_function("wasm_read_and_measure_each_time", |b| {
            b.to_async(&runtime)
                .iter_custom(|iters| time_connects(&warm, iters))
        });
        let prepared = runtime
            .block_on(
                warm.wasm()
                    .prepare(Path::new(guests::EVERYTHING_WASM), Expectation::Unpinned),
            )
            .unwrap();
        group.bench_function("wasm_pre_instantiated", |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let prepared = prepared.clone();
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let started = Instant::now();
                        let spec = spec();
                        let transport = moat_host::Planned::WasmPrepared {
                            prepared: prepared.clone(),
                            launch: WasmLaunch::from_spec(&spec),
                        }
                        .transport(&spec.name, spec.limits.clone());
                        let session = Session::connect(transport, Handshake::Initialize)
                            .await
                            .expect("connect");
                        total += started.elapsed();
                        session.close().await.expect("close");
                    }
                    total
                }
            })
        });
        let native = native_spec();
        group.bench_function("native_measured_spawn", |b| {
            b.to_async(&runtime)
                .iter_custom(|iters| time_connects_to(&warm, &native, iters))
        });
        // The same binary as a bare child (no measurement, namespaces,
        // Landlock, seccomp or capability drop) with rmcp's client on its
        // pipes: what Moat's containment costs is the difference.
        group.bench_function("native_bare_spawn", |b| {
            b.to_async(&runtime).iter_custom(|iters| async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let started = Instant::now();
                    let (client, mut child) = bare_child_session().await;
                    total += started.elapsed();
                    client.cancel().await.unwrap();
                    child.kill().await.unwrap();
                }
                total
            })
        });
        group.bench_function("in_process_rmcp", |b| {
            b.to_async(&runtime).iter_custom(|iters| async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let started = Instant::now();
                    let client = in_process_session().await;
                    total += started.elapsed();
                    client.cancel().await.unwrap();
                }
                total
            })
        });
        group.finish();
    }
}

fn tool_call_round_trip(c: &mut Criterion) {
    for (flavor, runtime) in runtimes() {
        let host = Host::new(Some(
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-cache"),
        ))
        .unwrap();
        let session: Session = runtime
            .block_on(host.connect_with(&spec(), Handshake::Initialize))
            .unwrap();
        let native: Session = runtime
            .block_on(host.connect_with(&native_spec(), Handshake::Initialize))
            .unwrap();
        let baseline = runtime.block_on(in_process_session());

        let mut group = c.benchmark_group(format!("tool_call_round_trip/{flavor}"));
        group.bench_function("wasm", |b| {
            b.to_async(&runtime)
                .iter(|| async { session.call_tool("add", add_args()).await.unwrap() })
        });
        group.bench_function("native", |b| {
            b.to_async(&runtime)
                .iter(|| async { native.call_tool("add", add_args()).await.unwrap() })
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
            native.close().await.unwrap();
            baseline.cancel().await.unwrap();
        });
    }
}

/// The cost of bounding guest CPU: the same calls on engines metering by
/// fuel (the default), by epoch interruption, and not at all, side by side.
/// `add` is mostly the transport; `blob` (64 KiB of text) is mostly guest
/// work, where per-operator metering shows.
fn cpu_limits(c: &mut Criterion) {
    use moat_host::wasm::Metering;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let blob_args = serde_json::json!({"n": 64 * 1024}).as_object().cloned();
    let mut group = c.benchmark_group("cpu_limits");
    for (label, metering) in [
        ("fuel", Metering::Fuel),
        ("epoch", Metering::Epoch),
        ("unmetered", Metering::Unmetered),
    ] {
        let host = Host::with_metering(
            Some(Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-cache-{label}"))),
            metering,
        )
        .unwrap();
        let session: Session = runtime
            .block_on(host.connect_with(&spec(), Handshake::Initialize))
            .unwrap();
        group.bench_function(format!("add/{label}"), |b| {
            b.to_async(&runtime)
                .iter(|| async { session.call_tool("add", add_args()).await.unwrap() })
        });
        group.bench_function(format!("blob_64k/{label}"), |b| {
            b.to_async(&runtime)
                .iter(|| async { session.call_tool("blob", blob_args.clone()).await.unwrap() })
        });
        runtime.block_on(session.close()).unwrap();
    }
    group.finish();
}

criterion_group!(
    benches,
    start_to_initialized,
    tool_call_round_trip,
    cpu_limits
);
criterion_main!(benches);

//! The bodies of Moat's fuzz targets. `fuzz/` wraps each in a libFuzzer
//! target; `tests/replay.rs` runs every file of the corpus and every past
//! crash through the same functions as plain tests, so a crash found once
//! stays a regression test.
//!
//! Each target checks invariants on every input, by assertion: no panic
//! anywhere below it, every failure a typed error, and the transport ends
//! closed (no task or instance left).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use moat_host::Pins;
use moat_host::instance::{Exit, Identity, Launched, Metrics, Tracker};
use moat_host::lock::{Lock, LockedServer, LockedTool, canonical_json, tool_pin};
use moat_host::{Config, Digest, Evidence, Handshake, Host, Limits, ServerSpec, Session};

/// A fuzz target's body: one input, checked by assertion.
pub type Target = fn(&[u8]);

/// The targets, by name, as `fuzz/` and the corpus directories call them.
pub const TARGETS: &[(&str, Target)] = &[
    ("framing", framing),
    ("config", config),
    ("routing", routing),
    ("wasm_boundary", wasm_boundary),
    ("arguments", arguments),
    ("typed_values", typed_values),
];

/// Bytes a replayed or fuzzed server may write: enough for every framing
/// case, small enough to keep runs fast.
const MAX_INPUT: usize = 16 << 10;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}

fn host() -> &'static Host {
    static HOST: OnceLock<Host> = OnceLock::new();
    HOST.get_or_init(|| Host::new(None).expect("a host"))
}

fn small_limits() -> Limits {
    Limits {
        max_line_bytes: 4096,
        request_timeout_ms: 300,
        close_grace_ms: 10,
        stderr_buffer_bytes: 1024,
        ..Limits::default()
    }
}

/// (a) The stdout line reader and framing: `data` is everything a server
/// writes to stdout before it ends. The handshake and one listing either
/// work or fail with a typed error, and nothing of the transport is left.
pub fn framing(data: &[u8]) {
    let data = data[..data.len().min(MAX_INPUT)].to_vec();
    runtime().block_on(async move {
        let transport =
            moat_host::ServerTransport::new("fuzzed", small_limits(), move |tracker| async move {
                Ok(scripted(data, &tracker))
            });
        let tracker = transport.shared().tracker().clone();
        if let Ok(session) = Session::connect(transport, Handshake::Initialize).await {
            let _ = session.list_tools().await;
            let _ = session.close().await;
        }
        assert_eq!(tracker.live(), 0, "the transport did not end closed");
    });
}

/// A "server" that wrote `stdout`, ignored its stdin, and exited.
fn scripted(stdout: Vec<u8>, tracker: &Arc<Tracker>) -> Launched {
    let (exit_tx, exit) = tokio::sync::watch::channel(None);
    let guard = tracker.enter();
    let task = tokio::spawn(async move {
        let _guard = guard;
        let _ = exit_tx.send(Some(Exit::Code(0)));
    });
    Launched {
        stdin: Box::new(tokio::io::sink()),
        stdout: Box::new(std::io::Cursor::new(stdout)),
        stderr: Box::new(tokio::io::empty()),
        exit,
        task,
        terminate: Box::new(|| {}),
        stop: Box::new(|| {}),
        on_request: Box::new(|| {}),
        metrics: Arc::new(Metrics::default()),
        identity: Identity {
            digest: None,
            measured: Vec::new(),
            sandbox: Default::default(),
            evidence: Evidence::NativeUnmeasured,
            component: None,
            oci: None,
        },
        answers_deadlines: false,
    }
}

/// (b) Config and lock parsing: any text is a config or a clear error, and
/// a lock that parses survives writing and reading back unchanged.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    #[cfg(feature = "planted-crash")]
    if text.contains("MOAT-PLANTED-CRASH") {
        panic!("the planted crash was found");
    }
    let path = Path::new("/fuzz/moat.toml");
    if let Err(error) = Config::parse(path, text) {
        assert!(!error.to_string().is_empty());
    }
    if let Ok(lock) = Lock::parse(path, text) {
        let again = Lock::parse(path, &lock.to_text()).expect("a written lock reads back");
        assert_eq!(again, lock, "a lock changed on the way through its file");
    }
}

/// (c) Namespacing and routing: any name an agent sends is routed or
/// refused with an error; the validity check agrees with its pattern.
pub fn routing(data: &[u8]) {
    let name = String::from_utf8_lossy(&data[..data.len().min(512)]).into_owned();
    let by_pattern = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    assert_eq!(moat_host::gateway::valid_exposed_name(&name), by_pattern);
    let mut spec = ServerSpec::wasm("a", "/nonexistent/moat-fuzz/a.wasm");
    spec.allow_unmeasured = true;
    let config = Config {
        path: "/fuzz/moat.toml".into(),
        servers: [("a".to_owned(), spec)].into(),
        serve: Default::default(),
        wasm: Default::default(),
        nodes: Default::default(),
    };
    let gateway = moat_host::gateway::Gateway::new(host().clone(), config, None);
    runtime().block_on(async {
        let session = gateway.session();
        // Server `a` cannot start: every route ends in an error.
        let error = session
            .call(&name, None)
            .await
            .expect_err("no tool can answer");
        assert!(!error.message.is_empty());
        assert!(session.close().await.is_empty());
    });
}

/// (d) The whole wasm boundary: a real component writes fuzzer-chosen bytes
/// to stdout and stderr and exits with a fuzzer-chosen code (see the
/// `replay` guest), driven through the real wasm transport.
pub fn wasm_boundary(data: &[u8]) {
    let data = &data[..data.len().min(MAX_INPUT)];
    let mut spec = ServerSpec::wasm("replay", moat_test_guests::REPLAY_WASM);
    spec.allow_unmeasured = true;
    spec.limits = small_limits();
    let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
    spec.env.values.insert("REPLAY".into(), hex);
    runtime().block_on(async {
        let transport = host().transport(&spec).expect("a transport");
        let tracker = transport.shared().tracker().clone();
        if let Ok(session) = Session::connect(transport, Handshake::Initialize).await {
            let _ = session.list_tools().await;
            let _ = session.close().await;
        }
        assert_eq!(tracker.live(), 0, "the transport did not end closed");
    });
}

/// (e) Argument validation: `data` is a schema and arguments (JSON, split
/// at the first 0 byte). A schema is usable or a typed error; arguments
/// pass or fail with a JSON pointer.
pub fn arguments(data: &[u8]) {
    let (schema, args) = match data.iter().position(|b| *b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b"{}"[..]),
    };
    let (Ok(schema), Ok(args)) = (
        serde_json::from_slice::<serde_json::Value>(schema),
        serde_json::from_slice::<serde_json::Value>(args),
    ) else {
        return;
    };
    let Some(pins) = pins_for(schema) else {
        return;
    };
    if let Err(violation) = pins.check_arguments("t", &args) {
        assert!(
            violation.pointer.starts_with('/'),
            "pointer {:?}",
            violation.pointer
        );
    }
}

/// (f) A typed tool component's arguments: the first byte picks a tool of
/// the `kinds` guest (every WIT type kind), the rest is JSON. Converting it
/// into component values never panics, and it succeeds exactly when the
/// tool's derived input schema, pinned as `moat lock` would pin it,
/// accepts the arguments: the schema describes what is accepted, no more and
/// no less. (JSON numbers beyond 2^53 in magnitude are left out of that
/// comparison: a double cannot hold them exactly, and validators differ.)
pub fn typed_values(data: &[u8]) {
    use moat_host::wasm::typed::schema::ToolShape;
    use moat_host::wasm::typed::value::to_params;
    static TOOLS: OnceLock<Vec<(ToolShape, Pins)>> = OnceLock::new();
    let tools = TOOLS.get_or_init(|| {
        let engine = moat_host::wasm::WasmEngine::new(None).expect("a wasm engine");
        let prepared = runtime()
            .block_on(engine.prepare(
                Path::new(moat_test_guests::KINDS_WASM),
                moat_host::Expectation::Unpinned,
            ))
            .expect("preparing the kinds guest");
        let typed = prepared.typed().expect("kinds is a typed component");
        typed
            .tools()
            .map(|shape| {
                let schema = serde_json::Value::Object(shape.input_schema.clone());
                (
                    shape.clone(),
                    pins_for(schema).expect("a derived schema pins"),
                )
            })
            .collect()
    });
    let Some((choice, json)) = data.split_first() else {
        return;
    };
    let (shape, pins) = &tools[usize::from(*choice) % tools.len()];
    let Ok(args) = serde_json::from_slice::<serde_json::Value>(json) else {
        return;
    };
    let Some(object) = args.as_object() else {
        return;
    };
    let converted = to_params(object, &shape.params);
    if let Err(error) = &converted {
        assert!(!error.path.is_empty(), "{error}");
    }
    if !has_inexact_number(&args) {
        let valid = pins.check_arguments("t", &args);
        assert_eq!(
            converted.is_ok(),
            valid.is_ok(),
            "conversion {converted:?} but schema {valid:?} for {args}"
        );
    }
}

/// Pins one tool `t` with `input_schema`, as `moat lock` would; `None`
/// when the schema cannot be pinned.
fn pins_for(input_schema: serde_json::Value) -> Option<Pins> {
    let identity = Digest::of(b"fuzz");
    let definition = canonical_json(&serde_json::json!({"name": "t", "inputSchema": input_schema}));
    let locked = LockedServer {
        kind: "wasm".into(),
        evidence: "wasm-measured".into(),
        sha256: String::new(),
        identity: identity.to_string(),
        measured: Default::default(),
        grants: Default::default(),
        tools: vec![LockedTool {
            name: "t".into(),
            sha256: tool_pin(&identity, &definition).to_string(),
            definition,
            flags: Vec::new(),
        }],
        prompts: Vec::new(),
        resources: Vec::new(),
        package: None,
        oci: None,
    };
    Pins::from_locked(&locked, identity).ok()
}

/// Whether `value` holds a number a double cannot represent exactly: a
/// float of 2^53 or more in magnitude.
fn has_inexact_number(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Number(n) => {
            !n.is_i64()
                && !n.is_u64()
                && n.as_f64()
                    .is_some_and(|f| f.abs() >= 9_007_199_254_740_992.0)
        }
        serde_json::Value::Array(items) => items.iter().any(has_inexact_number),
        serde_json::Value::Object(map) => map.values().any(has_inexact_number),
        _ => false,
    }
}

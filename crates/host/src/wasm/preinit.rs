//! Snapshots of a guest's initialised state (Wizer's way): a component that
//! exports `wizer-initialize` (`moat_wit::preinit!`) is instrumented,
//! instantiated with nothing granted, its initialiser run once under the
//! limits of the server that first starts it, and its memories and globals written back into a new
//! component. That component, not the source, is what Moat then compiles,
//! caches and runs: every instance starts where the initialiser left off.
//!
//! The snapshot is measured: its sha256 joins the instance's identity (the
//! component report) beside the source's, and its cache file is bound by
//! MAC to the source's digest, the engine and the snapshot's digest, so a
//! snapshot never outlives its source. A server opts out with
//! `preinit = false`, for a guest whose initialisation must see its
//! run-time environment.

use super::*;

use wasmtime::component::{Instance, WasmList};
use wasmtime_wizer::{ComponentInstanceState, Wizer};

/// The export a preinitialisable component carries: a function taking and
/// returning nothing.
pub const INIT_EXPORT: &str = "wizer-initialize";

/// Whether `component` is a command (it exports `wasi:cli/run`) that
/// exports the initialiser, as a function at top level: the components
/// Moat snapshots. A typed tool component is never snapshotted (its
/// exports are its tools; see `typed::schema`).
pub(super) fn exports_initializer(component: &Component, engine: &Engine) -> bool {
    let mut initializer = false;
    let mut command = false;
    for (name, item) in component.component_type().exports(engine) {
        initializer |= name == INIT_EXPORT
            && matches!(
                item.ty,
                wasmtime::component::types::ComponentItem::ComponentFunc(_)
            );
        command |= name.starts_with("wasi:cli/run@");
    }
    initializer && command
}

/// Whether the component in `bytes` is a command that exports the
/// initialiser (read from its export section, nothing compiled); see
/// [`exports_initializer`].
pub(super) fn bytes_export_initializer(bytes: &[u8]) -> bool {
    let mut initializer = false;
    let mut command = false;
    top_level(bytes, |payload| {
        if let wasmparser::Payload::ComponentExportSection(exports) = payload {
            for export in exports.clone().into_iter().flatten() {
                initializer |= export.name.name == INIT_EXPORT
                    && export.kind == wasmparser::ComponentExternalKind::Func;
                command |= export.name.name.starts_with("wasi:cli/run@");
            }
        }
        false
    });
    initializer && command
}

/// The names the component in `bytes` imports at its top level.
fn bytes_imports(bytes: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    top_level(bytes, |payload| {
        if let wasmparser::Payload::ComponentImportSection(imports) = payload {
            names.extend(
                imports
                    .clone()
                    .into_iter()
                    .flatten()
                    .map(|import| import.name.name.to_owned()),
            );
        }
        false
    });
    names
}

/// Whether the component in `bytes` imports any of wasi:http.
pub(super) fn bytes_import_http(bytes: &[u8]) -> bool {
    top_level(bytes, |payload| match payload {
        wasmparser::Payload::ComponentImportSection(imports) => imports
            .clone()
            .into_iter()
            .flatten()
            .any(|import| import.name.name.starts_with("wasi:http/")),
        _ => false,
    })
}

/// Whether `found` holds for any section of the outermost component in
/// `bytes` (nested modules and components are skipped; bytes that do not
/// parse hold nothing).
fn top_level(bytes: &[u8], mut found: impl FnMut(&wasmparser::Payload<'_>) -> bool) -> bool {
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let Ok(payload) = payload else {
            return false;
        };
        match payload {
            wasmparser::Payload::ModuleSection { .. }
            | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            payload if depth == 0 && found(&payload) => return true,
            _ => {}
        }
    }
    false
}

/// The version of what an initialiser is held to ([`RUN_TIME_ONLY`], the
/// handle check): bound into every snapshot's cache MAC, so a snapshot made
/// under other rules is made again, never loaded.
pub(super) const POLICY: u32 = 1;

/// Why a component could not be snapshotted.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PreinitError {
    #[error("instrumenting it for the snapshot: {0}")]
    Instrument(String),
    #[error("compiling the instrumented component: {0}")]
    Compile(String),
    #[error("`{INIT_EXPORT}` must be a function taking and returning nothing, not {0}")]
    Signature(String),
    #[error("instantiating it with nothing granted: {0}")]
    Instantiate(String),
    #[error("its `{INIT_EXPORT}` failed: {0}")]
    Initialiser(String),
    #[error(
        "its `{INIT_EXPORT}` returned holding {0} WASI handle(s) (stdio, files, sockets, \
         pollables), which a snapshot cannot carry: open them in `main` instead"
    )]
    OpenResources(usize),
    #[error(
        "its `{INIT_EXPORT}` called {0}: what it returns belongs to each instance (its \
         grants), and a snapshot would keep the initialiser's empty answer for all of them \
         (wasi-libc reads it once); read it in `main` instead"
    )]
    RunTimeRead(String),
    #[error("its `{INIT_EXPORT}` did not return within {0:?}")]
    Timeout(std::time::Duration),
    #[error("reading its state for the snapshot: {0}")]
    Snapshot(String),
    #[error("this engine does not meter guests, so an initialiser could not be bounded")]
    Unmetered,
}

/// Runs `bytes`' initialiser under `limits` (the server's: its fuel,
/// memory and deadline) and returns the snapshot component's bytes.
/// Runs on the calling thread (a blocking one), driving the async calls on
/// `runtime`.
pub(super) fn snapshot(
    engine: &Engine,
    linker: &Linker<HostState>,
    metering: Metering,
    limits: &Limits,
    bytes: &[u8],
    runtime: &tokio::runtime::Handle,
    compile: impl FnOnce(&[u8]) -> Result<Component, PreinitError>,
) -> Result<Vec<u8>, PreinitError> {
    if metering == Metering::Unmetered {
        return Err(PreinitError::Unmetered);
    }
    // Wizer parses what its validation (every feature on) admits and
    // panics on a core module importing a tag or an exact function: refuse
    // those first, and hold any other panic of its passes as a refusal.
    if let Some(kind) = unsupported_core_import(bytes) {
        return Err(PreinitError::Instrument(format!(
            "a core module imports a {kind}, which Wizer cannot snapshot"
        )));
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_snapshot(engine, linker, metering, limits, bytes, runtime, compile)
    }))
    .unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        Err(PreinitError::Instrument(format!(
            "wasmtime-wizer failed on this component: {text}"
        )))
    })
}

/// The kind of a core import that Wizer cannot take (`tag`, `exact
/// function`), in any module of the component, if one is there.
fn unsupported_core_import(bytes: &[u8]) -> Option<&'static str> {
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let Ok(wasmparser::Payload::ImportSection(imports)) = payload else {
            continue;
        };
        for import in imports.into_imports().flatten() {
            match import.ty {
                wasmparser::TypeRef::Tag(_) => return Some("tag"),
                wasmparser::TypeRef::FuncExact(_) => return Some("exact function"),
                _ => {}
            }
        }
    }
    None
}

/// [`snapshot`]'s work, which may panic inside Wizer.
fn run_snapshot(
    engine: &Engine,
    linker: &Linker<HostState>,
    metering: Metering,
    limits: &Limits,
    bytes: &[u8],
    runtime: &tokio::runtime::Handle,
    compile: impl FnOnce(&[u8]) -> Result<Component, PreinitError>,
) -> Result<Vec<u8>, PreinitError> {
    let mut wizer = Wizer::new();
    // Wizer 48 drops the initialiser's core export but not the component's
    // lift of it, which leaves the snapshot invalid: keep both. Only Moat
    // calls a component's exports, and it never calls this one again.
    wizer.keep_init_func(true);
    let (context, instrumented) = wizer
        .instrument_component(bytes)
        .map_err(|e| PreinitError::Instrument(format!("{e:#}")))?;
    let component = compile(&instrumented)?;
    let (item, index) = component
        .get_export(None, INIT_EXPORT)
        .ok_or_else(|| PreinitError::Signature("missing".into()))?;
    match &item {
        wasmtime::component::types::ComponentItem::ComponentFunc(func)
            if func.params().len() == 0 && func.results().len() == 0 => {}
        other => return Err(PreinitError::Signature(format!("{other:?}"))),
    }
    let limits = limits.clone();
    let runner = Runner {
        engine: engine.clone(),
        metering,
        limits: limits.clone(),
    };
    let linker =
        initialiser_linker(linker, &bytes_imports(bytes)).map_err(PreinitError::Instantiate)?;
    let mut store = runner
        .store(nothing_granted(&limits))
        .map_err(|exit| PreinitError::Instantiate(describe(exit)))?;
    let deadline = std::time::Duration::from_millis(limits.request_timeout_ms);
    runtime.block_on(async {
        let run = async {
            let instance = linker
                .instantiate_async(&mut store, &component)
                .await
                .map_err(|e| PreinitError::Instantiate(format!("{e:#}")))?;
            let init = instance
                .get_func(&mut store, index)
                .ok_or_else(|| PreinitError::Signature("not a function".into()))?;
            if let Err(error) = init.call_async(&mut store, &[], &mut []).await {
                // A limit comes first: a guest past its memory aborts, and
                // Rust's abort reads `RUST_BACKTRACE` on its way out.
                let read = error
                    .chain()
                    .find_map(|cause| cause.downcast_ref::<RunTimeRead>());
                if let Some(read) = read
                    && store.data().limiter.hit.is_none()
                {
                    return Err(PreinitError::RunTimeRead(read.0.clone()));
                }
                return Err(PreinitError::Initialiser(describe(classify(
                    &error, &store, &limits,
                ))));
            }
            // A handle the guest still holds is an index into this
            // instance's table, which no snapshot carries: an instance of
            // the snapshot would use it as a handle it never opened.
            let open = store.data_mut().table.iter_mut().count();
            if open > 0 {
                return Err(PreinitError::OpenResources(open));
            }
            let mut state = State {
                store: &mut store,
                instance,
                failed: None,
            };
            let snapshot = wizer
                .snapshot_component(&context, &mut state)
                .await
                .map_err(|e| PreinitError::Snapshot(format!("{e:#}")));
            match state.failed {
                Some(failed) => Err(PreinitError::Snapshot(failed)),
                None => snapshot,
            }
        };
        tokio::time::timeout(deadline, run)
            .await
            .unwrap_or(Err(PreinitError::Timeout(deadline)))
    })
}

/// The WASI interfaces an initialiser may not call, every function of
/// each. Each answers what belongs to one instance, and a snapshot would
/// keep the initialiser's answer for every instance:
///
/// - `wasi:cli/environment` and `wasi:filesystem/preopens` answer the
///   instance's grants (arguments, environment, working directory,
///   directories), and wasi-libc asks once and keeps the answer: the
///   instance's own grants would never be seen;
/// - the clocks answer the time: an `Instant` kept from the initialiser
///   lies in every instance's future (wasmtime-wasi counts each instance's
///   monotonic clock from its own start), and a wall-clock time would be
///   as old as the snapshot.
const RUN_TIME_ONLY: &[(&str, &[&str])] = &[
    (
        "wasi:cli/environment",
        &["get-environment", "get-arguments", "initial-cwd"],
    ),
    ("wasi:filesystem/preopens", &["get-directories"]),
    (
        "wasi:clocks/monotonic-clock",
        &[
            "now",
            "resolution",
            "subscribe-instant",
            "subscribe-duration",
        ],
    ),
    ("wasi:clocks/wall-clock", &["now", "resolution"]),
];

/// The trap an initialiser gets for calling one of [`RUN_TIME_ONLY`]: the
/// interface and function, without the version.
#[derive(Debug, thiserror::Error)]
#[error("{0}, which only an instance may call")]
struct RunTimeRead(String);

/// `base` with every function of [`RUN_TIME_ONLY`] that the component
/// imports (under the exact name it imports, whatever its 0.2 version)
/// replaced by one that traps with [`RunTimeRead`]. An import of such an
/// interface that needs a function not listed there fails to link: the
/// guard never lapses silently.
fn initialiser_linker(
    base: &Linker<HostState>,
    imports: &[String],
) -> Result<Linker<HostState>, String> {
    let mut linker = base.clone();
    linker.allow_shadowing(true);
    for import in imports {
        let unversioned = import.split('@').next().unwrap_or(import);
        let Some((_, funcs)) = RUN_TIME_ONLY
            .iter()
            .find(|(interface, _)| *interface == unversioned)
        else {
            continue;
        };
        let mut instance = linker
            .instance(import)
            .map_err(|e| format!("shadowing {import}: {e:#}"))?;
        for func in *funcs {
            let called = format!("`{unversioned}.{func}`");
            instance
                .func_new(func, move |_, _, _, _| {
                    Err(wasmtime::Error::new(RunTimeRead(called.clone())))
                })
                .map_err(|e| format!("replacing {import}.{func}: {e:#}"))?;
        }
    }
    Ok(linker)
}

/// How the initialiser's run ended, in words.
fn describe(exit: Exit) -> String {
    match exit {
        Exit::Code(code) => format!("it exited with code {code}"),
        Exit::Limit(hit) => format!("it hit a limit: {hit}"),
        Exit::Crashed(detail) => detail,
        Exit::Stopped => "it was stopped".into(),
    }
}

/// The state of the initialiser's instance: no arguments, no environment,
/// no directories, no network, stdin at its end and stdout and stderr
/// discarded; random bytes within the default bound.
fn nothing_granted(limits: &Limits) -> HostState {
    let mut builder = WasiCtx::builder();
    builder
        .max_random_size(limits.max_random_bytes)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    let mut table = ResourceTable::new();
    table.set_max_capacity(usize::try_from(limits.resource_table_capacity).unwrap_or(usize::MAX));
    HostState {
        wasi: builder.build(),
        table,
        limiter: Limiter::new(limits),
        requests: Arc::default(),
        requests_seen: 0,
        fuel_per_request: limits.fuel_per_request,
        fuel_at_last_hook: limits.fuel_per_request,
        metrics: Arc::default(),
        names: crate::wasm::lookup::Names::default(),
        http: wasmtime_wasi_http::WasiHttpCtx::new(),
        http_hooks: http::Hooks {
            policy: Arc::new(http::HttpPolicy::new(
                Vec::new(),
                limits.max_http_response_bytes,
            )),
        },
    }
}

/// Reads the instrumented instance's memories and globals for Wizer
/// through the accessor functions its instrumentation exported. A lookup
/// or call that fails is recorded, not panicked on; the snapshot is then
/// refused.
struct State<'a> {
    store: &'a mut Store<HostState>,
    instance: Instance,
    failed: Option<String>,
}

impl State<'_> {
    async fn call<R, R2: Default>(
        &mut self,
        instance: &str,
        func: &str,
        use_: impl FnOnce(&mut Store<HostState>, R) -> R2,
    ) -> R2
    where
        R: wasmtime::component::Lift + Send + Sync + 'static,
    {
        if self.failed.is_some() {
            return R2::default();
        }
        let found = self
            .instance
            .get_export(&mut *self.store, None, instance)
            .and_then(|(_, outer)| {
                self.instance
                    .get_export(&mut *self.store, Some(&outer), func)
            })
            .ok_or_else(|| format!("no export {instance}#{func}"))
            .and_then(|(_, index)| {
                self.instance
                    .get_typed_func::<(), (R,)>(&mut *self.store, index)
                    .map_err(|e| format!("{instance}#{func}: {e:#}"))
            });
        let func_name = func;
        let func = match found {
            Ok(func) => func,
            Err(error) => {
                self.failed = Some(error);
                return R2::default();
            }
        };
        match func.call_async(&mut *self.store, ()).await {
            Ok((value,)) => use_(self.store, value),
            Err(error) => {
                self.failed = Some(format!("{instance}#{func}: {error:#}", func = func_name));
                R2::default()
            }
        }
    }
}

impl ComponentInstanceState for State<'_> {
    async fn call_func_ret_list_u8(
        &mut self,
        instance: &str,
        func: &str,
        contents: impl FnOnce(&[u8]) + Send,
    ) {
        let mut contents = Some(contents);
        self.call(instance, func, |store, list: WasmList<u8>| {
            if let Some(contents) = contents.take() {
                contents(list.as_le_slice(&*store));
            }
        })
        .await;
        if let Some(contents) = contents {
            // The call failed (recorded): Wizer still expects the bytes.
            contents(&[]);
        }
    }

    async fn call_func_ret_s32(&mut self, instance: &str, func: &str) -> i32 {
        self.call(instance, func, |_, r| r).await
    }

    async fn call_func_ret_s64(&mut self, instance: &str, func: &str) -> i64 {
        self.call(instance, func, |_, r| r).await
    }

    async fn call_func_ret_f32(&mut self, instance: &str, func: &str) -> u32 {
        self.call(instance, func, |_, r: f32| r.to_bits()).await
    }

    async fn call_func_ret_f64(&mut self, instance: &str, func: &str) -> u64 {
        self.call(instance, func, |_, r: f64| r.to_bits()).await
    }
}

//! Snapshots of a guest's initialised state (`wizer-initialize`,
//! `moat_wit::preinit!`): what runs and what it saves, what the initialiser
//! is given against what `main` is given, how the snapshot is cached and
//! bound to its source, and what a hostile initialiser gets.

mod common;

use common::{args, text};

use std::path::Path;

use moat_host::wasm::{CacheOutcome, Metering, PreinitError, WasmError};
use moat_host::{
    ConnectError, Digest, Expectation, Host, LaunchError, LimitHit, ServerKind, ServerSpec,
};
use moat_test_guests as guests;
use serde_json::{Value, json};

fn spec(name: &str, path: &str, preinit: bool) -> ServerSpec {
    let mut spec = ServerSpec::wasm(name, path);
    spec.allow_unmeasured = true;
    if let ServerKind::Wasm { preinit: p, .. } = &mut spec.kind {
        *p = preinit;
    }
    spec
}

fn cached_host(cache: &Path) -> Host {
    Host::new(Some(cache.to_owned())).unwrap()
}

/// The snapshot an instance of `session` runs, from its identity.
fn snapshot_of(session: &moat_host::Session) -> Option<Digest> {
    session
        .identity()
        .and_then(|identity| identity.component)
        .and_then(|component| component.snapshot)
}

/// Starts `spec` on a host caching in `cache`, calls `add` once, and
/// returns the fuel the instance used for both and the snapshot it ran.
async fn start_and_add(cache: &Path, spec: &ServerSpec) -> (u64, Option<Digest>) {
    let session = cached_host(cache).connect(spec).await.unwrap();
    let result = session
        .call_tool("add", args(json!({"a": 2, "b": 40})))
        .await
        .unwrap();
    assert_eq!(text(&result), "42");
    let fuel = session.metrics().fuel_consumed();
    let snapshot = snapshot_of(&session);
    session.close().await.unwrap();
    (fuel, snapshot)
}

/// `everything` builds its routers (every tool's schema) in its
/// initialiser. Started from the snapshot it does not build them again:
/// its start and first call run under a third of the instructions, and its
/// identity names the snapshot that runs beside the source's digest. With
/// `preinit = false` the same bytes start afresh and name no snapshot.
#[tokio::test]
async fn a_component_with_an_initialiser_starts_from_its_snapshot_and_runs_less() {
    let cache = tempfile::tempdir().unwrap();
    let everything = |preinit| spec("everything", guests::EVERYTHING_WASM, preinit);
    let (plain_fuel, plain) = start_and_add(cache.path(), &everything(false)).await;
    let (snapshot_fuel, snapshot) = start_and_add(cache.path(), &everything(true)).await;
    assert_eq!(plain, None, "preinit = false runs the measured bytes");
    let source = Digest::of(&std::fs::read(guests::EVERYTHING_WASM).unwrap());
    let snapshot = snapshot.expect("the identity names the snapshot");
    assert_ne!(snapshot, source);
    assert!(
        snapshot_fuel * 3 < plain_fuel,
        "start and one call: {snapshot_fuel} fuel from the snapshot, {plain_fuel} without"
    );
    // Started again, from the cache: the same snapshot.
    let (_, again) = start_and_add(cache.path(), &everything(true)).await;
    assert_eq!(again, Some(snapshot));
}

/// Calls the probe's `attack` and returns its report.
async fn probe(host: &Host, spec: &ServerSpec) -> (Value, Option<Digest>) {
    let session = host.connect(spec).await.unwrap();
    let result = session.call_tool("attack", None).await.unwrap();
    let report = serde_json::from_str(&text(&result)).unwrap();
    let snapshot = snapshot_of(&session);
    session.close().await.unwrap();
    (report, snapshot)
}

/// An instance started from a snapshot keeps what the initialiser built
/// and still gets exactly its own grants, in `main`: arguments, the
/// environment and a preopened directory (wasi-libc reads the last two
/// once, so they would be frozen had the initialiser read them; see the
/// next test). Without a snapshot it gets the same grants and nothing
/// kept.
#[tokio::test]
async fn an_instance_from_a_snapshot_keeps_the_initialisers_state_and_gets_its_own_grants() {
    let cache = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("granted.txt"), "").unwrap();
    let host = cached_host(cache.path());
    let granted = |preinit| {
        let mut spec = spec("probe", guests::PREINIT_PROBE_WASM, preinit);
        spec.args = vec!["--flag".into()];
        spec.env.values.insert("PROBE".into(), "granted".into());
        spec.dirs = vec![moat_host::grants::DirGrant {
            host: data.path().to_owned(),
            guest: "/data".into(),
            mode: moat_host::grants::DirMode::Ro,
            inode: None,
        }];
        spec
    };
    let run = json!({
        "args": ["probe", "--flag"], "env": {"PROBE": "granted"}, "data": ["granted.txt"],
    });
    let (report, snapshot) = probe(&host, &granted(true)).await;
    assert!(snapshot.is_some());
    assert_eq!(
        report,
        json!({"snapshot": true, "kept": "kept by the initialiser", "run": run})
    );
    let (report, snapshot) = probe(&host, &granted(false)).await;
    assert_eq!(snapshot, None);
    assert_eq!(report, json!({"snapshot": false, "kept": null, "run": run}));
}

/// An initialiser that reads the environment is refused, naming the call:
/// the snapshot would keep its empty environment for every instance, and
/// the server's `env` grant would never be seen. With `preinit = false`
/// the same read, in `main`, sees the grant.
#[tokio::test]
async fn an_initialiser_that_reads_the_environment_is_refused() {
    let cache = tempfile::tempdir().unwrap();
    let host = cached_host(cache.path());
    let configured = |preinit| {
        let mut spec = spec("env", guests::PREINIT_ENV_WASM, preinit);
        spec.env
            .values
            .insert("PREINIT_CONFIG".into(), "granted".into());
        spec
    };
    let error = host
        .connect(&configured(true))
        .await
        .err()
        .expect("refused");
    match preinit_error(error) {
        PreinitError::RunTimeRead(called) => {
            assert_eq!(called, "`wasi:cli/environment.get-environment`")
        }
        other => panic!("expected the environment read, got {other}"),
    }
    let session = host.connect(&configured(false)).await.unwrap();
    let result = session.call_tool("attack", None).await.unwrap();
    assert_eq!(text(&result), "granted");
    session.close().await.unwrap();
}

/// The refusal a hostile initialiser gets, and its wording.
fn preinit_error(error: ConnectError) -> PreinitError {
    let shown = error.to_string();
    match error {
        ConnectError::Launch(LaunchError::Wasm(WasmError::Preinit { source, .. })) => {
            assert!(
                shown.ends_with(
                    "; set `preinit = false` on the server to start it without a snapshot"
                ),
                "{shown}"
            );
            source
        }
        other => panic!("expected a snapshot refusal, got {other}"),
    }
}

/// An initialiser that spins forever is stopped by the server's fuel: the
/// server is refused with the limit named, the host goes on serving, and
/// with `preinit = false` the same bytes start (their initialiser is never
/// run).
#[tokio::test]
async fn a_spinning_initialiser_is_stopped_by_fuel_and_refused() {
    let cache = tempfile::tempdir().unwrap();
    let host = cached_host(cache.path());
    let mut spin = spec("spin", guests::PREINIT_SPIN_WASM, true);
    spin.limits.fuel_per_request = 50_000_000;
    let error = host.connect(&spin).await.err().expect("refused");
    match preinit_error(error) {
        PreinitError::Initialiser(detail) => assert_eq!(
            detail,
            format!(
                "it hit a limit: {}",
                LimitHit::Fuel {
                    fuel_per_request: 50_000_000
                }
            )
        ),
        other => panic!("expected the fuel limit, got {other}"),
    }
    // The same host goes on serving.
    start_and_add(
        cache.path(),
        &spec("everything", guests::EVERYTHING_WASM, true),
    )
    .await;

    let plain = spec("spin", guests::PREINIT_SPIN_WASM, false);
    let session = host.connect(&plain).await.unwrap();
    let result = session.call_tool("attack", None).await.unwrap();
    assert_eq!(text(&result), "started");
    session.close().await.unwrap();
}

/// Under epoch metering (no fuel), the same spinning initialiser is
/// stopped by the server's deadline.
#[tokio::test]
async fn under_epoch_metering_a_spinning_initialiser_is_stopped_by_the_deadline() {
    let cache = tempfile::tempdir().unwrap();
    let host = Host::with_metering(Some(cache.path().to_owned()), Metering::Epoch).unwrap();
    let mut spin = spec("spin", guests::PREINIT_SPIN_WASM, true);
    spin.limits.request_timeout_ms = 300;
    let error = host.connect(&spin).await.err().expect("refused");
    match preinit_error(error) {
        PreinitError::Timeout(deadline) => {
            assert_eq!(deadline, std::time::Duration::from_millis(300))
        }
        other => panic!("expected the deadline, got {other}"),
    }
    let session = host
        .connect(&spec("everything", guests::EVERYTHING_WASM, true))
        .await
        .unwrap();
    let result = session
        .call_tool("add", args(json!({"a": 2, "b": 40})))
        .await
        .unwrap();
    assert_eq!(text(&result), "42");
    session.close().await.unwrap();
}

/// An initialiser that fills 64 MiB is stopped by the server's
/// `memory_bytes` (16 MiB), named.
#[tokio::test]
async fn an_initialiser_past_the_memory_limit_is_refused() {
    let cache = tempfile::tempdir().unwrap();
    let host = cached_host(cache.path());
    let mut hog = spec("hog", guests::PREINIT_HOG_WASM, true);
    hog.limits.memory_bytes = 16 << 20;
    let error = host.connect(&hog).await.err().expect("refused");
    match preinit_error(error) {
        PreinitError::Initialiser(detail) => assert_eq!(
            detail,
            format!(
                "it hit a limit: {}",
                LimitHit::Memory {
                    memory_bytes: 16 << 20
                }
            )
        ),
        other => panic!("expected the memory limit, got {other}"),
    }
}

/// Each read of what belongs to an instance, in the initialiser, refuses
/// the server naming the call: the arguments, the preopened directories
/// and the clock (the environment has a test of its own, above).
#[tokio::test]
async fn each_read_of_what_belongs_to_an_instance_is_refused_naming_it() {
    let cache = tempfile::tempdir().unwrap();
    let host = cached_host(cache.path());
    for (path, called) in [
        (
            guests::PREINIT_ARGS_WASM,
            "`wasi:cli/environment.get-arguments`",
        ),
        (
            guests::PREINIT_DIRS_WASM,
            "`wasi:filesystem/preopens.get-directories`",
        ),
        (
            guests::PREINIT_CLOCK_WASM,
            "`wasi:clocks/monotonic-clock.now`",
        ),
    ] {
        let error = host
            .connect(&spec("reads", path, true))
            .await
            .err()
            .expect("refused");
        match preinit_error(error) {
            PreinitError::RunTimeRead(read) => assert_eq!(read, called, "{path}"),
            other => panic!("{path}: expected {called}, got {other}"),
        }
        let session = host.connect(&spec("reads", path, false)).await.unwrap();
        let result = session.call_tool("attack", None).await.unwrap();
        assert_eq!(text(&result), "started");
        session.close().await.unwrap();
    }
}

/// An initialiser that returns holding a WASI handle (here the stderr
/// stream wasi-libc keeps after one `eprintln!`) is refused: the snapshot
/// would hold an index into a table no later instance has, and the first
/// write of each instance would trap far from its cause.
#[tokio::test]
async fn an_initialiser_that_keeps_a_handle_is_refused() {
    let cache = tempfile::tempdir().unwrap();
    let host = cached_host(cache.path());
    let error = host
        .connect(&spec("stdio", guests::PREINIT_STDIO_WASM, true))
        .await
        .err()
        .expect("refused");
    match preinit_error(error) {
        PreinitError::OpenResources(count) => assert!(count > 0),
        other => panic!("expected the open handle, got {other}"),
    }
    let session = host
        .connect(&spec("stdio", guests::PREINIT_STDIO_WASM, false))
        .await
        .unwrap();
    let result = session.call_tool("attack", None).await.unwrap();
    assert_eq!(text(&result), "started");
    session.close().await.unwrap();
}

/// With a suffix added to the file name.
fn suffixed(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// A snapshot's compiled file is cached under the source's digest and its
/// own (a record names the one in use), and bound by its MAC to both: a
/// record changed to name another digest, the plain compile of the same
/// source copied over the file, or another component's snapshot copied
/// over with its record, is recompiled, never loaded. A snapshot made
/// again replaces the file the record named. Two starts that snapshot at
/// once leave a record and a file that load.
#[tokio::test]
async fn a_snapshot_is_cached_bound_to_its_source_and_its_own_digest() {
    let cache = tempfile::tempdir().unwrap();
    let path = Path::new(guests::EVERYTHING_WASM);
    let source = Digest::of(&std::fs::read(path).unwrap());
    let prepare = |preinit: bool| {
        let cache = cache.path().to_owned();
        async move {
            let prepared = cached_host(&cache)
                .wasm()
                .prepare_with(
                    path,
                    Expectation::Unpinned,
                    preinit.then(moat_host::Limits::default).as_ref(),
                )
                .await
                .unwrap();
            (prepared.cache_outcome(), prepared.snapshot())
        }
    };
    let (first, second) = tokio::join!(prepare(true), prepare(true));
    assert_eq!(first.0, CacheOutcome::Compiled);
    assert_eq!(second.0, CacheOutcome::Compiled);
    let (outcome, first) = prepare(true).await;
    assert_eq!(outcome, CacheOutcome::Hit, "after two at once");
    let first = first.expect("a snapshot");

    let host = cached_host(cache.path());
    let wasm = host.wasm();
    let record = wasm.snapshot_cache_path(source).unwrap();
    let file = |snapshot| wasm.snapshot_compiled_path(source, snapshot).unwrap();
    assert_eq!(std::fs::read_to_string(&record).unwrap(), first.to_string());
    // The record changed to name another digest: a file that is not there.
    std::fs::write(&record, source.to_string()).unwrap();
    let (outcome, second) = prepare(true).await;
    assert_eq!(outcome, CacheOutcome::Recompiled, "a record that changed");
    let second = second.expect("a snapshot");
    assert_eq!(prepare(true).await, (CacheOutcome::Hit, Some(second)));

    // The plain compile of the same source, with its own valid MAC.
    assert_eq!(prepare(false).await, (CacheOutcome::Compiled, None));
    let plain = wasm.cache_path(source).unwrap();
    for suffix in ["", ".mac"] {
        std::fs::copy(suffixed(&plain, suffix), suffixed(&file(second), suffix)).unwrap();
    }
    let (outcome, third) = prepare(true).await;
    assert_eq!(
        outcome,
        CacheOutcome::Recompiled,
        "another compile copied over"
    );
    let third = third.expect("a snapshot");
    assert!(
        !file(second).exists(),
        "the replaced snapshot's file is removed"
    );
    assert!(file(third).exists());
    assert_eq!(prepare(false).await, (CacheOutcome::Hit, None));

    // Another component's snapshot, valid and written by Moat, copied over
    // this one's with its record and MAC.
    let other = Path::new(guests::PREINIT_PROBE_WASM);
    let other_digest = Digest::of(&std::fs::read(other).unwrap());
    let other_snapshot = wasm
        .prepare(other, Expectation::Unpinned)
        .await
        .unwrap()
        .snapshot()
        .expect("a snapshot");
    let other_file = wasm
        .snapshot_compiled_path(other_digest, other_snapshot)
        .unwrap();
    std::fs::copy(wasm.snapshot_cache_path(other_digest).unwrap(), &record).unwrap();
    for suffix in ["", ".mac"] {
        std::fs::copy(
            suffixed(&other_file, suffix),
            suffixed(&file(other_snapshot), suffix),
        )
        .unwrap();
    }
    let (outcome, fourth) = prepare(true).await;
    assert_eq!(
        outcome,
        CacheOutcome::Recompiled,
        "another snapshot copied over"
    );
    let fourth = fourth.expect("a snapshot");
    assert_ne!(fourth, other_snapshot);
    assert_eq!(prepare(true).await, (CacheOutcome::Hit, Some(fourth)));
}

/// Starts of one component that arrive together on one host (sessions
/// over HTTP on a cold cache) prepare it once: the first compiles and
/// snapshots, the others wait for it and take what it prepared.
#[tokio::test]
async fn starts_that_arrive_together_prepare_a_component_once() {
    let cache = tempfile::tempdir().unwrap();
    let host = cached_host(cache.path());
    let path = Path::new(guests::EVERYTHING_WASM);
    let prepare = || async {
        let prepared = host
            .wasm()
            .prepare(path, Expectation::Unpinned)
            .await
            .unwrap();
        (prepared.cache_outcome(), prepared.snapshot())
    };
    let (first, second, third) = tokio::join!(prepare(), prepare(), prepare());
    let mut outcomes = [first.0, second.0, third.0];
    outcomes.sort_by_key(|o| format!("{o:?}"));
    assert_eq!(
        outcomes,
        [
            CacheOutcome::Compiled,
            CacheOutcome::Memory,
            CacheOutcome::Memory
        ]
    );
    assert!(first.1.is_some());
    assert_eq!(first.1, second.1);
    assert_eq!(first.1, third.1);
}

/// An engine that does not meter guests could not bound an initialiser:
/// it runs the measured bytes, which build their state in `main`.
#[tokio::test]
async fn an_unmetered_engine_starts_without_a_snapshot() {
    let cache = tempfile::tempdir().unwrap();
    let host = Host::with_metering(Some(cache.path().to_owned()), Metering::Unmetered).unwrap();
    let (report, snapshot) = probe(&host, &spec("probe", guests::PREINIT_PROBE_WASM, true)).await;
    assert_eq!(snapshot, None);
    assert_eq!(report["snapshot"], json!(false));
    assert_eq!(report["kept"], json!(null));
}

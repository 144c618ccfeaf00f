//! Wasm-only checks of the wasm launcher: the measured bytes, the compiled
//! component cache, and what an idle guest costs.

mod common;

use common::{args, text};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use moat_host::wasm::{CacheOutcome, WasmError};
use moat_host::{ConnectError, Digest, Expectation, Host, LaunchError, ServerSpec, SessionError};
use moat_test_guests as guests;
use serde_json::json;

fn host() -> Host {
    Host::new(Some(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"),
    ))
    .expect("host")
}

fn temp_copy(source: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("guest.wasm");
    std::fs::copy(source, &path).unwrap();
    (dir, path)
}

#[tokio::test]
async fn a_component_with_one_byte_changed_is_refused() {
    let original = std::fs::read(guests::EVERYTHING_WASM).unwrap();
    let pinned = Digest::of(&original);
    let (_dir, path) = temp_copy(guests::EVERYTHING_WASM);
    let mut bytes = original.clone();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();

    let mut tampered = ServerSpec::wasm("everything", &path);
    tampered.sha256 = Some(pinned);
    match host().connect(&tampered).await {
        Err(ConnectError::Launch(LaunchError::Wasm(WasmError::Digest { mismatch, .. }))) => {
            assert_eq!(mismatch.expected, pinned);
            assert_eq!(mismatch.actual, Digest::of(&bytes));
        }
        Err(other) => panic!("expected a digest error, got {other}"),
        Ok(_) => panic!("a tampered component must not launch"),
    }
    // The same pin admits the original bytes.
    let mut genuine = ServerSpec::wasm("everything", guests::EVERYTHING_WASM);
    genuine.sha256 = Some(pinned);
    host()
        .connect(&genuine)
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_corrupt_or_foreign_cache_file_is_recompiled_not_loaded() {
    let cache = tempfile::tempdir().unwrap();
    let path = Path::new(guests::NON_JSON_WASM);
    let digest = Digest::of(&std::fs::read(path).unwrap());
    let fresh = || Host::new(Some(cache.path().to_owned())).unwrap();
    // How a fresh host (nothing in memory) gets the component.
    let fresh_outcome = || async {
        fresh()
            .wasm()
            .prepare(path, Expectation::Unpinned)
            .await
            .unwrap()
            .cache_outcome()
    };

    assert_eq!(fresh_outcome().await, CacheOutcome::Compiled);
    let engine = fresh();
    let cache_file = engine.wasm().cache_path(digest).unwrap();
    let second = engine
        .wasm()
        .prepare(path, Expectation::Unpinned)
        .await
        .unwrap();
    assert_eq!(second.cache_outcome(), CacheOutcome::Hit);
    let again = engine
        .wasm()
        .prepare(path, Expectation::Unpinned)
        .await
        .unwrap();
    assert_eq!(again.cache_outcome(), CacheOutcome::Memory);

    // One flipped byte in the compiled payload.
    let mut file = std::fs::read(&cache_file).unwrap();
    let middle = file.len() / 2;
    file[middle] ^= 0xff;
    std::fs::write(&cache_file, &file).unwrap();
    assert_eq!(fresh_outcome().await, CacheOutcome::Recompiled);
    assert_eq!(
        fresh_outcome().await,
        CacheOutcome::Hit,
        "the corrupt file was rewritten"
    );

    // The attack of issue 12: another component's compiled file, valid and
    // written by Moat, copied over this component's cache name. Loading it
    // would list the other component's tools under this one's digest.
    let other = Path::new(guests::EVERYTHING_WASM);
    let other_digest = Digest::of(&std::fs::read(other).unwrap());
    let host = fresh();
    // Its plain compile: with `preinit` it would be its snapshot's file.
    host.wasm()
        .prepare_with(other, Expectation::Unpinned, None)
        .await
        .unwrap();
    let other_file = host.wasm().cache_path(other_digest).unwrap();
    std::fs::copy(&other_file, &cache_file).unwrap();
    assert_eq!(fresh_outcome().await, CacheOutcome::Recompiled);

    // A file made without the key: its MAC recomputed as a plain sha256,
    // the way the first cache format recorded it.
    let payload = std::fs::read(&other_file).unwrap();
    std::fs::write(&cache_file, &payload).unwrap();
    let mut mac_file = cache_file.as_os_str().to_owned();
    mac_file.push(".mac");
    std::fs::write(&mac_file, Digest::of(&payload).as_bytes()).unwrap();
    assert_eq!(fresh_outcome().await, CacheOutcome::Recompiled);

    // The key is private to the user, and a cache from another key (a key
    // replaced, as after copying a cache between users) is not trusted.
    let key = cache.path().join("cache.key");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    std::fs::remove_file(&key).unwrap();
    assert_eq!(fresh_outcome().await, CacheOutcome::Recompiled);

    // And the recompiled component runs.
    let mut spec = ServerSpec::wasm("non-json", path);
    spec.allow_unmeasured = true;
    let session = fresh().connect(&spec).await.unwrap();
    assert_eq!(session.list_tools().await.unwrap().len(), 1);
    session.close().await.unwrap();
}

/// An idle guest parks in `wasi:io/poll`: a 300 ms sleep inside the guest
/// costs a handful of host calls and almost no fuel, where busy polling would
/// cost thousands of calls and hundreds of millions of fuel units.
#[tokio::test]
async fn an_idle_guest_burns_no_fuel_and_makes_no_busy_host_calls() {
    let mut spec = ServerSpec::wasm("everything", guests::EVERYTHING_WASM);
    spec.allow_unmeasured = true;
    let session = host().connect(&spec).await.unwrap();
    session
        .call_tool("add", args(json!({"a": 1, "b": 1})))
        .await
        .unwrap();
    let metrics = session.metrics();
    let (calls, fuel) = (metrics.hostcalls(), metrics.fuel_consumed());
    assert!(calls > 0 && fuel > 0, "the counters count");
    let slept = session
        .call_tool("sleep", args(json!({"ms": 300})))
        .await
        .unwrap();
    assert_eq!(text(&slept), "slept 300 ms");
    let calls = metrics.hostcalls() - calls;
    let fuel = metrics.fuel_consumed() - fuel;
    assert!(calls < 200, "{calls} host calls during a 300 ms idle sleep");
    assert!(
        fuel < 20_000_000,
        "{fuel} fuel used during a 300 ms idle sleep"
    );
    session.close().await.unwrap();
}

/// The hot path reads and hashes nothing the identity does not need: a
/// component file unchanged since it was hashed is known by its seal, and
/// a compiled file unchanged since it was verified is mapped as it is. A
/// file that changed just now is not sealed (its timestamps may not yet
/// tell a second change apart), and a sealed file that changes is read and
/// verified again.
#[tokio::test]
async fn unchanged_files_are_known_by_their_seals_and_changed_ones_are_verified() {
    use moat_host::seal::{Stat, now_ns};
    use moat_host::wasm::DigestSource;
    let cache = tempfile::tempdir().unwrap();
    let prepare = |path: PathBuf| {
        let cache = cache.path().to_owned();
        async move {
            let prepared = Host::new(Some(cache))
                .unwrap()
                .wasm()
                .prepare(&path, Expectation::Unpinned)
                .await
                .unwrap();
            (prepared.digest_source(), prepared.cache_outcome())
        }
    };
    let settled = |path: &Path| {
        Stat::of(&std::fs::metadata(path).unwrap())
            .unwrap()
            .settled(now_ns())
    };

    // A component that changed just now (a fresh copy) is hashed every time.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("non-json.wasm");
    std::fs::copy(guests::NON_JSON_WASM, &copy).unwrap();
    assert_eq!(
        prepare(copy.clone()).await,
        (DigestSource::Hashed, CacheOutcome::Compiled)
    );
    // Compiling can take longer than the settling time on a loaded
    // machine: change the copy's times again, so that it is still a file
    // that changed just now.
    std::fs::File::options()
        .write(true)
        .open(&copy)
        .unwrap()
        .set_modified(std::time::SystemTime::now())
        .unwrap();
    assert_eq!(
        prepare(copy.clone()).await,
        (DigestSource::Hashed, CacheOutcome::Hit),
        "the compiled file was just written: read and verified"
    );

    // Once both files have settled, the first start seals them and the next
    // one reads neither.
    let cache_file = Host::new(Some(cache.path().to_owned()))
        .unwrap()
        .wasm()
        .cache_path(Digest::of(&std::fs::read(&copy).unwrap()))
        .unwrap();
    let deadline = std::time::Instant::now() + moat_host::seal::SETTLED * 3;
    while !(settled(&copy) && settled(&cache_file)) {
        // Waiting on the clock itself: the rule is about the files' age.
        assert!(std::time::Instant::now() < deadline, "files never settled");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        prepare(copy.clone()).await,
        (DigestSource::Hashed, CacheOutcome::Hit)
    );
    assert_eq!(
        prepare(copy.clone()).await,
        (DigestSource::Sealed, CacheOutcome::Mapped)
    );

    // A change to either file breaks its seal.
    let mut compiled = std::fs::read(&cache_file).unwrap();
    let middle = compiled.len() / 2;
    compiled[middle] ^= 0xff;
    std::fs::write(&cache_file, &compiled).unwrap();
    assert_eq!(
        prepare(copy.clone()).await,
        (DigestSource::Sealed, CacheOutcome::Recompiled)
    );
    std::fs::write(&copy, std::fs::read(guests::EVERYTHING_WASM).unwrap()).unwrap();
    let (source, _) = prepare(copy.clone()).await;
    assert_eq!(source, DigestSource::Hashed, "other bytes under the name");
}

/// Under epoch metering a spinning guest has no fuel to run out of: it is
/// stopped by its deadline, because it yields to the runtime at every epoch
/// tick (on this current-thread runtime nothing else would run, the deadline
/// timer included). The sandbox report says that the per-request CPU budget
/// is not enforced, and the same host keeps serving.
#[tokio::test]
async fn an_epoch_metered_engine_stops_a_spinning_guest_at_its_deadline() {
    let host = Host::with_metering(
        Some(Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache-epoch")),
        moat_host::wasm::Metering::Epoch,
    )
    .expect("host");
    let mut spin = ServerSpec::wasm("spin", guests::SPIN_WASM);
    spin.allow_unmeasured = true;
    spin.limits.fuel_per_request = 1_000;
    spin.limits.request_timeout_ms = 500;
    let session = host.connect(&spin).await.expect("connect");
    let sandbox = session.identity().expect("identity").sandbox;
    assert!(
        sandbox.lines().contains(
            &"not enforced: CPU budget per request (fuel_per_request): this engine meters by \
              epoch, which bounds time (request_timeout_ms), not work"
                .to_owned()
        ),
        "{:?}",
        sandbox.lines()
    );
    let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let heartbeat = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            let mut interval = tokio::time::interval(std::time::Duration::from_millis(1));
            loop {
                interval.tick().await;
                ticks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    let error = session.call_tool("attack", None).await.unwrap_err();
    let during = ticks.load(std::sync::atomic::Ordering::SeqCst);
    heartbeat.abort();
    match error {
        SessionError::Fault { fault, .. } => assert_eq!(
            fault,
            moat_host::Fault::Limit {
                server: "spin".into(),
                limit: moat_host::LimitHit::Deadline {
                    request_timeout_ms: 500
                }
            }
        ),
        other => panic!("expected the deadline, got {other:?}"),
    }
    assert!(
        during >= 5,
        "heartbeat ticked only {during} times during the spin"
    );
    let _ = session.close().await;

    let mut everything = ServerSpec::wasm("everything", guests::EVERYTHING_WASM);
    everything.allow_unmeasured = true;
    let session = host.connect(&everything).await.expect("connect");
    let result = session
        .call_tool("add", args(json!({"a": 2, "b": 40})))
        .await
        .expect("add");
    assert_eq!(text(&result), "42");
    assert_eq!(
        session
            .metrics()
            .fuel_consumed
            .load(std::sync::atomic::Ordering::Relaxed),
        0,
        "an epoch-metered engine counts no fuel"
    );
    session.close().await.expect("close");
}

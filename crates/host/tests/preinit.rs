//! Snapshots of a guest's initialised state (`wizer-initialize`): what
//! runs, what it costs, what the initialiser is given, and what a hostile
//! initialiser gets.

mod common;

use common::{args, text};

use std::path::Path;

use moat_host::{Host, ServerKind, ServerSpec};
use moat_test_guests as guests;
use serde_json::json;

fn everything(preinit: bool) -> ServerSpec {
    let mut spec = ServerSpec::wasm("everything", guests::EVERYTHING_WASM);
    spec.allow_unmeasured = true;
    if let ServerKind::Wasm { preinit: p, .. } = &mut spec.kind {
        *p = preinit;
    }
    spec
}

/// Starts `spec` on a host caching in `cache`, calls `add` once, and
/// returns the fuel the instance used and the snapshot it ran.
async fn start_and_call(cache: &Path, spec: &ServerSpec) -> (u64, Option<moat_host::Digest>) {
    let host = Host::new(Some(cache.to_owned())).unwrap();
    let session = host.connect(spec).await.unwrap();
    let result = session
        .call_tool("add", args(json!({"a": 2, "b": 40})))
        .await
        .unwrap();
    assert_eq!(text(&result), "42");
    let fuel = session.metrics().fuel_consumed();
    let snapshot = session
        .identity()
        .and_then(|identity| identity.component)
        .and_then(|component| component.snapshot);
    session.close().await.unwrap();
    (fuel, snapshot)
}

#[tokio::test]
async fn a_component_with_an_initialiser_starts_from_its_snapshot() {
    let cache = tempfile::tempdir().unwrap();
    let (plain_fuel, plain) = start_and_call(cache.path(), &everything(false)).await;
    let (snap_fuel, snapshot) = start_and_call(cache.path(), &everything(true)).await;
    eprintln!("fuel: plain {plain_fuel}, snapshot {snap_fuel}");
    assert_eq!(plain, None);
    assert!(snapshot.is_some());
    assert!(snap_fuel < plain_fuel);
}

//! Remote launch by profile, the node's side (issue 35): a launch request
//! names a profile and the revision the front expects, and nothing else;
//! the node launches it from its own config and lock, or refuses naming
//! why, and signs what it launched. Both launchers; the node survives
//! every refusal.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{Launcher, args, spec, text};
use moat_host::claim::SigningKey;
use moat_host::lock::{LOCK_VERSION, Lock};
use moat_host::node::LaunchRequest;
use moat_host::node::launch::Node;
use moat_host::node::profile::revision;
use moat_host::{Config, Host};
use moat_test_guests as guests;
use serde_json::json;

both_launchers!(a_node_launches_only_the_profile_and_revision_it_holds,);

fn cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache")
}

async fn a_node_launches_only_the_profile_and_revision_it_holds(launcher: Launcher) {
    let dir = tempfile::tempdir().unwrap();
    let profile = spec(launcher, guests::EVERYTHING);
    let locked = Host::new(Some(cache()))
        .unwrap()
        .measure(&profile)
        .await
        .expect("measure");
    let held = revision(&profile, &locked);
    let lock = Lock {
        version: LOCK_VERSION,
        revoked: Vec::new(),
        servers: [(profile.name.clone(), locked)].into(),
    };
    let config = Config {
        path: "node.toml".into(),
        servers: [(profile.name.clone(), profile.clone())].into(),
        serve: Default::default(),
        wasm: Default::default(),
        nodes: Default::default(),
    };
    let host = Host::new(Some(cache()))
        .unwrap()
        .with_lock(lock.clone(), "moat.lock".into());
    let key = Arc::new(SigningKey::in_dir(&dir.path().join("keys"), true).unwrap());
    let node = Node::new(config, lock, host.clone(), key.clone());
    let body = |profile: &str, revision: String| {
        json!({"profile": profile, "revision": revision})
            .to_string()
            .into_bytes()
    };

    // Refused, each naming why, and nothing started.
    let stale = moat_host::Digest::of(b"an older lock");
    let refusals = [
        (
            body("everything", stale.to_string()),
            format!(
                "profile `everything`: stale revision: the front expects {stale}, this node holds {held} (update the front's `revision`, or the node's moat.lock, so that they agree)"
            ),
        ),
        (
            body("gpu", held.to_string()),
            "profile `gpu`: this node has no such profile (its config names: everything)"
                .to_owned(),
        ),
        (
            json!({"profile": "everything", "revision": held.to_string(), "command": "/bin/sh"})
                .to_string()
                .into_bytes(),
            "launch request: field `command` is not accepted: a front names a profile and its revision only; grants, limits, commands and policy are the node's own".to_owned(),
        ),
    ];
    for (body, expected) in refusals {
        let error = node
            .launch(&body, "nonce-of-the-front")
            .await
            .err()
            .expect("refused");
        assert_eq!(error.to_string(), expected);
    }
    assert_eq!(host.launches(), 0, "nothing was launched for a refusal");

    // The revision it holds: launched, signed, and served.
    let launched = node
        .launch(&body("everything", held.to_string()), "nonce-of-the-front")
        .await
        .unwrap();
    assert_eq!(host.launches(), 1);
    let asked = LaunchRequest {
        profile: "everything".into(),
        revision: held,
    };
    let statement = moat_host::node::check(
        "node",
        &serde_json::to_value(&launched.statement).unwrap(),
        &key.public(),
        &asked,
        "nonce-of-the-front",
    )
    .unwrap();
    assert_eq!(statement.session, launched.id);
    assert_eq!(
        statement.evidence,
        match launcher {
            Launcher::Wasm => "wasm-measured",
            Launcher::Native => "native-measured",
        }
    );
    assert_eq!(
        statement.identity,
        launched.session.launched_identity().unwrap().to_string()
    );
    let sum = launched
        .session
        .call_tool("add", args(json!({"a": 2, "b": 3})))
        .await
        .unwrap();
    assert_eq!(text(&sum), "5");
    launched.session.close().await.unwrap();
}

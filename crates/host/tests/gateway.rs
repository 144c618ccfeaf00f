//! The gateway's agent sessions, in process: namespaced tools across both
//! launchers, children per session, crash restarts bounded per session.

#[macro_use]
mod common;

use std::path::Path;

use common::{Launcher, args, spec, text};
use moat_host::gateway::{Gateway, MAX_RESTARTS};
use moat_host::{Config, Host};
use moat_test_guests as guests;
use serde_json::json;

both_launchers!(a_crashing_server_is_restarted_a_bounded_number_of_times);

fn gateway(servers: &[moat_host::ServerSpec]) -> Gateway {
    let config = Config {
        path: "moat.toml".into(),
        servers: servers
            .iter()
            .map(|s| (s.name.clone(), s.clone()))
            .collect(),
    };
    let host = Host::new(Some(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"),
    ))
    .unwrap();
    Gateway::new(host, config, None)
}

async fn a_crashing_server_is_restarted_a_bounded_number_of_times(launcher: Launcher) {
    let mut crash = spec(launcher, guests::EXIT_MID_CALL);
    crash.name = "crash".into();
    let mut well = spec(launcher, guests::EVERYTHING);
    well.name = "well".into();
    let gateway = gateway(&[crash, well]);
    let session = gateway.session();
    for attempt in 0..=MAX_RESTARTS {
        let error = session.call("crash__attack", None).await.unwrap_err();
        assert!(
            error.message.contains("exited with code 3"),
            "attempt {attempt}: {}",
            error.message
        );
    }
    let error = session.call("crash__attack", None).await.unwrap_err();
    assert!(
        error.message.contains(&format!(
            "after {MAX_RESTARTS} restarts in this session; giving up"
        )),
        "{}",
        error.message
    );
    // The other server of the session is unaffected, and another session
    // starts afresh.
    let ok = session
        .call("well__add", args(json!({"a": 2, "b": 40})))
        .await
        .unwrap();
    assert_eq!(text(&ok), "42");
    let fresh = gateway.session();
    let error = fresh.call("crash__attack", None).await.unwrap_err();
    assert!(
        error.message.contains("exited with code 3"),
        "{}",
        error.message
    );
    assert!(session.close().await.is_empty());
    assert!(fresh.close().await.is_empty());
}

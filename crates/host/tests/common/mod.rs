//! Helpers shared by the integration tests.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::Path;
use std::sync::OnceLock;

use moat_host::rmcp::model::{CallToolResult, JsonObject};
use moat_host::{Fault, Host, ServerSpec, Session, SessionError};
use moat_test_guests::{self as guests, Guest};
use serde_json::json;

/// The two launchers every transport-level test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    Wasm,
    Native,
}

/// Each listed `async fn name(launcher: Launcher)` becomes two tests,
/// `wasm::name` and `native::name`.
#[macro_export]
macro_rules! both_launchers {
    ($($test:ident),* $(,)?) => {
        mod wasm {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test($crate::common::Launcher::Wasm).await
                }
            )*
        }
        mod native {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test($crate::common::Launcher::Native).await
                }
            )*
        }
    };
}

/// The spec for `guest` built for `launcher`, launched with consent and
/// without a pin.
pub fn spec(launcher: Launcher, guest: Guest) -> ServerSpec {
    let mut spec = match launcher {
        Launcher::Wasm => ServerSpec::wasm(guest.name, guest.wasm),
        Launcher::Native => ServerSpec::native(guest.name, guest.native),
    };
    spec.allow_unmeasured = true;
    spec
}

/// A JSON object literal as tool arguments.
pub fn args(value: serde_json::Value) -> Option<JsonObject> {
    value.as_object().cloned()
}

/// The text content of a tool result, concatenated.
pub fn text(result: &CallToolResult) -> String {
    let content = serde_json::to_value(&result.content).unwrap();
    content
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect()
}

/// One host per test binary, with a shared component cache.
pub fn host() -> &'static Host {
    static HOST: OnceLock<Host> = OnceLock::new();
    HOST.get_or_init(|| {
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache");
        Host::new(Some(cache)).expect("host")
    })
}

pub async fn connect(spec: &ServerSpec) -> Session {
    host().connect(spec).await.expect("connect")
}

/// After any hostile case, the same host process serves a fresh instance.
pub async fn host_still_serves_everything(launcher: Launcher) {
    let session = connect(&spec(launcher, guests::EVERYTHING)).await;
    let result = session
        .call_tool("add", args(json!({"a": 2, "b": 40})))
        .await
        .expect("add");
    assert_eq!(text(&result), "42");
    session.close().await.expect("close");
}

pub fn fault_of(error: SessionError) -> Fault {
    match error {
        SessionError::Fault { fault, .. } => fault,
        other => panic!("expected a transport fault, got {other:?}"),
    }
}

/// The process's peak resident set (VmHWM), in bytes.
pub fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Whether process `pid` (a host pid) is alive: it exists and is not a zombie.
pub fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            state != Some('Z') && state != Some('X')
        }
    }
}

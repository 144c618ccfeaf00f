//! Helpers shared by the integration tests.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use moat_host::ServerSpec;
use moat_host::rmcp::model::{CallToolResult, JsonObject};
use moat_test_guests::Guest;

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

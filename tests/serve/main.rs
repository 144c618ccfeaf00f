//! `moat serve` on stdio, driven by an rmcp client over the child's pipes:
//! one wasm and one native server behind one MCP server, namespaced tools,
//! routed calls, and a verified audit chain that holds no arguments.

#[path = "../common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Stdio;

use moat_test_guests as guests;
use rmcp::model::CallToolRequestParams;
use rmcp::{ClientHandler, ServiceExt};

mod claims;
mod egress;
mod lifecycle;
mod routing;
mod start_failures;

#[derive(Clone, Default)]
struct Agent;
impl ClientHandler for Agent {}

/// `moat serve --config CONFIG EXTRA..` on piped stdio, with the tests'
/// component cache and state directory.
fn serve_stdio(config: &Path, extra: &[&std::ffi::OsStr]) -> tokio::process::Child {
    serve_stdio_with(config, extra, Stdio::inherit())
}

/// [`serve_stdio`], with moat's stderr going to `stderr`.
fn serve_stdio_with(
    config: &Path,
    extra: &[&std::ffi::OsStr],
    stderr: Stdio,
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_moat"))
        .arg("serve")
        .arg("--config")
        .arg(config)
        .args(extra)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", common::state_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("moat serve")
}

//! Agents' configs run as they are: a Claude Desktop config and a VS Code
//! `mcp.json` listing the official reference servers the way their READMEs
//! say (`npx -y`, `uvx`, a pip console script) are imported, installed by
//! Moat ahead of time, locked, and served by `moat serve` under the default
//! `sandbox = "required"`, driven by the official TypeScript SDK. The
//! registries (npm, PyPI) are the only network, and only at import.

#[path = "../common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use moat_host::config::Sandbox;
use moat_host::{Config, ServerKind};

mod launchers;
mod reference_servers;
mod update;

fn moat(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_moat"));
    command
        .current_dir(dir)
        .env("MOAT_DATA_DIR", dir.join("data"))
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", common::state_dir());
    command
}

fn succeeded(output: Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn run(program: &str, args: &[&str], dir: &Path) {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    succeeded(output, program);
}

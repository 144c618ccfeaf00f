//! The `moat` command line, run as a user would run it.

use std::path::Path;
use std::process::{Command, Output};

use moat_test_guests as guests;

mod commands;
mod configs;
mod failures;
mod inspect;
mod lock;

fn moat(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env_remove("MOAT_CONFIG")
        .env_remove("RUST_LOG")
        .output()
        .expect("running moat")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

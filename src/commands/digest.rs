//! `moat digest`: the sha256 of a file, to pin it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use moat_host::Digest;

#[derive(clap::Args)]
pub struct Args {
    /// The component or executable.
    path: PathBuf,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let bytes =
        std::fs::read(&args.path).with_context(|| format!("reading {}", args.path.display()))?;
    println!("{}", Digest::of(&bytes));
    Ok(ExitCode::SUCCESS)
}

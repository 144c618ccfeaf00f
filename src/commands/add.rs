//! `moat add`: one server added to moat.toml from its command line
//! ([`moat_host::importer::add_to_config`]).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use moat_host::printable;

#[derive(clap::Args)]
pub struct Args {
    /// The config file (created when missing).
    #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
    config: PathBuf,
    /// The server's name (default: from the package or the command).
    #[arg(long)]
    name: Option<String>,
    /// Add a package launcher as configured instead of installing it.
    #[arg(long)]
    no_install: bool,
    /// Replace the entry of a server of the same name (its pins in
    /// moat.lock stay until `moat lock` measures the new one).
    #[arg(long)]
    replace: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let added = moat_host::importer::add_to_config(
        &args.config,
        args.name.as_deref(),
        &args.command,
        !args.no_install,
        args.replace,
    )?;
    for line in &added.skipped {
        eprintln!("moat: add: {}", printable(line));
    }
    println!(
        "{} server `{}` {} {}; run `moat lock` to pin its tools",
        if added.replaced { "replaced" } else { "added" },
        added.name,
        if added.replaced { "in" } else { "to" },
        args.config.display()
    );
    Ok(ExitCode::SUCCESS)
}

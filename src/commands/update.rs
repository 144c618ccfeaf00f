//! `moat update`: a server's package moved to a newer version, the version
//! and tool diff shown, and re-pinned only with `--yes`
//! ([`moat_host::update`]).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use moat_host::printable;
use moat_host::update::{self, Event, Updated};

#[derive(clap::Args)]
pub struct Args {
    /// The config file.
    #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
    config: PathBuf,
    /// The version to move to (default: the newest).
    #[arg(long)]
    version: Option<String>,
    /// Re-pin: rewrite the server's entry in moat.toml and its pins in
    /// moat.lock.
    #[arg(long)]
    yes: bool,
    /// The server, as named in the config.
    server: String,
}

pub async fn run(args: Args) -> Result<ExitCode> {
    let server = &args.server;
    let updated = update::update(
        &args.config,
        server,
        args.version.as_deref(),
        args.yes,
        |event| match event {
            Event::Installed {
                package,
                from,
                to,
                same,
            } => println!(
                "{server}: {package} {from} -> {to}{}",
                if same { " (unchanged)" } else { "" }
            ),
            Event::Tools { changes, count } => {
                if changes.is_empty() {
                    println!("tools: no change ({count} tools)");
                } else {
                    println!("tools:");
                    for change in changes {
                        println!("  {}", printable(&change.to_string()));
                    }
                }
            }
            Event::ConfigRepinned { path } => {
                println!("re-pinned `{server}` in {}", path.display());
            }
        },
    )
    .await?;
    match updated {
        Updated::Nothing => println!("nothing to re-pin"),
        Updated::NotRepinned => println!(
            "not re-pinned: moat.toml and moat.lock are unchanged; run `moat update {server}{} --yes` to re-pin",
            args.version
                .as_deref()
                .map(|v| format!(" --version {v}"))
                .unwrap_or_default()
        ),
        Updated::Repinned { lock: None } => {}
        Updated::Repinned { lock: Some(lock) } => {
            println!("re-pinned `{server}` in {}", lock.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

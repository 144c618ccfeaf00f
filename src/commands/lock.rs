//! `moat lock`: every server measured into moat.lock
//! ([`moat_host::relock`]), with a line per server as it goes, the
//! flagged metadata, and the servers that failed at the end.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use moat_host::printable;
use moat_host::relock::{self, Event};

#[derive(clap::Args)]
pub struct Args {
    /// The config file.
    #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
    config: PathBuf,
}

pub async fn run(args: Args) -> Result<ExitCode> {
    let relocked = relock::relock(&args.config, |event| match event {
        Event::Replacing { path, error } => eprintln!(
            "moat: warning: replacing {}: {}",
            path.display(),
            printable(&error.to_string())
        ),
        Event::Skipped { server, revocation } => eprintln!(
            "moat: not measuring `{server}`: {}",
            printable(&moat_host::revoke::describe(revocation))
        ),
        Event::Measuring { server } => eprintln!("moat: measuring `{server}`"),
        Event::Measured { server, locked } => println!(
            "{server}: {} sha256 {} identity {} ({} tools, {} prompts, {} resources)",
            locked.evidence,
            locked.sha256,
            locked.identity,
            locked.tools.len(),
            locked.prompts.len(),
            locked.resources.len()
        ),
        Event::Failed { server } => {
            eprintln!("moat: `{server}` could not be measured (reported at the end)")
        }
    })
    .await?;
    for flagged in &relocked.flagged {
        println!(
            "warning: {}: {} `{}` has untrusted metadata: {} (see README, \"Metadata flags\")",
            flagged.server,
            flagged.kind,
            printable(&flagged.name),
            flagged.flags.join(", ")
        );
    }
    let state = relocked.write()?;
    println!("wrote {} ({})", relocked.path.display(), state.word());
    if relocked.failures.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "moat: error: {} of {} servers could not be measured (each kept the entry it had, if any; fix them and run `moat lock` again):",
        relocked.failures.len(),
        relocked.servers
    );
    for (name, error) in &relocked.failures {
        eprintln!("  {name}: {}", printable(&error.to_string()));
    }
    Ok(ExitCode::FAILURE)
}

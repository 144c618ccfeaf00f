//! `moat audit`: work with audit logs; `verify` checks one's hash chain
//! ([`moat_host::audit::verify`]).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use moat_host::printable;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Check the hash chain of an audit log; name the first broken line.
    Verify {
        /// The audit log (JSON lines).
        file: PathBuf,
    },
}

pub fn run(args: Args) -> Result<ExitCode> {
    let Command::Verify { file } = args.command;
    let key = moat_host::audit::key_in(&moat_host::setup::audit_key_dir()?, false)?;
    let verified = moat_host::audit::verify(&file, &key)?;
    println!(
        "{}: {} lines, every MAC and the chain intact, anchored{}",
        printable(&file.display().to_string()),
        verified.lines,
        match verified.unanchored {
            0 => String::new(),
            n => format!(
                " up to line {} (the last {n} written by Moat, which stopped before anchoring them)",
                verified.lines - n
            ),
        }
    );
    Ok(ExitCode::SUCCESS)
}

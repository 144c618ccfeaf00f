//! `moat claim verify`: checks a session's claim with the signer's public
//! key alone ([`moat_host::claim::verify`]) and, given the audit log,
//! against it ([`moat_host::claim::check_against_log`]).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use moat_host::claim::PublicKey;
use moat_host::printable;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Check a claim's signature and shape; with --audit, that the log
    /// holds its chain head and the calls and launches it counts.
    Verify {
        /// The claim (a JSON file `moat serve --claims DIR` wrote).
        claim: PathBuf,
        /// The signer's public key: 64 hex digits as `moat key show`
        /// prints them, or a file holding them.
        #[arg(long, value_name = "KEY")]
        public_key: String,
        /// The audit log the claim's session was recorded in.
        #[arg(long, value_name = "LOG")]
        audit: Option<PathBuf>,
    },
}

pub fn run(args: Args) -> Result<ExitCode> {
    let Command::Verify {
        claim: path,
        public_key,
        audit,
    } = args.command;
    let key = public_key_from(&public_key)?;
    let claim = moat_host::claim::verify(&path, &key)?;
    let calls: u64 = claim.calls.values().sum();
    println!(
        "{}: session {}, signed by {key}: {} servers, {calls} calls, {} refusals",
        printable(&path.display().to_string()),
        printable(&claim.session),
        claim.servers.len(),
        claim.refusals.len() as u64 + claim.refusals_omitted,
    );
    for server in &claim.servers {
        println!(
            "  {} ({}{}): {}",
            printable(&server.name),
            server.evidence,
            server
                .sha256
                .as_deref()
                .map_or_else(String::new, |d| format!(", sha256 {d}")),
            server.identity
        );
    }
    if let Some(log) = audit {
        let checked = moat_host::claim::check_against_log(&path, &claim, &log)?;
        println!(
            "{}: holds the session from line {} to its chain head at line {}, with the calls and launches the claim counts",
            printable(&log.display().to_string()),
            checked.opened_line,
            checked.head_line
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `text` as a public key, or the key in the file it names.
fn public_key_from(text: &str) -> Result<PublicKey> {
    if let Ok(key) = text.parse() {
        return Ok(key);
    }
    let path = std::path::Path::new(text);
    if path.exists() {
        let content = std::fs::read_to_string(path)
            .with_context(|| format!("reading the public key from {}", path.display()))?;
        return content
            .parse()
            .map_err(|e: String| anyhow::anyhow!("{}: {e}", path.display()));
    }
    text.parse()
        .map_err(|e: String| anyhow::anyhow!("--public-key: {e}"))
}

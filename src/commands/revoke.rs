//! `moat revoke`: the kill switch, recorded in moat.lock
//! ([`moat_host::relock::revoke`]).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use moat_host::printable;
use moat_host::relock::{self, Revoking};
use moat_host::revoke::describe;

#[derive(clap::Args)]
pub struct Args {
    /// The config file (moat.lock beside it is written).
    #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
    config: PathBuf,
    /// Why, recorded with the revocation and quoted in every refusal.
    #[arg(long, default_value = "")]
    reason: String,
    /// SERVER, SERVER__TOOL or sha256:DIGEST.
    target: String,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let revoking = relock::revoke(&args.config, &args.target, &args.reason)?;
    match &revoking {
        Revoking::Already(earlier) => {
            println!("already revoked: {}", printable(&describe(earlier)));
        }
        Revoking::New {
            revocation, path, ..
        } => {
            println!("{}", printable(&describe(revocation)));
            revoking.write()?;
            println!("wrote {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

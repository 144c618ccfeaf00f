//! `moat key`: Moat's claim signing key ([`moat_host::claim::key`]): `show`
//! prints its public half (to pin where claims are verified), `rotate`
//! retires it and makes a new one.

use std::process::ExitCode;

use anyhow::Result;
use moat_host::claim::{SigningKey, key};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Print the claim signing key's public half (made when there is none),
    /// and the retired keys' (claims signed with them verify with them).
    Show {
        /// Print the current public key alone, for a script.
        #[arg(long)]
        public: bool,
    },
    /// Retire the signing key and make a new one. Its public half is kept
    /// in the retired list; a running `moat serve` signs with the old key
    /// until it restarts.
    Rotate,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let dir = moat_host::setup::audit_key_dir()?;
    match args.command {
        Command::Show { public } => {
            let current = SigningKey::in_dir(&dir, true)?;
            if public {
                println!("{}", current.public());
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "claim signing key ({}): {}",
                key::ALGORITHM,
                current.public()
            );
            println!("  file: {}", current.path().display());
            for retired in key::retired(&dir)? {
                println!("retired at unix ms {}: {}", retired.unix_ms, retired.key);
            }
        }
        Command::Rotate => {
            let (old, new) = key::rotate(&dir)?;
            match old {
                Some(old) => println!("retired {old}"),
                None => println!("there was no claim signing key to retire"),
            }
            println!("claim signing key ({}): {}", key::ALGORITHM, new.public());
        }
    }
    Ok(ExitCode::SUCCESS)
}

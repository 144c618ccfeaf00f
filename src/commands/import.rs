//! `moat import`: a client config ([`moat_host::importer::import`]) or a
//! Wassette policy ([`moat_host::wassette::import`]) turned into moat.toml
//! entries, printed; what was not carried over goes to stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use moat_host::printable;

#[derive(clap::Args)]
pub struct Args {
    /// claude_desktop_config.json (`mcpServers`) or .vscode/mcp.json
    /// (`servers`); or, with --component, a Wassette policy.yaml.
    file: PathBuf,
    /// Import package launchers as configured instead of installing
    /// them (they then fetch code at every launch).
    #[arg(long)]
    no_install: bool,
    /// FILE is a Wassette policy.yaml for this component: print a
    /// moat.toml entry that runs it with the same grants, pinned.
    #[arg(long, value_name = "WASM", conflicts_with = "no_install")]
    component: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    if let Some(component) = &args.component {
        print!("{}", moat_host::wassette::import(&args.file, component)?);
        return Ok(ExitCode::SUCCESS);
    }
    let store = if args.no_install {
        None
    } else {
        Some(moat_host::store_dir().ok_or(moat_host::PackageError::NoStore)?)
    };
    let imported = moat_host::importer::import(
        &args.file,
        std::env::var_os("PATH").as_deref(),
        store.as_deref(),
    )?;
    print!("{}", imported.toml);
    for line in &imported.skipped {
        eprintln!("moat: import: {}", printable(line));
    }
    Ok(ExitCode::SUCCESS)
}

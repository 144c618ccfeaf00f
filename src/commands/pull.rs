//! `moat pull`: components pulled from OCI registries into Moat's store
//! ([`moat_host::oci::Store::pull`]), one line each.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use moat_host::Config;
use moat_host::config::WasmSource;
use moat_host::oci::{OciRef, Store};

#[derive(clap::Args)]
pub struct Args {
    /// The config file (when no REF is given).
    #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
    config: PathBuf,
    /// The references to pull.
    references: Vec<String>,
}

/// Each reference, or the config's `oci://` servers, into the store; one
/// line per component.
pub async fn run(args: Args) -> Result<ExitCode> {
    let mut wanted: Vec<(OciRef, PathBuf)> = Vec::new();
    if args.references.is_empty() {
        let config = Config::load(&args.config)?;
        for spec in config.servers.values() {
            if let moat_host::ServerKind::Wasm {
                source: WasmSource::Oci { reference, store },
                ..
            } = &spec.kind
            {
                wanted.push((reference.clone(), store.clone()));
            }
        }
        if wanted.is_empty() {
            bail!(
                "{}: no server has an oci:// component; name one: moat pull oci://HOST/REPO:TAG",
                args.config.display()
            );
        }
    } else {
        let store = Store::default_root()
            .context("no store for pulled components: set MOAT_DATA_DIR, XDG_DATA_HOME or HOME")?;
        for text in &args.references {
            wanted.push((text.parse::<OciRef>()?, store.clone()));
        }
    }
    for (reference, store) in wanted {
        let pulled = Store::new(store).pull(&reference).await?;
        println!("{}", pulled.reference);
        println!(
            "  component sha256:{} ({} KiB), {} {}",
            pulled.layer,
            pulled.size.div_ceil(1024),
            if pulled.fetched {
                "pulled to"
            } else {
                "already in"
            },
            pulled.path.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

//! `moat node`: a launch host ([`moat_host::node`]). `serve` listens for
//! fronts over TLS and launches the profiles they name; `revisions` prints
//! what a front pins: each profile's revision, the node's public key and,
//! given the certificate, its sha256.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use tokio::signal::unix::{SignalKind, signal};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Serve launches to fronts at ADDR over TLS until SIGTERM or Ctrl-C.
    /// Every request needs the token in MOAT_NODE_TOKEN; moat.lock must be
    /// beside the config.
    Serve {
        /// The config file whose servers are the profiles.
        #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
        config: PathBuf,
        /// Where to listen.
        #[arg(long, value_name = "ADDR")]
        listen: SocketAddr,
        /// The node's certificate chain (PEM); fronts pin its sha256.
        #[arg(long, value_name = "PEM")]
        cert: PathBuf,
        /// The certificate's private key (PEM).
        #[arg(long, value_name = "PEM")]
        key: PathBuf,
        /// The token fronts present (from the environment only).
        #[arg(long, env = "MOAT_NODE_TOKEN", hide_env_values = true, hide = true)]
        token: Option<String>,
    },
    /// Print each profile's revision (what a front writes as `revision`),
    /// the node's public key (`public_key`) and, with --cert, the
    /// certificate's sha256 (`cert_sha256`).
    Revisions {
        #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
        config: PathBuf,
        #[arg(long, value_name = "PEM")]
        cert: Option<PathBuf>,
        #[arg(long, value_name = "PEM", requires = "cert")]
        key: Option<PathBuf>,
    },
}

pub async fn run(args: Args) -> Result<ExitCode> {
    match args.command {
        Command::Revisions { config, cert, key } => {
            let node = moat_host::setup::node_for(&config, super::warn)?;
            println!("public_key = \"{}\"", node.public_key());
            if let Some(cert) = cert {
                let key = key.unwrap_or_else(|| cert.clone());
                let (_, pin) = moat_host::node::serve::tls(&cert, &key)?;
                println!("cert_sha256 = \"{pin}\"");
            }
            for (profile, revision) in node.revisions() {
                println!("{profile}: revision = \"{revision}\"");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve {
            config,
            listen,
            cert,
            key,
            token,
        } => {
            let Some(token) = token.filter(|t| !t.is_empty()) else {
                bail!(
                    "moat node serve: set MOAT_NODE_TOKEN to the token fronts present (their `token_env`): a node serves authenticated fronts only"
                );
            };
            let (tls, pin) = moat_host::node::serve::tls(&cert, &key)?;
            let node = Arc::new(moat_host::setup::node_for(&config, super::warn)?);
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("moat node: binding {listen}"))?;
            let addr = listener.local_addr().context("moat node: local address")?;
            eprintln!(
                "moat node: serving {} profile(s) at https://{addr}\n  cert_sha256 = \"{pin}\"\n  public_key = \"{}\"",
                node.revisions().len(),
                node.public_key()
            );
            let mut terminate =
                signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
            let shutdown = async move {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            };
            moat_host::node::serve::serve(node, listener, tls, token, shutdown).await?;
            eprintln!("moat node: stopped; every launch ended");
            Ok(ExitCode::SUCCESS)
        }
    }
}

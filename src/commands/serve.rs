//! `moat serve`: the gateway ([`moat_host::setup::gateway_for`]) served to
//! an agent on stdio ([`moat_host::front::stdio`]) or streamable HTTP
//! ([`moat_host::front::http`]) until the agent goes or a signal arrives;
//! reloaded on SIGHUP (and, with `--watch`, when the config or lock
//! changes), with a line for each reload.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use moat_host::front::http::{Allowed, HttpError};
use moat_host::gateway::{Gateway, ReloadError, Reloaded};
use moat_host::lock::Lock;
use moat_host::printable;
use tokio::signal::unix::{SignalKind, signal};

#[derive(clap::Args)]
pub struct Args {
    /// The config file.
    #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
    config: PathBuf,
    /// Fail if moat.lock is missing (it is enforced whenever present).
    #[arg(long)]
    locked: bool,
    /// Append a hash-chained audit record of every event to FILE.
    #[arg(long, value_name = "FILE")]
    audit: Option<PathBuf>,
    /// Sign a claim of what ran in each agent session when it ends, with
    /// Moat's claim key (`moat key show`), and write it into DIR (a file
    /// per session), or `audit` to record it in the --audit log.
    #[arg(long, value_name = "DIR|audit")]
    claims: Option<moat_host::claim::Place>,
    /// Serve streamable HTTP at ADDR (path /mcp) instead of stdio.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// The bearer token HTTP clients must send (required when ADDR is not
    /// loopback).
    #[arg(long, env = "MOAT_HTTP_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Extra Host values to accept over HTTP (loopback names always are).
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// Browser origins (scheme://host[:port]) allowed to call over HTTP.
    /// A request carrying any other Origin gets 403; none are allowed by
    /// default (agents that are not browsers send no Origin).
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    allow_origins: Vec<String>,
    /// Serve /metrics, /healthz and /readyz alone at ADDR: beside stdio
    /// serving a loopback address; beside --http (where they are also on
    /// its listener, /metrics behind the token) any address, /metrics with
    /// no token, for a scraper (say who reaches it with a firewall or a
    /// network policy).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Serve as replica NAME of several behind one load balancer: every id
    /// naming state only this process holds (2025 session, task, parked
    /// call) ends in `.NAME`, every answer carries `Moat-Replica: NAME`,
    /// and another replica's ids are refused by name (a DNS label, such as
    /// the pod's name).
    #[arg(long, value_name = "NAME", env = "MOAT_REPLICA", requires = "http", value_parser = replica)]
    replica: Option<moat_host::replica::Replica>,
    /// Reload the config and moat.lock whenever either changes on disk
    /// (as on SIGHUP, which always reloads).
    #[arg(long)]
    watch: bool,
    /// Export a span per tool call over OTLP/HTTP (JSON) to URL (an
    /// OpenTelemetry collector, `http://localhost:4318` say): off unless
    /// given.
    #[arg(long, value_name = "URL", env = "MOAT_OTLP_ENDPOINT")]
    pub otlp: Option<String>,
}

fn replica(name: &str) -> Result<moat_host::replica::Replica, moat_host::replica::ReplicaError> {
    moat_host::replica::Replica::new(name)
}

pub async fn run(mut args: Args) -> Result<ExitCode> {
    match args.http {
        Some(addr) => {
            let allowed = Allowed {
                hosts: std::mem::take(&mut args.allow_hosts),
                origins: std::mem::take(&mut args.allow_origins),
            };
            let token = args.token.take();
            serve_http(&args, addr, token, allowed).await
        }
        None => serve_stdio(&args).await,
    }
}

/// `moat serve --http ADDR`: streamable HTTP at /mcp, one agent session per
/// MCP session. Loopback by default; Host (and Origin) checked against DNS
/// rebinding; a bearer token is required when bound beyond loopback. The
/// limits are in [`moat_host::front::http`].
async fn serve_http(
    args: &Args,
    addr: SocketAddr,
    token: Option<String>,
    allowed: Allowed,
) -> Result<ExitCode> {
    if !addr.ip().is_loopback() && token.is_none() {
        bail!(HttpError::TokenRequired { addr });
    }
    let gateway = gateway(args).await?;
    if let Some(replica) = &args.replica {
        gateway.serve_as_replica(replica.clone());
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    match &args.replica {
        Some(replica) => eprintln!(
            "moat: serving MCP at http://{}/mcp as replica {replica}",
            listener.local_addr()?
        ),
        None => eprintln!("moat: serving MCP at http://{}/mcp", listener.local_addr()?),
    }
    let stop_probes = tokio_util::sync::CancellationToken::new();
    if let Some(addr) = args.metrics {
        let scope = moat_host::front::http::ProbeScope::BesideHttp {
            hosts: allowed.hosts.clone(),
        };
        spawn_probes(&gateway, addr, scope, &stop_probes).await?;
    }
    let _stop_probes = stop_probes.drop_guard();
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    };
    let failures =
        moat_host::front::http::serve(gateway, listener, token, allowed, shutdown).await?;
    Ok(close_status(&failures))
}

/// `moat serve` on stdio: one agent session until stdin closes or a signal
/// arrives; then every child is closed, and a failure to close is reported
/// in the exit status. With `--metrics`, the probes and /metrics are served
/// beside it on loopback.
async fn serve_stdio(args: &Args) -> Result<ExitCode> {
    let gateway = gateway(args).await?;
    let stop_probes = tokio_util::sync::CancellationToken::new();
    if let Some(addr) = args.metrics {
        let scope = moat_host::front::http::ProbeScope::Loopback;
        spawn_probes(&gateway, addr, scope, &stop_probes).await?;
    }
    let _stop_probes = stop_probes.drop_guard();
    let agent = moat_host::front::stdio::Agent::start(&gateway).await?;
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    };
    let failures = agent.serve_until(shutdown).await;
    Ok(close_status(&failures))
}

/// Binds `--metrics ADDR` and serves the probes and /metrics there, as
/// `scope` allows, until `stop`.
async fn spawn_probes(
    gateway: &Gateway,
    addr: SocketAddr,
    scope: moat_host::front::http::ProbeScope,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics: binding {addr}"))?;
    let bound = listener.local_addr().context("--metrics: local address")?;
    if matches!(scope, moat_host::front::http::ProbeScope::Loopback) && !bound.ip().is_loopback() {
        bail!(HttpError::MetricsNotLoopback { addr: bound });
    }
    eprintln!("moat: serving metrics at http://{bound}/metrics");
    let probes = moat_host::front::http::serve_probes(
        gateway.clone(),
        listener,
        scope,
        stop.clone().cancelled_owned(),
    );
    tokio::spawn(async move {
        if let Err(error) = probes.await {
            tracing::error!(%error, "metrics listener failed");
        }
    });
    Ok(())
}

/// The gateway for `args`, reloaded on SIGHUP (see [`reload_on_hangup`]).
async fn gateway(args: &Args) -> Result<Gateway> {
    let gateway = moat_host::setup::gateway_for(
        &args.config,
        args.locked,
        args.audit.as_deref(),
        args.claims.clone(),
        super::warn,
    )
    .await?;
    reload_on_hangup(&gateway, &args.config, args.watch)?;
    Ok(gateway)
}

/// How long `--watch` lets a burst of file events settle before reloading
/// (an editor's save can be several writes and renames).
const WATCH_SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

/// SIGHUP, and with `watch` a change to the config or its lock: both are
/// read again ([`Gateway::reload`]). New sessions get the new
/// configuration, open ones keep theirs, and what the new lock revokes or
/// no longer matches stops at once everywhere. A reload that fails changes
/// nothing; either way one line says what happened.
fn reload_on_hangup(gateway: &Gateway, config_path: &Path, watch: bool) -> Result<()> {
    let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let mut changes = if watch {
        let files = [config_path.to_owned(), Lock::path_for(config_path)];
        let changes = moat_host::watch(&files)?;
        eprintln!(
            "moat: watching {} and {} for changes",
            files[0].display(),
            files[1].display()
        );
        Some(changes)
    } else {
        None
    };
    let gateway = gateway.clone();
    tokio::spawn(async move {
        loop {
            let source = tokio::select! {
                signal = hangup.recv() => match signal {
                    Some(()) => "SIGHUP",
                    None => return,
                },
                Some(_) = async { changes.as_mut()?.recv().await }, if changes.is_some() => {
                    tokio::time::sleep(WATCH_SETTLE).await;
                    while changes.as_mut().is_some_and(|c| c.try_recv().is_ok()) {}
                    "watch"
                }
            };
            eprintln!(
                "moat: {}",
                reload_report(source, &gateway, gateway.reload(source).await)
            );
        }
    });
    Ok(())
}

/// The line `moat serve` prints after a reload from `source`.
fn reload_report(source: &str, gateway: &Gateway, result: Result<Reloaded, ReloadError>) -> String {
    match result {
        Ok(done) => format!(
            "{source}: reloaded (generation {}, {} servers): {} revocations in force ({} new, {} lifted); \
             calls in flight to what is refused: {} drained, {} cancelled; {} children stopped",
            done.generation,
            done.servers,
            done.revocations,
            done.enforced.added,
            done.enforced.lifted,
            done.enforced.drained,
            done.enforced.cancelled,
            done.enforced.stopped,
        ),
        Err(error) => format!(
            "error: {source}: reload refused: {}; still serving generation {}, unchanged",
            printable(&moat_host::error_chain(&error)),
            gateway.generation()
        ),
    }
}

/// Reports every server that failed to close; the exit status says whether any did.
fn close_status(failures: &[(String, moat_host::SessionError)]) -> ExitCode {
    for (server, error) in failures {
        eprintln!(
            "moat: error: closing server `{server}`: {}",
            printable(&error.to_string())
        );
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

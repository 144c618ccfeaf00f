//! `moat`: the command line. `Cli` and its `Command`s, the dispatch to one
//! module per subcommand (`commands/`: each parses its arguments, calls
//! moat-host, and prints), and the process's setup: logging, OTLP traces,
//! the descriptor limit, the async runtime and signals. Everything that
//! matters lives in moat-host.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use moat_host::printable;

mod commands;

/// Run MCP servers isolated, measured and bounded.
#[derive(Parser)]
#[command(name = "moat", version, about)]
struct Cli {
    /// Log verbosity (repeat for more); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

/// Each subcommand's arguments are defined only when it runs (`defer`):
/// building every subcommand's was 3% of a `moat serve` start.
#[derive(Subcommand)]
#[command(defer = true)]
enum Command {
    /// List a server's tools, with its digest and evidence class.
    Tools(commands::tools::Args),
    /// Call one tool and print its result as JSON.
    Call(commands::call::Args),
    /// Start every server, measure it and write moat.lock beside the config:
    /// digests, execution identity, evidence and every tool's definition.
    Lock(commands::lock::Args),
    /// The kill switch: record in moat.lock that a server, one of its tools
    /// (SERVER__TOOL) or a digest (sha256:HEX) must not run. Launches and
    /// calls of it are refused from then on, with who revoked it and why;
    /// `moat lock` keeps the entry. Remove the entry to lift it.
    Revoke(commands::revoke::Args),
    /// Serve every configured server to an agent as one MCP server, on
    /// stdio or (`--http`) streamable HTTP: tools exposed as `server__tool`,
    /// servers started on first use and closed with the session; a server
    /// that cannot start is left out and tried again.
    Serve(commands::serve::Args),
    /// Turn a Claude Desktop or VS Code MCP config into moat.toml entries
    /// (printed), measuring each command; says what was not carried over.
    ///
    /// `npx`/`bunx`/`pnpm dlx`, `uvx`/`pipx run` and `python -m` servers
    /// are installed once into Moat's package store (npm or pip, no install
    /// scripts, no source builds) and imported as the installed program.
    Import(commands::import::Args),
    /// Add one server to moat.toml from its command line, as a client
    /// config would list it: `moat add -- npx -y @modelcontextprotocol/server-memory`.
    /// Package launchers are installed as `moat import` does.
    Add(commands::add::Args),
    /// Install the newest (or --version) release of a server's package,
    /// show the version and tool-definition diff, and re-pin moat.toml and
    /// moat.lock only with --yes.
    Update(commands::update::Args),
    /// Every server: identity, evidence, limits, capabilities, and its tools
    /// as pinned, drifted or new. Starts each server to measure it.
    Inspect(commands::inspect::Args),
    /// Run a native server once, able to read every file and reach the
    /// network but to write only its private /tmp (and --write
    /// directories), record the files it opens and the addresses it connects
    /// to, and print the `dirs` and `net` entries that would let it run
    /// under the sandbox.
    Learn(commands::learn::Args),
    /// Work with audit logs.
    Audit(commands::audit::Args),
    /// Work with session claims (`moat serve --claims`): verify one.
    Claim(commands::claim::Args),
    /// Moat's claim signing key: show its public half, or rotate it.
    Key(commands::key::Args),
    /// A launch host: serve this config's servers, launched by profile and
    /// revision, to fronts whose config names this node (over TLS, with a
    /// token); or print each profile's revision.
    Node(commands::node::Args),
    /// Fuzz one server through its tools' input schemas and the protocol:
    /// every crash, hang, limit hit, panic, protocol error or result outside
    /// its own outputSchema is a finding, shrunk, saved in the corpus and
    /// replayable. Exits 1 when there is a finding.
    Fuzz(commands::fuzz::Args),
    /// Pull components from OCI registries into Moat's store ahead of the
    /// first launch: each REF (`oci://HOST/REPO:TAG` or `...@sha256:DIGEST`),
    /// or every `oci://` server of the config when none is given. Prints
    /// the reference with its manifest digest, to pin it in moat.toml.
    Pull(commands::pull::Args),
    /// Print the sha256 of a file, to pin it with `sha256 = "..."`.
    Digest(commands::digest::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Under `moat fuzz`, servers failing is the expected news: it is in the
    // report, not in a warning per case.
    let quiet = matches!(cli.command, Command::Fuzz(_));
    let otlp = match &cli.command {
        Command::Serve(args) => args.otlp.as_deref(),
        _ => None,
    };
    // Built before the runtime: the exporter's blocking HTTP client may not
    // be made inside one.
    let traces = match otlp.map(otlp_traces).transpose() {
        Ok(traces) => traces,
        Err(error) => {
            eprintln!(
                "moat: error: --otlp: {}",
                printable(&moat_host::error_chain(error.as_ref()))
            );
            return ExitCode::FAILURE;
        }
    };
    init_logging(cli.verbose, quiet, traces.as_ref());
    // Proxied connections, HTTP connections and servers' pipes all cost
    // descriptors: Moat takes all it may have (servers get their own
    // `open_files`, not this).
    #[cfg(unix)]
    match moat_host::raise_open_files() {
        Ok(open) => tracing::debug!(
            soft = open.soft,
            hard = open.hard,
            was = open.was,
            "RLIMIT_NOFILE"
        ),
        Err(error) => tracing::warn!(%error, "keeping the descriptor limit Moat started with"),
    }
    // A report piped into `head` ends quietly, as other tools do, rather than
    // with a panic message. SIGPIPE itself stays ignored: restoring its
    // default would let a server that exits before reading its stdin kill
    // Moat (status 141) when Moat writes to it, instead of Moat reporting it.
    quiet_on_closed_stdout();
    let runtime = match runtime_for(&cli.command).enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("moat: error: starting the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(run(cli.command));
    // Do not wait for blocking threads: tokio's stdin reader sits in a read
    // that cannot be cancelled, and would hold a signalled `serve` open.
    runtime.shutdown_background();
    // The spans still batched are sent before exit.
    if let Some(traces) = traces
        && let Err(error) = traces.shutdown()
    {
        eprintln!("moat: error: --otlp: sending the last spans: {error}");
    }
    match outcome {
        Ok(code) => code,
        Err(error) => {
            // One line: the chain of causes, joined, with whatever a server
            // wrote into it (error messages, stderr tails) escaped.
            let message = printable(&moat_host::error_chain(error.as_ref()).replace('\n', " "));
            eprintln!("moat: error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The async runtime a command runs on. `moat serve` on stdio has one agent
/// making one call at a time: its messages pass through several tasks (the
/// agent's session, the gateway, each server's transport and, for wasm, the
/// instance), and on a single thread each hand-over is a plain poll instead
/// of waking another thread, which on a virtual machine costs tens of
/// microseconds a call (`cargo bench --bench serve`). Native children still
/// run in parallel as processes, compiles run on the blocking pool, and a
/// busy wasm guest yields at its fuel or epoch interval. Everything else,
/// `serve --http` with its many agents above all, gets a worker per core.
fn runtime_for(command: &Command) -> tokio::runtime::Builder {
    match command {
        Command::Serve(args) if args.http.is_none() => {
            tokio::runtime::Builder::new_current_thread()
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    }
}

/// The tracer provider for `moat serve --otlp URL`: spans batched and sent
/// over OTLP/HTTP with JSON bodies to `URL/v1/traces`, as service `moat`.
fn otlp_traces(endpoint: &str) -> Result<opentelemetry_sdk::trace::SdkTracerProvider> {
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        bail!("{endpoint}: not an http:// or https:// URL");
    }
    // The exporter's client speaks TLS through rustls, with Moat's provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(url)
        .build()
        .context("building the OTLP exporter")?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("moat")
        .build();
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// Logs to stderr at the verbosity asked for (`RUST_LOG` overrides); with
/// `traces`, the tool-call spans (`moat_host::trace`) are also exported.
fn init_logging(
    verbose: u8,
    quiet: bool,
    traces: Option<&opentelemetry_sdk::trace::SdkTracerProvider>,
) {
    use opentelemetry::trace::TracerProvider;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let default = match verbose {
        0 if quiet => "error",
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour only for a person at a terminal: a log file or an agent app
    // reading stderr gets no escape codes.
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let spans = traces.map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("moat"))
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target("moat_host::trace", tracing::Level::INFO),
            )
    });
    tracing_subscriber::registry().with(logs).with(spans).init();
}

async fn run(command: Command) -> Result<ExitCode> {
    // A file that outgrows RLIMIT_FSIZE (the audit log, say) fails its write
    // with EFBIG, which Moat reports (an audit log fails closed), instead
    // of SIGXFSZ killing Moat. Handled rather than ignored: a handler goes
    // back to the default in the servers Moat starts, where SIG_IGN would
    // be inherited. Registered for the process's life.
    let _file_too_large =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(libc::SIGXFSZ))
            .context("installing the SIGXFSZ handler")?;
    match command {
        Command::Tools(args) => commands::tools::run(args).await,
        Command::Call(args) => commands::call::run(args).await,
        Command::Lock(args) => commands::lock::run(args).await,
        Command::Revoke(args) => commands::revoke::run(args),
        Command::Serve(args) => commands::serve::run(args).await,
        Command::Import(args) => commands::import::run(args),
        Command::Add(args) => commands::add::run(args),
        Command::Update(args) => commands::update::run(args).await,
        Command::Inspect(args) => commands::inspect::run(args).await,
        Command::Learn(args) => commands::learn::run(args).await,
        Command::Audit(args) => commands::audit::run(args),
        Command::Claim(args) => commands::claim::run(args),
        Command::Key(args) => commands::key::run(args),
        Command::Node(args) => commands::node::run(args).await,
        Command::Fuzz(args) => commands::fuzz::run(args).await,
        Command::Pull(args) => commands::pull::run(args).await,
        Command::Digest(args) => commands::digest::run(args),
    }
}

/// Ends quietly, by SIGPIPE as other tools do, when printing to stdout fails
/// because the reader went away (`moat tools | head`); every other panic is
/// reported as usual.
fn quiet_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            // End as other tools do when their reader goes: by SIGPIPE.
            // SAFETY: restoring a signal's default and raising it in this
            // thread; nothing else depends on its disposition any more.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::raise(libc::SIGPIPE);
            }
            std::process::exit(141);
        }
        report(info);
    }));
}

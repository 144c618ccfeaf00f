//! `moat`: the command line. Argument parsing and output formatting only;
//! everything that matters lives in moat-host.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use moat_host::grants::DirMode;
use moat_host::lock::{LOCK_VERSION, Lock};
use moat_host::policy::ToolStatus;
use moat_host::rmcp::model::JsonObject;
use moat_host::text::printable;
use moat_host::{Config, Digest, Host, Session};

mod fuzz;
mod packages;

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

#[derive(Subcommand)]
enum Command {
    /// List a server's tools, with its digest and evidence class.
    Tools {
        /// The config file.
        #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
        config: PathBuf,
        /// Fail if moat.lock is missing (it is enforced whenever present).
        #[arg(long)]
        locked: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// The server, as named in the config.
        server: String,
    },
    /// Call one tool and print its result as JSON.
    Call {
        /// The config file.
        #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
        config: PathBuf,
        /// Fail if moat.lock is missing (it is enforced whenever present).
        #[arg(long)]
        locked: bool,
        /// The server, as named in the config.
        server: String,
        /// The tool.
        tool: String,
        /// The arguments, a JSON object.
        arguments: Option<String>,
    },
    /// Start every server, measure it and write moat.lock beside the config:
    /// digests, execution identity, evidence and every tool's definition.
    Lock {
        /// The config file.
        #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
        config: PathBuf,
    },
    /// The kill switch: record in moat.lock that a server, one of its tools
    /// (SERVER__TOOL) or a digest (sha256:HEX) must not run. Launches and
    /// calls of it are refused from then on, with who revoked it and why;
    /// `moat lock` keeps the entry. Remove the entry to lift it.
    Revoke {
        /// The config file (moat.lock beside it is written).
        #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
        config: PathBuf,
        /// Why, recorded with the revocation and quoted in every refusal.
        #[arg(long, default_value = "")]
        reason: String,
        /// SERVER, SERVER__TOOL or sha256:DIGEST.
        target: String,
    },
    /// Serve every configured server to an agent as one MCP server, on
    /// stdio or (`--http`) streamable HTTP: tools exposed as `server__tool`,
    /// servers started on first use and closed with the session; a server
    /// that cannot start is left out and tried again.
    Serve {
        /// The config file.
        #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
        config: PathBuf,
        /// Fail if moat.lock is missing (it is enforced whenever present).
        #[arg(long)]
        locked: bool,
        /// Append a hash-chained audit record of every event to FILE.
        #[arg(long, value_name = "FILE")]
        audit: Option<PathBuf>,
        /// Serve streamable HTTP at ADDR (path /mcp) instead of stdio.
        #[arg(long, value_name = "ADDR")]
        http: Option<std::net::SocketAddr>,
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
        /// Beside stdio serving: serve /metrics, /healthz and /readyz at
        /// ADDR, a loopback address (with --http they are on its listener).
        #[arg(long, value_name = "ADDR", conflicts_with = "http")]
        metrics: Option<std::net::SocketAddr>,
        /// Reload the config and moat.lock whenever either changes on disk
        /// (as on SIGHUP, which always reloads).
        #[arg(long)]
        watch: bool,
        /// Export a span per tool call over OTLP/HTTP (JSON) to URL (an
        /// OpenTelemetry collector, `http://localhost:4318` say): off unless
        /// given.
        #[arg(long, value_name = "URL", env = "MOAT_OTLP_ENDPOINT")]
        otlp: Option<String>,
    },
    /// Turn a Claude Desktop or VS Code MCP config into moat.toml entries
    /// (printed), measuring each command; says what was not carried over.
    ///
    /// `npx`/`bunx`/`pnpm dlx`, `uvx`/`pipx run` and `python -m` servers
    /// are installed once into Moat's package store (npm or pip, no install
    /// scripts, no source builds) and imported as the installed program.
    Import {
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
    },
    /// Add one server to moat.toml from its command line, as a client
    /// config would list it: `moat add -- npx -y @modelcontextprotocol/server-memory`.
    /// Package launchers are installed as `moat import` does.
    Add {
        /// The config file (created when missing).
        #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
        config: PathBuf,
        /// The server's name (default: from the package or the command).
        #[arg(long)]
        name: Option<String>,
        /// Add a package launcher as configured instead of installing it.
        #[arg(long)]
        no_install: bool,
        /// Replace the entry of a server of the same name (its pins in
        /// moat.lock stay until `moat lock` measures the new one).
        #[arg(long)]
        replace: bool,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Install the newest (or --version) release of a server's package,
    /// show the version and tool-definition diff, and re-pin moat.toml and
    /// moat.lock only with --yes.
    Update {
        /// The config file.
        #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
        config: PathBuf,
        /// The version to move to (default: the newest).
        #[arg(long)]
        version: Option<String>,
        /// Re-pin: rewrite the server's entry in moat.toml and its pins in
        /// moat.lock.
        #[arg(long)]
        yes: bool,
        /// The server, as named in the config.
        server: String,
    },
    /// Every server: identity, evidence, limits, capabilities, and its tools
    /// as pinned, drifted or new. Starts each server to measure it.
    Inspect {
        /// The config file.
        #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
        config: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run a native server once, able to read every file and reach the
    /// network but to write only its private /tmp (and --write
    /// directories), record the files it opens and the addresses it connects
    /// to, and print the `dirs` and `net` entries that would let it run
    /// under the sandbox.
    Learn {
        /// The config file.
        #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
        config: PathBuf,
        /// Consent without asking: the server runs once able to read every
        /// file the user can and to reach the network.
        #[arg(long)]
        yes: bool,
        /// Let the run write under DIR (repeatable); what it writes there is
        /// proposed `rw`. Refused for system directories, the home
        /// directory itself and Moat's own files.
        #[arg(long = "write", value_name = "DIR")]
        write: Vec<PathBuf>,
        /// After start-up, call TOOL with ARGS (a JSON object) and watch
        /// what it opens and writes too (repeatable, in order): files named
        /// only in tool arguments (a workbook, a database) are seen this way.
        #[arg(long = "call", num_args = 2, value_names = ["TOOL", "ARGS"])]
        call: Vec<String>,
        /// The server, as named in the config.
        server: String,
    },
    /// Work with audit logs.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Fuzz one server through its tools' input schemas and the protocol:
    /// every crash, hang, limit hit, panic, protocol error or result outside
    /// its own outputSchema is a finding, shrunk, saved in the corpus and
    /// replayable. Exits 1 when there is a finding.
    Fuzz(FuzzArgs),
    /// Pull components from OCI registries into Moat's store ahead of the
    /// first launch: each REF (`oci://HOST/REPO:TAG` or `...@sha256:DIGEST`),
    /// or every `oci://` server of the config when none is given. Prints
    /// the reference with its manifest digest, to pin it in moat.toml.
    Pull {
        /// The config file (when no REF is given).
        #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
        config: PathBuf,
        /// The references to pull.
        references: Vec<String>,
    },
    /// Print the sha256 of a file, to pin it with `sha256 = "..."`.
    Digest {
        /// The component or executable.
        path: PathBuf,
    },
}

#[derive(clap::Args)]
struct FuzzArgs {
    /// The config file.
    #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
    config: PathBuf,
    /// The server, as named in the config (with --replay: the case file's
    /// server unless given).
    server: Option<String>,
    /// Fuzz only this tool (repeatable); default: every tool listed.
    #[arg(long = "tool", value_name = "NAME")]
    tools: Vec<String>,
    /// How long to generate cases (`90s`, `2m`, `500ms`; a bare number is
    /// seconds). Default 60s. Shrinking comes after.
    #[arg(long, value_name = "DURATION", conflicts_with = "runs")]
    time: Option<String>,
    /// Generate exactly N cases instead.
    #[arg(long, value_name = "N")]
    runs: Option<u64>,
    /// Seed of the case generator: the same seed, server and corpus give the
    /// same cases in the same order. Default: from the clock (printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Inputs to mutate (`*.json` cases) and where findings are saved, under
    /// `findings/`. Default: moat-fuzz/<server>.
    #[arg(long, value_name = "DIR")]
    corpus: Option<PathBuf>,
    /// Write a report to FILE: JUnit XML when it ends in `.xml`, JSON
    /// otherwise (repeatable).
    #[arg(long = "report", value_name = "FILE")]
    reports: Vec<PathBuf>,
    /// Run one saved case on a fresh instance and report what it does now;
    /// exits 1 if it is still a finding.
    #[arg(long, value_name = "CASE", conflicts_with_all = ["time", "runs", "seed", "tools"])]
    replay: Option<PathBuf>,
    /// A fresh instance for every case (default: one instance is reused
    /// until a case breaks it).
    #[arg(long)]
    fresh: bool,
    /// Instances running cases at once (default: the number of CPUs, at
    /// most 8). Cases are generated in the same order whatever this is.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    jobs: Option<u16>,
    /// Lowers the server's request_timeout_ms for the run (never raises it):
    /// a case without an answer by then is a hang.
    #[arg(long, value_name = "DURATION", default_value = "5s")]
    case_timeout: String,
    /// Shrinking: at most this many candidate runs per finding.
    #[arg(long, value_name = "N", default_value_t = 500)]
    shrink_attempts: u32,
    /// Shrinking: at most this long per finding.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    shrink_time: String,
    /// Write every case, in order, as a JSON line to FILE (to compare runs).
    #[arg(long, value_name = "FILE")]
    log_cases: Option<PathBuf>,
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Check the hash chain of an audit log; name the first broken line.
    Verify {
        /// The audit log (JSON lines).
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Under `moat fuzz`, servers failing is the expected news: it is in the
    // report, not in a warning per case.
    let quiet = matches!(cli.command, Command::Fuzz(_));
    let otlp = match &cli.command {
        Command::Serve { otlp, .. } => otlp.as_deref(),
        _ => None,
    };
    // Built before the runtime: the exporter's blocking HTTP client may not
    // be made inside one.
    let traces = match otlp.map(otlp_traces).transpose() {
        Ok(traces) => traces,
        Err(error) => {
            eprintln!(
                "moat: error: --otlp: {}",
                printable(&moat_host::text::error_chain(error.as_ref()))
            );
            return ExitCode::FAILURE;
        }
    };
    init_logging(cli.verbose, quiet, traces.as_ref());
    // Proxied connections, HTTP connections and servers' pipes all cost
    // descriptors: Moat takes all it may have (servers get their own
    // `open_files`, not this).
    #[cfg(unix)]
    match moat_host::limits::raise_open_files() {
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
            let message =
                printable(&moat_host::text::error_chain(error.as_ref()).replace('\n', " "));
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
        Command::Serve { http: None, .. } => tokio::runtime::Builder::new_current_thread(),
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
        Command::Serve {
            config,
            locked,
            audit,
            http: Some(addr),
            token,
            allow_hosts,
            allow_origins,
            watch,
            ..
        } => {
            let allowed = moat_host::front::http::Allowed {
                hosts: allow_hosts,
                origins: allow_origins,
            };
            let reload = Reload { watch };
            serve_http(
                &config,
                locked,
                audit.as_deref(),
                addr,
                token,
                allowed,
                reload,
            )
            .await
        }
        Command::Serve {
            config,
            locked,
            audit,
            http: None,
            metrics,
            watch,
            ..
        } => serve(&config, locked, audit.as_deref(), metrics, Reload { watch }).await,
        Command::Inspect { config, json } => inspect(&config, json).await,
        Command::Learn {
            config,
            yes,
            write,
            call,
            server,
        } => learn(&config, &server, yes, &write, &call).await,
        Command::Import {
            file,
            component: Some(component),
            ..
        } => {
            print!("{}", moat_host::wassette::import(&file, &component)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Import {
            file, no_install, ..
        } => {
            let store = if no_install {
                None
            } else {
                Some(moat_host::dirs::store().ok_or(moat_host::packages::PackageError::NoStore)?)
            };
            let imported = moat_host::importer::import(
                &file,
                std::env::var_os("PATH").as_deref(),
                store.as_deref(),
            )?;
            print!("{}", imported.toml);
            for line in &imported.skipped {
                eprintln!("moat: import: {}", printable(line));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Add {
            config,
            name,
            no_install,
            replace,
            command,
        } => packages::add(&config, name.as_deref(), &command, !no_install, replace),
        Command::Update {
            config,
            version,
            yes,
            server,
        } => packages::update(&config, &server, version.as_deref(), yes).await,
        Command::Audit {
            command: AuditCommand::Verify { file },
        } => {
            let key = moat_host::audit::key_in(&audit_key_dir()?, false)?;
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
        Command::Pull { config, references } => pull(&config, &references).await,
        Command::Digest { path } => {
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            println!("{}", Digest::of(&bytes));
            Ok(ExitCode::SUCCESS)
        }
        Command::Revoke {
            config,
            reason,
            target,
        } => revoke(&config, &target, &reason),
        Command::Lock { config } => {
            let loaded = Config::load(&config)?;
            let host = new_host(&config)?;
            let previous = previous_revocations(&Lock::path_for(&config))?;
            let revoked = previous.revocations();
            let mut lock = Lock {
                version: LOCK_VERSION,
                revoked: previous.revoked.clone(),
                ..Lock::default()
            };
            let mut failures = Vec::new();
            for (name, spec) in &loaded.servers {
                if let Some(revocation) = revoked.of_name(name, None) {
                    // A revoked server is not started to be measured; its
                    // entry (if any) stays as it was.
                    eprintln!(
                        "moat: not measuring `{name}`: {}",
                        printable(&moat_host::revoke::describe(revocation))
                    );
                    if let Some(old) = previous.servers.get(name) {
                        lock.servers.insert(name.clone(), old.clone());
                    }
                    continue;
                }
                eprintln!("moat: measuring `{name}`");
                let locked = match host.measure(spec).await {
                    Ok(locked) => locked,
                    Err(error) => {
                        // Every server is measured; the failures are
                        // reported together at the end. A failed server
                        // keeps the entry it had.
                        eprintln!("moat: `{name}` could not be measured (reported at the end)");
                        if let Some(old) = previous.servers.get(name) {
                            lock.servers.insert(name.clone(), old.clone());
                        }
                        failures.push((name.clone(), error));
                        continue;
                    }
                };
                println!(
                    "{name}: {} sha256 {} identity {} ({} tools, {} prompts, {} resources)",
                    locked.evidence,
                    locked.sha256,
                    locked.identity,
                    locked.tools.len(),
                    locked.prompts.len(),
                    locked.resources.len()
                );
                lock.servers.insert(name.clone(), locked);
            }
            moat_host::lock::flag_cross_server_references(&mut lock);
            for (name, locked) in &lock.servers {
                let items = [
                    ("tool", &locked.tools),
                    ("prompt", &locked.prompts),
                    ("resource", &locked.resources),
                ];
                for (kind, entries) in items {
                    for entry in entries.iter().filter(|e| !e.flags.is_empty()) {
                        println!(
                            "warning: {name}: {kind} `{}` has untrusted metadata: {} (see README, \"Metadata flags\")",
                            printable(&entry.name),
                            entry.flags.join(", ")
                        );
                    }
                }
            }
            let path = Lock::path_for(&config);
            let before = std::fs::read(&path).ok();
            lock.write(&path)?;
            let state = match before {
                Some(before) if before == lock.to_text().as_bytes() => "unchanged",
                Some(_) => "updated",
                None => "created",
            };
            println!("wrote {} ({state})", path.display());
            if failures.is_empty() {
                return Ok(ExitCode::SUCCESS);
            }
            eprintln!(
                "moat: error: {} of {} servers could not be measured (each kept the entry it had, if any; fix them and run `moat lock` again):",
                failures.len(),
                loaded.servers.len()
            );
            for (name, error) in &failures {
                eprintln!("  {name}: {}", printable(&error.to_string()));
            }
            Ok(ExitCode::FAILURE)
        }
        Command::Tools {
            config,
            locked,
            json,
            server,
        } => {
            let session = connect(&config, &server, locked).await?;
            let tools = session.list_tools().await;
            let reports = session.tool_reports().await;
            let identity = session.shared().identity();
            session.close().await?;
            let tools = tools?;
            let reports = reports?;
            let oci = identity.as_ref().and_then(|i| i.oci.clone());
            let (digest, evidence, measured, sandbox, component) = identity
                .map(|i| {
                    (
                        i.digest
                            .map(|d| d.to_string())
                            .unwrap_or_else(|| "not measured".into()),
                        i.evidence.to_string(),
                        i.measured,
                        i.sandbox.lines(),
                        i.component,
                    )
                })
                .unwrap_or_default();
            let kind = component.as_ref().map(|c| c.kind.to_string());
            let not_tools = component.map(|c| c.not_tools).unwrap_or_default();
            if json {
                let report = serde_json::json!({
                    "server": server,
                    "kind": kind,
                    "not_tools": not_tools,
                    "sha256": digest,
                    "oci": oci.as_ref().map(|o| serde_json::json!({
                        "reference": o.reference,
                        "manifest": o.manifest.to_string(),
                        "layer": o.layer.to_string(),
                    })),
                    "evidence": evidence,
                    "sandbox": sandbox,
                    "measured": measured
                        .iter()
                        .map(|(path, digest)| serde_json::json!({"path": path, "sha256": digest.to_string()}))
                        .collect::<Vec<_>>(),
                    "tools": tools,
                    "pins": reports.as_ref().map(|reports| reports
                        .iter()
                        .map(|r| serde_json::json!({"name": r.name, "status": r.status.word(), "detail": format!("{:?}", r.status)}))
                        .collect::<Vec<_>>()),
                });
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("server    {server}");
                if let Some(kind) = &kind {
                    println!("kind      {kind}");
                }
                println!("evidence  {evidence}");
                println!("sha256    {digest}");
                if let Some(oci) = &oci {
                    println!(
                        "oci       {} (manifest sha256:{})",
                        printable(&oci.reference),
                        oci.manifest
                    );
                }
                for (path, digest) in &measured {
                    println!(
                        "measured  {digest}  {}",
                        printable(&path.display().to_string())
                    );
                }
                for line in &sandbox {
                    println!("sandbox   {}", printable(line));
                }
                for line in &not_tools {
                    println!("not a tool {}", printable(line));
                }
                println!();
                let width = tools.iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
                match &reports {
                    None => {
                        println!("{:width$}  DESCRIPTION", "TOOL");
                        for tool in &tools {
                            let description = tool
                                .description
                                .as_deref()
                                .map(printable)
                                .unwrap_or_default();
                            println!("{:width$}  {description}", printable(&tool.name));
                        }
                    }
                    Some(reports) => {
                        let width = reports
                            .iter()
                            .map(|r| r.name.len())
                            .max()
                            .unwrap_or(4)
                            .max(width);
                        println!(
                            "{:width$}  {:7}  DESCRIPTION (from moat.lock)",
                            "TOOL", "STATUS"
                        );
                        for report in reports {
                            let detail = match &report.status {
                                ToolStatus::Pinned { .. } => tools
                                    .iter()
                                    .find(|t| t.name == report.name)
                                    .and_then(|t| t.description.as_deref())
                                    .map(printable)
                                    .unwrap_or_default(),
                                ToolStatus::Drifted { locked, live } => {
                                    format!("unavailable: locked {locked}, live {live}")
                                }
                                ToolStatus::New { live } => {
                                    format!("unavailable: not in the lock (live {live})")
                                }
                                ToolStatus::Missing { locked } => {
                                    format!("the server no longer lists it (locked {locked})")
                                }
                            };
                            println!(
                                "{:width$}  {:7}  {detail}",
                                printable(&report.name),
                                report.status.word()
                            );
                        }
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Fuzz(args) => fuzz::run(args).await,
        Command::Call {
            config,
            locked,
            server,
            tool,
            arguments,
        } => {
            let arguments = parse_arguments(arguments.as_deref())?;
            let session = connect(&config, &server, locked).await?;
            let result = session.call_tool(&tool, arguments).await;
            session.close().await?;
            let result = result?;
            println!("{}", serde_json::to_string_pretty(&result)?);
            if result.is_error == Some(true) {
                let detail = serde_json::to_value(&result.content)
                    .ok()
                    .and_then(|content| {
                        content
                            .as_array()?
                            .iter()
                            .find_map(|c| c["text"].as_str().map(printable))
                    })
                    .unwrap_or_default();
                eprintln!(
                    "moat: error: tool `{tool}` on server `{server}` reported an error: {detail}"
                );
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn parse_arguments(arguments: Option<&str>) -> Result<Option<JsonObject>> {
    let Some(text) = arguments else {
        return Ok(None);
    };
    let value: serde_json::Value =
        serde_json::from_str(text).context("the tool arguments are not valid JSON")?;
    match value {
        serde_json::Value::Object(object) => Ok(Some(object)),
        other => bail!(
            "the tool arguments must be a JSON object, found {}",
            match other {
                serde_json::Value::Array(_) => "an array",
                serde_json::Value::String(_) => "a string",
                serde_json::Value::Number(_) => "a number",
                serde_json::Value::Bool(_) => "a boolean",
                _ => "null",
            }
        ),
    }
}

/// The lock `moat lock` replaces, for the revocations it must keep. One that
/// cannot be read is only a warning, unless it holds revocations: those are
/// never dropped silently.
fn previous_revocations(path: &Path) -> Result<Lock> {
    match Lock::load(path) {
        Ok(lock) => Ok(lock.unwrap_or_default()),
        Err(error) => {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if text.contains("[[revoked]]") {
                bail!(
                    "{error}: it lists revocations, which `moat lock` keeps: fix the file (or move it away) first"
                );
            }
            eprintln!(
                "moat: warning: replacing {}: {}",
                path.display(),
                printable(&error.to_string())
            );
            Ok(Lock::default())
        }
    }
}

/// `moat revoke`: appends the revocation of `target` to moat.lock.
fn revoke(config_path: &Path, target: &str, reason: &str) -> Result<ExitCode> {
    use moat_host::revoke::Target;
    let parsed: Target = target.parse()?;
    let lock_path = Lock::path_for(config_path);
    let mut lock = Lock::load(&lock_path)?.with_context(|| {
        format!(
            "no {}: revocations are kept in the lock; run `moat lock` first",
            lock_path.display()
        )
    })?;
    let server = match &parsed {
        Target::Server(server) | Target::Tool { server, .. } => Some(server),
        Target::Digest(_) => None,
    };
    if let Some(server) = server {
        let config = Config::load(config_path)?;
        if !config.servers.contains_key(server) && !lock.servers.contains_key(server) {
            bail!(
                "no server `{server}` in {} or {}",
                config_path.display(),
                lock_path.display()
            );
        }
    }
    let revoked = lock.revocations();
    if let Some((_, earlier)) = revoked.iter().find(|(t, _)| *t == parsed) {
        println!(
            "already revoked: {}",
            printable(&moat_host::revoke::describe(earlier))
        );
        return Ok(ExitCode::SUCCESS);
    }
    let revocation = moat_host::revoke::revocation(&parsed, reason);
    println!("{}", printable(&moat_host::revoke::describe(&revocation)));
    lock.revoked.push(revocation);
    lock.write(&lock_path)?;
    println!("wrote {}", lock_path.display());
    Ok(ExitCode::SUCCESS)
}

/// A host for `config_path`, enforcing moat.lock when it exists beside the
/// config (and requiring it with `--locked`).
fn host_for(config_path: &Path, locked: bool) -> Result<Host> {
    let mut host = new_host(config_path)?;
    let lock_path = Lock::path_for(config_path);
    match Lock::load(&lock_path)? {
        Some(lock) => {
            for problem in moat_host::gateway::check_lock_names(&lock) {
                eprintln!("moat: warning: {problem}");
            }
            host = host.with_lock(lock, lock_path)
        }
        None if locked => bail!(
            "--locked: {} does not exist; run `moat lock` to create it",
            lock_path.display()
        ),
        None => {}
    }
    Ok(host)
}

/// A host with the default cache that refuses grants overlapping the
/// cache, `config_path` or the lock beside it.
pub(crate) fn new_host(config_path: &Path) -> Result<Host> {
    // The engine's metering is the config's `[wasm]` setting; a config yet
    // to be written (`moat add` makes it) has the default.
    let (metering, allocator) = if config_path.exists() {
        let config = Config::load(config_path)?;
        (
            config.wasm.metering,
            moat_host::wasm::Allocator::of(&config),
        )
    } else {
        Default::default()
    };
    Ok(
        Host::with_options(Host::default_cache_dir(), metering.into(), allocator)?
            .protect("config", config_path.to_owned())
            .protect("lock", Lock::path_for(config_path)),
    )
}

/// Connects to `server` (see [`host_for`]).
async fn connect(config_path: &Path, server: &str, locked: bool) -> Result<Session> {
    let config = Config::load(config_path)?;
    let spec = config.server(server)?;
    Ok(host_for(config_path, locked)?.connect(spec).await?)
}

/// `moat inspect`: one report per server, as a table or JSON.
/// `moat pull`: each reference, or the config's `oci://` servers, into the
/// store; one line per component.
async fn pull(config_path: &Path, references: &[String]) -> Result<ExitCode> {
    use moat_host::config::WasmSource;
    use moat_host::oci::{OciRef, Store};
    let mut wanted: Vec<(OciRef, PathBuf)> = Vec::new();
    if references.is_empty() {
        let config = Config::load(config_path)?;
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
                config_path.display()
            );
        }
    } else {
        let store = Store::default_root()
            .context("no store for pulled components: set MOAT_DATA_DIR, XDG_DATA_HOME or HOME")?;
        for text in references {
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

async fn inspect(config_path: &Path, json: bool) -> Result<ExitCode> {
    let config = Config::load(config_path)?;
    let host = host_for(config_path, false)?;
    let mut reports = Vec::new();
    let mut failed = false;
    for (name, spec) in &config.servers {
        let kind = match &spec.kind {
            moat_host::ServerKind::Wasm { source, .. } => format!("wasm {source}"),
            moat_host::ServerKind::Native { command, .. } => format!("native {command}"),
            moat_host::ServerKind::Remote { url, .. } => format!("remote {url}"),
        };
        let mut report = serde_json::json!({
            "server": name,
            "kind": kind,
            "limits": serde_json::to_value(&spec.limits)?,
            "dirs": spec.dirs.iter().map(|d| format!("{} -> {} ({})", d.host.display(), d.guest, d.mode)).collect::<Vec<_>>(),
            "net": spec.net.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "env": spec.env.keys().chain(spec.env_passthrough.iter()).collect::<Vec<_>>(),
            "sandbox": spec.sandbox.to_string(),
        });
        match host.connect(spec).await {
            Ok(session) => {
                let identity = session.shared().identity();
                let tools = session.tool_reports().await;
                let live = session.list_tools().await;
                session.close().await?;
                if let Some(identity) = identity {
                    report["evidence"] = identity.evidence.to_string().into();
                    report["sha256"] = identity.digest.map(|d| d.to_string()).into();
                    report["rules"] = identity.sandbox.lines().into();
                    if let Some(component) = identity.component {
                        report["kind"] = format!(
                            "{} ({})",
                            report["kind"].as_str().unwrap_or_default(),
                            component.kind
                        )
                        .into();
                        report["not_tools"] = component.not_tools.into();
                    }
                }
                report["tools"] = match (tools?, live?) {
                    (Some(pins), _) => pins
                        .iter()
                        .map(|r| serde_json::json!({"name": r.name, "status": r.status.word()}))
                        .collect(),
                    (None, live) => live
                        .iter()
                        .map(|t| serde_json::json!({"name": t.name, "status": "unpinned"}))
                        .collect(),
                };
            }
            Err(error) => {
                failed = true;
                report["error"] = format!("{error}").into();
            }
        }
        reports.push(report);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        for report in &reports {
            println!("{}", report["server"].as_str().unwrap_or_default());
            for key in ["kind", "evidence", "sha256", "sandbox", "error"] {
                if let Some(value) = report.get(key).and_then(|v| v.as_str()) {
                    println!("  {key:9} {}", printable(value));
                }
            }
            for key in ["dirs", "net", "env", "rules", "not_tools"] {
                for value in report[key].as_array().into_iter().flatten() {
                    println!(
                        "  {key:9} {}",
                        printable(value.as_str().unwrap_or_default())
                    );
                }
            }
            let limits: Vec<String> = report["limits"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            println!("  {:9} {}", "limits", limits.join(", "));
            for tool in report["tools"].as_array().into_iter().flatten() {
                println!(
                    "  tool      {:8} {}",
                    tool["status"].as_str().unwrap_or_default(),
                    printable(tool["name"].as_str().unwrap_or_default())
                );
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn open_audit(audit: Option<&Path>) -> Result<Option<std::sync::Arc<moat_host::audit::AuditLog>>> {
    let Some(path) = audit else {
        return Ok(None);
    };
    let key = moat_host::audit::key_in(&audit_key_dir()?, true)?;
    Ok(Some(std::sync::Arc::new(moat_host::audit::AuditLog::open(
        path, key,
    )?)))
}

/// Where the audit key lives (see `moat_host::audit::default_key_dir`).
fn audit_key_dir() -> Result<PathBuf> {
    moat_host::audit::default_key_dir()
        .context("no directory for the audit key: set MOAT_STATE_DIR (or XDG_STATE_HOME, or HOME)")
}

/// `moat serve --http ADDR`: streamable HTTP at /mcp, one agent session per
/// MCP session. Loopback by default; Host (and Origin) checked against DNS
/// rebinding; a bearer token is required when bound beyond loopback. The
/// limits are in [`moat_host::http`].
async fn serve_http(
    config_path: &Path,
    locked: bool,
    audit: Option<&Path>,
    addr: std::net::SocketAddr,
    token: Option<String>,
    allowed: moat_host::front::http::Allowed,
    reload: Reload,
) -> Result<ExitCode> {
    if !addr.ip().is_loopback() && token.is_none() {
        bail!(moat_host::front::http::HttpError::TokenRequired { addr });
    }
    let gateway = gateway_for(config_path, locked, audit).await?;
    reload_on_hangup(&gateway, config_path, reload.watch)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    eprintln!("moat: serving MCP at http://{}/mcp", listener.local_addr()?);
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
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

/// The gateway `moat serve` runs, with exposed names checked before serving:
/// from the lock when there is one, otherwise by starting each server once.
async fn gateway_for(
    config_path: &Path,
    locked: bool,
    audit: Option<&Path>,
) -> Result<moat_host::gateway::Gateway> {
    let config = Config::load(config_path)?;
    // A pass-through variable that is unset here is not set for the server
    // either: said once, at start, before a server fails for want of it.
    for (name, spec) in &config.servers {
        for var in &spec.env_passthrough {
            if std::env::var_os(var).is_none() {
                tracing::warn!(
                    "server `{name}`: env_passthrough names {var}, which is not set in Moat's environment: the server starts without it"
                );
            }
        }
    }
    let mut host = host_for(config_path, locked)?;
    if let Some(audit) = audit {
        host = host
            .protect("audit log", audit.to_owned())
            .protect("audit anchor", moat_host::audit::anchor_path(audit))
            .protect(moat_host::grants::AUDIT_KEY, audit_key_dir()?);
    }
    let pinned = host.is_locked();
    let gateway = moat_host::gateway::Gateway::new(host, config, open_audit(audit)?);
    if !pinned {
        gateway.check_names().await;
    }
    Ok(gateway)
}

/// When `moat serve` reloads: on SIGHUP always, and with `watch` when the
/// config or its lock changes.
#[derive(Clone, Copy)]
struct Reload {
    watch: bool,
}

/// How long `--watch` lets a burst of file events settle before reloading
/// (an editor's save can be several writes and renames).
const WATCH_SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

/// SIGHUP, and with `watch` a change to the config or its lock: both are
/// read again ([`moat_host::gateway::Gateway::reload`]). New sessions get
/// the new configuration, open ones keep theirs, and what the new lock
/// revokes or no longer matches stops at once everywhere. A reload that
/// fails changes nothing; either way one line says what happened.
fn reload_on_hangup(
    gateway: &moat_host::gateway::Gateway,
    config_path: &Path,
    watch: bool,
) -> Result<()> {
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    let mut changes = if watch {
        let files = [config_path.to_owned(), Lock::path_for(config_path)];
        let changes = moat_host::watch::watch(&files)?;
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
fn reload_report(
    source: &str,
    gateway: &moat_host::gateway::Gateway,
    result: Result<moat_host::gateway::Reloaded, moat_host::gateway::ReloadError>,
) -> String {
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
            printable(&moat_host::text::error_chain(&error)),
            gateway.generation()
        ),
    }
}

/// Reports every server that failed to close; the exit status says whether any did.
fn close_status(failures: &[(String, moat_host::ClientError)]) -> ExitCode {
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

/// `moat serve` on stdio: one agent session until stdin closes or a signal
/// arrives; then every child is closed, and a failure to close is reported
/// in the exit status.
async fn serve(
    config_path: &Path,
    locked: bool,
    audit: Option<&Path>,
    metrics: Option<std::net::SocketAddr>,
    reload: Reload,
) -> Result<ExitCode> {
    let gateway = gateway_for(config_path, locked, audit).await?;
    reload_on_hangup(&gateway, config_path, reload.watch)?;
    let stop_probes = tokio_util::sync::CancellationToken::new();
    if let Some(addr) = metrics {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--metrics: binding {addr}"))?;
        let bound = listener.local_addr().context("--metrics: local address")?;
        if !bound.ip().is_loopback() {
            bail!(moat_host::front::http::HttpError::MetricsNotLoopback { addr: bound });
        }
        eprintln!("moat: serving metrics at http://{bound}/metrics");
        let probes = moat_host::front::http::serve_probes(
            gateway.clone(),
            listener,
            stop_probes.clone().cancelled_owned(),
        );
        tokio::spawn(async move {
            if let Err(error) = probes.await {
                tracing::error!(%error, "metrics listener failed");
            }
        });
    }
    let _stop_probes = stop_probes.drop_guard();
    let agent = moat_host::front::stdio::Agent::start(&gateway).await?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    };
    let failures = agent.serve_until(shutdown).await;
    Ok(close_status(&failures))
}

/// `moat learn`: asks for consent (unless `--yes`), runs the server once,
/// watched, able to read everything but to write only its private /tmp and
/// the `--write` directories, and prints the grants as TOML: `rw` only where
/// it wrote, writes it wanted and did not do as lines to confirm, and what
/// is never proposed with why.
async fn learn(
    config: &Path,
    server: &str,
    yes: bool,
    write: &[PathBuf],
    call: &[String],
) -> Result<ExitCode> {
    let loaded = Config::load(config)?;
    let spec = loaded.server(server)?;
    let calls = call
        .chunks(2)
        .map(|pair| {
            let [tool, arguments] = pair else {
                bail!("moat learn --call needs TOOL and ARGS (a JSON object)");
            };
            let arguments: serde_json::Value =
                serde_json::from_str(arguments).with_context(|| {
                    format!(
                        "moat learn --call {} {}: ARGS is not JSON",
                        printable(tool),
                        printable(arguments)
                    )
                })?;
            match arguments {
                serde_json::Value::Object(object) => Ok((tool.clone(), Some(object))),
                serde_json::Value::Null => Ok((tool.clone(), None)),
                other => bail!(
                    "moat learn --call {}: ARGS must be a JSON object, not {other}",
                    printable(tool)
                ),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let writes = std::iter::once("its private /tmp".to_owned())
        .chain(
            write
                .iter()
                .map(|dir| printable(&dir.display().to_string())),
        )
        .collect::<Vec<_>>()
        .join(", ");
    if !yes {
        eprint!(
            "moat learn runs `{}` once able to READ EVERY FILE you can and to reach the network (it may write only {writes}; namespaces, capabilities and seccomp stay), and records what it opens and connects to. Continue? [y/N] ",
            printable(server)
        );
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            eprintln!("moat learn: not run");
            return Ok(ExitCode::from(2));
        }
    }
    let host = new_host(config)?;
    let moat_host::client::Learned {
        proposal,
        outcome,
        calls: called,
    } = host.learn(spec, write, &calls).await?;
    if let Err(error) = &outcome {
        eprintln!(
            "moat learn: `{}` failed during the learn run (which lets it read everything but write only {writes}): {error}",
            printable(server)
        );
    }
    for (tool, result) in &called {
        let what = match result {
            Ok(result) => {
                let text: String = result
                    .content
                    .iter()
                    .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
                    .collect::<Vec<_>>()
                    .join(" ");
                let short: String = text.chars().take(200).collect();
                format!(
                    "{}: {}",
                    if result.is_error == Some(true) {
                        "the tool answered an error"
                    } else {
                        "answered"
                    },
                    printable(&short)
                )
            }
            Err(error) => format!("failed: {error}"),
        };
        eprintln!("moat learn: call {}: {what}", printable(tool));
    }
    let shown = |path: &Path| printable(&path.display().to_string());
    println!(
        "# `moat learn {}`: what the server used beyond its grants. Append to {}:",
        printable(server),
        printable(&config.display().to_string())
    );
    if proposal.dirs.is_empty() && proposal.net.is_empty() && proposal.confirm.is_empty() {
        println!("# nothing: its grants already cover what it used");
    }
    for (dir, write) in &proposal.dirs {
        if *write {
            println!("# it wrote here during the run");
        }
        println!(
            "{}",
            moat_host::grants::toml::dir_entry(server, dir, None, DirMode::of(*write))
        );
    }
    for (dir, how) in &proposal.confirm {
        let mut what = Vec::new();
        if how.denied {
            what.push("tried to write there and was refused");
        }
        if how.unwritten {
            what.push("opened files there for writing and wrote nothing");
        }
        println!(
            "# to confirm, NOT proposed: it {} ({}); grant it read-write only if the server should write there, or run `moat learn --write {} {}` to let it and see:",
            what.join(" and "),
            shown(dir),
            shown(dir),
            printable(server)
        );
        let entry = moat_host::grants::toml::dir_entry(server, dir, None, DirMode::Rw);
        println!("# {}", entry.replace('\n', "\n# "));
    }
    for (path, how, why) in &proposal.refused {
        let mut what = Vec::new();
        if how.read {
            what.push("read there");
        }
        if how.written {
            what.push("wrote there");
        }
        if how.denied {
            what.push("tried to write there and was refused");
        }
        if how.unwritten {
            what.push("opened files there for writing and wrote nothing");
        }
        println!(
            "# refused, not proposed: {} {} (it {}): {why}",
            shown(path),
            DirMode::of(how.wants_write()),
            what.join(", "),
        );
    }
    if !proposal.net.is_empty() {
        println!(
            "# and in [servers.{}] (reached through Moat's egress proxy, by name: see README):\n# net = {}",
            moat_host::grants::toml::key(server),
            moat_host::grants::toml::net_list(&proposal.net)
        );
    }
    for probe in &proposal.probes {
        println!(
            "# it also read {} (a runtime's probe; grant it only if the server needs it)",
            shown(probe)
        );
    }
    for (path, kept) in &proposal.withheld {
        println!(
            "# it also used {}, which would overlap Moat's own {} (not proposed: such a grant is refused; keep the config and lock apart from the server's files if it needs them)",
            shown(path),
            shown(kept)
        );
    }
    for socket in &proposal.unix {
        println!(
            "# it tried the Unix socket {}, which no grant opens",
            shown(socket)
        );
    }
    Ok(if outcome.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
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

//! `moat`: the command line. Argument parsing and output formatting only;
//! everything that matters lives in moat-host.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use moat_host::rmcp::model::JsonObject;
use moat_host::{Config, Digest, Host, Session};

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
        /// The server, as named in the config.
        server: String,
        /// The tool.
        tool: String,
        /// The arguments, a JSON object.
        arguments: Option<String>,
    },
    /// Print the sha256 of a file, to pin it with `sha256 = "..."`.
    Digest {
        /// The component or executable.
        path: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("moat: error: starting the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(error) => {
            // One line: the chain of causes, joined.
            let message = format!("{error:#}").replace('\n', " ");
            eprintln!("moat: error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Digest { path } => {
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            println!("{}", Digest::of(&bytes));
            Ok(ExitCode::SUCCESS)
        }
        Command::Tools {
            config,
            json,
            server,
        } => {
            let session = connect(&config, &server).await?;
            let tools = session.list_tools().await;
            let identity = session.shared().identity();
            session.close().await?;
            let tools = tools?;
            let (digest, evidence, measured) = identity
                .map(|i| {
                    (
                        i.digest
                            .map(|d| d.to_string())
                            .unwrap_or_else(|| "not measured".into()),
                        i.evidence.to_string(),
                        i.measured,
                    )
                })
                .unwrap_or_default();
            if json {
                let report = serde_json::json!({
                    "server": server,
                    "sha256": digest,
                    "evidence": evidence,
                    "measured": measured
                        .iter()
                        .map(|(path, digest)| serde_json::json!({"path": path, "sha256": digest.to_string()}))
                        .collect::<Vec<_>>(),
                    "tools": tools,
                });
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("server    {server}");
                println!("evidence  {evidence}");
                println!("sha256    {digest}");
                for (path, digest) in &measured {
                    println!("measured  {digest}  {}", path.display());
                }
                println!();
                let width = tools.iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
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
            Ok(ExitCode::SUCCESS)
        }
        Command::Call {
            config,
            server,
            tool,
            arguments,
        } => {
            let arguments = parse_arguments(arguments.as_deref())?;
            let session = connect(&config, &server).await?;
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

async fn connect(config_path: &Path, server: &str) -> Result<Session> {
    let config = Config::load(config_path)?;
    let spec = config.server(server)?;
    let host = Host::new(Host::default_cache_dir())?;
    Ok(host.connect(spec).await?)
}

/// Server-supplied text is untrusted: never write control characters or
/// escape sequences to a terminal.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

//! `moat tools`: one server's identity, tools and pins
//! ([`moat_host::report::tools`]), as a table or JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use moat_host::ToolStatus;
use moat_host::printable;

#[derive(clap::Args)]
pub struct Args {
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
}

pub async fn run(args: Args) -> Result<ExitCode> {
    let report =
        moat_host::report::tools(&args.config, &args.server, args.locked, super::warn).await?;
    if args.json {
        let json = serde_json::to_value(&report)?;
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("server    {}", report.server);
    if let Some(kind) = &report.kind {
        println!("kind      {kind}");
    }
    println!("evidence  {}", report.evidence);
    println!("sha256    {}", report.sha256);
    if let Some(snapshot) = &report.snapshot {
        println!("snapshot  {snapshot} (its initialised state, which runs)");
    }
    if let Some(oci) = &report.oci {
        println!(
            "oci       {} (manifest sha256:{})",
            printable(&oci.reference),
            oci.manifest
        );
    }
    for measured in &report.measured {
        println!(
            "measured  {}  {}",
            measured.sha256,
            printable(&measured.path.display().to_string())
        );
    }
    for line in &report.sandbox {
        println!("sandbox   {}", printable(line));
    }
    for line in &report.not_tools {
        println!("not a tool {}", printable(line));
    }
    println!();
    let tools = &report.tools;
    let width = tools.iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
    match &report.pins {
        None => {
            println!("{:width$}  DESCRIPTION", "TOOL");
            for tool in tools {
                let description = tool
                    .description
                    .as_deref()
                    .map(printable)
                    .unwrap_or_default();
                println!("{:width$}  {description}", printable(&tool.name));
            }
        }
        Some(pins) => {
            let width = pins
                .iter()
                .map(|r| r.name.len())
                .max()
                .unwrap_or(4)
                .max(width);
            println!(
                "{:width$}  {:7}  DESCRIPTION (from moat.lock)",
                "TOOL", "STATUS"
            );
            for pin in pins {
                let detail = match &pin.status {
                    ToolStatus::Pinned { .. } => tools
                        .iter()
                        .find(|t| t.name == pin.name)
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
                    printable(&pin.name),
                    pin.status.word()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

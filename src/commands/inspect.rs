//! `moat inspect`: every server's report ([`moat_host::report::inspect`]),
//! as a table or JSON; fails when a server could not start.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use moat_host::printable;

#[derive(clap::Args)]
pub struct Args {
    /// The config file.
    #[arg(long, short, env = "MOAT_CONFIG", default_value = "moat.toml")]
    config: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: Args) -> Result<ExitCode> {
    let reports = moat_host::report::inspect(&args.config, super::warn).await?;
    if args.json {
        let json = serde_json::to_value(&reports)?;
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        for report in &reports {
            println!("{}", report.server);
            let launched = report.launched.as_ref();
            let lines = [
                ("kind", Some(&report.kind)),
                ("evidence", launched.map(|l| &l.evidence)),
                ("sha256", launched.and_then(|l| l.sha256.as_ref())),
                ("snapshot", launched.and_then(|l| l.snapshot.as_ref())),
                ("sandbox", Some(&report.sandbox)),
                ("error", report.error.as_ref()),
            ];
            for (key, value) in lines {
                if let Some(value) = value {
                    println!("  {key:9} {}", printable(value));
                }
            }
            let lists = [
                ("dirs", Some(&report.dirs)),
                ("net", Some(&report.net)),
                ("env", Some(&report.env)),
                ("rules", launched.map(|l| &l.rules)),
                ("not_tools", launched.and_then(|l| l.not_tools.as_ref())),
            ];
            for (key, values) in lists {
                for value in values.into_iter().flatten() {
                    println!("  {key:9} {}", printable(value));
                }
            }
            let limits: Vec<String> = serde_json::to_value(&report.limits)?
                .as_object()
                .into_iter()
                .flatten()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            println!("  {:9} {}", "limits", limits.join(", "));
            for tool in report.tools.iter().flatten() {
                println!("  tool      {:8} {}", tool.status, printable(&tool.name));
            }
        }
    }
    Ok(if reports.iter().any(|r| r.error.is_some()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

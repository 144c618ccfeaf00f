//! `moat call`: one tool called on a fresh session, its result printed as
//! JSON; a result that is an error fails the command.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use moat_host::printable;
use moat_host::rmcp::model::JsonObject;

#[derive(clap::Args)]
pub struct Args {
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
}

pub async fn run(args: Args) -> Result<ExitCode> {
    let Args {
        config,
        locked,
        server,
        tool,
        arguments,
    } = args;
    let arguments = parse_arguments(arguments.as_deref())?;
    let session = moat_host::setup::connect(&config, &server, locked, super::warn).await?;
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
        eprintln!("moat: error: tool `{tool}` on server `{server}` reported an error: {detail}");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The tool's arguments: a JSON object, or none.
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

//! `moat learn`: a native server run once, watched ([`moat_host::Host::learn`]),
//! and the grants that would let it run under the sandbox printed as
//! moat.toml lines.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use moat_host::Config;
use moat_host::grants::DirMode;
use moat_host::printable;

#[derive(clap::Args)]
pub struct Args {
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
}

/// `moat learn`: asks for consent (unless `--yes`), runs the server once,
/// watched, able to read everything but to write only its private /tmp and
/// the `--write` directories, and prints the grants as TOML: `rw` only where
/// it wrote, writes it wanted and did not do as lines to confirm, and what
/// is never proposed with why.
pub async fn run(args: Args) -> Result<ExitCode> {
    let Args {
        config,
        yes,
        write,
        call,
        server,
    } = args;
    let (config, server) = (config.as_path(), server.as_str());
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
    let host = moat_host::setup::new_host(config)?;
    let learned = host.learn(spec, &write, &calls).await?;
    let (proposal, outcome, called) = (learned.proposal, learned.outcome, learned.calls);
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

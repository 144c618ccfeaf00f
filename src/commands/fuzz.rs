//! `moat fuzz`: argument handling, progress on a terminal, the summary and
//! the reports. The fuzzing itself is `moat_host::fuzz`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use moat_host::fuzz::report::{self, CaseFile};
use moat_host::fuzz::{self as engine, Budget, Event, Options, Runner, Summary};
use moat_host::lock::Lock;
use moat_host::printable;
use moat_host::{Config, ServerSpec};

#[derive(clap::Args)]
pub struct Args {
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

/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

pub async fn run(args: Args) -> Result<ExitCode> {
    let config = Config::load(&args.config)?;
    let case_timeout = parse_duration(&args.case_timeout).context("--case-timeout")?;
    if let Some(path) = &args.replay {
        return replay(&args, &config, path, case_timeout).await;
    }
    let Some(server) = args.server.as_deref() else {
        bail!(
            "name the server to fuzz: `moat fuzz SERVER` (servers in {}: {})",
            args.config.display(),
            names(&config)
        );
    };
    let spec = spec_for(&args.config, &config, server)?;
    let budget = match (args.runs, &args.time) {
        (Some(n), _) => Budget::Runs(n),
        (None, Some(time)) => Budget::Time(parse_duration(time).context("--time")?),
        (None, None) => Budget::Time(Duration::from_secs(60)),
    };
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let options = Options {
        tools: args.tools.clone(),
        budget,
        seed,
        corpus: args
            .corpus
            .clone()
            .unwrap_or_else(|| engine::default_corpus(server)),
        fresh: args.fresh,
        case_timeout: Some(case_timeout),
        shrink_attempts: args.shrink_attempts,
        shrink_time: parse_duration(&args.shrink_time).context("--shrink-time")?,
        jobs: args
            .jobs
            .map(usize::from)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(8))),
    };
    let host = moat_host::setup::new_host(&args.config)?;
    let runner = Runner::start(host, spec, options.fresh, options.case_timeout).await?;
    eprintln!(
        "moat fuzz: server `{server}` ({}), seed {seed}, {budget}, {} job(s), corpus {}",
        engine::launcher_word(runner.spec()),
        options.jobs,
        options.corpus.display()
    );
    let mut log = match &args.log_cases {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => None,
    };
    let mut log_error = None;
    let mut progress = Progress::new(runner.tools().len());
    let summary = engine::fuzz(runner, &options, |event| match event {
        Event::Generated { index, case } => {
            if let Some(log) = &mut log
                && log_error.is_none()
            {
                let line = serde_json::json!({ "index": index, "case": case });
                if let Err(error) = writeln!(log, "{line}") {
                    log_error = Some(error);
                }
            }
        }
        Event::Case {
            case,
            outcome,
            elapsed,
            ..
        } => {
            progress.case(case.subject(), outcome.class.is_finding(), elapsed);
        }
        Event::Finding(finding) => {
            progress.clear();
            eprintln!(
                "moat fuzz: finding after {:.1} s (case {}): {} in {}: {}",
                finding.found_after_ms as f64 / 1000.0,
                finding.case_index,
                finding.class,
                finding.subject,
                printable(&report::excerpt(&finding.detail, 300))
            );
        }
        Event::Shrinking(finding) => {
            progress.clear();
            eprintln!(
                "moat fuzz: shrinking the {} in {}",
                finding.class, finding.subject
            );
        }
    })
    .await?;
    progress.clear();
    if let Some(error) = log_error {
        bail!("writing --log-cases: {error}");
    }
    if let Some(mut log) = log {
        log.flush().context("writing --log-cases")?;
    }
    print_summary(&summary, &args.config);
    for path in &args.reports {
        let text = if path.extension().is_some_and(|e| e == "xml") {
            report::junit(&summary)
        } else {
            report::json(&summary)
        };
        std::fs::write(path, text).with_context(|| format!("writing report {}", path.display()))?;
    }
    Ok(if summary.findings.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `--replay CASE`: one case on a fresh instance.
async fn replay(
    args: &Args,
    config: &Config,
    path: &Path,
    case_timeout: Duration,
) -> Result<ExitCode> {
    let file = CaseFile::read(path)?;
    let server = match args.server.as_deref() {
        Some(server) => server,
        None if !file.server.is_empty() => &file.server,
        None => bail!(
            "{} names no server: `moat fuzz SERVER --replay {}`",
            path.display(),
            path.display()
        ),
    };
    let spec = spec_for(&args.config, config, server)?;
    let host = moat_host::setup::new_host(&args.config)?;
    let mut runner = Runner::start(host, spec, true, Some(case_timeout)).await?;
    let outcome = runner.run_fresh(&file.case).await;
    runner.close().await;
    let case = serde_json::to_string(&file.case)?;
    println!("case    {}", printable(&report::excerpt(&case, 400)));
    println!("saved   {}: {}", file.class, printable(&file.detail));
    println!("now     {}: {}", outcome.class, printable(&outcome.detail));
    if outcome.class.is_finding() {
        println!("verdict still a finding ({})", outcome.class);
        Ok(ExitCode::from(1))
    } else {
        println!("verdict no longer a finding");
        Ok(ExitCode::SUCCESS)
    }
}

/// The server's spec; with no sha256 in the config, the digest moat.lock
/// approved (if any) is required instead. Tool pins are not enforced: the
/// fuzzer sends what they would refuse.
fn spec_for(config_path: &Path, config: &Config, server: &str) -> Result<ServerSpec> {
    let mut spec = config.server(server)?.clone();
    if spec.sha256.is_none()
        && let Some(lock) = Lock::load(&Lock::path_for(config_path))?
        && let Some(locked) = lock.servers.get(server)
        && !locked.sha256.is_empty()
    {
        spec.sha256 = Some(
            locked
                .sha256
                .parse()
                .with_context(|| format!("moat.lock: sha256 of `{server}`"))?,
        );
    }
    Ok(spec)
}

fn names(config: &Config) -> String {
    config
        .servers
        .keys()
        .cloned()
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_summary(summary: &Summary, config: &Path) {
    println!(
        "moat fuzz: server `{}` ({}{}), seed {}: {} cases in {:.1} s ({:.0} cases/s), {} instance(s)",
        summary.server,
        summary.launcher,
        summary
            .sha256
            .as_deref()
            .map(|d| format!(", sha256 {}", &d[..d.len().min(12)]))
            .unwrap_or_default(),
        summary.seed,
        summary.cases,
        summary.fuzz_ms as f64 / 1000.0,
        summary.cases_per_second,
        summary.instances,
    );
    for (subject, tally) in &summary.subjects {
        let outcomes: Vec<String> = tally
            .outcomes
            .iter()
            .map(|(class, n)| format!("{class} {n}"))
            .collect();
        println!(
            "  {:<20} {:>7} cases  {}",
            printable(subject),
            tally.cases,
            outcomes.join(", ")
        );
    }
    if summary.findings.is_empty() {
        println!("no findings");
        return;
    }
    println!("{} finding(s):", summary.findings.len());
    for finding in &summary.findings {
        let case = serde_json::to_string(&finding.case).unwrap_or_default();
        println!(
            "  {} in {} ({} occurrence(s), first after {:.1} s)",
            finding.class,
            printable(&finding.subject),
            finding.occurrences,
            finding.found_after_ms as f64 / 1000.0
        );
        println!(
            "    {}",
            printable(&report::excerpt(
                if finding.shrink.detail.is_empty() {
                    &finding.detail
                } else {
                    &finding.shrink.detail
                },
                300
            ))
        );
        println!(
            "    minimal case: {}",
            printable(&report::excerpt(&case, 300))
        );
        if !finding.shrink.reproduced {
            println!("    (did not fail the same way again on a fresh instance: not shrunk)");
        }
        if let Some(file) = &finding.file {
            println!(
                "    replay: moat fuzz --config {} --replay {}",
                config.display(),
                file.display()
            );
        }
    }
}

/// Parses `90s`, `2m`, `1h`, `500ms`, or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .with_context(|| format!("`{text}` is not a duration (try 60s, 2m, 500ms)"))?;
    let seconds = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => bail!("`{text}`: unknown unit `{other}` (use ms, s, m or h)"),
    };
    Duration::try_from_secs_f64(seconds).with_context(|| format!("`{text}` is not a duration"))
}

/// The progress line, on a terminal only (and never under CI).
struct Progress {
    enabled: bool,
    last: Option<Instant>,
    cases: u64,
    findings: u64,
    covered: std::collections::BTreeSet<String>,
    tools: usize,
}

impl Progress {
    fn new(tools: usize) -> Self {
        Self {
            enabled: std::io::stderr().is_terminal() && std::env::var_os("CI").is_none(),
            last: None,
            cases: 0,
            findings: 0,
            covered: Default::default(),
            tools,
        }
    }

    fn case(&mut self, subject: &str, finding: bool, elapsed: Duration) {
        self.cases += 1;
        self.findings += u64::from(finding);
        if subject != engine::PROTOCOL_SUBJECT && !self.covered.contains(subject) {
            self.covered.insert(subject.to_owned());
        }
        if !self.enabled || self.last.is_some_and(|t| t.elapsed() < PROGRESS_EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        let rate = self.cases as f64 / elapsed.as_secs_f64().max(1e-3);
        eprint!(
            "\r\x1b[Kmoat fuzz: {} cases ({rate:.0}/s), {} failing, tools {}/{} covered, {:.0} s",
            self.cases,
            self.findings,
            self.covered.len(),
            self.tools,
            elapsed.as_secs_f64()
        );
    }

    fn clear(&mut self) {
        if self.enabled && self.last.is_some() {
            eprint!("\r\x1b[K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(
            parse_duration("5 parsecs")
                .unwrap_err()
                .to_string()
                .contains("unknown unit")
        );
        assert!(parse_duration("soon").is_err());
    }
}

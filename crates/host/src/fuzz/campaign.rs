//! The campaign: [`fuzz`] generates cases until the budget is spent,
//! tallies outcomes per subject, keeps the first case of each finding,
//! shrinks each on fresh instances and saves it in the corpus (files and
//! reports are [`super::report`]'s; candidates are [`super::shrink`]'s).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{
    Budget, Case, Event, Finding, FuzzError, Generator, Options, PROTOCOL_SUBJECT, Runner,
    ShrinkStats, Summary, Tally, ToolSchema, launcher_word, report, shrink,
};

/// A fuzz run: generates cases until the budget is spent, records the first
/// case of each (subject, class) finding, then shrinks each on fresh
/// instances and saves it under `corpus/findings/`.
pub async fn fuzz(
    runner: Runner,
    options: &Options,
    mut on_event: impl FnMut(Event<'_>),
) -> Result<Summary, FuzzError> {
    use futures::StreamExt as _;

    let corpus = report::load_corpus(&options.corpus)?;
    let tools = select_tools(&runner, &options.tools)?;
    let mut generator = Generator::new(options.seed, tools, &corpus);
    let mut subjects: BTreeMap<String, Tally> = BTreeMap::new();
    for tool in generator.tools() {
        subjects.insert(tool.name.clone(), Tally::default());
    }
    subjects.insert(PROTOCOL_SUBJECT.to_owned(), Tally::default());
    let mut findings: Vec<Finding> = Vec::new();
    let mut digest = sha2::Sha256::default();
    let started = Instant::now();
    let mut index = 0u64;
    // One runner (one instance at a time) per job; a case waits for a free
    // runner, so a hang holds up one job, not the run.
    let mut idle: Vec<Runner> = (1..options.jobs.max(1)).map(|_| runner.sibling()).collect();
    let mut running = futures::stream::FuturesUnordered::new();
    let mut retired = 0u64;
    idle.push(runner);
    loop {
        while !idle.is_empty() {
            let more = match options.budget {
                Budget::Runs(n) => index < n,
                Budget::Time(limit) => started.elapsed() < limit,
            };
            if !more {
                break;
            }
            let Some(mut worker) = idle.pop() else { break };
            let case = generator.next_case();
            sha2::Digest::update(&mut digest, serde_json::to_vec(&case).unwrap_or_default());
            sha2::Digest::update(&mut digest, b"\n");
            on_event(Event::Generated { index, case: &case });
            let at = index;
            running.push(async move {
                let outcome = worker.run(&case).await;
                (worker, at, case, outcome)
            });
            index += 1;
        }
        let Some((worker, at, case, outcome)) = running.next().await else {
            break;
        };
        idle.push(worker);
        let elapsed = started.elapsed();
        let tally = subjects.entry(case.subject().to_owned()).or_default();
        tally.cases += 1;
        *tally
            .outcomes
            .entry(outcome.class.word().to_owned())
            .or_default() += 1;
        on_event(Event::Case {
            index: at,
            case: &case,
            outcome: &outcome,
            elapsed,
        });
        if outcome.class.is_finding() {
            match findings
                .iter_mut()
                .find(|f| f.class == outcome.class && f.subject == case.subject())
            {
                Some(known) => known.occurrences += 1,
                None => {
                    let finding = Finding {
                        class: outcome.class,
                        subject: case.subject().to_owned(),
                        detail: outcome.detail.clone(),
                        case: case.clone(),
                        original: case.clone(),
                        case_index: at,
                        found_after_ms: millis(elapsed),
                        occurrences: 1,
                        shrink: ShrinkStats::default(),
                        file: None,
                    };
                    on_event(Event::Finding(&finding));
                    findings.push(finding);
                }
            }
        }
    }
    drop(running);
    let mut runner = idle.pop().expect("every runner is back once nothing runs");
    for other in idle {
        retired += other.instances();
        other.close().await;
    }
    let fuzz_time = started.elapsed();
    for finding in &mut findings {
        on_event(Event::Shrinking(finding));
        shrink_finding(&mut runner, finding, options).await;
    }
    let mut findings = merge_shrunk(findings);
    for finding in &mut findings {
        let file = report::save_finding(
            &options.corpus,
            runner.spec(),
            runner.sha256(),
            finding,
            options.seed,
        )?;
        finding.file = Some(file);
    }
    let shrink_time = started.elapsed() - fuzz_time;
    let summary = Summary {
        server: runner.spec.name.clone(),
        launcher: launcher_word(&runner.spec).to_owned(),
        sha256: runner.sha256.clone(),
        seed: options.seed,
        budget: options.budget.to_string(),
        fresh: options.fresh,
        request_timeout_ms: runner.spec.limits.request_timeout_ms,
        cases: index,
        fuzz_ms: millis(fuzz_time),
        shrink_ms: millis(shrink_time),
        cases_per_second: if fuzz_time.is_zero() {
            0.0
        } else {
            index as f64 / fuzz_time.as_secs_f64()
        },
        instances: runner.instances() + retired,
        subjects,
        findings,
        cases_digest: hex::encode(sha2::Digest::finalize(digest)),
    };
    runner.close().await;
    Ok(summary)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn select_tools(runner: &Runner, wanted: &[String]) -> Result<Vec<ToolSchema>, FuzzError> {
    if wanted.is_empty() {
        return Ok(runner.tools().to_vec());
    }
    wanted
        .iter()
        .map(|name| {
            runner
                .tools()
                .iter()
                .find(|t| &t.name == name)
                .cloned()
                .ok_or_else(|| FuzzError::NoSuchTool {
                    server: runner.spec.name.clone(),
                    tool: name.clone(),
                    listed: runner
                        .tools()
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
        })
        .collect()
}

/// A protocol case that shrank to a plain call of one tool is that tool's
/// finding: filed under the tool, and merged into the tool's own finding of
/// the same class when there is one.
fn merge_shrunk(findings: Vec<Finding>) -> Vec<Finding> {
    let mut merged: Vec<Finding> = Vec::new();
    let (tools, protocol): (Vec<Finding>, Vec<Finding>) = findings
        .into_iter()
        .partition(|f| f.subject != PROTOCOL_SUBJECT);
    merged.extend(tools);
    for mut finding in protocol {
        if let Case::Call { tool, .. } = &finding.case {
            finding.subject = tool.clone();
        }
        match merged
            .iter_mut()
            .find(|f| f.subject == finding.subject && f.class == finding.class)
        {
            Some(known) => known.occurrences += finding.occurrences,
            None => merged.push(finding),
        }
    }
    merged.sort_by_key(|f| f.found_after_ms);
    merged
}

/// Reruns the finding on a fresh instance, then greedily keeps the first
/// simpler candidate that fails with the same class, until none does or the
/// budget is spent.
async fn shrink_finding(runner: &mut Runner, finding: &mut Finding, options: &Options) {
    let started = Instant::now();
    let within_budget = |stats: &ShrinkStats| {
        stats.attempts < options.shrink_attempts && started.elapsed() < options.shrink_time
    };
    let mut stats = ShrinkStats::default();
    let first = runner.run_fresh(&finding.original).await;
    stats.attempts += 1;
    stats.reproduced = first.class == finding.class;
    if !stats.reproduced {
        finding.shrink = stats;
        return;
    }
    stats.detail = first.detail;
    let mut current = finding.original.clone();
    'outer: while within_budget(&stats) {
        for candidate in shrink::case_candidates(&current) {
            if !within_budget(&stats) {
                break 'outer;
            }
            stats.attempts += 1;
            let outcome = runner.run_fresh(&candidate).await;
            if outcome.class == finding.class {
                stats.steps += 1;
                stats.detail = outcome.detail;
                current = candidate;
                continue 'outer;
            }
        }
        break;
    }
    finding.case = current;
    finding.shrink = stats;
}

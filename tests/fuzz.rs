//! `moat fuzz`, run as a user's CI would run it, against the `fuzzable`
//! guest: built clean, and built with four planted bugs (see
//! guests/fuzzable/src/lib.rs), each as wasm and natively.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use moat_test_guests as guests;
use serde_json::{Value, json};

/// The fuzzing budget the issue asks for: a minute.
const MINUTE: &str = "60s";

/// Extra arguments per launcher: under wasm, fuel decides that a loop is
/// endless, whatever the load on the machine, so the case deadline is kept
/// well above the time the fuel takes to run out.
fn launcher_args(launcher: Launcher) -> &'static [&'static str] {
    match launcher {
        Launcher::Wasm => &["--case-timeout", "30s"],
        Launcher::Native => &[],
    }
}

fn moat(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(args)
        .current_dir(dir)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env_remove("MOAT_CONFIG")
        .env_remove("RUST_LOG")
        .env("CI", "1")
        .output()
        .expect("running moat")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Launcher {
    Wasm,
    Native,
}

/// A moat.toml with the clean and the planted build for `launcher`.
fn config(dir: &Path, launcher: Launcher) -> PathBuf {
    let entry = |name: &str, guest: guests::Guest, memory: &str| match launcher {
        // A 1 MB malformed request costs rmcp's wasm build more than the
        // default 2e9 fuel (measured: about 0.2 s of wall time), so the
        // budget is raised; the planted endless loop still meets it in about
        // a second.
        Launcher::Wasm => format!(
            "[servers.{name}]\nwasm = {:?}\nallow_unmeasured = true\n[servers.{name}.limits]\nfuel_per_request = 20000000000\n",
            guest.wasm
        ),
        // The planted allocation meets RLIMIT_AS (128 MiB) long before the
        // deadline, even on a loaded machine; a hang is 5 s without an answer.
        // The clean build's memory is bounded by what it uses (RLIMIT_DATA),
        // not by its address space: glibc reserves 64 MiB for each thread's
        // arena, so the clean server (about 5 MB resident) held 275 MB of
        // address space, and twice an instance reused for thousands of
        // cases met RLIMIT_AS (128 MiB once, 512 MiB at case 36,255 of
        // seed 1 once) with a large case that a fresh instance answered.
        Launcher::Native => format!(
            "[servers.{name}]\ncommand = {:?}\nallow_unmeasured = true\n[servers.{name}.limits]\nrequest_timeout_ms = 5000\n{memory}\n",
            guest.native
        ),
    };
    let path = dir.join("moat.toml");
    std::fs::write(
        &path,
        entry("clean", guests::FUZZABLE, "data_bytes = 536870912")
            + &entry(
                "planted",
                guests::FUZZABLE_PLANTED,
                "address_space_bytes = 134217728",
            ),
    )
    .unwrap();
    path
}

fn report(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The finding of `subject` and `class` in a JSON report.
fn finding<'a>(report: &'a Value, subject: &str, class: &str) -> &'a Value {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["subject"] == subject && f["class"] == class)
        .unwrap_or_else(|| panic!("no {class} finding in `{subject}`: {report:#}"))
}

/// `moat fuzz SERVER` for a minute with seed 1, JSON and JUnit reports in
/// `dir`; the output and the JSON report.
fn fuzz_for_a_minute(dir: &Path, server: &str, jobs: &str, launcher: Launcher) -> (Output, Value) {
    let args = [
        "fuzz",
        server,
        "--time",
        MINUTE,
        "--seed",
        "1",
        "--jobs",
        jobs,
        "--report",
        "report.json",
        "--report",
        "report.xml",
    ];
    let output = moat(dir, &[&args[..], launcher_args(launcher)].concat());
    assert!(
        dir.join("report.json").exists(),
        "no report: {}",
        text(&output.stderr)
    );
    let report = report(&dir.join("report.json"));
    (output, report)
}

fn planted_bugs_are_found_shrunk_and_replayed(launcher: Launcher) {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), launcher);
    let (output, report) = fuzz_for_a_minute(dir.path(), "planted", "4", launcher);
    let stdout = text(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(1),
        "findings make the exit status 1\n{stdout}\n{}",
        text(&output.stderr)
    );
    assert_eq!(
        report["launcher"],
        if launcher == Launcher::Wasm {
            "wasm"
        } else {
            "native"
        }
    );

    // Each planted bug: found within the minute, its class and cause named
    // per launcher, shrunk to the minimal input.
    let (loop_class, loop_cause, alloc_cause) = match launcher {
        // Fuel runs out long before the case deadline; the allocation meets
        // the store's memory limit.
        Launcher::Wasm => ("limit", "fuel_per_request", "memory_bytes"),
        // Nothing counts a native loop but the clock; the allocation meets
        // RLIMIT_AS.
        Launcher::Native => ("hang", "request_timeout_ms = 5000", "address_space_bytes"),
    };
    let expected = [
        (
            "echo",
            "panic",
            "bytes do not fit the 4096-byte buffer",
            json!({"text": "a".repeat(4097)}),
        ),
        ("countdown", loop_class, loop_cause, json!({"from": -1})),
        ("flatten", "limit", alloc_cause, json!({"items": [[]]})),
        (
            "classify",
            "output-schema",
            "at `/rank`",
            json!({"size": "large"}),
        ),
    ];
    for (tool, class, cause, minimal) in &expected {
        let found = finding(&report, tool, class);
        assert!(
            found["detail"].as_str().unwrap().contains(cause)
                || found["shrink"]["detail"].as_str().unwrap().contains(cause),
            "{tool}: {found:#}"
        );
        assert!(found["found_after_ms"].as_u64().unwrap() < 60_000);
        assert_eq!(found["shrink"]["reproduced"], true, "{tool}: {found:#}");
        assert_eq!(
            found["case"],
            json!({"kind": "call", "tool": tool, "arguments": minimal}),
            "{tool} shrinks to its minimal input"
        );

        // The saved case replays to the same class; against the clean
        // build it is no finding.
        let file = found["file"].as_str().unwrap();
        let replay = moat(
            dir.path(),
            &[&["fuzz", "--replay", file][..], launcher_args(launcher)].concat(),
        );
        let replayed = text(&replay.stdout);
        assert_eq!(replay.status.code(), Some(1), "{tool}: {replayed}");
        assert!(
            replayed.contains(&format!("now     {class}: ")),
            "{tool}: {replayed}"
        );
        let fixed = moat(dir.path(), &["fuzz", "clean", "--replay", file]);
        assert_eq!(fixed.status.code(), Some(0), "{}", text(&fixed.stdout));
        assert!(text(&fixed.stdout).contains("verdict no longer a finding"));
    }
    // No finding beyond the planted ones, except one whose class depended on
    // the moment (a case that did not fail the same way again on a fresh
    // instance, such as a concurrent case, or an allocation that a loaded
    // machine let the deadline overtake): it is kept, not shrunk.
    for found in report["findings"].as_array().unwrap() {
        let planted = expected
            .iter()
            .any(|(tool, class, ..)| found["subject"] == *tool && found["class"] == *class);
        assert!(
            planted || found["shrink"]["reproduced"] == false,
            "unexpected finding: {found:#}"
        );
    }

    // The case rate is in the report and in the summary.
    assert!(report["cases_per_second"].as_f64().unwrap() > 0.0);
    assert!(stdout.contains("cases/s"), "{stdout}");
    // JUnit for CI systems: a failing test case per tool with a finding.
    let junit = std::fs::read_to_string(dir.path().join("report.xml")).unwrap();
    assert!(junit.starts_with("<?xml"), "{junit}");
    for (tool, class, ..) in &expected {
        let case = junit
            .split("<testcase ")
            .find(|c| c.contains(&format!("name=\"{tool}\"")))
            .unwrap_or_else(|| panic!("no test case for {tool}: {junit}"));
        assert!(
            case.contains(&format!("<failure type=\"{class}\"")),
            "{case}"
        );
    }
}

#[test]
fn planted_bugs_are_found_shrunk_and_replayed_wasm() {
    planted_bugs_are_found_shrunk_and_replayed(Launcher::Wasm);
}

#[test]
fn planted_bugs_are_found_shrunk_and_replayed_native() {
    planted_bugs_are_found_shrunk_and_replayed(Launcher::Native);
}

fn the_clean_build_runs_the_full_time_without_a_finding(launcher: Launcher) {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), launcher);
    let (output, report) = fuzz_for_a_minute(dir.path(), "clean", "2", launcher);
    let stdout = text(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&output.stderr)
    );
    assert!(stdout.contains("no findings"), "{stdout}");
    assert_eq!(report["findings"], json!([]));
    assert!(report["fuzz_ms"].as_u64().unwrap() >= 60_000, "{report:#}");
    // Every tool was fuzzed, with valid and invalid input and protocol cases.
    for subject in ["classify", "countdown", "echo", "flatten", "(protocol)"] {
        let tally = &report["subjects"][subject];
        assert!(tally["cases"].as_u64().unwrap() > 100, "{subject}: {tally}");
        assert!(
            tally["outcomes"]["ok"].as_u64().unwrap_or(0) > 0,
            "{subject}: {tally}"
        );
        assert!(
            tally["outcomes"]["rejected"].as_u64().unwrap_or(0) > 0,
            "{subject}: {tally}"
        );
    }
    let junit = std::fs::read_to_string(dir.path().join("report.xml")).unwrap();
    assert!(
        junit.contains("failures=\"0\"") && !junit.contains("<failure"),
        "{junit}"
    );
}

#[test]
fn the_clean_build_runs_the_full_time_without_a_finding_wasm() {
    the_clean_build_runs_the_full_time_without_a_finding(Launcher::Wasm);
}

#[test]
fn the_clean_build_runs_the_full_time_without_a_finding_native() {
    the_clean_build_runs_the_full_time_without_a_finding(Launcher::Native);
}

#[test]
fn the_same_seed_gives_the_same_cases_in_the_same_order() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), Launcher::Wasm);
    let run = |seed: &str, jobs: &str, log: &str| {
        let output = moat(
            dir.path(),
            &[
                "fuzz",
                "clean",
                "--runs",
                "400",
                "--seed",
                seed,
                "--jobs",
                jobs,
                "--log-cases",
                log,
                "--report",
                &format!("{log}.json"),
            ],
        );
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        let cases = std::fs::read_to_string(dir.path().join(log)).unwrap();
        let report = report(&dir.path().join(format!("{log}.json")));
        (cases, report)
    };
    // Different numbers of jobs finish cases in different orders; the cases
    // are generated in one order all the same.
    let (first, first_report) = run("42", "1", "a.jsonl");
    let (second, second_report) = run("42", "4", "b.jsonl");
    assert_eq!(first.lines().count(), 400);
    assert_eq!(first, second, "the same seed gave other cases");
    assert_eq!(first_report["cases_digest"], second_report["cases_digest"]);
    assert_eq!(first_report["seed"], 42);
    let (other, other_report) = run("43", "1", "c.jsonl");
    assert_ne!(first, other, "another seed gave the same cases");
    assert_ne!(first_report["cases_digest"], other_report["cases_digest"]);
    // Every case is in the log, in order.
    for (i, line) in first.lines().enumerate() {
        let line: Value = serde_json::from_str(line).unwrap();
        assert_eq!(line["index"], i);
    }
}

#[test]
fn bad_requests_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), Launcher::Wasm);
    let output = moat(
        dir.path(),
        &["fuzz", "clean", "--tool", "nope", "--runs", "1"],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains(
            "server `clean` has no tool `nope` (it lists: classify, countdown, echo, flatten)"
        ),
        "{}",
        text(&output.stderr)
    );
    std::fs::write(dir.path().join("junk.json"), "{\"kind\": \"call\"").unwrap();
    let output = moat(dir.path(), &["fuzz", "clean", "--replay", "junk.json"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr)
            .contains("case file junk.json: neither a moat fuzz case file nor a case"),
        "{}",
        text(&output.stderr)
    );
    let output = moat(dir.path(), &["fuzz", "clean", "--time", "5 parsecs"]);
    assert!(
        text(&output.stderr).contains("--time: `5 parsecs`: unknown unit `parsecs`"),
        "{}",
        text(&output.stderr)
    );
    // A bare case names no server: the command says how to give one.
    std::fs::write(
        dir.path().join("bare.json"),
        r#"{"kind": "call", "tool": "echo", "arguments": {"text": "hi"}}"#,
    )
    .unwrap();
    let output = moat(dir.path(), &["fuzz", "--replay", "bare.json"]);
    assert!(
        text(&output.stderr).contains("bare.json names no server"),
        "{}",
        text(&output.stderr)
    );
    let output = moat(dir.path(), &["fuzz", "clean", "--replay", "bare.json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stdout));
    assert!(text(&output.stdout).contains("now     ok"));
}

#[test]
fn cases_reuse_one_instance_unless_each_is_to_have_a_fresh_one() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), Launcher::Native);
    let instances = |extra: &[&str]| {
        let args = [
            "fuzz", "clean", "--runs", "30", "--seed", "5", "--jobs", "1", "--report", "r.json",
        ];
        let output = moat(dir.path(), &[&args[..], extra].concat());
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        report(&dir.path().join("r.json"))["instances"]
            .as_u64()
            .unwrap()
    };
    // The instance that listed the tools serves every case...
    assert_eq!(instances(&[]), 1);
    // ...or each case gets its own, after it.
    assert_eq!(instances(&["--fresh"]), 31);
}

/// `moat fuzz` on a typed tool component: cases come from the schemas
/// derived from its WIT, and the planted bug (an unchecked slice that traps)
/// is found as a crash of that call, and shrunk.
#[test]
fn a_typed_components_planted_bug_is_found_from_its_wit_schemas() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("moat.toml"),
        format!(
            "[servers.kinds]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::KINDS_WASM
        ),
    )
    .unwrap();
    let output = moat(
        dir.path(),
        &[
            "fuzz",
            "kinds",
            "--tool",
            "prefix",
            "--tool",
            "greet",
            "--runs",
            "300",
            "--seed",
            "1",
            "--report",
            "report.json",
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    let report = report(&dir.path().join("report.json"));
    // The guest's panic message is read from its stderr, with the trap
    // beneath it.
    let found = finding(&report, "prefix", "panic");
    let detail = found["shrink"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("panicked at kinds/src/lib.rs")
            && detail.contains("end byte index 1 is out of bounds of ``")
            && detail
                .ends_with("(crash: failed: wasm trap: wasm `unreachable` instruction executed)"),
        "{found:#}"
    );
    assert_eq!(found["shrink"]["reproduced"], true, "{found:#}");
    // Shrunk to the smallest count past the end of the smallest text.
    assert_eq!(
        found["case"],
        json!({"kind": "call", "tool": "prefix", "arguments": {"text": "", "count": 1}})
    );
    // The other tool, which has no bug, has no finding.
    let findings = report["findings"].as_array().unwrap();
    assert!(
        findings.iter().all(|f| f["subject"] == "prefix"),
        "{findings:#?}"
    );
    assert!(report["subjects"]["greet"]["cases"].as_u64().unwrap() > 50);
}

//! The outside view, as an agent sees it: a driver spawns a command, speaks
//! MCP over its stdio (`initialize`, `tools/list`, a first `tools/call`,
//! then 500 sequential calls of `echo`), and reads the peak RSS of the
//! process tree. One run prints, side by side:
//!
//! - `native`: the `everything` guest built natively and spawned directly
//!   (the floor);
//! - `serve → wasm`: `moat serve` in front of the same guest compiled to
//!   wasm32-wasip2, its component already in the cache, without and with a
//!   lock;
//! - `serve → native child`: `moat serve` in front of the native guest;
//! - `serve → native script`: the same, as a `#!` script whose interpreter
//!   is the native guest: what a script server adds at launch (the sealed
//!   copy of the script bound over its path in the server's root);
//! - `serve → typed, per call` and `serve → typed, session`: `moat serve` in
//!   front of the typed tool component `kinds` (calls of `greet`), a fresh
//!   instance per call and one per session, with their call p50 against the
//!   stdio component's;
//! - `…, pooled`: the stdio and per-call typed rows again with
//!   `[wasm] allocator = "pooling"`, the pooling allocator beside the
//!   default on-demand one;
//! - `serve → wasm, no snapshot`: the stdio component with
//!   `preinit = false`, its initialiser (building its routers) run at every
//!   start instead of once into a snapshot (`MOAT_BENCH_BASELINE_PREINIT=1`
//!   when the baseline binary knows `preinit`; else its row has no such
//!   line, as such a binary makes no snapshot);
//! - the compile cache: the first and second start in front of the
//!   JavaScript typed component, with an empty cache.
//!
//! Start is spawn → first call answered, the median of `STARTS` runs; calls
//! are p50 and p99 of `CALLS`; RSS is the sum of VmHWM over the process and
//! its children just before stdin closes. Ratios are against `native`.
//!
//! Over streamable HTTP (`moat serve --http`, driven by rmcp's HTTP client):
//!
//! - throughput: `AGENTS` agent sessions each make `CALLS_PER_AGENT`
//!   calls, all sessions at once, in front of the wasm guest and in front of
//!   the native guest (a child per session), with rmcp's client as it ships
//!   (a new connection for every request) and over a reqwest client that
//!   keeps its connections; each row also says the CPU time a call cost the
//!   gateway (`moat serve` and every process below it) and the agents,
//!   read from `/proc` while the clock ran, which the agents' own share of
//!   the two cores does not move as it moves the rate;
//! - idle sessions: `IDLE_SESSIONS` sessions (or `$MOAT_BENCH_IDLE_SESSIONS`)
//!   each call the wasm guest once and stay open; the bench prints
//!   `moat serve`'s RSS, PSS and memory mappings, and what one more
//!   session costs in each, on demand and pooled. The run stops at the
//!   first session that fails (and says why): each wasm instance holds
//!   several mappings, so the kernel's `vm.max_map_count` bounds the
//!   sessions a process can hold.
//!
//! `MOAT_BENCH_STDIO_ONLY=1` stops after the stdio table and the compile
//! cache (the start figures, without the HTTP runs); `MOAT_BENCH_HTTP_ONLY=1`
//! runs only the HTTP runs. `MOAT_BENCH_CALLS_PER_AGENT=N` makes each
//! throughput agent call `N` times instead of `CALLS_PER_AGENT` (a longer
//! run, for a profiler to attach to or a steadier rate).
//!
//! `MOAT_BENCH_BASELINE=PATH` measures another `moat` binary (an earlier
//! commit's, say) in the same run, each of its rows right before this
//! build's, and prints the two side by side with their ratios.
//! `MOAT_BENCH_BASELINE_GUESTS=DIR` gives the baseline's rows the guests of
//! another guests target dir (laid out as crates/test-guests builds it:
//! `DIR/wasm32-wasip2/dist/everything.wasm`, `DIR/dist/everything`,
//! `kinds.wasm`, or the same under `release`), built with other flags, say; the baseline then has a
//! native floor of its own, measured right before this build's, and its
//! ratios are printed against it. Without `MOAT_BENCH_BASELINE` the
//! baseline is this build's binary, so only the guests differ.
//!
//! `cargo bench --bench serve`; `MOAT_BENCH_MOAT=PATH` runs the same
//! bench against another `moat` binary (the `dist` profile's, say:
//! `cargo build --profile dist -p moat`, then
//! `MOAT_BENCH_MOAT=target/dist/moat cargo bench --bench serve`).
//!
//! The `moat` that `cargo bench` builds has other symbol names than
//! `cargo build --release -p moat` (the dev-dependencies' features are
//! unified into it), so `link/moat.order` does not lay out its hot code
//! (build.rs); the bench says how much of the order each binary defines.
//! The figures users get are those of
//! `MOAT_BENCH_MOAT=target/release/moat` after `cargo build --release -p moat`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use moat_test_guests as guests;
use serde_json::{Value, json};

mod http;
mod rows;
mod stdio;

use http::*;
use rows::*;
use stdio::*;

const STARTS: usize = 15;
const CALLS: usize = 500;
/// Concurrent agent sessions in the throughput run.
const AGENTS: usize = 100;
/// Calls each of them makes: 20,000 in a run, a few seconds, so that the
/// CPU time read from `/proc` (in ticks of 10 ms, a process at a time)
/// counts enough ticks in each of a hundred native children.
const CALLS_PER_AGENT: usize = 200;
/// Sessions held open in the idle-memory run.
const IDLE_SESSIONS: usize = 10_000;

/// The `moat` being measured now: this build's (or `$MOAT_BENCH_MOAT`), or
/// `$MOAT_BENCH_BASELINE` while the baseline's rows are measured.
static BINARY: std::sync::Mutex<Option<std::ffi::OsString>> = std::sync::Mutex::new(None);

/// The `moat` under test: this build's, or `$MOAT_BENCH_MOAT`.
fn under_test() -> std::ffi::OsString {
    std::env::var_os("MOAT_BENCH_MOAT").unwrap_or_else(|| env!("CARGO_BIN_EXE_moat").into())
}

fn moat_binary() -> std::ffi::OsString {
    BINARY.lock().unwrap().clone().unwrap_or_else(under_test)
}

/// Runs `f` with `binary` as the `moat` every command spawns.
fn with_binary<T>(binary: &std::ffi::OsString, f: impl FnOnce() -> T) -> T {
    *BINARY.lock().unwrap() = Some(binary.clone());
    let out = f();
    *BINARY.lock().unwrap() = None;
    out
}

fn moat(config: &Path, cache: &Path, state: &Path) -> Command {
    let mut command = Command::new(moat_binary());
    command
        .args(["serve", "--config"])
        .arg(config)
        .env("MOAT_CACHE_DIR", cache)
        .env("MOAT_STATE_DIR", state)
        .env("RUST_LOG", "error");
    command
}

/// Says how much of `link/moat.order` (the layout of the hot functions,
/// build.rs) `binary` defines. The names are those of
/// `cargo build --release -p moat`; the `moat` that `cargo bench` builds has
/// other names (it unifies the dev-dependencies' features), so its hot code
/// lies scattered as without the order.
fn link_order(binary: &std::ffi::OsStr) {
    let order = concat!(env!("CARGO_MANIFEST_DIR"), "/link/moat.order");
    let Ok(order) = std::fs::read_to_string(order) else {
        return;
    };
    let Ok(nm) = Command::new("nm")
        .arg("--defined-only")
        .arg(binary)
        .output()
    else {
        println!("  (nm not found: the share of link/moat.order this binary defines is not known)");
        return;
    };
    let nm = String::from_utf8_lossy(&nm.stdout);
    let defined: std::collections::HashSet<&str> = nm
        .lines()
        .filter_map(|line| line.split(' ').nth(2))
        .collect();
    let wanted: Vec<&str> = order
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect();
    let found = wanted.iter().filter(|name| defined.contains(*name)).count();
    let share = 100.0 * found as f64 / wanted.len().max(1) as f64;
    println!(
        "  defines {found} of the {} hot functions of link/moat.order ({share:.1}%)",
        wanted.len()
    );
    if share < 90.0 {
        println!(
            "  (its hot code is laid out as without the order: for the layout users get, \
             `cargo build --release -p moat` and MOAT_BENCH_MOAT=target/release/moat)"
        );
    }
}

/// The stdio table: each row's start, call and peak RSS, and its ratios to
/// the first row (the native floor).
fn print_table(title: &str, rows: &[Row]) {
    let floor = &rows[0];
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "\n{:<26} {:>22} {:>26} {:>18}",
        title, "spawn → first call", "call p50 / p99", "peak RSS"
    );
    for row in rows {
        println!(
            "{:<26} {:>12.2} ms {:>6.2}× {:>8.0} / {:>5.0} µs {:>5.2}× {:>8.1} MB {:>5.2}×",
            row.name,
            row.start.as_secs_f64() * 1e3,
            ratio(row.start, floor.start),
            row.p50.as_secs_f64() * 1e6,
            row.p99.as_secs_f64() * 1e6,
            ratio(row.p50, floor.p50),
            row.rss as f64 / 1e6,
            row.rss as f64 / floor.rss as f64,
        );
    }
    println!(
        "(start: median of {STARTS} runs; calls: {CALLS} sequential `echo`, or `greet` for typed; RSS: VmHWM of the process tree)"
    );
}

fn write_config(dir: &Path, name: &str, body: &str) -> PathBuf {
    let sub = dir.join(name);
    std::fs::create_dir_all(&sub).unwrap();
    let path = sub.join("moat.toml");
    std::fs::write(&path, body).unwrap();
    path
}

/// Whether the environment variable `name` is set to anything but `0`.
fn flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v != "0")
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is ignored here.
    let current = under_test();
    let current_guests = Guests::built();
    let baseline_guests = std::env::var_os("MOAT_BENCH_BASELINE_GUESTS")
        .map(|dir| Guests::in_dir(Path::new(&dir)))
        .filter(|guests| *guests != current_guests);
    let baseline = std::env::var_os("MOAT_BENCH_BASELINE")
        .or_else(|| baseline_guests.as_ref().map(|_| current.clone()));
    println!("moat under test: {}", current.to_string_lossy());
    link_order(&current);
    if let Some(baseline) = &baseline {
        println!("baseline: {}", baseline.to_string_lossy());
        link_order(baseline);
    }
    if let Some(guests) = &baseline_guests {
        println!(
            "baseline's guests: {} and {}",
            guests.everything_wasm, guests.everything_native
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let configs = with_binary(&current, || {
        prepare(&dir.path().join("current"), true, &current_guests)
    });
    // Set when the baseline knows `preinit` (it is newer than snapshots).
    let baseline_preinit = std::env::var_os("MOAT_BENCH_BASELINE_PREINIT").is_some()
        || std::env::var_os("MOAT_BENCH_BASELINE").is_none();
    let before = baseline.as_ref().map(|b| {
        (
            b,
            with_binary(b, || {
                prepare(
                    &dir.path().join("baseline"),
                    baseline_preinit,
                    baseline_guests.as_ref().unwrap_or(&current_guests),
                )
            }),
        )
    });

    if !flag("MOAT_BENCH_HTTP_ONLY") {
        // The baseline's own floor, when its guests are others: right before
        // this build's.
        let base_floor = baseline_guests.as_ref().map(|guests| {
            measure("native", "echo", &|| {
                Command::new(&guests.everything_native)
            })
        });
        let floor = measure("native", "echo", &|| {
            Command::new(&current_guests.everything_native)
        });
        let mut rows = vec![floor];
        // With a baseline, each row is measured with it right before this
        // build.
        let mut runs: Vec<(&std::ffi::OsString, &Configs)> = Vec::new();
        if let Some((binary, configs)) = &before {
            runs.push((binary, configs));
        }
        runs.push((&current, &configs));
        let mut measured = serve_rows(&runs);
        rows.extend(measured.pop().unwrap());
        let base_rows = measured.pop();
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
        // With guests of its own, the baseline's rows against its own floor.
        let base_rows = match (base_floor, base_rows) {
            (Some(base_floor), Some(base_rows)) => {
                let base_rows: Vec<Row> = std::iter::once(base_floor).chain(base_rows).collect();
                print_table("baseline, its guests", &base_rows);
                Some(base_rows)
            }
            (_, base_rows) => base_rows,
        };
        print_table("outside driver", &rows);
        let stdio = &rows[1];
        for typed in [&rows[5], &rows[6], &rows[8]] {
            println!(
                "{}: call p50 {:.2}× the stdio component's (target ≤ 2×)",
                typed.name,
                ratio(typed.p50, stdio.p50)
            );
        }
        let fresh = &rows[9];
        println!(
            "{}: start {:.2}× the snapshot's ({}), call p50 {:.2}×",
            fresh.name,
            ratio(fresh.start, stdio.start),
            stdio.name,
            ratio(fresh.p50, stdio.p50)
        );
        if let Some(base_rows) = &base_rows {
            println!(
                "\n{:<26} {:>30} {:>30} {:>24}",
                "baseline → this build", "spawn → first call", "call p50", "peak RSS"
            );
            // The floors too, when the baseline has one of its own.
            let after_rows = if base_rows.len() == rows.len() {
                &rows[..]
            } else {
                &rows[1..]
            };
            for (before, after) in base_rows.iter().zip(after_rows) {
                println!(
                    "{:<26} {:>8.2} → {:>7.2} ms {:>5.2}× {:>8.0} → {:>7.0} µs {:>5.2}× {:>6.1} → {:>5.1} MB {:>5.2}×",
                    after.name,
                    before.start.as_secs_f64() * 1e3,
                    after.start.as_secs_f64() * 1e3,
                    ratio(after.start, before.start),
                    before.p50.as_secs_f64() * 1e6,
                    after.p50.as_secs_f64() * 1e6,
                    ratio(after.p50, before.p50),
                    before.rss as f64 / 1e6,
                    after.rss as f64 / 1e6,
                    after.rss as f64 / before.rss as f64,
                );
            }
            println!("(ratios are this build over the baseline: below 1 is better)");
        }
        with_binary(&current, || {
            compile_cache(&dir.path().join("cold-cache"), &configs.state, &digest)
        });
    }
    if flag("MOAT_BENCH_STDIO_ONLY") {
        return;
    }

    // Over streamable HTTP.
    raise_open_files();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let idle: usize = std::env::var("MOAT_BENCH_IDLE_SESSIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(IDLE_SESSIONS);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runs = Vec::new();
    if let Some((binary, configs)) = &before {
        runs.push(("baseline", *binary, configs));
    }
    runs.push(("this build", &current, &configs));
    for (label, binary, configs) in runs {
        with_binary(binary, || http_runs(label, configs, &runtime, idle));
    }
}

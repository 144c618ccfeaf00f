//! How failures reach the user: non-zero exits with one-line errors, a report
//! into a closed pipe, a server that exits before reading, and an exit fault
//! carrying the whole stderr tail.

use super::*;

#[test]
fn failures_exit_non_zero_with_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    let wrong = "0".repeat(64);
    std::fs::write(
        &config,
        format!(
            "[servers.pinned]\nwasm = {:?}\nsha256 = \"{wrong}\"\n[servers.open]\nwasm = {:?}\n[servers.ok]\nwasm = {:?}\nallow_unmeasured = true\n[servers.spin]\nwasm = {:?}\nallow_unmeasured = true\nlimits = {{ fuel_per_request = 100000000 }}\n",
            guests::EVERYTHING_WASM,
            guests::EVERYTHING_WASM,
            guests::EVERYTHING_WASM,
            guests::SPIN_WASM,
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["call", "--config", config, "pinned", "add", "{}"],
            "digest mismatch: pinned sha256 0000",
        ),
        (
            &["call", "--config", config, "open", "add", "{}"],
            "has no sha256 pinned",
        ),
        (
            &["call", "--config", config, "nope", "add", "{}"],
            "no server named `nope` (configured: ok, open, pinned, spin)",
        ),
        (
            &["call", "--config", config, "spin", "attack"],
            "tools/call `attack` on server `spin` failed: server `spin` hit its CPU limit: fuel_per_request = 100000000 used up",
        ),
        (
            &["call", "--config", config, "ok", "add", "[1]"],
            "must be a JSON object, found an array",
        ),
        (
            &["call", "--config", config, "ok", "add", "{"],
            "not valid JSON",
        ),
        (
            &[
                "call",
                "--config",
                config,
                "ok",
                "fail",
                r#"{"message":"boom"}"#,
            ],
            "reported an error: boom",
        ),
        (
            &["call", "--config", "/nonexistent/moat.toml", "ok", "add"],
            "reading config /nonexistent/moat.toml",
        ),
    ];
    for (args, expected) in cases {
        let output = moat(args);
        assert!(!output.status.success(), "{args:?} succeeded");
        let err = stderr(&output);
        let last = err.lines().last().unwrap_or_default();
        assert!(last.starts_with("moat: error: "), "{args:?}: {err}");
        assert!(
            last.contains(expected),
            "{args:?}: expected {expected:?} in {last:?}"
        );
    }
    let bad_toml = dir.path().join("bad.toml");
    std::fs::write(&bad_toml, "[servers.a]\nwasm = \"a.wasm\"\nfuel = 1\n").unwrap();
    let output = moat(&["tools", "--config", bad_toml.to_str().unwrap(), "a"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("bad.toml:3:1: unknown field `fuel`"),
        "{}",
        stderr(&output)
    );
}

#[cfg(unix)]
#[test]
fn a_report_into_a_closed_pipe_ends_quietly_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader); // like `moat tools ... | head -0`
    let output = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["tools", "--config", "examples/moat.toml", "everything"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env_remove("RUST_LOG")
        .stdout(writer)
        .output()
        .expect("running moat");
    assert_eq!(output.status.signal(), Some(libc::SIGPIPE), "{output:?}");
    assert!(!stderr(&output).contains("panicked"), "{}", stderr(&output));
}

/// A config holding one native server run as `command args...`, unmeasured.
fn native_config(dir: &Path, command: &str, args: &[&str]) -> std::path::PathBuf {
    let config = dir.join("moat.toml");
    let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    std::fs::write(
        &config,
        format!(
            "[servers.s]\ncommand = {command:?}\nargs = [{}]\nallow_unmeasured = true\n",
            args.join(", ")
        ),
    )
    .unwrap();
    config
}

/// A server that exits before reading its stdin is an error Moat reports,
/// never a SIGPIPE that kills it silently (status 141). The race is the
/// server's: ten runs give it every chance.
#[test]
fn a_server_that_exits_before_reading_is_reported_not_a_sigpipe() {
    let dir = tempfile::tempdir().unwrap();
    let config = native_config(dir.path(), "true", &[]);
    for _ in 0..10 {
        let output = moat(&["call", "--config", config.to_str().unwrap(), "s", "x"]);
        assert_eq!(
            output.status.code(),
            Some(1),
            "moat ended with {:?}: {}",
            output.status,
            stderr(&output)
        );
        assert!(
            stderr(&output).contains("server `s`"),
            "{}",
            stderr(&output)
        );
    }
}

/// The fault of a server that writes to stderr and exits carries that
/// stderr: the fault waits for the stderr reader.
#[test]
fn an_exit_fault_carries_the_whole_stderr_tail() {
    let dir = tempfile::tempdir().unwrap();
    let config = native_config(
        dir.path(),
        "sh",
        &["-c", "echo the-last-words-of-the-server >&2; exit 3"],
    );
    for _ in 0..10 {
        let output = moat(&["call", "--config", config.to_str().unwrap(), "s", "x"]);
        let text = stderr(&output);
        assert!(
            text.contains("exited with code 3") && text.contains("the-last-words-of-the-server"),
            "{text}"
        );
    }
}

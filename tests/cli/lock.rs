//! `moat lock` and `moat revoke`: a byte-identical lock that `tools`
//! enforces, revocations, a lock that holds whichever way the config is
//! named, and every server measured with each failure reported at the end.

use super::*;

#[test]
fn lock_writes_a_byte_identical_lock_and_tools_enforce_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.everything]\nwasm = {:?}\nallow_unmeasured = true\nenv = {{ EVERYTHING_DRIFT = \"0\" }}\n[servers.shady]\ncommand = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM,
            guests::SHADY_METADATA_NATIVE,
        ),
    )
    .unwrap();
    let config_arg = config.to_str().unwrap();
    let lock_path = dir.path().join("moat.lock");

    // --locked refuses to run without a lock.
    let output = moat(&["tools", "--locked", "--config", config_arg, "everything"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("does not exist; run `moat lock`"),
        "{}",
        stderr(&output)
    );

    let output = moat(&["lock", "--config", config_arg]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let first = std::fs::read(&lock_path).unwrap();
    let text = stdout(&output);
    assert!(text.contains("created"), "{text}");
    assert!(
        text.contains("warning: shady: tool `attack` has untrusted metadata: ansi-escape, bidi-controls, instruction-tags, names-other-server:everything, override-phrases, sensitive-paths, zero-width-characters"),
        "{text}"
    );
    assert!(
        !output.stdout.contains(&0x1b),
        "raw escape written to the terminal"
    );

    let output = moat(&["lock", "--config", config_arg]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    assert!(stdout(&output).contains("unchanged"), "{}", stdout(&output));
    assert_eq!(
        std::fs::read(&lock_path).unwrap(),
        first,
        "moat.lock is byte-identical"
    );

    let output = moat(&["tools", "--locked", "--config", config_arg, "everything"]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    assert!(
        stdout(&output)
            .lines()
            .any(|l| l.starts_with("echo ") && l.contains(" pinned ")),
        "{}",
        stdout(&output)
    );
    let output = moat(&["tools", "--config", config_arg, "shady"]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    assert!(
        !output.stdout.contains(&0x1b),
        "raw escape written to the terminal"
    );
    assert!(
        stdout(&output).contains("\\u{1b}[8m"),
        "{}",
        stdout(&output)
    );
    // The description's newlines are shown, not obeyed: no forged line.
    assert!(
        !stdout(&output).lines().any(|l| l.starts_with("fake")),
        "{}",
        stdout(&output)
    );
    assert!(
        stdout(&output).contains("safe\\u{a}fake"),
        "{}",
        stdout(&output)
    );

    // Drift the `echo` tool: `moat tools` reports it, `moat call` refuses it.
    let drifted = std::fs::read_to_string(&config)
        .unwrap()
        .replace("\"0\"", "\"1\"");
    std::fs::write(&config, drifted).unwrap();
    let output = moat(&["tools", "--config", config_arg, "everything"]);
    let text = stdout(&output);
    let echo = text
        .lines()
        .find(|l| l.starts_with("echo "))
        .unwrap_or_default();
    assert!(
        echo.contains(" drifted ") && echo.contains("unavailable: locked "),
        "{text}"
    );
    let output = moat(&[
        "call",
        "--config",
        config_arg,
        "everything",
        "echo",
        r#"{"message":"x"}"#,
    ]);
    assert!(!output.status.success());
    assert!(
        stderr(&output)
            .contains("tool `echo` on server `everything` is unavailable: its definition drifted"),
        "{}",
        stderr(&output)
    );
}

/// The kill switch at the command line: `moat revoke` records a digest or a
/// server in moat.lock, each launch of it is refused with who revoked it and
/// why, the other servers run on, and `moat lock` keeps the revocations
/// without starting what they revoke.
#[test]
fn revoke_refuses_launches_of_what_it_names_and_lock_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.wasm]\nwasm = {:?}\nallow_unmeasured = true\n[servers.native]\ncommand = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM,
            guests::EVERYTHING_NATIVE,
        ),
    )
    .unwrap();
    let config_arg = config.to_str().unwrap();
    let lock_path = dir.path().join("moat.lock");

    let output = moat(&["revoke", "--config", config_arg, "wasm"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("revocations are kept in the lock; run `moat lock` first"),
        "{}",
        stderr(&output)
    );
    let output = moat(&["lock", "--config", config_arg]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));

    let digest = moat_host::Digest::of(&std::fs::read(guests::EVERYTHING_WASM).unwrap());
    let target = format!("sha256:{digest}");
    let output = moat(&[
        "revoke",
        "--config",
        config_arg,
        "--reason",
        "CVE-2026-0001",
        &target,
    ]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    assert!(
        stdout(&output).contains(&format!("`{target}` was revoked by ")),
        "{}",
        stdout(&output)
    );
    let output = moat(&["tools", "--config", config_arg, "wasm"]);
    assert!(!output.status.success(), "a revoked digest ran");
    let error = stderr(&output);
    assert!(
        error.contains(&format!(
            "server `wasm` is refused: `{target}` was revoked by "
        )) && error.contains(": CVE-2026-0001"),
        "{error}"
    );
    let output = moat(&["tools", "--config", config_arg, "native"]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));

    let output = moat(&["revoke", "--config", config_arg, &target]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    assert!(
        stdout(&output).starts_with("already revoked: "),
        "{}",
        stdout(&output)
    );

    let output = moat(&["revoke", "--config", config_arg, "native"]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let output = moat(&["lock", "--config", config_arg]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    assert!(
        stderr(&output).contains("moat: not measuring `native`: `native` was revoked by "),
        "{}",
        stderr(&output)
    );
    let lock = moat_host::lock::Lock::load(&lock_path).unwrap().unwrap();
    let targets: Vec<&str> = lock.revoked.iter().map(|r| r.target.as_str()).collect();
    assert_eq!(targets, [target.as_str(), "native"], "kept, in order");
    assert!(
        lock.servers.contains_key("native"),
        "its entry stays as it was"
    );
    let output = moat(&["call", "--config", config_arg, "native", "calls"]);
    assert!(!output.status.success(), "a revoked server ran");
    assert!(
        stderr(&output).contains("server `native` is refused: `native` was revoked by "),
        "{}",
        stderr(&output)
    );

    for (bad, expected) in [
        ("a b", "`a b` is not SERVER, SERVER__TOOL or sha256:DIGEST"),
        ("nope", "no server `nope` in"),
        (
            "sha256:12",
            "a sha256 digest is 64 hex digits, found 2 characters",
        ),
    ] {
        let output = moat(&["revoke", "--config", config_arg, bad]);
        assert!(!output.status.success(), "{bad}");
        assert!(
            stderr(&output).contains(expected),
            "{bad}: {}",
            stderr(&output)
        );
    }
}

/// Issue 33: the lock does not depend on how `--config` is spelled. A lock
/// made with a relative `--config` is the lock of the same file named by an
/// absolute path or through a symbolic link to its directory: the server's
/// working directory (which enters its identity) is canonical.
#[test]
fn a_lock_holds_whichever_way_the_config_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
    std::fs::write(
        real.join("moat.toml"),
        format!(
            "[servers.everything]\ncommand = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_NATIVE
        ),
    )
    .unwrap();
    let run = |cwd: &Path, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_moat"))
            .args(args)
            .current_dir(cwd)
            .env(
                "MOAT_CACHE_DIR",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
            )
            .env_remove("MOAT_CONFIG")
            .env_remove("RUST_LOG")
            .output()
            .expect("running moat")
    };
    let output = run(&real, &["lock", "--config", "moat.toml"]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    assert!(stdout(&output).contains("created"), "{}", stdout(&output));
    let lock = std::fs::read(real.join("moat.lock")).unwrap();
    let absolute = real.join("moat.toml");
    let through_link = dir.path().join("link/moat.toml");
    for (cwd, config) in [
        (dir.path(), absolute.to_str().unwrap()),
        (dir.path(), through_link.to_str().unwrap()),
        (dir.path(), "link/./moat.toml"),
        (real.as_path(), "./moat.toml"),
    ] {
        let output = run(
            cwd,
            &["tools", "--locked", "--config", config, "everything"],
        );
        assert!(
            output.status.success(),
            "--config {config}: stderr: {}",
            stderr(&output)
        );
        let output = run(cwd, &["lock", "--config", config]);
        assert!(output.status.success(), "stderr: {}", stderr(&output));
        assert!(
            stdout(&output).contains("unchanged"),
            "--config {config}: {}",
            stdout(&output)
        );
        assert_eq!(std::fs::read(real.join("moat.lock")).unwrap(), lock);
    }
}

/// Issue 33 (8): `moat lock` measures every server and reports every
/// failure at the end, instead of stopping at the first; what it could
/// measure is locked.
#[test]
fn lock_measures_every_server_and_reports_each_failure_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.a-broken]\ncommand = \"/bin/sh\"\nargs = [\"-c\", \"echo first >&2; exit 3\"]\nallow_unmeasured = true\n\
             [servers.b-good]\ncommand = {:?}\nallow_unmeasured = true\n\
             [servers.c-broken]\ncommand = \"/bin/sh\"\nargs = [\"-c\", \"echo second >&2; exit 4\"]\nallow_unmeasured = true\n",
            guests::EVERYTHING_NATIVE,
        ),
    )
    .unwrap();
    let output = moat(&["lock", "--config", config.to_str().unwrap()]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(
        err.contains("moat: error: 2 of 3 servers could not be measured"),
        "{err}"
    );
    let a = err
        .lines()
        .find(|l| l.starts_with("  a-broken: "))
        .unwrap_or_default();
    let c = err
        .lines()
        .find(|l| l.starts_with("  c-broken: "))
        .unwrap_or_default();
    assert!(a.contains("first"), "{err}");
    assert!(c.contains("second"), "{err}");
    let lock = std::fs::read_to_string(dir.path().join("moat.lock")).unwrap();
    assert!(lock.contains("[servers.b-good]"), "{lock}");
    assert!(!lock.contains("broken"), "{lock}");
}

/// `moat lock` measures servers at the same time: each of these two opens
/// one end of a FIFO before it starts, which blocks until the other opens
/// the other end. Measured one after the other, the first never starts
/// (its handshake passes `request_timeout_ms`) and the lock is incomplete.
#[cfg(unix)]
#[test]
fn lock_measures_servers_at_the_same_time_and_reports_in_config_order() {
    let dir = tempfile::tempdir().unwrap();
    let meet = dir.path().join("meet");
    std::fs::create_dir(&meet).unwrap();
    let fifo = meet.join("fifo");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let server = |name: &str, open: &str| {
        format!(
            "[servers.{name}]\ncommand = \"/bin/sh\"\nargs = [\"-c\", \"exec 3{open}{fifo}; exec 3>&-; exec {native}\"]\nallow_unmeasured = true\n\
             [[servers.{name}.dirs]]\nhost = \"{meet}\"\nmode = \"rw\"\n\
             [[servers.{name}.dirs]]\nhost = \"{bin}\"\nmode = \"ro\"\n\
             [servers.{name}.limits]\nrequest_timeout_ms = 10000\n",
            fifo = fifo.display(),
            native = guests::EVERYTHING_NATIVE,
            meet = meet.display(),
            bin = Path::new(guests::EVERYTHING_NATIVE)
                .parent()
                .unwrap()
                .display(),
        )
    };
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!("{}{}", server("a-writer", ">"), server("b-reader", "<")),
    )
    .unwrap();
    let output = moat(&["lock", "--config", config.to_str().unwrap()]);
    let err = stderr(&output);
    assert!(output.status.success(), "{err}");
    let out = stdout(&output);
    let a = out.find("a-writer: ").expect(&out);
    let b = out.find("b-reader: ").expect(&out);
    assert!(a < b, "{out}");
    let lock = std::fs::read_to_string(dir.path().join("moat.lock")).unwrap();
    assert!(
        lock.contains("[servers.a-writer]") && lock.contains("[servers.b-reader]"),
        "{lock}"
    );
}

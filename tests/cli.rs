//! The `moat` command line, run as a user would run it.

use std::path::Path;
use std::process::{Command, Output};

use moat_test_guests as guests;

fn moat(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env_remove("MOAT_CONFIG")
        .env_remove("RUST_LOG")
        .output()
        .expect("running moat")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_example_config_serves_the_bundled_guest() {
    // The example points at the guest the build script produced.
    let config = moat_host::Config::load(Path::new("examples/moat.toml")).unwrap();
    let moat_host::ServerKind::Wasm {
        source: moat_host::config::WasmSource::File(path),
        ..
    } = &config.server("everything").unwrap().kind
    else {
        panic!("the example's server is a wasm component");
    };
    assert_eq!(
        path.canonicalize().unwrap(),
        Path::new(guests::EVERYTHING_WASM).canonicalize().unwrap()
    );

    let output = moat(&[
        "call",
        "--config",
        "examples/moat.toml",
        "everything",
        "add",
        r#"{"a":2,"b":40}"#,
    ]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let result: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(result["content"][0]["text"], "42");
}

#[test]
fn tools_lists_tools_with_evidence_and_digest() {
    let output = moat(&["tools", "--config", "examples/moat.toml", "everything"]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    let digest = moat_host::Digest::of(&std::fs::read(guests::EVERYTHING_WASM).unwrap());
    assert!(text.contains("evidence  wasm-measured"), "{text}");
    assert!(text.contains(&format!("sha256    {digest}")), "{text}");
    for tool in [
        "echo", "add", "sleep", "fail", "blob", "progress", "calls", "shape",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{tool} "))),
            "{tool} missing from:\n{text}"
        );
    }
    let json = moat(&[
        "tools",
        "--json",
        "--config",
        "examples/moat.toml",
        "everything",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["evidence"], "wasm-measured");
    assert_eq!(report["tools"].as_array().unwrap().len(), 9);
}

#[test]
fn digest_prints_the_sha256_to_pin() {
    let output = moat(&["digest", guests::EVERYTHING_WASM]);
    assert!(output.status.success());
    let expected = moat_host::Digest::of(&std::fs::read(guests::EVERYTHING_WASM).unwrap());
    assert_eq!(stdout(&output).trim(), expected.to_string());
}

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

#[test]
fn tools_and_call_work_unchanged_for_a_native_server() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    let digest = moat_host::Digest::of(&std::fs::read(guests::EVERYTHING_NATIVE).unwrap());
    std::fs::write(
        &config,
        format!(
            "[servers.native]\ncommand = {:?}\nsha256 = \"{digest}\"\n[servers.native.limits]\ncpu_seconds = 10\n",
            guests::EVERYTHING_NATIVE
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let output = moat(&["tools", "--config", config, "native"]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("evidence  native-measured"), "{text}");
    assert!(text.contains(&format!("sha256    {digest}")), "{text}");
    let output = moat(&[
        "call",
        "--config",
        config,
        "native",
        "add",
        r#"{"a":2,"b":40}"#,
    ]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let result: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(result["content"][0]["text"], "42");
}

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

#[test]
fn inspect_reports_every_server_and_import_converts_client_configs() {
    let output = moat(&["inspect", "--json", "--config", "examples/moat.toml"]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let reports: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let servers: Vec<&str> = reports
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["server"].as_str().unwrap())
        .collect();
    assert_eq!(servers, ["everything", "everything-native"]);
    assert_eq!(reports[0]["evidence"], "wasm-measured");
    assert_eq!(reports[1]["evidence"], "native-unmeasured");
    assert_eq!(reports[1]["limits"]["cpu_seconds"], 60);
    assert!(reports[1]["rules"].as_array().unwrap().len() >= 2);
    assert_eq!(reports[0]["tools"].as_array().unwrap().len(), 9);

    let dir = tempfile::tempdir().unwrap();
    let claude = dir.path().join("claude_desktop_config.json");
    std::fs::write(
        &claude,
        format!(
            r#"{{"mcpServers": {{"everything": {{"command": {:?}}}, "far": {{"url": "https://example.invalid/mcp"}}}}}}"#,
            guests::EVERYTHING_NATIVE
        ),
    )
    .unwrap();
    let output = moat(&["import", claude.to_str().unwrap()]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    assert!(stderr(&output).contains("`far`: a remote server at https://example.invalid/mcp"));
    let config = dir.path().join("moat.toml");
    std::fs::write(&config, &output.stdout).unwrap();
    let digest = moat_host::Digest::of(&std::fs::read(guests::EVERYTHING_NATIVE).unwrap());
    assert!(stdout(&output).contains(&format!("sha256 = \"{digest}\"")));
    // The imported, pinned entry runs as it is.
    let output = moat(&[
        "call",
        "--config",
        config.to_str().unwrap(),
        "everything",
        "add",
        r#"{"a":2,"b":40}"#,
    ]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
}

/// Issue 12, item 6: what a client config holds reaches neither the printed
/// TOML nor the terminal raw. A command path with newlines cannot add lines
/// to the TOML through its comment, and names and URLs with escape
/// sequences are shown escaped.
#[cfg(unix)]
#[test]
fn import_escapes_what_the_client_config_holds() {
    let dir = tempfile::tempdir().unwrap();
    let sneaky = dir.path().join("bin\n[servers.evil]\ncommand = \"sh\"\n#");
    std::fs::create_dir(&sneaky).unwrap();
    let server = sneaky.join("server");
    std::fs::copy(guests::EVERYTHING_NATIVE, &server).unwrap();
    let claude = dir.path().join("claude.json");
    let config = serde_json::json!({"mcpServers": {
        "good": {"command": server},
        "red\u{1b}[31mname": {"command": server},
        "far": {"url": "https://example.invalid/\u{1b}]0;owned\u{7}"}
    }});
    std::fs::write(&claude, config.to_string()).unwrap();
    let output = moat(&["import", claude.to_str().unwrap()]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    let parsed: toml::Table = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let servers = parsed["servers"].as_table().unwrap();
    let mut names: Vec<&String> = servers.keys().collect();
    names.sort();
    assert_eq!(names, ["good", "red--31mname"], "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("[servers.evil]")),
        "{text}"
    );
    assert!(text.contains("bin\\u{a}[servers.evil]"), "{text}");
    assert!(!output.stdout.contains(&0x1b), "raw escape on stdout");
    assert!(!output.stderr.contains(&0x1b), "raw escape on stderr");
    assert!(!output.stderr.contains(&0x07), "raw bell on stderr");
    assert!(
        stderr(&output).contains("`red\\u{1b}[31mname`: renamed to `red--31mname`"),
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

/// Issue 33: a tool name that cannot be exposed is left out with a warning
/// naming it, and the gateway starts (here it then meets EOF on stdin
/// before any agent; `serve.rs` serves the rest to an agent).
#[test]
fn serve_leaves_out_a_tool_name_it_cannot_expose() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.ok]\nwasm = {:?}\nallow_unmeasured = true\n[servers.shady]\nwasm = {:?}\nallow_unmeasured = true\nenv = {{ HOSTILE_TOOL_NAME = \"read file\" }}\n",
            guests::EVERYTHING_WASM,
            guests::SHADY_METADATA_WASM,
        ),
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["serve", "--config", config.to_str().unwrap()])
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("running moat serve");
    assert!(
        stderr(&output).contains("moat: error: starting the MCP session on stdio"),
        "it started serving: {}",
        stderr(&output)
    );
    assert!(
        stderr(&output).contains(
            "server `shady`, tool `read file`: the exposed name `shady__read file` does not match ^[a-zA-Z0-9_-]{1,64}$, so it is left out"
        ),
        "{}",
        stderr(&output)
    );
    // Issue 33 (11): no colour codes when stderr is not a terminal.
    assert!(!output.stderr.contains(&0x1b), "{}", stderr(&output));
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

/// `moat inspect` prints the sandbox mode as configured and every limit.
#[test]
fn inspect_prints_the_sandbox_mode_and_the_limits() {
    let output = moat(&["inspect", "--config", "examples/moat.toml"]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("\n  sandbox   required\n"), "{text}");
    let limits: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("  limits    "))
        .collect();
    assert_eq!(limits.len(), 2, "{text}");
    assert!(limits[1].contains("cpu_seconds=60"), "{}", limits[1]);
    assert!(
        limits[0].contains("request_timeout_ms=30000"),
        "{}",
        limits[0]
    );
}

/// `[wasm] metering = "epoch"` reaches the engine: the evidence says the
/// per-request CPU budget is not enforced, and the server still answers.
#[test]
fn epoch_metering_from_the_config_is_reported_by_inspect() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    let entry = format!(
        "[servers.everything]\nwasm = {:?}\nallow_unmeasured = true\n",
        guests::EVERYTHING_WASM
    );
    std::fs::write(&config, &entry).unwrap();
    let fuel = moat(&["inspect", "--config", config.to_str().unwrap()]);
    assert!(fuel.status.success(), "stderr: {}", stderr(&fuel));
    assert!(!stdout(&fuel).contains("fuel_per_request): this engine meters by epoch"));
    std::fs::write(&config, format!("[wasm]\nmetering = \"epoch\"\n{entry}")).unwrap();
    let epoch = moat(&["inspect", "--config", config.to_str().unwrap()]);
    assert!(epoch.status.success(), "stderr: {}", stderr(&epoch));
    let text = stdout(&epoch);
    assert!(
        text.contains(
            "not enforced: CPU budget per request (fuel_per_request): this engine meters by epoch"
        ),
        "{text}"
    );
}

/// `moat tools` and `moat inspect` say which kind of component a server is,
/// and which exported functions of a typed one are not tools, and why.
#[test]
fn tools_and_inspect_say_which_kind_each_component_is() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.everything]\nwasm = {:?}\nallow_unmeasured = true\n\n\
             [servers.kinds]\nwasm = {:?}\ninstance = \"session\"\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM,
            guests::KINDS_WASM
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let tools = moat(&["tools", "--config", config, "kinds"]);
    assert!(tools.status.success(), "stderr: {}", stderr(&tools));
    let text = stdout(&tools);
    assert!(
        text.contains("\nkind      typed tool component (exported functions are tools)\n"),
        "{text}"
    );
    for line in [
        "not a tool moat:kinds/shapes@0.1.0#[constructor]counter: its result is a resource",
        "not a tool moat:kinds/shapes@0.1.0#[method]counter.bump: its parameter `self` is a resource",
        "not a tool moat:kinds/shapes@0.1.0#make-counter: its result is a resource",
        "sandbox   enforced: state (typed component): one instance a session, replaced after a failed call",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
    assert!(text.contains("\nadd "), "{text}");
    let inspect = moat(&["inspect", "--config", config]);
    assert!(inspect.status.success(), "stderr: {}", stderr(&inspect));
    let text = stdout(&inspect);
    assert!(
        text.contains(&format!(
            "  kind      wasm {} (stdio component (MCP on wasi:cli/run))\n",
            guests::EVERYTHING_WASM
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "  kind      wasm {} (typed tool component (exported functions are tools))\n",
            guests::KINDS_WASM
        )),
        "{text}"
    );
    assert!(
        text.contains(
            "  not_tools moat:kinds/shapes@0.1.0#make-counter: its result is a resource\n"
        ),
        "{text}"
    );
    // `instance` is for wasm servers only.
    std::fs::write(
        dir.path().join("bad.toml"),
        "[servers.n]\ncommand = \"node\"\ninstance = \"call\"\n",
    )
    .unwrap();
    let bad = moat(&[
        "inspect",
        "--config",
        dir.path().join("bad.toml").to_str().unwrap(),
    ]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("server `n`: `instance` applies to `wasm` servers only"),
        "{}",
        stderr(&bad)
    );
}

/// `moat import policy.yaml --component X.wasm` turns a Wassette policy into
/// a moat.toml entry that runs the component with the same grants: a
/// storage grant at the same path (read-only unless write is allowed), an
/// environment key passed through, a network host as an HTTPS origin.
#[test]
fn a_wassette_policy_imports_as_a_config_with_the_same_grants() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("notes.txt"), "granted notes").unwrap();
    std::fs::write(dir.path().join("secret.txt"), "not granted").unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "version: \"1.0\"\ndescription: \"Reads notes\"\npermissions:\n  storage:\n    allow:\n      - uri: \"fs://{}\"\n        access: [\"read\"]\n  network:\n    allow:\n      - host: \"localhost:8443\"\n  environment:\n    allow:\n      - key: \"MOAT_POLICY_TOKEN\"\n",
            data.display()
        ),
    )
    .unwrap();
    let imported = moat(&[
        "import",
        policy.to_str().unwrap(),
        "--component",
        guests::FETCH_WASM,
    ]);
    assert!(imported.status.success(), "stderr: {}", stderr(&imported));
    let config = dir.path().join("moat.toml");
    std::fs::write(&config, stdout(&imported)).unwrap();
    let config = config.to_str().unwrap();
    let call = |tool: &str, arguments: serde_json::Value| {
        let output = Command::new(env!("CARGO_BIN_EXE_moat"))
            .args([
                "call",
                "--config",
                config,
                "fetch",
                tool,
                &arguments.to_string(),
            ])
            .env(
                "MOAT_CACHE_DIR",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
            )
            .env("MOAT_POLICY_TOKEN", "t0ken")
            .env("MOAT_OTHER", "hidden")
            .output()
            .unwrap();
        if !output.status.success() {
            // An `err` result: `moat call` says so on stderr and fails.
            let text = stderr(&output);
            let err = text
                .split_once("reported an error: ")
                .map(|(_, json)| serde_json::from_str(json.trim()).unwrap())
                .unwrap_or_else(|| panic!("{tool}: {text}"));
            return err;
        }
        let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        result["structuredContent"]["result"].clone()
    };
    let notes = data.join("notes.txt");
    assert_eq!(
        call("read-file", serde_json::json!({"path": notes})),
        serde_json::json!({"ok": "granted notes"})
    );
    // The same path as on the host; nothing beside it.
    let outside = call(
        "read-file",
        serde_json::json!({"path": dir.path().join("secret.txt")}),
    );
    assert!(outside.get("err").is_some(), "{outside}");
    // Read only: the policy did not allow write.
    let write = call(
        "write-file",
        serde_json::json!({"path": data.join("new.txt"), "text": "x"}),
    );
    assert!(write.get("err").is_some(), "{write}");
    assert!(!data.join("new.txt").exists());
    assert_eq!(
        call("env-var", serde_json::json!({"key": "MOAT_POLICY_TOKEN"})),
        "t0ken"
    );
    assert_eq!(
        call("env-var", serde_json::json!({"key": "MOAT_OTHER"})),
        serde_json::Value::Null
    );
    let inspect = moat(&["inspect", "--config", config]);
    let text = stdout(&inspect);
    assert!(
        text.contains("HTTP (wasi:http): requests only to https://localhost:8443"),
        "{text}"
    );
    assert!(text.contains("sha256"), "{text}");
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

/// Issue 33 (11): `moat serve --help` says what it serves on: stdio or
/// streamable HTTP, not "stdio only".
#[test]
fn serve_help_names_both_transports() {
    let output = moat(&["serve", "--help"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let help = stdout(&output);
    assert!(!help.contains("stdio only"), "{help}");
    assert!(
        help.lines()
            .next()
            .is_some_and(|l| l.contains("on stdio or (`--http`) streamable HTTP")),
        "{help}"
    );
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

/// Issue 33 item 8: `moat add` refuses a name that is taken before it
/// installs anything, and `--replace` swaps the entry in place, keeping the
/// rest of moat.toml (its comments too) as written.
#[test]
fn moat_add_refuses_a_taken_name_and_replaces_an_entry_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "# my servers\n[servers.kept]\ncommand = {:?}\nallow_unmeasured = true\n\n[servers.everything]\ncommand = {:?}\nallow_unmeasured = true\nargs = [\"old\"]\n[servers.everything.env]\nOLD = \"1\"\n",
            guests::EVERYTHING_NATIVE,
            guests::EVERYTHING_NATIVE
        ),
    )
    .unwrap();
    let config_text = config.display().to_string();
    let add = |extra: &[&str]| {
        let mut args = vec!["add", "--config", &config_text, "--name", "everything"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", guests::EVERYTHING_NATIVE, "new"]);
        moat(&args)
    };
    let refused = add(&[]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains(
            "a server named `everything` is already configured (choose another with --name, or replace it with --replace)"
        ),
        "{}",
        stderr(&refused)
    );
    let replaced = add(&["--replace"]);
    assert!(replaced.status.success(), "{}", stderr(&replaced));
    assert!(
        stdout(&replaced).contains("replaced server `everything` in"),
        "{}",
        stdout(&replaced)
    );
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.starts_with("# my servers\n[servers.kept]\n"), "{text}");
    let loaded = moat_host::Config::load(&config).unwrap();
    let entry = loaded.server("everything").unwrap();
    assert_eq!(entry.args, ["new"], "{text}");
    assert!(
        entry.env.is_empty(),
        "the old entry's tables went with it: {text}"
    );
    assert!(loaded.server("kept").is_ok());
    assert_eq!(text.matches("[servers.everything]").count(), 1, "{text}");
}

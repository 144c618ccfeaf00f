//! The everyday commands on a working config: the example config serves the
//! bundled guest, `tools` lists tools with evidence and digest (for a native
//! server too), `digest`, `serve` leaving out a tool name it cannot expose,
//! and `serve --help`.

use super::*;

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
    // The bundled guest builds its routers in `wizer-initialize`: what runs
    // is the snapshot, and it is named.
    assert!(
        text.lines()
            .any(|l| l.starts_with("snapshot  ")
                && l.ends_with(" (its initialised state, which runs)")),
        "{text}"
    );
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

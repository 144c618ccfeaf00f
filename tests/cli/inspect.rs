//! `inspect` and `tools` report the sandbox mode, the limits, epoch metering
//! and which kind each component is.

use super::*;

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

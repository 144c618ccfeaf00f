//! MCP clients that nobody here wrote drive `moat serve`: the official
//! TypeScript SDK over stdio lists tools across a wasm and a native server,
//! calls both, receives progress, and cancels a long call.

use std::path::Path;
use std::process::Command;

use moat_test_guests as guests;

#[test]
fn the_typescript_sdk_drives_moat_serve_over_stdio() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sdk = root.join("target/npm/node_modules/@modelcontextprotocol/sdk");
    assert!(
        sdk.join("package.json").exists(),
        "{} is missing: run `bash tests/setup.sh` (the README's test command does)",
        sdk.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.wasm]\nwasm = {:?}\nallow_unmeasured = true\n[servers.native]\ncommand = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM,
            guests::EVERYTHING_NATIVE
        ),
    )
    .unwrap();
    let audit = dir.path().join("audit.jsonl");
    let output = Command::new("node")
        .arg(root.join("tests/clients/ts_agent.mjs"))
        .arg(&sdk)
        .arg(env!("CARGO_BIN_EXE_moat"))
        .arg(&config)
        .env("MOAT_AUDIT", &audit)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .output()
        .expect("running node");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the TypeScript agent failed:\n{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)));

    let tools: Vec<&str> = report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    assert!(
        tools.contains(&"wasm__echo") && tools.contains(&"native__echo"),
        "{tools:?}"
    );
    assert_eq!(report["wasm_add"], "42");
    assert_eq!(report["native_add"], "3");
    assert_eq!(
        report["progress"],
        serde_json::json!([[1, 3], [2, 3], [3, 3]])
    );
    assert_eq!(report["progress_result"], "3 steps done");
    assert_eq!(report["cancelled"], true);
    assert_eq!(report["after_cancel"], "still here");

    // Moat cancelled the call on the server, and says so in the audit log.
    moat_host::audit::verify(&audit).unwrap();
    let log = std::fs::read_to_string(&audit).unwrap();
    let sleep = log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["event"] == "tool_call" && e["tool"] == "sleep")
        .expect("the sleep call is audited");
    assert_eq!(sleep["outcome"], "cancelled");
    assert!(sleep["duration_ms"].as_u64().unwrap() < 60_000);
}

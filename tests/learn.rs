//! `moat learn`: the reference servers fail under the default (required)
//! sandbox with nothing granted, `moat learn` proposes grants, and with them
//! appended to the config the same servers start and answer.
#![cfg(target_os = "linux")]

use std::path::Path;
use std::process::{Command, Output, Stdio};

fn moat(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(args)
        .arg("--config")
        .arg(config)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("running moat")
}

fn python_executable() -> String {
    let output = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// `server` fails under the sandbox and says why; `moat learn` output,
/// appended, makes it answer `tool`.
fn learn_makes_it_start(server: &str, entry: &str, tool: &str, arguments: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(&config, entry).unwrap();

    let before = moat(&config, &["call", server, tool, arguments]);
    let stderr = String::from_utf8_lossy(&before.stderr);
    assert!(
        !before.status.success(),
        "{server} started with nothing granted"
    );
    assert!(
        stderr.contains("The native sandbox may be the cause")
            && stderr.contains(&format!("moat learn {server}")),
        "{stderr}"
    );

    // Without consent nothing runs.
    let refused = moat(&config, &["learn", server]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not run"));

    let learned = moat(&config, &["learn", "--yes", server]);
    let proposal = String::from_utf8_lossy(&learned.stdout).into_owned();
    assert!(
        learned.status.success(),
        "{}",
        String::from_utf8_lossy(&learned.stderr)
    );
    assert!(
        proposal.contains(&format!("[[servers.{server}.dirs]]"))
            && proposal.contains("mode = \"ro\""),
        "{proposal}"
    );
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&proposal);
    std::fs::write(&config, text).unwrap();

    let after = moat(&config, &["call", server, tool, arguments]);
    assert!(
        after.status.success(),
        "{server} still fails with the learned grants:\n{proposal}\n{}",
        String::from_utf8_lossy(&after.stderr)
    );
}

#[test]
fn learned_grants_start_the_python_reference_server() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let site = root.join("target/py");
    assert!(
        site.join("mcp_server_time").exists(),
        "run `bash tests/setup.sh`"
    );
    let entry = format!(
        "[servers.time]\ncommand = {:?}\nargs = [\"-m\", \"mcp_server_time\", \"--local-timezone\", \"UTC\"]\nenv = {{ PYTHONPATH = {:?} }}\nallow_unmeasured = true\n",
        python_executable(),
        site
    );
    learn_makes_it_start("time", &entry, "get_current_time", r#"{"timezone": "UTC"}"#);
}

#[test]
fn learned_grants_start_the_npm_reference_server() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root
        .join("target/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .canonicalize()
        .expect("run `bash tests/setup.sh`");
    let entry = format!(
        "[servers.everything]\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\nallow_unmeasured = true\n",
        script
    );
    learn_makes_it_start("everything", &entry, "echo", r#"{"message": "learned"}"#);
}

//! `moat learn`: the reference servers fail under the default (required)
//! sandbox with nothing granted, `moat learn` proposes grants, and with them
//! appended to the config the same servers start and answer. A server that
//! writes during the learn run changes nothing outside its private /tmp and
//! the `--write` directories, even when Moat is root, and is proposed `rw`
//! only where it wrote; system directories, the home directory and Moat's
//! own files are never proposed for writing.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use moat_test_guests as guests;
use serde_json::json;

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

/// Removes a file when dropped: a marker the server must not have made, or
/// a fixture of the test's own.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A directory outside /tmp (a learn run has a private /tmp, where the
/// host's would not be seen) for a config.
fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let config = dir.path().join("moat.toml");
    (dir, config)
}

/// Writes `config` with the `breakout` guest as `scribbler`, running `ops`
/// (see breakout.rs) as it starts.
fn scribbler(config: &Path, ops: serde_json::Value) {
    std::fs::write(
        config,
        format!(
            "[servers.scribbler]\ncommand = {:?}\nargs = [\"at-start\", {:?}]\nallow_unmeasured = true\n",
            guests::BREAKOUT_NATIVE,
            ops.to_string()
        ),
    )
    .unwrap();
}

/// The `dirs` a learn proposal grants (its comments left out), as
/// `(host, mode)`.
fn proposed_dirs(proposal: &str) -> Vec<(String, String)> {
    let table: toml::Table = toml::from_str(proposal).expect("the proposal is TOML");
    let Some(dirs) = table
        .get("servers")
        .and_then(|s| s.get("scribbler"))
        .and_then(|s| s.get("dirs"))
        .and_then(|d| d.as_array())
    else {
        return Vec::new();
    };
    dirs.iter()
        .map(|d| {
            (
                d["host"].as_str().unwrap().to_owned(),
                d["mode"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn learn_scribbler(config: &Path, write: &[&Path]) -> String {
    let mut args = vec!["learn".to_owned(), "--yes".to_owned()];
    for dir in write {
        args.push("--write".into());
        args.push(dir.display().to_string());
    }
    args.push("scribbler".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let learned = moat(config, &args);
    assert!(
        learned.status.success(),
        "{}",
        String::from_utf8_lossy(&learned.stderr)
    );
    String::from_utf8(learned.stdout).unwrap()
}

#[test]
fn a_learn_run_writes_nothing_outside_its_scratch_and_proposes_no_rw_it_did_not_see_written() {
    let pid = std::process::id();
    let (work, config) = workspace();
    // A host directory outside any grant, standing for /etc, that the
    // user may write to.
    let stand_in = work.path().join("stand-in");
    std::fs::create_dir(&stand_in).unwrap();
    let stand_in_marker = stand_in.join("moat-learn-marker");
    // The real /etc, which root may write to without any capability.
    let etc_marker = Removed(PathBuf::from(format!("/etc/moat-learn-marker-{pid}")));
    // A file in /usr/bin: the test's own when root (root owns /usr/bin and
    // may open it for writing), otherwise one the user cannot write.
    let (fixture, _fixture_guard) = if is_root() {
        let path = PathBuf::from(format!("/usr/bin/moat-learn-fixture-{pid}"));
        std::fs::write(&path, "fixture\n").unwrap();
        (path.clone(), Some(Removed(path)))
    } else {
        (std::fs::canonicalize("/usr/bin/env").unwrap(), None)
    };
    let fixture_before = (
        std::fs::read(&fixture).unwrap(),
        std::fs::metadata(&fixture).unwrap().modified().unwrap(),
    );
    let ops = json!([
        {"op": "write", "path": stand_in_marker, "text": "learned"},
        {"op": "write", "path": etc_marker.0, "text": "learned"},
        {"op": "open-write", "path": fixture},
        {"op": "write", "path": "/tmp/scratch.txt", "text": "learned"},
    ]);
    scribbler(&config, ops);

    let proposal = learn_scribbler(&config, &[]);

    assert!(
        !stand_in_marker.exists(),
        "the learn run wrote {}:\n{proposal}",
        stand_in_marker.display()
    );
    assert!(
        !etc_marker.0.exists(),
        "the learn run wrote {}:\n{proposal}",
        etc_marker.0.display()
    );
    assert_eq!(
        (
            std::fs::read(&fixture).unwrap(),
            std::fs::metadata(&fixture).unwrap().modified().unwrap()
        ),
        fixture_before,
        "{} changed",
        fixture.display()
    );
    // Nothing is proposed read-write, nor any grant of /etc, /usr/bin or
    // the stand-in.
    let dirs = proposed_dirs(&proposal);
    let stand_in_text = stand_in.display().to_string();
    assert!(
        dirs.iter().all(|(host, mode)| mode == "ro"
            && host != "/etc"
            && host != "/usr/bin"
            && *host != stand_in_text),
        "{proposal}"
    );
    // Each refusal is said, with why.
    assert!(
        proposal.contains(
            "# refused, not proposed: /etc rw (it tried to write there and was refused): in a system directory: a server writing there changes the host"
        ),
        "{proposal}"
    );
    assert!(
        proposal.contains(
            "# refused, not proposed: /usr/bin rw (it tried to write there and was refused): in a system directory: a server writing there changes the host"
        ),
        "{proposal}"
    );
    // The stand-in is a write to confirm, shown as such, never a grant.
    assert!(
        proposal.contains(&format!(
            "# to confirm, NOT proposed: it tried to write there and was refused ({stand_in_text}); grant it read-write only if the server should write there, or run `moat learn --write {stand_in_text} scribbler` to let it and see:\n# [[servers.scribbler.dirs]]\n# host = \"{stand_in_text}\"\n# mode = \"rw\"\n"
        )),
        "{proposal}"
    );
}

#[test]
fn a_learn_run_proposes_rw_where_the_server_wrote_and_only_confirms_an_open_that_wrote_nothing() {
    let (work, config) = workspace();
    let data = work.path().join("data");
    let settings = work.path().join("settings");
    std::fs::create_dir(&data).unwrap();
    std::fs::create_dir(&settings).unwrap();
    let existing = settings.join("settings.json");
    std::fs::write(&existing, "{}").unwrap();
    let ops = json!([
        {"op": "write", "path": data.join("out.txt"), "text": "learned"},
        {"op": "open-write", "path": existing},
    ]);
    scribbler(&config, ops);

    let proposal = learn_scribbler(&config, &[&data, &settings]);

    assert_eq!(
        std::fs::read_to_string(data.join("out.txt")).unwrap(),
        "learned"
    );
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "{}");
    let data_text = data.display().to_string();
    let settings_text = settings.display().to_string();
    assert_eq!(
        proposed_dirs(&proposal),
        [(data_text, "rw".to_owned())],
        "{proposal}"
    );
    assert!(
        proposal.contains(&format!(
            "# to confirm, NOT proposed: it opened files there for writing and wrote nothing ({settings_text})"
        )),
        "{proposal}"
    );
}

#[test]
fn moat_learn_refuses_to_let_a_server_write_system_directories_home_or_moats_own_files() {
    let (work, first) = workspace();
    scribbler(&first, json!([]));
    let home = work.path().join("home");
    let state = work.path().join("state");
    std::fs::create_dir(&home).unwrap();
    std::fs::create_dir(&state).unwrap();
    let config = state.join("moat.toml");
    std::fs::copy(first, &config).unwrap();
    for (dir, why) in [
        (PathBuf::from("/etc"), "refused: in a system directory"),
        (PathBuf::from("/usr/bin"), "refused: in a system directory"),
        (PathBuf::from("/"), "refused: a top-level directory"),
        (
            home.clone(),
            "refused: the home directory, or a directory holding it",
        ),
        (state.clone(), "overlaps Moat's config"),
    ] {
        let refused = Command::new(env!("CARGO_BIN_EXE_moat"))
            .args(["learn", "--yes", "--write"])
            .arg(&dir)
            .args(["scribbler", "--config"])
            .arg(&config)
            .env("HOME", &home)
            .env(
                "MOAT_CACHE_DIR",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
            )
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(
            refused.status.code(),
            Some(1),
            "{}: {stderr}",
            dir.display()
        );
        assert!(stderr.contains(why), "{}: {stderr}", dir.display());
        assert!(refused.stdout.is_empty(), "{}", dir.display());
    }
}

/// Issue 33 item 7: files named only in tool arguments (a workbook to
/// read, a database to write) are invisible to start-up; `moat learn
/// --call TOOL ARGS` makes the calls in the watched run, so what they read
/// is proposed `ro` and what they wrote (in a `--write` directory) `rw`.
#[test]
fn a_learn_run_sees_what_tool_calls_open_and_write() {
    let (work, config) = workspace();
    let inputs = work.path().join("inputs");
    let outputs = work.path().join("outputs");
    std::fs::create_dir(&inputs).unwrap();
    std::fs::create_dir(&outputs).unwrap();
    std::fs::write(inputs.join("book.txt"), "a workbook").unwrap();
    std::fs::write(
        &config,
        format!(
            "[servers.scribbler]\ncommand = {:?}\nallow_unmeasured = true\n",
            guests::PROBE_NATIVE
        ),
    )
    .unwrap();
    let write = outputs.display().to_string();
    // Start-up alone opens neither.
    let started = moat(&config, &["learn", "--yes", "--write", &write, "scribbler"]);
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    assert_eq!(proposed_dirs(&String::from_utf8_lossy(&started.stdout)), []);

    let read = json!({"op": "read", "path": inputs.join("book.txt")}).to_string();
    let written = json!({"op": "write", "path": outputs.join("table.db")}).to_string();
    let learned = moat(
        &config,
        &[
            "learn",
            "--yes",
            "--write",
            &write,
            "--call",
            "attack",
            &read,
            "--call",
            "attack",
            &written,
            "scribbler",
        ],
    );
    let stderr = String::from_utf8_lossy(&learned.stderr);
    assert!(learned.status.success(), "{stderr}");
    assert!(
        stderr.contains("moat learn: call attack: answered: {\"data\":\"a workbook\",\"ok\":true}"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(outputs.join("table.db")).unwrap(),
        "written by probe"
    );
    let mut proposed = proposed_dirs(&String::from_utf8_lossy(&learned.stdout));
    proposed.sort();
    assert_eq!(
        proposed,
        [
            (inputs.display().to_string(), "ro".to_owned()),
            (write.clone(), "rw".to_owned())
        ]
    );

    let bad = moat(
        &config,
        &["learn", "--yes", "--call", "attack", "[1]", "scribbler"],
    );
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("moat learn --call attack: ARGS must be a JSON object, not [1]"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

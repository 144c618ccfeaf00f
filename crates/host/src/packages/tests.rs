use std::path::Path;
use std::process::Command;

use super::install::{INSTALL_RECORD, exact_version, hex_of, in_store, request_key};
use super::python::console_scripts;
use super::run::{PROGRESS_EVERY, run_telling, tree_bytes};
use super::*;
use crate::identity::Digest;

#[test]
fn an_exact_version_already_installed_is_found_in_the_store_and_nothing_else_is() {
    assert!(exact_version("2026.8.31") && exact_version("1.0.0-rc.1") && exact_version("0.25"));
    for range in ["^1.2.3", "~1.2", ">=1", "latest", "1", "1.x", "1.2.*"] {
        assert!(!exact_version(range), "{range}");
    }
    let store = tempfile::tempdir().unwrap();
    let dir = store.path().join("npm-0123456789abcdef");
    std::fs::create_dir(&dir).unwrap();
    let lock = b"{\"lockfileVersion\": 3}";
    std::fs::write(dir.join("package-lock.json"), lock).unwrap();
    let request = Request {
        ecosystem: Ecosystem::Npm,
        name: "@scope/server".into(),
        extras: Vec::new(),
        version: Some("1.2.3".into()),
        with: Vec::new(),
        entry: Entry::Program(None),
        args: Vec::new(),
        launcher: "npx".into(),
    };
    let record = PackageRecord {
        ecosystem: Ecosystem::Npm,
        name: "@scope/server".into(),
        version: "1.2.3".into(),
        extras: Vec::new(),
        with: Vec::new(),
        entry: "server".into(),
        entry_args: vec![
            dir.join("node_modules/@scope/server/dist/index.js")
                .display()
                .to_string(),
        ],
        store: dir.clone(),
        lockfile_sha256: hex_of(&Digest::of(lock)),
    };
    std::fs::write(
        dir.join(INSTALL_RECORD),
        serde_json::json!({"request": request_key(&request, "1.2.3"), "record": record})
            .to_string(),
    )
    .unwrap();
    assert_eq!(
        in_store(store.path(), &request, "1.2.3"),
        Some(record.clone())
    );
    assert_eq!(
        in_store(store.path(), &request, "1.2.4"),
        None,
        "another version"
    );
    let mut beside = request.clone();
    beside.with.push("is-number@7.0.0".into());
    assert_eq!(
        in_store(store.path(), &beside, "1.2.3"),
        None,
        "another request"
    );
    std::fs::write(dir.join("package-lock.json"), b"{}").unwrap();
    assert_eq!(
        in_store(store.path(), &request, "1.2.3"),
        None,
        "a lockfile changed since"
    );
}

#[test]
fn a_long_install_says_how_far_it_has_got_and_how_long_it_took() {
    let dir = tempfile::tempdir().unwrap();
    let mut told = Vec::new();
    // The installer writes 300 KiB, then waits for its input to close
    // (a fifo nobody writes: it ends when the test's writer goes).
    let fifo = dir.path().join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let out = dir.path().join("site");
    std::fs::create_dir(&out).unwrap();
    let mut command = Command::new("sh");
    command.arg("-c").arg(format!(
        "head -c 307200 /dev/zero > {}/wheel; cat {} > /dev/null",
        out.display(),
        fifo.display()
    ));
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = std::thread::spawn({
        let fifo = fifo.clone();
        let out = out.clone();
        let progress = progress.clone();
        move || {
            // Opened for writing once the installer has written its
            // files and a progress line was told; closed at once,
            // which ends its `cat`.
            while tree_bytes(&out) < 307_200
                || progress.load(std::sync::atomic::Ordering::SeqCst) == 0
            {
                std::thread::yield_now();
            }
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
    });
    run_telling(
        "npm package slow",
        &mut command,
        &out,
        std::time::Duration::from_millis(1),
        &mut |line| {
            progress.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            told.push(line)
        },
    )
    .unwrap();
    writer.join().unwrap();
    let last = told.pop().unwrap();
    assert!(
        last.starts_with("moat: installed npm package slow in ")
            && last.ends_with(" s (300.0 KiB)"),
        "{last}"
    );
    assert!(
        !told.is_empty()
            && told.iter().all(|l| {
                l.starts_with("moat: still installing npm package slow: ")
                    && l.ends_with(" written so far")
            }),
        "{told:?}"
    );
    let failed = run_telling(
        "npm package broken",
        Command::new("sh").args(["-c", "echo 'E404 not found' >&2; exit 1"]),
        &out,
        PROGRESS_EVERY,
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(failed.contains("E404 not found"), "{failed}");
}

/// An install that fails on a network error is tried once more, and the
/// user is told why; one that fails on anything else is not.
#[test]
fn an_install_failing_on_the_network_is_tried_once_more_and_no_other_is() {
    let dir = tempfile::tempdir().unwrap();
    let tries = dir.path().join("tries");
    // Fails the first time with npm's words for a reset connection.
    let flaky = format!(
        "echo x >> {tries}; [ $(wc -l < {tries}) -ge 2 ] || {{ echo 'npm error code ECONNRESET' >&2; exit 1; }}",
        tries = tries.display()
    );
    let mut told = Vec::new();
    run_telling(
        "npm package flaky",
        Command::new("sh").args(["-c", &flaky]),
        dir.path(),
        PROGRESS_EVERY,
        &mut |line| told.push(line),
    )
    .unwrap();
    assert_eq!(std::fs::read_to_string(&tries).unwrap().lines().count(), 2);
    assert_eq!(
        told[0],
        "moat: installing npm package flaky failed on a network error (`code ECONNRESET`); trying once more"
    );
    assert!(
        told[1].starts_with("moat: installed npm package flaky in "),
        "{told:?}"
    );

    std::fs::remove_file(&tries).unwrap();
    let missing = format!(
        "echo x >> {}; echo 'npm error code E404' >&2; exit 1",
        tries.display()
    );
    let mut told = Vec::new();
    let failed = run_telling(
        "npm package missing",
        Command::new("sh").args(["-c", &missing]),
        dir.path(),
        PROGRESS_EVERY,
        &mut |line| told.push(line),
    )
    .unwrap_err()
    .to_string();
    assert!(failed.contains("npm error code E404"), "{failed}");
    assert_eq!(std::fs::read_to_string(&tries).unwrap().lines().count(), 1);
    assert!(told.is_empty(), "{told:?}");
}

/// The extras and the requirements installed beside a package are
/// kept in moat.toml, so `moat update` installs them again.
#[test]
fn extras_and_requirements_beside_are_recorded_for_update() {
    let text = r#"[servers.time]
command = "/usr/bin/python3"
allow_unmeasured = true
args = ["-I", "/s/python-x/moat-entry.py"]
[servers.time.package]
ecosystem = "python"
name = "mcp-server-time"
version = "2026.10.19"
extras = ["cli"]
with = ["tzdata==2025.2"]
entry = "mcp-server-time"
entry_args = ["-I", "/s/python-x/moat-entry.py"]
store = "/s/python-x"
lockfile_sha256 = "00"
"#;
    let path = Path::new("/etc/moat/moat.toml");
    let config = crate::config::Config::parse(path, text).unwrap();
    let spec = config.server("time").unwrap();
    let record = spec.package().unwrap();
    assert_eq!(record.extras, ["cli"]);
    assert_eq!(record.with, ["tzdata==2025.2"]);
    let request = record.request();
    assert_eq!(request.extras, ["cli"]);
    assert_eq!(request.with, ["tzdata==2025.2"]);
    assert_eq!(
        request.entry,
        Entry::Program(Some("mcp-server-time".into()))
    );

    let mut new = spec.clone();
    let crate::config::ServerKind::Native {
        package: Some(package),
        ..
    } = &mut new.kind
    else {
        panic!("a native server with a package");
    };
    package.with = vec!["tzdata==2026.1".into()];
    let written = repin_config(path, text, "time", &new).unwrap();
    let again = crate::config::Config::parse(path, &written).unwrap();
    let record = again.server("time").unwrap().package().cloned().unwrap();
    assert_eq!(
        (record.extras.as_slice(), record.with.as_slice()),
        (&["cli".to_owned()][..], &["tzdata==2026.1".to_owned()][..])
    );
}

#[test]
fn console_scripts_are_read_from_the_distribution() {
    let dir = tempfile::tempdir().unwrap();
    let info = dir.path().join("My_Pkg-1.0.dist-info");
    std::fs::create_dir(&info).unwrap();
    std::fs::write(
        info.join("entry_points.txt"),
        "[gui_scripts]\ng = m:g\n[console_scripts]\nmy-pkg = my_pkg.cli:main [extra]\n",
    )
    .unwrap();
    assert_eq!(
        console_scripts(dir.path(), "my-pkg"),
        [("my-pkg".to_owned(), "my_pkg.cli:main [extra]".to_owned())]
    );
    assert!(console_scripts(dir.path(), "other").is_empty());
}

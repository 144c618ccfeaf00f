//! The native containment promises hold when Moat is not root: the `moat`
//! command, copied with the `breakout` server to a place any user can read,
//! runs as `nobody` when the tests run as root (as CI does), and as the
//! current user otherwise. Under `sandbox = "required"` (which refuses a
//! launch whose namespaces, Landlock or seccomp cannot be set up) the server
//! holds no capability, cannot signal a process of the same user, leaves no
//! process behind, writes to a private /tmp, reaches no host socket and
//! sees no host name outside its own root (no stat, no inotify watch, no
//! host pid in its /proc); a
//! server with a `net` grant reaches its listed host through Moat's egress
//! proxy and nothing else.
#![cfg(target_os = "linux")]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use moat_test_guests as guests;
use serde_json::{Value, json};

const NOBODY: u32 = 65534;

/// The user the test runs Moat as: `nobody` when the tests run as root.
fn user() -> Option<u32> {
    // SAFETY: geteuid has no preconditions.
    (unsafe { libc::geteuid() } == 0).then_some(NOBODY)
}

fn as_user(command: &mut Command) -> &mut Command {
    if let Some(uid) = user() {
        // From root, std also clears the supplementary groups.
        command.uid(uid).gid(NOBODY);
    }
    command
}

/// A directory outside /tmp (native servers have a private /tmp) that the
/// user can read, holding copies of `moat` and `breakout` and a config.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    /// With `probe` granted `net = ["127.0.0.1:PORT"]` for `port`.
    fn new(port: u16) -> Self {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let open = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        open(dir.path(), 0o777);
        for (from, name) in [
            (env!("CARGO_BIN_EXE_moat"), "moat"),
            (guests::BREAKOUT_NATIVE, "breakout"),
            (guests::PROBE_NATIVE, "probe"),
        ] {
            let to = dir.path().join(name);
            std::fs::copy(from, &to).unwrap();
            open(&to, 0o755);
        }
        let config = dir.path().join("moat.toml");
        std::fs::write(
            &config,
            format!("[servers.breakout]\ncommand = \"./breakout\"\nallow_unmeasured = true\nsandbox = \"required\"\n\n[servers.breakout.limits]\nclose_grace_ms = 400\n\n[servers.probe]\ncommand = \"./probe\"\nallow_unmeasured = true\nsandbox = \"required\"\nnet = [\"127.0.0.1:{port}\"]\n"),
        )
        .unwrap();
        open(&config, 0o644);
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `moat call breakout attack ARGUMENTS` as the user: the report, once
    /// `moat` has exited (within a bound: it must never wait on what the
    /// server left behind).
    fn attack(&self, arguments: Value) -> Value {
        self.call("breakout", arguments)
    }

    /// `moat call SERVER attack ARGUMENTS` as the user.
    fn call(&self, server: &str, arguments: Value) -> Value {
        let mut child = as_user(
            Command::new(self.path("moat"))
                .arg("call")
                .arg("--config")
                .arg(self.path("moat.toml"))
                .args([server, "attack", &arguments.to_string()])
                .env_clear()
                .env("MOAT_CACHE_DIR", self.path("cache"))
                .env("HOME", self.dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        )
        .spawn()
        .expect("running moat");
        let bound = Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < bound, "moat call did not exit within 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "moat call failed: {stderr}");
        let result: Value = serde_json::from_slice(&output.stdout).unwrap();
        serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap()
    }
}

fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        state != Some('Z') && state != Some('X')
    })
}

#[track_caller]
fn refused(report: &Value, errno: i32, what: &str) {
    assert_eq!(report["ok"], json!(false), "{what} succeeded: {report}");
    assert_eq!(report["errno"], json!(errno), "{what}: {report}");
}

#[test]
fn the_native_promises_hold_for_an_unprivileged_moat() {
    // A host service on loopback, reachable only through Moat's egress proxy.
    let service = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = service.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut stream in service.incoming().map_while(Result::ok) {
            let mut line = [0u8; 16];
            let _ = stream.read(&mut line);
            let _ = stream.write_all(b"pong");
        }
    });
    let setup = Setup::new(port);
    // Egress works unprivileged: the child's loopback and listener are made
    // in its own user and network namespaces.
    assert_eq!(
        setup.call(
            "probe",
            json!({"op": "proxy", "addr": format!("127.0.0.1:{port}")})
        ),
        json!({"ok": true, "data": "pong"})
    );
    let unlisted = format!("127.0.0.1:{}", port.wrapping_add(1));
    assert_eq!(
        setup.call("probe", json!({"op": "proxy", "addr": unlisted})),
        json!({"ok": false, "error": format!("HTTP/1.1 403 Forbidden moat: {unlisted} is not in this server's net grants")})
    );

    let caps = setup.attack(json!({"op": "caps"}));
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            caps["data"][set],
            json!("0000000000000000"),
            "{set}: {caps}"
        );
    }
    assert_eq!(caps["data"]["Seccomp"], json!("2"), "{caps}");

    // A process of the same user, outside the server.
    let mut neighbour = as_user(Command::new("sleep").arg("600")).spawn().unwrap();
    let signal =
        setup.attack(json!({"op": "signal", "pid": neighbour.id(), "signal": libc::SIGKILL}));
    refused(
        &signal,
        libc::ESRCH,
        "SIGKILL to a process of the same user",
    );
    assert!(running(neighbour.id()));
    neighbour.kill().unwrap();
    neighbour.wait().unwrap();

    for (op, errno) in [
        (json!({"op": "unshare"}), libc::EPERM),
        (json!({"op": "packet"}), libc::EPERM),
        (
            json!({"op": "udp", "addr": "127.0.0.1:9"}),
            libc::ENETUNREACH,
        ),
        (
            json!({"op": "abstract", "name": "moat-unprivileged"}),
            libc::EPERM,
        ),
    ] {
        refused(&setup.attack(op.clone()), errno, &op.to_string());
    }

    let tmp = setup.attack(json!({"op": "tmp"}));
    assert_eq!(
        tmp,
        json!({"ok": true, "data": {"dir": "/tmp", "entries": ["breakout-tmp"]}})
    );

    // A deaf server whose grandchild left its session and holds its pipes:
    // `moat call` still returns, and nothing is left.
    let token = format!("moat-unprivileged-escape-{}", std::process::id());
    let escaped = setup.attack(json!({"op": "escape", "token": token, "deaf": true}));
    assert_eq!(escaped["ok"], json!(true), "{escaped}");
    // The server's /proc is its own PID namespace's: the grandchild is
    // looked for on the host by its token.
    assert_eq!(
        processes_with(&token),
        Vec::<u32>::new(),
        "the grandchild outlived `moat call`"
    );
}

/// Host pids of live processes whose argv holds `token`.
fn processes_with(token: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            (running(pid) && String::from_utf8_lossy(&cmdline).contains(token)).then_some(pid)
        })
        .collect()
}

/// The server of an unprivileged Moat has a root of its own too: a host
/// directory and file the user can read, beside the server's own files,
/// do not exist for it (inotify_add_watch and stat: ENOENT), and its /proc
/// lists no pid of the host.
#[test]
fn no_host_name_outside_its_own_root_exists_for_a_server_of_an_unprivileged_moat() {
    let setup = Setup::new(9);
    let hidden = setup.path("hidden");
    std::fs::create_dir(&hidden).unwrap();
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = hidden.join("the-users-file");
    std::fs::write(&file, "readable by the user").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused(
        &setup.attack(json!({"op": "inotify", "path": hidden})),
        libc::ENOENT,
        "inotify_add_watch on an ungranted directory",
    );
    refused(
        &setup.attack(json!({"op": "stat", "path": file})),
        libc::ENOENT,
        "stat of an ungranted file",
    );
    let mut neighbour = as_user(Command::new("sleep").arg("600")).spawn().unwrap();
    let pids = setup.attack(json!({"op": "pids", "pids": [std::process::id(), neighbour.id(), 1]}));
    neighbour.kill().unwrap();
    neighbour.wait().unwrap();
    assert_eq!(pids["ok"], json!(true), "{pids}");
    assert_eq!(pids["data"]["exists"], json!([1]), "{pids}");
    assert_eq!(pids["data"]["self"], json!("1"), "{pids}");
}

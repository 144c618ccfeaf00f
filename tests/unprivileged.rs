//! The native containment promises hold when Moat is not root: the `moat`
//! command, copied with the `breakout` server to a place any user can read,
//! runs as `nobody` when the tests run as root (as CI does), and as the
//! current user otherwise. Under `sandbox = "required"` (which refuses a
//! launch whose namespaces, Landlock or seccomp cannot be set up) the server
//! holds no capability, cannot signal a process of the same user, leaves no
//! process behind, writes to a private /tmp and reaches no host socket; a
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
        // A `#!` script run by `breakout` as its interpreter, writable by
        // the user through a hard link inside the script server's rw grant.
        let script = dir.path().join("script");
        std::fs::write(
            &script,
            format!("#!{}\n# AAAAAAAA\n", dir.path().join("breakout").display()),
        )
        .unwrap();
        open(&script, 0o777);
        std::fs::create_dir(dir.path().join("rw")).unwrap();
        open(&dir.path().join("rw"), 0o777);
        std::fs::hard_link(&script, dir.path().join("rw/alias")).unwrap();
        let digest = moat_host::Digest::of(&std::fs::read(&script).unwrap());
        let config = dir.path().join("moat.toml");
        std::fs::write(
            &config,
            format!("[servers.script]\ncommand = \"./script\"\nsha256 = \"{digest}\"\nsandbox = \"required\"\n[[servers.script.dirs]]\nhost = \"{rw}\"\nmode = \"rw\"\n\n[servers.breakout]\ncommand = \"./breakout\"\nallow_unmeasured = true\nsandbox = \"required\"\n\n[servers.breakout.limits]\nclose_grace_ms = 400\n\n[servers.probe]\ncommand = \"./probe\"\nallow_unmeasured = true\nsandbox = \"required\"\nnet = [\"127.0.0.1:{port}\"]\n", rw = dir.path().join("rw").display()),
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

    // A script rewritten in place (same inode) after its measurement, by
    // its own interpreter: what the interpreter reads is the measured copy.
    let alias = setup.path("rw/alias");
    let rewritten = setup.call("script", json!({"op": "rewrite-script", "alias": alias}));
    assert_eq!(
        rewritten,
        json!({"ok": true, "data": {"given": setup.path("script"), "read": format!("#!{}\n# AAAAAAAA\n", setup.path("breakout").display())}})
    );
    assert!(
        std::fs::read_to_string(setup.path("script"))
            .unwrap()
            .ends_with("# BBBBBBBB\n"),
        "the file itself was rewritten"
    );

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
    let pid: u32 = escaped["data"].as_str().unwrap().parse().unwrap();
    assert!(!running(pid), "the grandchild {pid} outlived `moat call`");
}

//! The native containment promises hold when Moat is not root: the `moat`
//! command, copied with the `breakout` server to a place any user can read,
//! runs as `nobody` when the tests run as root (as CI does), and as the
//! current user otherwise. Under `sandbox = "required"` (which refuses a
//! launch whose namespaces, Landlock or seccomp cannot be set up) the server
//! holds no capability, cannot signal a process of the same user, leaves no
//! process behind, writes to a private /tmp, reaches no host socket and
//! none of the host's SysV shared memory or message queues (its own IPC,
//! UTS and cgroup namespaces), and opens sockets in the allowed families
//! only; a server with a `net` grant reaches its listed host through Moat's
//! egress proxy and nothing else; it sees no host name outside its own root
//! (no stat, no inotify watch, no host pid in its /proc). `moat learn` run
//! as the user lets a server write nothing outside its private /tmp, even
//! in a directory the user may write to.
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
        (json!({"op": "packet"}), libc::EAFNOSUPPORT),
        (
            json!({"op": "socket", "family": 40, "type": libc::SOCK_STREAM, "protocol": 0}), // AF_VSOCK
            libc::EAFNOSUPPORT,
        ),
        (
            json!({"op": "socket", "family": 38, "type": libc::SOCK_SEQPACKET, "protocol": 0}), // AF_ALG
            libc::EAFNOSUPPORT,
        ),
        (
            json!({"op": "socket", "family": libc::AF_NETLINK, "type": libc::SOCK_RAW, "protocol": libc::NETLINK_AUDIT}),
            libc::EAFNOSUPPORT,
        ),
        (
            json!({"op": "socketpair", "family": libc::AF_INET, "type": libc::SOCK_STREAM}),
            libc::EAFNOSUPPORT,
        ),
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

    // What a server needs still opens: TCP and the routing netlink.
    for (family, kind, protocol) in [
        (libc::AF_INET, libc::SOCK_STREAM, 0),
        (libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE),
    ] {
        let report = setup
            .attack(json!({"op": "socket", "family": family, "type": kind, "protocol": protocol}));
        assert_eq!(report["ok"], json!(true), "{report}");
    }

    // The host's SysV objects, open to every user (mode 0666): out of
    // reach of the server, by key, in its own IPC namespace.
    let ipc = HostIpc::new();
    for op in ["shm", "msgq"] {
        refused(
            &setup.attack(json!({"op": op, "key": ipc.key})),
            libc::ENOENT,
            op,
        );
    }
    assert_eq!(
        ipc.content(),
        HostIpc::CONTENT,
        "the host's segment changed"
    );
    assert_eq!(
        ipc.messages_queued(),
        0,
        "a message reached the host's queue"
    );
    let ns = setup.attack(json!({"op": "ns"}));
    for name in ["ipc", "uts", "cgroup"] {
        let ours = std::fs::read_link(format!("/proc/self/ns/{name}")).unwrap();
        assert_ne!(ns["data"][name], json!(ours.display().to_string()), "{ns}");
    }
    drop(ipc);

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
        json!({"ok": true, "data": {"dir": "/tmp", "entries": ["breakout-tmp", "home"]}})
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

/// A SysV shared memory segment and message queue of the host (this test
/// process), made with a known key and mode 0666, removed when dropped.
struct HostIpc {
    key: libc::key_t,
    shm: i32,
    memory: *mut u8,
    msq: i32,
}

impl HostIpc {
    const CONTENT: &[u8; 16] = b"the host's bytes";

    fn new() -> Self {
        let key = 0x4e00_0000 | (std::process::id() as i32 & 0xffff);
        let create = libc::IPC_CREAT | libc::IPC_EXCL | 0o666;
        // SAFETY: SysV calls on plain integers; the segment is attached at a
        // place the kernel picks and written within its 4096 bytes.
        unsafe {
            let shm = libc::shmget(key, 4096, create);
            assert!(shm >= 0, "shmget: {}", std::io::Error::last_os_error());
            let memory = libc::shmat(shm, std::ptr::null(), 0).cast::<u8>();
            assert_ne!(memory as isize, -1, "shmat");
            std::ptr::copy_nonoverlapping(Self::CONTENT.as_ptr(), memory, Self::CONTENT.len());
            let msq = libc::msgget(key, create);
            assert!(msq >= 0, "msgget: {}", std::io::Error::last_os_error());
            // Found by key in the host's namespace: what the server would
            // reach without one of its own.
            assert_eq!(libc::shmget(key, 0, 0), shm);
            assert_eq!(libc::msgget(key, 0), msq);
            Self {
                key,
                shm,
                memory,
                msq,
            }
        }
    }

    fn content(&self) -> Vec<u8> {
        // SAFETY: reads 16 bytes of the attached 4096-byte segment.
        unsafe { std::slice::from_raw_parts(self.memory, Self::CONTENT.len()).to_vec() }
    }

    fn messages_queued(&self) -> u64 {
        // SAFETY: IPC_STAT into a zeroed msqid_ds on the stack.
        unsafe {
            let mut stat: libc::msqid_ds = std::mem::zeroed();
            assert_eq!(libc::msgctl(self.msq, libc::IPC_STAT, &mut stat), 0);
            stat.msg_qnum as u64
        }
    }
}

impl Drop for HostIpc {
    fn drop(&mut self) {
        // SAFETY: detaches and removes the objects this test made.
        unsafe {
            libc::shmdt(self.memory.cast());
            libc::shmctl(self.shm, libc::IPC_RMID, std::ptr::null_mut());
            libc::msgctl(self.msq, libc::IPC_RMID, std::ptr::null_mut());
        }
    }
}

/// Issue 32, item 1: with `HOME` a directory of its own, a console script
/// in `$HOME/.local/bin` (whose `lib/` beside makes `$HOME/.local` its
/// installation root) cannot read Moat's state in `$HOME/.local/state/moat`
/// (the key is readable by the user: only the sandbox refuses it), while it
/// runs and reads itself.
#[test]
fn an_install_root_in_home_local_never_reaches_moats_state() {
    let setup = Setup::new(9);
    // `call` runs Moat with HOME set to the setup directory.
    let local = setup.path(".local");
    for dir in ["bin", "lib/python3.12/site-packages", "state/moat"] {
        std::fs::create_dir_all(local.join(dir)).unwrap();
    }
    let key = local.join("state/moat/audit.key");
    std::fs::write(&key, "the audit key").unwrap();
    let script = local.join("bin/x");
    std::fs::write(&script, format!("#!{}\n", setup.path("probe").display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = setup.path("moat.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "\n[servers.local]\ncommand = {:?}\nallow_unmeasured = true\nsandbox = \"required\"\n",
        script.display().to_string()
    ));
    std::fs::write(&config, text).unwrap();
    // Not bound into the server's own root, the key does not exist for it.
    assert_eq!(
        setup.call("local", json!({"op": "read", "path": key})),
        json!({"ok": false, "error": "No such file or directory (os error 2)"}),
        "Moat's audit key was read"
    );
    assert_eq!(
        setup.call("local", json!({"op": "list", "path": local})),
        json!({"ok": false, "error": "Permission denied (os error 13)"}),
        "$HOME/.local was listed"
    );
    let own = setup.call("local", json!({"op": "read", "path": script}));
    assert_eq!(own["ok"], json!(true), "{own}");
}

#[test]
fn an_unprivileged_learn_run_writes_nothing_the_user_could_write() {
    let setup = Setup::new(9);
    // A directory the user may write to, outside any grant.
    let open_dir = setup.path("open");
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = open_dir.join("moat-learn-marker");
    let ops = json!([
        {"op": "write", "path": marker, "text": "learned"},
        {"op": "write", "path": "/tmp/scratch.txt", "text": "learned"},
    ]);
    let config = setup.path("learn.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.scribbler]\ncommand = \"./breakout\"\nargs = [\"at-start\", {:?}]\nallow_unmeasured = true\n",
            ops.to_string()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let output = as_user(
        Command::new(setup.path("moat"))
            .args(["learn", "--yes", "--config"])
            .arg(&config)
            .arg("scribbler")
            .env_clear()
            .env("MOAT_CACHE_DIR", setup.path("cache"))
            .env("HOME", setup.path("home"))
            .stdin(Stdio::null()),
    )
    .output()
    .expect("running moat learn");
    let proposal = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!marker.exists(), "the learn run wrote {}", marker.display());
    assert!(
        !proposal.lines().any(|line| line == "mode = \"rw\""),
        "{proposal}"
    );
    assert!(
        proposal.contains(&format!(
            "# to confirm, NOT proposed: it tried to write there and was refused ({})",
            open_dir.display()
        )),
        "{proposal}"
    );
}

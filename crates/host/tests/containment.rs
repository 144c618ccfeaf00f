//! Containment of native servers, tried by a hostile server (`breakout`)
//! while a well-behaved neighbour keeps answering: it cannot signal Moat or
//! an unrelated process, holds no privilege even when Moat is root, inherits
//! no descriptor, cannot leave a process behind or make close wait, and with
//! no `net` grant reaches no socket of the host (TCP, UDP, pathname or
//! abstract Unix), reaches none of the host's SysV shared memory or message
//! queues, opens sockets in the allowed families only, and sees no host name
//! outside its own root (no stat, no inotify watch, no host pid in /proc).
//! Each refusal is asserted by its errno.
#![cfg(target_os = "linux")]

mod common;

use std::time::{Duration, Instant};

use common::{args, host, running, text};
use moat_host::{ServerSpec, Session};
use moat_test_guests as guests;
use serde_json::{Value, json};

fn breakout() -> ServerSpec {
    let mut spec = ServerSpec::native("breakout", guests::BREAKOUT_NATIVE);
    spec.allow_unmeasured = true;
    spec
}

/// A native `everything` that must keep answering whatever its neighbour
/// does.
struct Neighbour(Session);

impl Neighbour {
    async fn start() -> Self {
        let mut spec = ServerSpec::native("neighbour", guests::EVERYTHING_NATIVE);
        spec.allow_unmeasured = true;
        let neighbour = Self(host().connect(&spec).await.expect("neighbour"));
        neighbour.answers().await;
        neighbour
    }

    async fn answers(&self) {
        let result = self
            .0
            .call_tool("add", args(json!({"a": 2, "b": 40})))
            .await
            .expect("the neighbour answers");
        assert_eq!(text(&result), "42");
    }

    async fn close(self) {
        self.answers().await;
        self.0.close().await.expect("the neighbour closes");
    }
}

async fn attack(session: &Session, arguments: Value) -> Value {
    let result = session
        .call_tool("attack", args(arguments))
        .await
        .expect("the breakout server answers");
    serde_json::from_str(&text(&result)).expect("a JSON report")
}

/// Asserts that the attack failed with `errno`.
#[track_caller]
fn refused(report: &Value, errno: i32, what: &str) {
    assert_eq!(report["ok"], json!(false), "{what} succeeded: {report}");
    assert_eq!(report["errno"], json!(errno), "{what}: {report}");
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

#[tokio::test]
async fn signals_reach_neither_moat_nor_an_unrelated_process() {
    let neighbour = Neighbour::start().await;
    let mut unrelated = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let server = host().connect(&breakout()).await.unwrap();
    for (pid, signal, whom) in [
        (std::process::id(), libc::SIGSTOP, "Moat"),
        (unrelated.id(), libc::SIGKILL, "an unrelated process"),
    ] {
        let report = attack(
            &server,
            json!({"op": "signal", "pid": pid, "signal": signal}),
        )
        .await;
        refused(&report, libc::ESRCH, &format!("signal {signal} to {whom}"));
        neighbour.answers().await;
    }
    assert!(running(unrelated.id()), "the unrelated process survived");
    unrelated.kill().unwrap();
    unrelated.wait().unwrap();
    let _ = server.close().await;
    neighbour.close().await;
}

#[tokio::test]
async fn no_privilege_is_held_even_when_moat_is_root() {
    let neighbour = Neighbour::start().await;
    let server = host().connect(&breakout()).await.unwrap();
    let caps = attack(&server, json!({"op": "caps"})).await;
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            caps["data"][set],
            json!("0000000000000000"),
            "{set}: {caps}"
        );
    }
    assert_eq!(caps["data"]["NoNewPrivs"], json!("1"), "{caps}");
    assert_eq!(caps["data"]["Seccomp"], json!("2"), "{caps}");
    let neighbour_pid = std::process::id();
    for (op, errno) in [
        (json!({"op": "packet"}), libc::EAFNOSUPPORT),
        (json!({"op": "raw"}), libc::EPERM),
        (json!({"op": "bpf"}), libc::EPERM),
        (json!({"op": "klogctl"}), libc::EPERM),
        (json!({"op": "ptrace", "pid": neighbour_pid}), libc::EPERM),
        (json!({"op": "unshare"}), libc::EPERM),
        (json!({"op": "keyctl"}), libc::EPERM),
    ] {
        let report = attack(&server, op.clone()).await;
        refused(&report, errno, &op.to_string());
        neighbour.answers().await;
    }
    let identity = server.identity().unwrap();
    for line in [
        "enforced: PID namespace",
        "enforced: IPC, UTS and cgroup namespaces",
        "enforced: capabilities: none",
        "enforced: seccomp: EPERM for ptrace",
        "enforced: network namespace",
        "enforced: descriptors: only stdin, stdout, stderr and the measured executable",
    ] {
        assert!(
            identity.sandbox.lines().iter().any(|l| l.starts_with(line)),
            "{line} missing from {:#?}",
            identity.sandbox
        );
    }
    server.close().await.unwrap();
    neighbour.close().await;
}

#[tokio::test]
async fn a_descriptor_moat_inherited_does_not_reach_the_server() {
    use std::os::fd::AsRawFd;
    let neighbour = Neighbour::start().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "the caller's secret").unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&secret)
        .unwrap();
    let fd = file.as_raw_fd();
    // As Moat's caller might hand it: without close-on-exec.
    // SAFETY: clears the flags of a descriptor this test owns.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
    let server = host().connect(&breakout()).await.unwrap();
    let report = attack(&server, json!({"op": "fd", "fd": fd})).await;
    refused(&report, libc::EBADF, "reading the inherited descriptor");
    neighbour.answers().await;
    server.close().await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "the caller's secret"
    );
    drop(file);
    neighbour.close().await;
}

#[tokio::test]
async fn a_grandchild_that_leaves_its_session_dies_with_the_server_and_close_is_bounded() {
    let neighbour = Neighbour::start().await;
    let mut spec = breakout();
    spec.limits.close_grace_ms = 400;
    let server = host().connect(&spec).await.unwrap();
    let token = format!("moat-escape-{}", std::process::id());
    // The server ignores SIGTERM and SIGHUP and stdin EOF from now on; its
    // grandchild is in a session of its own and holds stdout and stderr.
    let report = attack(
        &server,
        json!({"op": "escape", "token": token, "deaf": true}),
    )
    .await;
    assert_eq!(report["ok"], json!(true), "{report}");
    // The server's /proc is its own PID namespace's: the grandchild is
    // found on the host by its token.
    let found = processes_with(&token);
    assert_eq!(found.len(), 1, "one grandchild: {found:?}");
    let pid = found[0];
    assert!(running(pid), "the grandchild runs before close");
    neighbour.answers().await;
    let started = Instant::now();
    server.close().await.unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(2 * 400),
        "close took {took:?}, more than twice close_grace_ms"
    );
    assert!(!running(pid), "the grandchild outlived close");
    assert_eq!(processes_with(&token), Vec::<u32>::new());
    neighbour.close().await;
}

#[tokio::test]
async fn without_net_no_socket_of_the_host_is_reached() {
    use std::os::linux::net::SocketAddrExt;
    let neighbour = Neighbour::start().await;
    let dir = tempfile::tempdir().unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let path = dir.path().join("listener.sock");
    let unix = std::os::unix::net::UnixListener::bind(&path).unwrap();
    unix.set_nonblocking(true).unwrap();
    let name = format!("moat-test-{}", std::process::id());
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let abstract_listener = std::os::unix::net::UnixListener::bind_addr(&address).unwrap();
    abstract_listener.set_nonblocking(true).unwrap();
    let server = host().connect(&breakout()).await.unwrap();
    let cases = [
        (
            json!({"op": "udp", "addr": udp.local_addr().unwrap().to_string()}),
            libc::ENETUNREACH,
        ),
        (
            json!({"op": "tcp", "addr": tcp.local_addr().unwrap().to_string()}),
            // Landlock refuses the connect before routing would.
            libc::EACCES,
        ),
        (json!({"op": "unix", "path": path}), libc::EPERM),
        (json!({"op": "abstract", "name": name}), libc::EPERM),
    ];
    for (op, errno) in cases {
        let report = attack(&server, op.clone()).await;
        refused(&report, errno, &op.to_string());
        neighbour.answers().await;
    }
    let mut buf = [0u8; 16];
    assert_eq!(
        udp.recv_from(&mut buf).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "a datagram arrived"
    );
    for accepted in [
        tcp.accept().map(|_| ()),
        unix.accept().map(|_| ()),
        abstract_listener.accept().map(|_| ()),
    ] {
        assert_eq!(
            accepted.unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock,
            "a connection arrived"
        );
    }
    server.close().await.unwrap();
    neighbour.close().await;
}

#[tokio::test]
async fn each_server_writes_to_a_private_tmp_that_goes_with_it() {
    let neighbour = Neighbour::start().await;
    let server = host().connect(&breakout()).await.unwrap();
    assert!(
        std::fs::read_dir("/tmp").unwrap().next().is_some(),
        "the host's /tmp has entries the server must not see"
    );
    let report = attack(&server, json!({"op": "tmp"})).await;
    // Nothing of the host's /tmp but what the server runs from, when that
    // lies under /tmp (a checkout there): it is bound in at its place; and
    // the server's own HOME (issue 33), made empty in its private /tmp.
    let mut entries = vec!["breakout-tmp".to_owned(), "home".to_owned()];
    if let Ok(inside) = std::path::Path::new(guests::BREAKOUT_NATIVE).strip_prefix("/tmp") {
        let first = inside.components().next().unwrap();
        entries.push(first.as_os_str().to_string_lossy().into_owned());
        entries.sort();
    }
    assert_eq!(
        report,
        json!({"ok": true, "data": {"dir": "/tmp", "entries": entries}})
    );
    assert!(
        !std::path::Path::new("/tmp/breakout-tmp").exists(),
        "the server's /tmp is the host's"
    );
    server.close().await.unwrap();
    // A second server starts from an empty /tmp again.
    let server = host().connect(&breakout()).await.unwrap();
    let again = attack(&server, json!({"op": "tmp"})).await;
    assert_eq!(again, report);
    server.close().await.unwrap();
    neighbour.close().await;
}

/// A directory granted under the host's /tmp is still there, at the same
/// path, inside the server's private /tmp; nothing else of the host's /tmp is.
#[tokio::test]
async fn a_grant_under_the_hosts_tmp_reaches_through_the_private_tmp() {
    use moat_host::config::{DirGrant, DirMode};
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let granted = dir.path().join("granted");
    std::fs::create_dir(&granted).unwrap();
    std::fs::write(granted.join("note"), "from the host").unwrap();
    std::fs::write(dir.path().join("beside"), "not granted").unwrap();
    let mut spec = ServerSpec::native("probe", guests::PROBE_NATIVE);
    spec.allow_unmeasured = true;
    spec.dirs = vec![DirGrant {
        host: granted.clone(),
        guest: granted.display().to_string(),
        mode: DirMode::Rw,
        inode: None,
    }];
    let server = host().connect(&spec).await.unwrap();
    let probe = |arguments: Value| {
        let server = &server;
        async move { attack(server, arguments).await }
    };
    let read = probe(json!({"op": "read", "path": granted.join("note")})).await;
    assert_eq!(read, json!({"ok": true, "data": "from the host"}));
    let write = probe(json!({"op": "write", "path": granted.join("new")})).await;
    assert_eq!(write, json!({"ok": true, "data": "written"}));
    let beside = probe(json!({"op": "read", "path": dir.path().join("beside")})).await;
    assert_eq!(beside["ok"], json!(false), "{beside}");
    server.close().await.unwrap();
    assert_eq!(
        std::fs::read_to_string(granted.join("new")).unwrap(),
        "written by probe"
    );
}

/// A SysV shared memory segment and message queue of the host (this test
/// process), made with known keys and mode 0666, removed when dropped.
struct HostIpc {
    key: libc::key_t,
    shm: i32,
    memory: *mut u8,
    msq: i32,
}

impl HostIpc {
    const CONTENT: &[u8; 16] = b"the host's bytes";

    fn new(salt: i32) -> Self {
        let key = 0x4d00_0000 | ((std::process::id() as i32 & 0xffff) << 4) | salt;
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
            Self {
                key,
                shm,
                memory,
                msq,
            }
        }
    }

    /// What a process of the host's IPC namespace finds by the key: the
    /// same objects (what the server would reach without a namespace).
    fn reachable_by_key(&self) -> bool {
        // SAFETY: lookups by key, no memory touched.
        unsafe { libc::shmget(self.key, 0, 0) == self.shm && libc::msgget(self.key, 0) == self.msq }
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

#[tokio::test]
async fn the_hosts_sysv_ipc_hostname_and_cgroup_are_out_of_reach() {
    let neighbour = Neighbour::start().await;
    let ipc = HostIpc::new(1);
    assert!(ipc.reachable_by_key(), "the host's objects exist by key");
    let server = host().connect(&breakout()).await.unwrap();
    for op in ["shm", "msgq"] {
        let report = attack(&server, json!({"op": op, "key": ipc.key})).await;
        refused(&report, libc::ENOENT, op);
        neighbour.answers().await;
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
    // Its own IPC, UTS and cgroup namespaces.
    let ns = attack(&server, json!({"op": "ns"})).await;
    for name in ["ipc", "uts", "cgroup"] {
        let ours = std::fs::read_link(format!("/proc/self/ns/{name}")).unwrap();
        let theirs = ns["data"][name].as_str().expect("the server's namespace");
        assert_ne!(theirs, ours.display().to_string(), "{name}: {ns}");
    }
    // No capability to set even its own hostname; the host's is untouched.
    let before = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let renamed = attack(&server, json!({"op": "hostname", "name": "breakout"})).await;
    refused(&renamed, libc::EPERM, "sethostname");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        before
    );
    server.close().await.unwrap();
    neighbour.close().await;
}

/// Sockets open in AF_INET, AF_INET6 and AF_NETLINK (NETLINK_ROUTE) only
/// (AF_UNIX: socketpair only); every other family answers EAFNOSUPPORT,
/// whether the kernel has it or not.
#[tokio::test]
async fn sockets_open_only_in_the_allowed_families() {
    const AF_VSOCK: i32 = 40;
    const AF_ALG: i32 = 38;
    let neighbour = Neighbour::start().await;
    let server = host().connect(&breakout()).await.unwrap();
    let socket = |family: i32, kind: i32, protocol: i32| json!({"op": "socket", "family": family, "type": kind, "protocol": protocol});
    for (op, errno) in [
        (socket(AF_VSOCK, libc::SOCK_STREAM, 0), libc::EAFNOSUPPORT),
        (socket(AF_ALG, libc::SOCK_SEQPACKET, 0), libc::EAFNOSUPPORT),
        (
            socket(libc::AF_BLUETOOTH, libc::SOCK_STREAM, 0),
            libc::EAFNOSUPPORT,
        ),
        (
            socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_AUDIT),
            libc::EAFNOSUPPORT,
        ),
        (
            socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM,
                libc::NETLINK_KOBJECT_UEVENT,
            ),
            libc::EAFNOSUPPORT,
        ),
        (
            json!({"op": "socketpair", "family": AF_VSOCK, "type": libc::SOCK_STREAM}),
            libc::EAFNOSUPPORT,
        ),
        // SOCK_PACKET (10, obsolete) in AF_INET would be an AF_PACKET socket.
        (socket(libc::AF_INET, 10, 0x0300), libc::EPERM),
    ] {
        let report = attack(&server, op.clone()).await;
        refused(&report, errno, &op.to_string());
        neighbour.answers().await;
    }
    // What a server needs still opens, as it does here (IPv6 may be absent
    // from this kernel).
    for (family, kind, protocol) in [
        (libc::AF_INET, libc::SOCK_STREAM, 0),
        (libc::AF_INET, libc::SOCK_DGRAM, 0),
        (libc::AF_INET6, libc::SOCK_STREAM, 0),
        (libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE),
    ] {
        // SAFETY: socket(2) on plain integers; the descriptor is closed.
        let here = unsafe {
            let fd = libc::socket(family, kind, protocol);
            if fd >= 0 {
                libc::close(fd);
            }
            fd >= 0
        };
        let report = attack(&server, socket(family, kind, protocol)).await;
        assert_eq!(
            report["ok"],
            json!(here),
            "{family}/{kind}/{protocol}: {report}"
        );
    }
    let pair = attack(
        &server,
        json!({"op": "socketpair", "family": libc::AF_UNIX, "type": libc::SOCK_STREAM}),
    )
    .await;
    assert_eq!(pair["ok"], json!(true), "{pair}");
    let identity = server.identity().unwrap();
    assert!(
        identity.sandbox.lines().iter().any(|l| l.contains(
            "EAFNOSUPPORT for socket in any family but AF_UNIX, AF_INET, AF_INET6, AF_NETLINK (netlink: NETLINK_ROUTE only)"
        )),
        "{:#?}",
        identity.sandbox
    );
    server.close().await.unwrap();
    neighbour.close().await;
}

/// Issue 32, item 1: a console script in `~/.local/bin` (its `lib/` beside
/// makes `~/.local` its installation root) cannot read Moat's audit key
/// under `~/.local/state/moat`: the root Moat would have granted without
/// listing holds the key, so it is not granted (and the evidence says so),
/// while the script itself still runs. The neighbour answers throughout.
#[tokio::test]
async fn an_implicit_install_root_never_reaches_moats_audit_key() {
    let neighbour = Neighbour::start().await;
    // Outside /tmp: the server has a private /tmp of its own.
    let home = tempfile::tempdir_in("/var/tmp").unwrap();
    let home = std::fs::canonicalize(home.path()).unwrap();
    let local = home.join(".local");
    for dir in ["bin", "lib/python3.12/site-packages", "state/moat"] {
        std::fs::create_dir_all(local.join(dir)).unwrap();
    }
    let key = local.join("state/moat/audit.key");
    std::fs::write(&key, "the audit key").unwrap();
    let script = local.join("bin/x");
    std::fs::write(&script, format!("#!{}\n", guests::PROBE_NATIVE)).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let host = moat_host::Host::new(Some(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"),
    ))
    .unwrap()
    .protect(moat_host::grants::AUDIT_KEY, local.join("state/moat"));
    let mut spec = ServerSpec::native("x", script.to_str().unwrap());
    spec.allow_unmeasured = true;
    let server = host.connect(&spec).await.expect("the script runs");
    // Not bound into its own root, the key does not exist for it.
    let read = attack(&server, json!({"op": "read", "path": key})).await;
    assert_eq!(
        read,
        json!({"ok": false, "error": "No such file or directory (os error 2)"}),
        "the audit key was read"
    );
    let listed = attack(&server, json!({"op": "list", "path": local})).await;
    assert_eq!(
        listed,
        json!({"ok": false, "error": "Permission denied (os error 13)"}),
        "~/.local was listed"
    );
    let rules = server.identity().unwrap().sandbox.lines().join("\n");
    assert!(
        rules.contains(&format!(
            "enforced: not granted: the installation root {} of {} (it holds Moat's audit key at {})",
            local.display(),
            script.display(),
            local.join("state/moat").display()
        )),
        "{rules}"
    );
    server.close().await.unwrap();
    neighbour.close().await;
    common::host_still_serves_everything(common::Launcher::Native).await;
}

/// Landlock refuses what an ungranted path holds, not its name: in a root of
/// its own, a host path outside the server's grants does not exist, so it
/// can neither be watched with inotify nor stat'ed, and the server's /proc
/// is its own PID namespace's. A granted directory beside it still works.
#[tokio::test]
async fn no_host_name_outside_the_servers_own_root_exists_for_it() {
    use moat_host::config::{DirGrant, DirMode};
    let neighbour = Neighbour::start().await;
    // Outside /tmp (which is private anyway).
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let hidden = dir.path().join("hidden");
    std::fs::create_dir(&hidden).unwrap();
    let file = hidden.join("the-users-file");
    std::fs::write(&file, "sixteen bytes...").unwrap();
    let granted = dir.path().join("granted");
    std::fs::create_dir(&granted).unwrap();
    std::fs::write(granted.join("note"), "from the host").unwrap();
    let mut spec = breakout();
    spec.dirs = vec![DirGrant {
        host: granted.clone(),
        guest: granted.display().to_string(),
        mode: DirMode::Rw,
        inode: None,
    }];
    let server = host().connect(&spec).await.unwrap();
    let watch = attack(&server, json!({"op": "inotify", "path": hidden})).await;
    refused(
        &watch,
        libc::ENOENT,
        "inotify_add_watch on an ungranted directory",
    );
    let stat = attack(&server, json!({"op": "stat", "path": file})).await;
    refused(&stat, libc::ENOENT, "stat of an ungranted file");
    neighbour.answers().await;
    // Moat runs in this test process: its pid is not in the server's /proc.
    let moat = std::process::id();
    let pids = attack(&server, json!({"op": "pids", "pids": [moat, 1]})).await;
    assert_eq!(pids["ok"], json!(true), "{pids}");
    assert_eq!(pids["data"]["exists"], json!([1]), "{pids}");
    assert_eq!(pids["data"]["self"], json!("1"), "{pids}");
    // Listing /proc shows the server's own processes only (its /proc is
    // readable: what it starts reads its own /proc/self).
    assert_eq!(pids["data"]["listed"], json!([1]), "{pids}");
    // The grant is there, at its own path, with its mode.
    let seen = attack(&server, json!({"op": "stat", "path": granted.join("note")})).await;
    assert_eq!(seen["ok"], json!(true), "{seen}");
    let identity = server.identity().unwrap();
    assert!(
        identity
            .sandbox
            .lines()
            .iter()
            .any(|l| l.starts_with("enforced: own root: the server's / is a tmpfs of its own")),
        "{:#?}",
        identity.sandbox
    );
    server.close().await.unwrap();

    let mut probe = ServerSpec::native("probe", guests::PROBE_NATIVE);
    probe.allow_unmeasured = true;
    probe.dirs = spec.dirs.clone();
    let probe = host().connect(&probe).await.unwrap();
    let read = attack(&probe, json!({"op": "read", "path": granted.join("note")})).await;
    assert_eq!(read, json!({"ok": true, "data": "from the host"}));
    let write = attack(&probe, json!({"op": "write", "path": granted.join("new")})).await;
    assert_eq!(write, json!({"ok": true, "data": "written"}));
    let beside = attack(&probe, json!({"op": "read", "path": file})).await;
    assert_eq!(beside["ok"], json!(false), "{beside}");
    assert!(
        beside["error"].as_str().unwrap().contains("No such file"),
        "{beside}"
    );
    probe.close().await.unwrap();
    assert_eq!(
        std::fs::read_to_string(granted.join("new")).unwrap(),
        "written by probe"
    );
    neighbour.close().await;
}

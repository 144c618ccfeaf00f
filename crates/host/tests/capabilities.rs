//! Capabilities, in pairs on both launchers: the grant works, the denial
//! fails. Directories (ro, rw, and every way out: `../`, absolute paths, a
//! link to /etc, a sibling sharing the prefix), network destinations, and
//! the evidence of what the sandbox enforced.

#[macro_use]
mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};

use common::{Launcher, args, spec, text};
use moat_host::config::{DirGrant, DirMode, NetGrant, Sandbox};
use moat_host::grants::GrantError;
use moat_host::lock::{LOCK_VERSION, Lock};
use moat_host::native::NativeError;
use moat_host::wasm::WasmError;
use moat_host::{ClientError, Host, LaunchError, ServerSpec, Session};
use moat_test_guests as guests;
use serde_json::json;

both_launchers!(
    a_read_only_dir_reads_but_does_not_write,
    a_read_write_dir_writes,
    every_way_out_of_a_granted_dir_is_denied,
    a_listed_port_connects_and_others_are_denied,
    no_network_without_a_grant,
    a_grant_swapped_for_a_link_by_another_server_is_refused,
    under_the_lock_a_replaced_or_added_grant_is_refused,
    a_grant_over_what_moat_keeps_is_refused,
);

fn cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache")
}

/// A tree with `data/` (granted), `data_evil/` (a sibling sharing the
/// prefix), `secret.txt` beside them, and `data/link` pointing at /etc.
struct Tree {
    root: tempfile::TempDir,
}

impl Tree {
    fn new() -> Self {
        Self::in_dir("/var/tmp")
    }

    fn in_dir(base: &str) -> Self {
        // By default outside /tmp (where a checkout may live too): a native server has
        // a private /tmp of its own, where a way out of the grant would find
        // nothing to deny.
        let root = tempfile::tempdir_in(base).unwrap();
        let data = root.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("hello.txt"), "hello from data").unwrap();
        std::fs::create_dir(root.path().join("data_evil")).unwrap();
        std::fs::write(root.path().join("data_evil/x.txt"), "evil").unwrap();
        std::fs::write(root.path().join("secret.txt"), "secret").unwrap();
        std::os::unix::fs::symlink("/etc", data.join("link")).unwrap();
        Self { root }
    }

    fn host(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    /// What the server opens for `relative` under the grant: the guest path
    /// for wasm, the host path for native.
    fn inside(&self, launcher: Launcher, relative: &str) -> String {
        match launcher {
            Launcher::Wasm => format!("/data/{relative}"),
            Launcher::Native => self.host("data").join(relative).display().to_string(),
        }
    }
}

fn probe(launcher: Launcher, tree: &Tree, mode: DirMode) -> ServerSpec {
    let mut spec = spec(launcher, guests::PROBE);
    spec.dirs = vec![DirGrant {
        host: tree.host("data"),
        guest: "/data".into(),
        mode,
        inode: None,
    }];
    spec
}

async fn connect(spec: &ServerSpec) -> Session {
    Host::new(Some(cache()))
        .unwrap()
        .connect(spec)
        .await
        .unwrap()
}

/// Runs one probe operation: Ok(data) or Err(error text).
async fn attempt(session: &Session, arguments: serde_json::Value) -> Result<String, String> {
    let result = session.call_tool("attack", args(arguments)).await.unwrap();
    let report: serde_json::Value = serde_json::from_str(&text(&result)).unwrap();
    if report["ok"] == true {
        Ok(report["data"].as_str().unwrap_or_default().to_owned())
    } else {
        Err(report["error"].as_str().unwrap_or_default().to_owned())
    }
}

/// How each denial surfaces inside the server. Native: a path outside its
/// own root does not exist (ENOENT), a read-only grant is a read-only mount
/// (EROFS), and Landlock answers EACCES for what the root holds but the
/// grants do not (a link out to /etc/shadow) and for sockets. Wasi answers
/// ENOTCAPABLE-style EPERM inside a preopen, ENOENT outside every preopen
/// (nothing is there to name), and EACCES for sockets.
#[derive(Clone, Copy)]
enum Denial {
    /// A file operation under a granted directory.
    InsideGrant,
    /// A write in a read-only granted directory.
    ReadOnly,
    /// `..` out of a granted directory.
    UpAndOut,
    /// A path outside every granted directory.
    OutsideGrants,
    /// A socket operation.
    Network,
}

fn expected_error(launcher: Launcher, denial: Denial) -> &'static str {
    match (launcher, denial) {
        (Launcher::Native, Denial::ReadOnly) => "Read-only file system (os error 30)",
        (Launcher::Native, Denial::UpAndOut | Denial::OutsideGrants) => {
            "No such file or directory (os error 2)"
        }
        (Launcher::Native, _) => "Permission denied (os error 13)",
        (Launcher::Wasm, Denial::InsideGrant | Denial::ReadOnly | Denial::UpAndOut) => {
            "Operation not permitted (os error 63)"
        }
        (Launcher::Wasm, Denial::OutsideGrants) => "No such file or directory (os error 44)",
        (Launcher::Wasm, Denial::Network) => "Permission denied (os error 2)",
    }
}

fn assert_denied(launcher: Launcher, denial: Denial, outcome: Result<String, String>, what: &str) {
    match outcome {
        Err(error) => assert_eq!(error, expected_error(launcher, denial), "{what}"),
        Ok(data) => panic!("{what} must be denied, but it worked: {data:?}"),
    }
}

async fn a_read_only_dir_reads_but_does_not_write(launcher: Launcher) {
    let tree = Tree::new();
    let session = connect(&probe(launcher, &tree, DirMode::Ro)).await;
    let read = attempt(
        &session,
        json!({"op": "read", "path": tree.inside(launcher, "hello.txt")}),
    )
    .await;
    assert_eq!(read.as_deref(), Ok("hello from data"));
    let write = attempt(
        &session,
        json!({"op": "write", "path": tree.inside(launcher, "new.txt")}),
    )
    .await;
    assert_denied(launcher, Denial::ReadOnly, write, "a write in a ro dir");
    assert!(!tree.host("data/new.txt").exists());
    session.close().await.unwrap();
}

async fn a_read_write_dir_writes(launcher: Launcher) {
    let tree = Tree::new();
    let session = connect(&probe(launcher, &tree, DirMode::Rw)).await;
    let write = attempt(
        &session,
        json!({"op": "write", "path": tree.inside(launcher, "new.txt")}),
    )
    .await;
    assert_eq!(write.as_deref(), Ok("written"));
    assert_eq!(
        std::fs::read_to_string(tree.host("data/new.txt")).unwrap(),
        "written by probe"
    );
    session.close().await.unwrap();
}

async fn every_way_out_of_a_granted_dir_is_denied(launcher: Launcher) {
    let tree = Tree::new();
    let session = connect(&probe(launcher, &tree, DirMode::Rw)).await;
    let secret = tree.host("secret.txt").display().to_string();
    let sibling = match launcher {
        Launcher::Wasm => "/data_evil/x.txt".to_owned(),
        Launcher::Native => tree.host("data_evil/x.txt").display().to_string(),
    };
    let ways_out = [
        (
            "../",
            tree.inside(launcher, "../secret.txt"),
            Denial::UpAndOut,
        ),
        ("an absolute path", secret.clone(), Denial::OutsideGrants),
        (
            "a link to /etc",
            tree.inside(launcher, "link/shadow"),
            Denial::InsideGrant,
        ),
        (
            "a sibling sharing the prefix",
            sibling.clone(),
            Denial::OutsideGrants,
        ),
    ];
    for (what, path, denial) in &ways_out {
        let read = attempt(&session, json!({"op": "read", "path": path})).await;
        assert_denied(
            launcher,
            *denial,
            read,
            &format!("reading through {what} ({path})"),
        );
    }
    let write = attempt(&session, json!({"op": "write", "path": sibling})).await;
    assert_denied(
        launcher,
        Denial::OutsideGrants,
        write,
        "writing into the sibling",
    );
    assert_eq!(
        std::fs::read_to_string(tree.host("data_evil/x.txt")).unwrap(),
        "evil"
    );
    session.close().await.unwrap();
}

/// A loopback server answering `pong` to every connection.
fn pong_server() -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut buf = [0u8; 5];
            let _ = stream.read(&mut buf);
            if &buf[..4] == b"quit" {
                return;
            }
            let _ = stream.write_all(b"pong");
        }
    });
    (port, handle)
}

fn stop(port: u16, handle: std::thread::JoinHandle<()>) {
    if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
        let _ = stream.write_all(b"quit\n");
    }
    let _ = handle.join();
}

async fn a_listed_port_connects_and_others_are_denied(launcher: Launcher) {
    let (listed, listed_server) = pong_server();
    let (unlisted, unlisted_server) = pong_server();
    let mut spec = spec(launcher, guests::PROBE);
    spec.net = vec![NetGrant {
        host: "127.0.0.1".into(),
        port: listed,
    }];
    if launcher == Launcher::Native {
        native_egress_goes_through_the_proxy_only(spec, listed, unlisted).await;
        stop(listed, listed_server);
        stop(unlisted, unlisted_server);
        return;
    }
    let session = connect(&spec).await;
    let ok = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.1:{listed}")}),
    )
    .await;
    assert_eq!(ok.as_deref(), Ok("pong"));
    let other_port = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.1:{unlisted}")}),
    )
    .await;
    assert_denied(launcher, Denial::Network, other_port, "an unlisted port");
    let other_host = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.2:{listed}")}),
    )
    .await;
    assert_denied(launcher, Denial::Network, other_host, "an unlisted host");
    session.close().await.unwrap();
    stop(listed, listed_server);
    stop(unlisted, unlisted_server);
}

/// Issue 13: a native server with `net` grants runs, under the default
/// `required` sandbox, in a network namespace whose only way out is Moat's
/// egress proxy: the listed host and port are reached through it, an
/// unlisted port or host (or the same address by another name) gets 403
/// from the proxy, and a direct connection reaches nothing.
async fn native_egress_goes_through_the_proxy_only(spec: ServerSpec, listed: u16, unlisted: u16) {
    assert_eq!(spec.sandbox, Sandbox::Required);
    let session = connect(&spec).await;
    let sandbox = session.shared().identity().unwrap().sandbox;
    assert!(
        sandbox.lines().iter().any(|l| l
            .starts_with("enforced: network namespace: out only through Moat's egress proxy")
            && l.contains(&format!("to 127.0.0.1:{listed} by the name asked for"))),
        "{sandbox:?}"
    );
    let through = attempt(
        &session,
        json!({"op": "proxy", "addr": format!("127.0.0.1:{listed}")}),
    )
    .await;
    assert_eq!(through.as_deref(), Ok("pong"));
    for refused in [
        format!("127.0.0.1:{unlisted}"),
        format!("127.0.0.2:{listed}"),
        format!("localhost:{listed}"),
    ] {
        let answer = attempt(&session, json!({"op": "proxy", "addr": refused})).await;
        assert_eq!(
            answer,
            Err(format!(
                "HTTP/1.1 403 Forbidden moat: {refused} is not in this server's net grants"
            ))
        );
    }
    let direct = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.1:{listed}")}),
    )
    .await;
    assert!(
        direct.is_err(),
        "a direct connection must reach nothing: {direct:?}"
    );
    session.close().await.unwrap();
}

async fn no_network_without_a_grant(launcher: Launcher) {
    let (port, server) = pong_server();
    let session = connect(&spec(launcher, guests::PROBE)).await;
    let outcome = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.1:{port}")}),
    )
    .await;
    assert_denied(
        launcher,
        Denial::Network,
        outcome,
        "a connect without any net grant",
    );
    let sandbox = session.shared().identity().unwrap().sandbox;
    assert!(
        sandbox
            .lines()
            .iter()
            .any(|l| l.starts_with("enforced: network")
                && (l.ends_with("none") || l.ends_with("no TCP connect or bind"))),
        "{sandbox:?}"
    );
    session.close().await.unwrap();
    stop(port, server);
}

/// The grant error behind a failed connect, from either launcher.
fn grant_error(error: ClientError) -> GrantError {
    match error {
        ClientError::Launch(LaunchError::Grant(error))
        | ClientError::Launch(LaunchError::Native(NativeError::Grant(error)))
        | ClientError::Launch(LaunchError::Wasm(WasmError::Grant(error))) => *error,
        other => panic!("not a grant error: {other:?}"),
    }
}

/// Issue 12, item 2: a native server with read-write on `data` replaces
/// `data/docs` with a link to /etc; another server granted read-only
/// `data/docs` must not start reading /etc.
async fn a_grant_swapped_for_a_link_by_another_server_is_refused(launcher: Launcher) {
    let tree = Tree::new();
    std::fs::create_dir(tree.host("data/docs")).unwrap();
    std::fs::write(tree.host("data/docs/readme"), "docs").unwrap();
    let mut reader = probe(launcher, &tree, DirMode::Ro);
    reader.dirs[0].host = tree.host("data/docs");
    let session = connect(&reader).await;
    session.close().await.unwrap();

    let writer = probe(Launcher::Native, &tree, DirMode::Rw);
    let session = connect(&writer).await;
    let swap = attempt(
        &session,
        json!({"op": "swap", "path": tree.host("data/docs").display().to_string(), "target": "/etc"}),
    )
    .await;
    assert_eq!(swap.as_deref(), Ok("swapped"));
    session.close().await.unwrap();

    let error = Host::new(Some(cache()))
        .unwrap()
        .connect(&reader)
        .await
        .err()
        .expect("a grant that is now a link must not start");
    match grant_error(error) {
        GrantError::Link { link, target, .. } => {
            assert_eq!(link, tree.host("data/docs"));
            assert_eq!(target, Path::new("/etc"));
        }
        other => panic!("{other}"),
    }
}

/// Under the lock a grant is pinned to the inode `moat lock` opened: a
/// directory replaced since (same path, other inode) is refused, and so is
/// a grant the lock does not list.
async fn under_the_lock_a_replaced_or_added_grant_is_refused(launcher: Launcher) {
    let tree = Tree::new();
    let spec = probe(launcher, &tree, DirMode::Ro);
    let host = Host::new(Some(cache())).unwrap();
    let locked = host.measure(&spec).await.unwrap();
    let data = tree.host("data").display().to_string();
    assert!(locked.grants.contains_key(&data), "{:?}", locked.grants);
    let mut lock = Lock {
        version: LOCK_VERSION,
        ..Lock::default()
    };
    lock.servers.insert(spec.name.clone(), locked);
    let locked_host = || {
        Host::new(Some(cache()))
            .unwrap()
            .with_lock(lock.clone(), tree.host("moat.lock"))
    };
    locked_host()
        .connect(&spec)
        .await
        .unwrap()
        .close()
        .await
        .unwrap();

    // Replaced by a directory of the same name and contents.
    std::fs::rename(tree.host("data"), tree.host("data.old")).unwrap();
    std::fs::create_dir(tree.host("data")).unwrap();
    std::fs::write(tree.host("data/hello.txt"), "hello from data").unwrap();
    let error = locked_host().connect(&spec).await.err().unwrap();
    match grant_error(error) {
        GrantError::Changed { path, .. } => assert_eq!(path, tree.host("data")),
        other => panic!("{other}"),
    }

    let mut added = spec.clone();
    added.dirs.push(DirGrant {
        host: tree.host("data_evil"),
        guest: "/evil".into(),
        mode: DirMode::Ro,
        inode: None,
    });
    match locked_host().connect(&added).await.err().unwrap() {
        ClientError::GrantNotLocked { path, .. } => {
            assert_eq!(path, tree.host("data_evil").display().to_string())
        }
        other => panic!("{other}"),
    }
}

/// Issue 12, item 1: a server granted Moat's cache directory (or anything
/// holding it, or the config, lock or audit log) is refused before it runs.
async fn a_grant_over_what_moat_keeps_is_refused(launcher: Launcher) {
    let tree = Tree::new();
    let own_cache = tree.host("data/cache");
    let host = Host::new(Some(own_cache.clone()))
        .unwrap()
        .protect("audit log", tree.host("audit.jsonl"));
    let mut spec = probe(launcher, &tree, DirMode::Rw);
    let error = host.connect(&spec).await.err().unwrap();
    match grant_error(error) {
        GrantError::Protected {
            what, protected, ..
        } => {
            assert_eq!(what, "compiled-component cache");
            assert_eq!(protected, own_cache);
        }
        other => panic!("{other}"),
    }
    spec.dirs[0].host = tree.root.path().to_owned();
    match grant_error(host.connect(&spec).await.err().unwrap()) {
        GrantError::Protected { what, .. } => assert!(
            what == "compiled-component cache" || what == "audit log",
            "{what}"
        ),
        other => panic!("{other}"),
    }
    // The grant alone, with the cache elsewhere, starts.
    spec.dirs[0].host = tree.host("data");
    Host::new(Some(cache()))
        .unwrap()
        .connect(&spec)
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
}

/// Behind the egress proxy, DNS is Moat's: /etc/resolv.conf points at
/// 127.0.0.1 in the server's namespace, where a name its `net` lists gets
/// the addresses Moat resolved at launch and any other name is refused, so
/// no query reaches a resolver. (The registry is the name: the only network
/// the tests use.)
#[tokio::test]
async fn native_dns_answers_the_listed_names_only() {
    let listed = "registry.npmjs.org";
    let mut spec = spec(Launcher::Native, guests::PROBE);
    spec.net = vec![NetGrant {
        host: listed.into(),
        port: 443,
    }];
    let session = connect(&spec).await;
    let sandbox = session.shared().identity().unwrap().sandbox;
    assert!(
        sandbox.lines().iter().any(|l| l.starts_with(
            "enforced: DNS: answered by Moat at 127.0.0.1:53 (resolv.conf covered, read-only), for registry.npmjs.org only"
        )),
        "{sandbox:?}"
    );
    let mut expected: Vec<String> = tokio::net::lookup_host((listed, 0))
        .await
        .unwrap()
        .map(|a| a.ip().to_string())
        .collect();
    expected.sort();
    let answer = attempt(
        &session,
        json!({"op": "resolve", "addr": format!("{listed}:443")}),
    )
    .await
    .unwrap();
    let mut found: Vec<String> = answer.split(',').map(str::to_owned).collect();
    found.sort();
    found.dedup();
    expected.dedup();
    assert_eq!(
        found, expected,
        "the listed name resolves to Moat's addresses"
    );
    let refused = attempt(&session, json!({"op": "resolve", "addr": "pypi.org:443"})).await;
    // REFUSED, which the C library reports as a temporary failure.
    assert_eq!(
        refused,
        Err(
            "failed to lookup address information: Temporary failure in name resolution".to_owned()
        )
    );
    let conf = attempt(&session, json!({"op": "read", "path": "/etc/resolv.conf"})).await;
    assert!(conf.unwrap().contains("nameserver 127.0.0.1"));
    let write = attempt(&session, json!({"op": "write", "path": "/etc/resolv.conf"})).await;
    assert!(write.is_err(), "{write:?}");
    session.close().await.unwrap();
}

/// A native server's private /tmp is writable, and Landlock follows a path
/// bound into it up through the mount point: a read-only grant under the
/// host's /tmp is bound read-only, so writing there fails (EROFS) and
/// nothing reaches the host, while an rw grant beside it still writes.
#[tokio::test]
async fn a_read_only_grant_under_tmp_stays_read_only_in_the_private_tmp() {
    let tree = Tree::in_dir("/tmp");
    let mut spec = probe(Launcher::Native, &tree, DirMode::Ro);
    std::fs::create_dir(tree.host("out")).unwrap();
    spec.dirs.push(DirGrant {
        host: tree.host("out"),
        guest: "/out".into(),
        mode: DirMode::Rw,
        inode: None,
    });
    let session = connect(&spec).await;
    let path = |p: &str| tree.host(p).display().to_string();
    let read = attempt(
        &session,
        json!({"op": "read", "path": path("data/hello.txt")}),
    )
    .await;
    assert_eq!(read.as_deref(), Ok("hello from data"));
    for target in ["data/new.txt", "data/hello.txt"] {
        let write = attempt(&session, json!({"op": "write", "path": path(target)})).await;
        assert_eq!(
            write,
            Err("Read-only file system (os error 30)".to_owned()),
            "{target}"
        );
    }
    assert!(!tree.host("data/new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(tree.host("data/hello.txt")).unwrap(),
        "hello from data"
    );
    let write = attempt(
        &session,
        json!({"op": "write", "path": path("out/new.txt")}),
    )
    .await;
    assert_eq!(write.as_deref(), Ok("written"));
    assert_eq!(
        std::fs::read_to_string(tree.host("out/new.txt")).unwrap(),
        "written by probe"
    );
    session.close().await.unwrap();
}

/// Issue 12, item 4: a wasm guest looks up only the names its `net` lists,
/// answered from the launch-time resolution: nothing else reaches a
/// resolver (DNS is no channel out), and a flood of lookups costs the host
/// nothing on its blocking pool.
#[tokio::test]
async fn a_wasm_guest_looks_up_only_the_names_net_lists() {
    let (port, server) = pong_server();
    let mut spec = spec(Launcher::Wasm, guests::PROBE);
    spec.net = vec![NetGrant {
        host: "localhost".into(),
        port,
    }];
    let session = connect(&spec).await;
    let listed = attempt(
        &session,
        json!({"op": "resolve", "addr": format!("localhost:{port}")}),
    )
    .await
    .unwrap();
    assert!(listed.split(',').any(|a| a == "127.0.0.1"), "{listed}");
    let connected = attempt(
        &session,
        json!({"op": "connect", "addr": format!("LocalHost.:{port}")}),
    )
    .await;
    assert_eq!(connected.as_deref(), Ok("pong"));
    session.close().await.unwrap();

    // Granted by address only: the name that /etc/hosts maps to that very
    // address is still not looked up.
    spec.net = vec![NetGrant {
        host: "127.0.0.1".into(),
        port,
    }];
    let session = connect(&spec).await;
    let neighbour = connect(&common::spec(Launcher::Wasm, guests::EVERYTHING)).await;
    let (flood, echoed) = tokio::join!(
        attempt(
            &session,
            json!({"op": "resolve", "addr": format!("localhost:{port}"), "count": 10_000}),
        ),
        neighbour.call_tool("echo", args(json!({"message": "still here"})))
    );
    assert_eq!(flood.unwrap_err(), "Permission denied (os error 2)");
    assert_eq!(text(&echoed.unwrap()), "still here");
    let literal = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.1:{port}")}),
    )
    .await;
    assert_eq!(literal.as_deref(), Ok("pong"));
    session.close().await.unwrap();
    neighbour.close().await.unwrap();
    stop(port, server);
}

/// A host service for many connections at once: each gets `pong` for each
/// line it sends and is held until its client closes it.
fn pong_many() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(b"pong").is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// Issue 32, item 2: native servers flooding Moat's egress proxy with
/// connections they hold spend Moat's descriptors (two each). Each server's
/// connections are bounded (`egress_connections_per_server`), each agent
/// session's (`..._per_session`) and the gateway's (`egress_connections`):
/// two flooding servers get the limit beyond their bound, a third server
/// still connects, and a connection beyond the session's or the gateway's
/// bound is refused naming it. The first session's flooder is the instance
/// the name check started: taken over, it counts against that session.
#[tokio::test]
async fn egress_connections_are_bounded_per_server_session_and_gateway() {
    use moat_host::config::{Config, ServeSettings};
    use moat_host::gateway::Gateway;
    use std::num::NonZeroUsize;
    let port = pong_many();
    let addr = format!("127.0.0.1:{port}");
    let server = |name: &str| {
        let mut spec = spec(Launcher::Native, guests::PROBE);
        spec.name = name.into();
        // Three processes: the gateway runs identical servers as one.
        spec.env.insert("PROBE".into(), name.into());
        spec.net = vec![NetGrant {
            host: "127.0.0.1".into(),
            port,
        }];
        (name.to_owned(), spec)
    };
    let config = Config {
        path: "moat.toml".into(),
        servers: [server("flood_a"), server("flood_b"), server("third")].into(),
        serve: ServeSettings {
            egress_connections: NonZeroUsize::new(13).unwrap(),
            egress_connections_per_session: NonZeroUsize::new(10).unwrap(),
            egress_connections_per_server: NonZeroUsize::new(4).unwrap(),
            ..Default::default()
        },
        wasm: Default::default(),
    };
    let gateway = Gateway::new(Host::new(Some(cache())).unwrap(), config, None);
    gateway.check_names().await;
    let hold = |session: &moat_host::gateway::AgentSession, server: &str, count: u64| {
        let session = session.clone();
        let tool = format!("{server}__attack");
        let arguments = args(json!({"op": "hold", "addr": addr, "count": count}));
        async move {
            let result = session.call(&tool, arguments).await.unwrap();
            let report: serde_json::Value = serde_json::from_str(&text(&result)).unwrap();
            match report["ok"].as_bool() {
                Some(true) => Ok(report["data"].as_str().unwrap().to_owned()),
                _ => Err(report["error"].as_str().unwrap().to_owned()),
            }
        }
    };
    let refused = |held: usize, limit: &str| {
        Err(format!(
            "held {held}, then: HTTP/1.1 503 Service Unavailable moat: egress connection limit ({limit}) reached"
        ))
    };
    let first = gateway.session();
    assert_eq!(hold(&first, "flood_a", 6).await, refused(4, "4 per server"));
    assert_eq!(hold(&first, "flood_b", 6).await, refused(4, "4 per server"));
    // The flooders hold 8: a third server of the same session connects.
    assert_eq!(hold(&first, "third", 1).await, Ok("held 1".to_owned()));
    assert_eq!(hold(&first, "third", 2).await, refused(1, "10 per session"));
    // Another session's servers have a share of their own, up to the
    // gateway's bound.
    let second = gateway.session();
    assert_eq!(
        hold(&second, "flood_a", 6).await,
        refused(3, "13 per gateway")
    );
    // Moat survives and still serves: the flooders' connections go with
    // their sessions.
    for session in [first, second] {
        assert!(session.close().await.is_empty());
    }
    assert!(gateway.close_all().await.is_empty());
}

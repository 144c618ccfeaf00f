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
use moat_host::{ConnectError, Host, LaunchError, ServerSpec, Session};
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

/// Issue 13, and issue 33 item 5: a native server with `net` grants runs,
/// under the default `required` sandbox, in a network namespace whose only
/// ways out are Moat's: the listed host and port are reached through the
/// proxy and directly (Moat's relay listens there inside); an unlisted port
/// or host (or the same address by another name) gets 403 from the proxy,
/// and directly it is refused at once or has no route.
async fn native_egress_goes_through_the_proxy_only(spec: ServerSpec, listed: u16, unlisted: u16) {
    assert_eq!(spec.sandbox, Sandbox::Required);
    let session = connect(&spec).await;
    let sandbox = session.identity().unwrap().sandbox;
    assert!(
        sandbox.lines().iter().any(|l| l
            .starts_with(&format!("enforced: network namespace: out only through Moat, to 127.0.0.1:{listed} at the addresses resolved at launch: relayed transparently (127.0.0.1:{listed}), and through the proxy at 127.0.0.1:3128"))),
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
    assert_eq!(
        direct.as_deref(),
        Ok("pong"),
        "the relay reaches the listed port"
    );
    // An unlisted port: Landlock's TCP rule refuses the connect (EACCES;
    // on a kernel without Landlock's TCP rules, nothing listens there).
    let direct = attempt(
        &session,
        json!({"op": "connect", "addr": format!("127.0.0.1:{unlisted}")}),
    )
    .await
    .unwrap_err();
    assert!(
        [
            "Permission denied (os error 13)",
            "Connection refused (os error 111)"
        ]
        .contains(&direct.as_str()),
        "{direct}"
    );
    for (unlisted, error) in [
        (
            format!("127.0.0.2:{listed}"),
            "Connection refused (os error 111)",
        ),
        (
            format!("192.0.2.7:{listed}"),
            "Network is unreachable (os error 101)",
        ),
    ] {
        let direct = attempt(&session, json!({"op": "connect", "addr": unlisted})).await;
        assert_eq!(direct, Err(error.to_owned()), "{unlisted}");
    }
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
    let sandbox = session.identity().unwrap().sandbox;
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
fn grant_error(error: ConnectError) -> GrantError {
    match error {
        ConnectError::Launch(LaunchError::Grant(error))
        | ConnectError::Launch(LaunchError::Native(NativeError::Grant(error)))
        | ConnectError::Launch(LaunchError::Wasm(WasmError::Grant(error))) => *error,
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
        ConnectError::GrantNotLocked { path, .. } => {
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

/// Behind Moat's egress, DNS is Moat's: /etc/resolv.conf points at
/// 127.0.0.1 in the server's namespace, where a name its `net` lists gets
/// its relay address inside the namespace and any other name is NXDOMAIN,
/// so no query reaches a resolver; the refusal is told to the observer
/// (the gateway's writes it to the audit log).
#[tokio::test]
async fn native_dns_answers_the_listed_names_only() {
    let listed = "registry.npmjs.org";
    let mut spec = spec(Launcher::Native, guests::PROBE);
    spec.net = vec![NetGrant {
        host: listed.into(),
        port: 443,
    }];
    let refusals = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = refusals.clone();
    let host = common::host().with_egress(
        moat_host::egress::Shares::default()
            .with_lookup(moat_host::egress::Lookup::new(|_name: String| async {
                Ok(vec!["93.184.215.14".parse().unwrap()])
            }))
            .observe(moat_host::egress::Observer::new(move |refusal| {
                seen.lock().unwrap().push(refusal)
            })),
    );
    let session = host.connect(&spec).await.unwrap();
    let sandbox = session.identity().unwrap().sandbox;
    assert!(
        sandbox.lines().iter().any(|l| l.starts_with(
            "enforced: DNS: answered by Moat at 127.0.0.1:53 (resolv.conf covered, read-only), for registry.npmjs.org only (each with its relay address); any other name is NXDOMAIN"
        )),
        "{sandbox:?}"
    );
    let answer = attempt(
        &session,
        json!({"op": "resolve", "addr": format!("{listed}:443")}),
    )
    .await;
    assert_eq!(
        answer.as_deref(),
        Ok("127.100.0.1"),
        "the listed name resolves to its relay"
    );
    let refused = attempt(&session, json!({"op": "resolve", "addr": "pypi.org:443"})).await;
    assert!(
        refusals
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.destination == "pypi.org"
                && r.reason == "not in this server's net grants (DNS answered NXDOMAIN)"),
        "{refusals:?}"
    );
    // NXDOMAIN: no such name, at once.
    assert_eq!(
        refused,
        Err("failed to lookup address information: Name or service not known".to_owned())
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

/// A loopback service at `address`: answers every HTTP request with `body`.
fn http_service(address: &str, body: &'static str) -> u16 {
    let listener = TcpListener::bind(address).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

/// A loopback service that speaks just enough of PostgreSQL's protocol to
/// turn every client away with `FATAL: granted postgres reached` (no
/// server to install: the client's own message proves where it got).
fn postgres_service() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                loop {
                    let mut length = [0u8; 4];
                    if stream.read_exact(&mut length).is_err() {
                        return;
                    }
                    let length = u32::from_be_bytes(length) as usize;
                    let mut rest = vec![0u8; length.saturating_sub(4).min(1 << 16)];
                    if stream.read_exact(&mut rest).is_err() {
                        return;
                    }
                    let code = rest
                        .get(..4)
                        .map(|c| u32::from_be_bytes(c.try_into().unwrap()));
                    // SSLRequest and GSSENCRequest: "not here", then the
                    // startup message follows.
                    if matches!(code, Some(80_877_103 | 80_877_104)) {
                        let _ = stream.write_all(b"N");
                        continue;
                    }
                    let mut fields = Vec::new();
                    for (kind, value) in [
                        (b'S', "FATAL"),
                        (b'V', "FATAL"),
                        (b'C', "28000"),
                        (b'M', "granted postgres reached"),
                    ] {
                        fields.push(kind);
                        fields.extend_from_slice(value.as_bytes());
                        fields.push(0);
                    }
                    fields.push(0);
                    let mut message = vec![b'E'];
                    message.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
                    message.extend_from_slice(&fields);
                    let _ = stream.write_all(&message);
                    return;
                }
            });
        }
    });
    port
}

/// A Go program that GETs its argument with net/http and prints the body.
fn go_client() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("egress-go");
    let binary = dir.join("goget");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("goget.go");
    std::fs::write(
        &source,
        "package main\n\nimport (\n\t\"fmt\"\n\t\"io\"\n\t\"net/http\"\n\t\"os\"\n)\n\nfunc main() {\n\tresponse, err := http.Get(os.Args[1])\n\tif err != nil {\n\t\tfmt.Fprintln(os.Stderr, err)\n\t\tos.Exit(1)\n\t}\n\tbody, _ := io.ReadAll(response.Body)\n\tfmt.Print(string(body))\n}\n",
    )
    .unwrap();
    let built = std::process::Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(&source)
        .env("GOCACHE", dir.join("cache"))
        .env("GOPATH", dir.join("gopath"))
        .env("GO111MODULE", "off")
        .env("CGO_ENABLED", "0")
        .output()
        .expect("go (run `bash tests/setup.sh`, which installs it)");
    assert!(
        built.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    binary
}

/// Issue 33 item 5: egress works for any client. Inside the server's
/// namespace a `net` grant is reached directly, as anywhere: Node's
/// `fetch` (which ignores HTTP_PROXY), Python's requests and httpx, Go's
/// net/http, curl (direct and through the proxy) and a PostgreSQL client
/// each reach the granted loopback service and are refused an ungranted
/// one at once; an ungranted name is NXDOMAIN, and told to the observer.
/// A name is looked up once, at launch: re-pointed afterwards (to another
/// granted address), it still reaches the launch-time address only.
#[tokio::test]
async fn native_egress_is_transparent_to_every_client() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let py_egress = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/py-egress");
    let py_egress = std::fs::canonicalize(&py_egress)
        .unwrap_or_else(|_| panic!("{}: run `bash tests/setup.sh`", py_egress.display()));
    let go = go_client();
    let granted = http_service("127.0.0.1:0", "granted service A");
    // Service B: the same port on another loopback address.
    let other = TcpListener::bind(("127.0.0.2", granted));
    let repointed = match other {
        Ok(listener) => {
            drop(listener);
            http_service(
                &format!("127.0.0.2:{granted}"),
                "service B, where the name points later",
            )
        }
        Err(error) => panic!("binding 127.0.0.2:{granted}: {error}"),
    };
    assert_eq!(repointed, granted);
    let ungranted = http_service("127.0.0.1:0", "ungranted service");
    let postgres = postgres_service();

    let mut spec = spec(Launcher::Native, guests::PROBE);
    spec.net = [
        ("127.0.0.1", granted),
        ("127.0.0.2", granted),
        ("127.0.0.1", postgres),
        ("svc.test", granted),
        // An address outside 127/8: made an alias of the namespace's lo.
        ("10.255.255.1", granted),
    ]
    .into_iter()
    .map(|(host, port)| NetGrant {
        host: host.into(),
        port,
    })
    .collect();
    spec.dirs = vec![
        DirGrant {
            host: py_egress.clone(),
            guest: py_egress.display().to_string(),
            mode: DirMode::Ro,
            inode: None,
        },
        DirGrant {
            host: go.parent().unwrap().to_path_buf(),
            guest: go.parent().unwrap().display().to_string(),
            mode: DirMode::Ro,
            inode: None,
        },
    ];
    spec.env
        .insert("PYTHONPATH".into(), py_egress.display().to_string());
    let launched = Arc::new(AtomicBool::new(false));
    let flag = launched.clone();
    let refusals = Arc::new(Mutex::new(Vec::new()));
    let seen = refusals.clone();
    let host = common::host().with_egress(
        moat_host::egress::Shares::default()
            .with_lookup(moat_host::egress::Lookup::new(move |name: String| {
                // At launch svc.test is 127.0.0.1; asked again, 127.0.0.2.
                let later = flag.swap(true, Ordering::SeqCst);
                async move {
                    assert_eq!(name, "svc.test");
                    Ok(vec![
                        if later { "127.0.0.2" } else { "127.0.0.1" }
                            .parse()
                            .unwrap(),
                    ])
                }
            }))
            .observe(moat_host::egress::Observer::new(move |refusal| {
                seen.lock().unwrap().push(refusal)
            })),
    );
    let session = host.connect(&spec).await.unwrap();
    let exec = |argv: Vec<String>| {
        let session = &session;
        async move { attempt(session, json!({"op": "exec", "argv": argv})).await }
    };
    let url = |port: u16| format!("http://127.0.0.1:{port}/");
    let node = |url: String| {
        vec![
            "node".to_owned(),
            "-e".to_owned(),
            format!(
                "fetch({url:?}).then(r => r.text()).then(t => console.log(t), e => {{ console.error(e.cause?.code ?? e.message); process.exit(1); }})"
            ),
        ]
    };
    let python = |library: &str, url: String| {
        let get = match library {
            "requests" => format!("import requests; print(requests.get({url:?}, timeout=10).text)"),
            _ => format!("import httpx; print(httpx.get({url:?}, timeout=10).text)"),
        };
        vec!["/usr/bin/python3".to_owned(), "-c".to_owned(), get]
    };
    let curl = |url: String, direct: bool| {
        let mut argv = vec![
            "curl".to_owned(),
            "-sS".to_owned(),
            "--max-time".to_owned(),
            "10".to_owned(),
        ];
        if direct {
            argv.extend(["--noproxy".to_owned(), "*".to_owned()]);
        }
        argv.push(url);
        argv
    };
    let go_path = go.display().to_string();
    let go_get = move |url: String| vec![go_path.clone(), url];
    type Argv<'a> = Box<dyn Fn(String) -> Vec<String> + 'a>;
    let clients: Vec<(&str, Argv)> = vec![
        ("node fetch", Box::new(node)),
        ("python requests", Box::new(move |u| python("requests", u))),
        ("python httpx", Box::new(move |u| python("httpx", u))),
        ("go net/http", Box::new(go_get)),
        ("curl, direct", Box::new(move |u| curl(u, true))),
        ("curl, through the proxy", Box::new(move |u| curl(u, false))),
    ];
    for (client, argv) in &clients {
        let reached = exec(argv(url(granted))).await;
        assert_eq!(reached.as_deref(), Ok("granted service A"), "{client}");
        // Refused: an error, or (a client that reads a 403 as an answer)
        // the proxy's refusal.
        let error = match exec(argv(url(ungranted))).await {
            Ok(text) | Err(text) => text,
        };
        assert!(
            !error.contains("ungranted service"),
            "{client} reached an ungranted service: {error}"
        );
        assert!(
            [
                "ECONNREFUSED",
                "Connection refused",
                "connection refused",
                "EACCES",
                "Permission denied",
                "permission denied",
                "403",
                "is not in this server's net grants",
                "Couldn't connect to server"
            ]
            .iter()
            .any(|needle| error.contains(needle)),
            "{client}: {error}"
        );
    }
    let psql = |port: u16| {
        vec![
            "psql".to_owned(),
            format!(
                "host=127.0.0.1 port={port} user=moat dbname=moat connect_timeout=10 sslmode=disable"
            ),
            "-c".to_owned(),
            "select 1".to_owned(),
        ]
    };
    let reached = exec(psql(postgres)).await.unwrap_err();
    assert!(
        reached.contains("FATAL:  granted postgres reached"),
        "{reached}"
    );
    let refused = exec(psql(ungranted)).await.unwrap_err();
    assert!(
        refused.contains("Connection refused") || refused.contains("Permission denied"),
        "{refused}"
    );

    // 10.255.255.1 is the namespace's own (an alias of lo, where Moat's
    // relay listens on the granted port): another port there is refused at
    // once, where without the alias it would have no route.
    let alias = attempt(
        &session,
        json!({"op": "connect", "addr": format!("10.255.255.1:{postgres}")}),
    )
    .await;
    assert_eq!(alias, Err("Connection refused (os error 111)".to_owned()));

    // The name: pinned at launch, whatever it resolves to later.
    for argv in [
        curl(format!("http://svc.test:{granted}/"), true),
        node(format!("http://svc.test:{granted}/")),
    ] {
        assert_eq!(exec(argv).await.as_deref(), Ok("granted service A"));
    }
    assert!(launched.load(Ordering::SeqCst), "svc.test was looked up");
    let unlisted = exec(curl(format!("http://other.test:{granted}/"), true))
        .await
        .unwrap_err();
    assert!(
        unlisted.contains("Could not resolve host: other.test"),
        "{unlisted}"
    );
    assert!(
        refusals
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.server == "probe" && r.destination == "other.test"),
        "{refusals:?}"
    );
    session.close().await.unwrap();

    // A new launch looks the name up again: now it is service B's.
    let session = host.connect(&spec).await.unwrap();
    let later = attempt(
        &session,
        json!({"op": "exec", "argv": curl(format!("http://svc.test:{granted}/"), true)}),
    )
    .await;
    assert_eq!(
        later.as_deref(),
        Ok("service B, where the name points later")
    );
    session.close().await.unwrap();
}

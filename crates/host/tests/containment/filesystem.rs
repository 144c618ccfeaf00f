//! The hostile server against the filesystem: a private /tmp that goes with
//! it (a grant under the host's /tmp still reached through it), no reach to
//! Moat's audit key through an implicit install root, and no host name
//! outside its own root.

use super::*;

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

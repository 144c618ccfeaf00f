//! Grants checked at launch: one swapped for a link by another server, one
//! replaced or added under the lock, and one over what Moat keeps are
//! refused.

use super::*;

both_launchers!(
    a_grant_swapped_for_a_link_by_another_server_is_refused,
    under_the_lock_a_replaced_or_added_grant_is_refused,
    a_grant_over_what_moat_keeps_is_refused,
);

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

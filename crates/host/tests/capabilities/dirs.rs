//! Directory grants on both launchers: read-only reads but does not write,
//! read-write writes, every way out of a granted directory is denied, and a
//! read-only grant under /tmp stays read-only in a native server's private
//! /tmp.

use super::*;

both_launchers!(
    a_read_only_dir_reads_but_does_not_write,
    a_read_write_dir_writes,
    every_way_out_of_a_granted_dir_is_denied,
);

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

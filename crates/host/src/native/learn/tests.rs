use std::path::{Path, PathBuf};

use super::*;

fn used(read: bool, written: bool, denied: bool, unwritten: bool) -> Use {
    Use {
        read,
        written,
        denied,
        unwritten,
    }
}

fn granted(site: &Path) -> Granted<'static> {
    Granted {
        executable: Path::new("/usr/bin/node"),
        measure: &[],
        dirs: &[],
        protected: vec![PathBuf::from("/srv/moat-learn-test/state")],
        package_paths: vec![site.to_owned()],
        roots: Vec::new(),
        home: Some(PathBuf::from("/home/someone")),
    }
}

#[test]
fn files_are_grouped_by_package_root_and_granted_read_only_unless_written() {
    // Names only: propose looks at the filesystem only for a bare
    // directory, which none of these is.
    let root = PathBuf::from("/srv/moat-learn-test");
    let modules = root.join("app/node_modules");
    let site = root.join("py");
    let data = root.join("data");
    let mut observed = Observed::default();
    for (path, how) in [
        (
            modules.join("a/dist/index.js"),
            used(true, false, false, false),
        ),
        (modules.join("b/index.js"), used(true, false, false, false)),
        (
            site.join("mcp/__init__.py"),
            used(true, false, false, false),
        ),
        (data.join("out.txt"), used(false, true, false, false)),
        (
            PathBuf::from("/usr/lib/x.so"),
            used(true, false, false, false),
        ),
        (PathBuf::from("/etc/hosts"), used(true, false, false, false)),
        (
            PathBuf::from("/tmp/scratch"),
            used(false, true, false, false),
        ),
        (PathBuf::from("/dev/null"), used(true, true, false, false)),
        (
            PathBuf::from("/sys/fs/cgroup/cpu.max"),
            used(true, false, false, false),
        ),
    ] {
        observed.files.insert(path, how);
    }
    observed.connects.insert("127.0.0.1:8080".into());
    let proposal = propose(&observed, &granted(&site));
    assert_eq!(
        proposal.dirs,
        [(modules, false), (data, true), (site, false)]
    );
    assert!(proposal.confirm.is_empty() && proposal.refused.is_empty());
    assert_eq!(proposal.net, ["127.0.0.1:8080"]);
    assert_eq!(proposal.probes, [PathBuf::from("/sys/fs/cgroup/cpu.max")]);
}

#[test]
fn a_write_that_did_not_happen_is_only_to_confirm_and_system_writes_are_refused() {
    let root = PathBuf::from("/srv/moat-learn-test");
    let site = root.join("py");
    let mut observed = Observed::default();
    for (path, how) in [
        // Opened for writing, nothing written, also read: `ro`, and rw
        // to confirm.
        (
            root.join("cfg/settings.json"),
            used(true, false, false, true),
        ),
        // A write refused: to confirm only.
        (root.join("out/result.txt"), used(false, false, true, false)),
        // Written inside a read-only grant: its own rw grant.
        (root.join("cfg/cache/x"), used(false, true, false, false)),
        // System directories: refused, whatever happened.
        (
            PathBuf::from("/etc/moat-marker"),
            used(false, false, true, false),
        ),
        (
            PathBuf::from("/usr/bin/env"),
            used(true, false, false, true),
        ),
        (
            PathBuf::from("/var/lib/app/db"),
            used(false, true, false, false),
        ),
        (PathBuf::from("/var/x"), used(true, false, false, false)),
        (
            PathBuf::from("/home/someone/notes.txt"),
            used(false, false, true, false),
        ),
        (
            PathBuf::from("/home/someone/proj/a.txt"),
            used(true, false, false, false),
        ),
        (
            root.join("state/moat.lock"),
            used(false, true, false, false),
        ),
    ] {
        observed.files.insert(path, how);
    }
    let proposal = propose(&observed, &granted(&site));
    assert_eq!(
        proposal.dirs,
        [
            (PathBuf::from("/home/someone/proj"), false),
            (root.join("cfg"), false),
            (root.join("cfg/cache"), true),
            (PathBuf::from("/var/lib/app"), true),
        ]
    );
    assert_eq!(
        proposal.confirm,
        [
            (root.join("cfg"), used(true, false, false, true)),
            (root.join("out"), used(false, false, true, false)),
        ]
    );
    let refused: Vec<&Path> = proposal
        .refused
        .iter()
        .map(|(p, _, _)| p.as_path())
        .collect();
    assert_eq!(
        refused,
        [
            Path::new("/etc"),
            Path::new("/home/someone"),
            Path::new("/usr/bin"),
            Path::new("/var"),
        ]
    );
    assert!(proposal.refused[0].2.starts_with("in a system directory"));
    assert!(proposal.refused[2].2.starts_with("in a system directory"));
    assert_eq!(
        proposal.withheld,
        [(root.join("state"), root.join("state"))]
    );
}

use std::os::fd::BorrowedFd;
use std::path::Path;

use super::landlock::{kernel_abi, plan_for_abi};
use super::learn::learn_plan_for_abi;
use super::start::etc_grants;
use super::*;
use crate::grants::NetGrant;

fn grants<'a>(fd: BorrowedFd<'a>, net: &'a [NetGrant], sandbox: Sandbox) -> Grants<'a> {
    static ROOTS: ImplicitRoots = ImplicitRoots {
        granted: Vec::new(),
        held_back: Vec::new(),
    };
    Grants {
        executable: fd,
        executable_path: Path::new("/bin/sh"),
        interpreter: None,
        roots: &ROOTS,
        proxy_port: None,
        measure: &[],
        dirs: &[],
        net,
        sandbox,
    }
}

#[test]
fn a_required_sandbox_names_the_missing_kernel_feature() {
    let file = std::fs::File::open("/bin/sh").unwrap();
    let fd = std::os::fd::AsFd::as_fd(&file);
    match plan_for_abi(&grants(fd, &[], Sandbox::Required), 0) {
        Err(SandboxError::Unsupported { feature }) => {
            assert!(feature.starts_with("Landlock (Linux 5.13+"), "{feature}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    match plan_for_abi(&grants(fd, &[], Sandbox::Required), 3) {
        Err(SandboxError::Unsupported { feature }) => {
            assert_eq!(feature, "Landlock ABI 4 (Linux 6.7) for TCP rules")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn best_effort_records_what_was_not_enforced() {
    let file = std::fs::File::open("/bin/sh").unwrap();
    let fd = std::os::fd::AsFd::as_fd(&file);
    let plan = plan_for_abi(&grants(fd, &[], Sandbox::BestEffort), 0).unwrap();
    assert!(plan.ruleset.is_none());
    assert!(plan.enforced.is_empty());
    assert_eq!(plan.not_enforced.len(), 1);
    assert!(plan.not_enforced[0].starts_with("Landlock (Linux 5.13+"));
}

#[test]
fn a_required_learn_run_needs_landlock_and_says_what_it_may_write() {
    let learn = |sandbox| LearnGrants {
        dirs: &[],
        writable: &[],
        scratch: None,
        sandbox,
    };
    match learn_plan_for_abi(&learn(Sandbox::Required), 0) {
        Err(SandboxError::Unsupported { feature }) => {
            assert!(
                feature.contains("`moat learn` run could write"),
                "{feature}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    if kernel_abi() >= 1 {
        let plan = learn_plan(&learn(Sandbox::Required)).unwrap();
        assert!(plan.ruleset.is_some());
        assert!(
                plan.enforced.iter().any(|line| line.ends_with(
                    "reads and executes anything; writes only its private /tmp, /dev/null: a write anywhere else fails with EACCES and is recorded, not done"
                )),
                "{:?}",
                plan.enforced
            );
    }
}

#[test]
fn etc_grants_leave_the_secrets_out() {
    let mut paths = Vec::new();
    etc_grants(Path::new("/etc"), "", &mut paths);
    assert!(!paths.iter().any(|p| p == Path::new("/etc/shadow")));
    assert!(!paths.iter().any(|p| p.starts_with("/etc/ssl/private")));
    if Path::new("/etc/ssl/openssl.cnf").exists() {
        assert!(paths.iter().any(|p| p == Path::new("/etc/ssl/openssl.cnf")));
    }
}

/// Issue 32, item 1: the root a `~/.local/bin` console script would
/// have brought (`~/.local`, holding Moat's state and data) is never
/// granted; the interpreter's own site directory is, and nothing of
/// Moat's. A pipx venv is granted whole; `$HOME` and a root holding a
/// protected path never are.
#[test]
fn implicit_roots_keep_clear_of_home_local_and_moats_directories() {
    let home = tempfile::tempdir().unwrap();
    let home = std::fs::canonicalize(home.path()).unwrap();
    let local = home.join(".local");
    for dir in [
        "bin",
        "lib/python3.12/site-packages",
        "lib/python3.11/site-packages",
        "lib/other",
        "share/moat/store",
        "state/moat",
        "share/pipx/venvs/tool/bin",
        "share/pipx/venvs/tool/lib/python3.12/site-packages",
    ] {
        std::fs::create_dir_all(local.join(dir)).unwrap();
    }
    std::fs::write(local.join("state/moat/audit.key"), "k").unwrap();
    let state = local.join("state/moat");
    let kept = crate::grants::Kept::new(
        &[
            crate::grants::Protected {
                what: crate::grants::STATE_DIR,
                path: state.clone(),
            },
            crate::grants::Protected {
                what: crate::grants::DATA_DIR,
                path: local.join("share/moat"),
            },
        ],
        Some(home.clone()),
    );
    let script = local.join("bin/server");
    // A pip --user script run by python3.12: its own site directory.
    let roots = implicit_roots(&script, Some(Path::new("/usr/bin/python3.12")), &kept);
    assert_eq!(roots.granted, [local.join("lib/python3.12")]);
    assert_eq!(roots.held_back.len(), 1, "{roots:?}");
    assert!(
        roots.held_back[0].starts_with(&format!(
            "not granted: the installation root {} of {}",
            local.display(),
            script.display()
        )) && roots.held_back[0].contains("as a whole"),
        "{}",
        roots.held_back[0]
    );
    // Run by an unversioned python3: every version's, nothing else.
    let roots = implicit_roots(&script, Some(Path::new("/usr/bin/python3")), &kept);
    assert_eq!(
        roots.granted,
        [local.join("lib/python3.11"), local.join("lib/python3.12")]
    );
    // A binary that is not Python's: nothing instead, and said.
    let roots = implicit_roots(&script, None, &kept);
    assert!(roots.granted.is_empty(), "{roots:?}");
    assert!(roots.held_back[0].contains("nothing granted instead"));
    // A pipx venv is granted whole.
    let venv = local.join("share/pipx/venvs/tool");
    let roots = implicit_roots(
        &venv.join("bin/tool"),
        Some(&venv.join("bin/python")),
        &kept,
    );
    assert_eq!(roots.granted, [venv]);
    assert!(roots.held_back.is_empty());
    // The home directory itself, and a root holding Moat's state.
    std::fs::create_dir_all(home.join("bin")).unwrap();
    std::fs::create_dir_all(home.join("lib")).unwrap();
    let roots = implicit_roots(&home.join("bin/x"), None, &kept);
    assert!(roots.granted.is_empty());
    assert!(
        roots.held_back[0].contains("it is the home directory"),
        "{roots:?}"
    );
    let other = crate::grants::Kept::new(
        &[crate::grants::Protected {
            what: crate::grants::STATE_DIR,
            path: state,
        }],
        None,
    );
    let roots = implicit_roots(&script, None, &other);
    assert!(roots.granted.is_empty());
    assert!(
        roots.held_back[0].contains("it holds Moat's state directory (the audit key)"),
        "{roots:?}"
    );
    // Inside what holds a key: refused too.
    assert!(
        other
            .refusal(&local.join("state/moat/sub"))
            .is_some_and(|why| why.contains("lies inside"))
    );
    // Inside the store (not a key): a package's venv may be granted.
    assert_eq!(kept.refusal(&local.join("share/moat/store/x")), None);
}

//! What a learn run's record proposes: grants grouped by package root,
//! `rw` only where something was written, and what is never proposed
//! ([`refusal`]), with why.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{Observed, Use};

/// Directories no learn proposal grants `rw`, nor anything inside them:
/// the system's own files and devices (a server writing there is changing
/// the host, not keeping its own data). Any grant of one of them itself is
/// refused too.
pub const SYSTEM_TREES: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc",
    "/sbin", "/sys", "/usr",
];

/// Directories never proposed themselves, in any mode (what lies inside
/// them may be): each holds far more than one server's files.
pub const TOO_BROAD: &[&str] = &[
    "/", "/home", "/media", "/mnt", "/root", "/run", "/srv", "/tmp", "/var",
];

/// Why a grant of `path` (read-write when `write`) is never proposed,
/// or `None` when it may be. `home` is the user's home directory.
pub fn refusal(path: &Path, write: bool, home: Option<&Path>) -> Option<&'static str> {
    if write && SYSTEM_TREES.iter().any(|dir| path.starts_with(dir)) {
        return Some(
            "in a system directory: a server writing there changes the host, not its own data",
        );
    }
    if SYSTEM_TREES.iter().any(|dir| path == Path::new(dir)) {
        return Some(
            "a system directory itself: far wider than what the server used (grant the file or subdirectory it needs)",
        );
    }
    if TOO_BROAD.iter().any(|dir| path == Path::new(dir)) {
        return Some(
            "a top-level directory: it holds far more than the server's own files (grant the subdirectory it needs)",
        );
    }
    if home.is_some_and(|home| home.starts_with(path)) {
        return Some(
            "the home directory, or a directory holding it: every file of the user's (grant the subdirectory it needs)",
        );
    }
    None
}

/// Grants that would let the server do what it did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Proposal {
    /// Directories to grant, and whether to grant them read-write (only
    /// where something was written).
    pub dirs: Vec<(PathBuf, bool)>,
    /// Directories where it tried to write and did not: not proposed as
    /// `rw`, only suggested for the user to confirm, with how it went.
    pub confirm: Vec<(PathBuf, Use)>,
    /// Grants not proposed, whatever the server did, and why (see
    /// [`refusal`]), with how it used the path.
    pub refused: Vec<(PathBuf, Use, &'static str)>,
    /// `net` entries.
    pub net: Vec<String>,
    /// Unix sockets it tried to reach, which no grant opens.
    pub unix: Vec<PathBuf>,
    /// What it read under /sys (runtimes probe cgroup limits and CPU
    /// topology there and carry on without them): not proposed, only shown.
    pub probes: Vec<PathBuf>,
    /// Paths it used that would overlap what Moat keeps from servers (its
    /// config, lock, cache or audit log), with what they would overlap: not
    /// proposed, since such a grant is refused.
    pub withheld: Vec<(PathBuf, PathBuf)>,
}

/// What the server a launch describes already has without asking.
pub struct Granted<'a> {
    pub executable: &'a Path,
    pub measure: &'a [PathBuf],
    pub dirs: &'a [crate::grants::DirGrant],
    /// Package roots named in its environment (`PYTHONPATH`, `NODE_PATH`).
    pub package_paths: Vec<PathBuf>,
    /// What no grant may overlap.
    pub protected: Vec<PathBuf>,
    /// The installation roots granted without listing.
    pub roots: Vec<PathBuf>,
    /// The user's home directory, never proposed itself.
    pub home: Option<PathBuf>,
}

/// Turns what a watched run saw into grants (see the module's docs).
pub fn propose(observed: &Observed, granted: &Granted<'_>) -> Proposal {
    let covered = |path: &Path, write: bool| {
        crate::sandbox::granted_to_start(path, granted.executable, &granted.roots) && !write
            || path == Path::new("/dev/null")
            // What it writes under /tmp lands in its private /tmp; what it
            // reads there of the host's must be granted.
            || (path.starts_with("/tmp") && write)
            || path.starts_with("/proc")
            || granted
                .measure
                .iter()
                .any(|m| path.starts_with(m) && !write)
            || granted.dirs.iter().any(|d| {
                path.starts_with(&d.host) && (!write || d.mode == crate::grants::DirMode::Rw)
            })
    };
    let mut anchors: BTreeMap<PathBuf, Use> = BTreeMap::new();
    let mut probes = Vec::new();
    for (path, how) in &observed.files {
        // What a grant already covers of it, read or write, is left out.
        let mut how = *how;
        if how.read && covered(path, false) {
            how.read = false;
        }
        if how.wants_write() && covered(path, true) {
            how = Use {
                read: how.read,
                ..Use::default()
            };
        }
        if how == Use::default() {
            continue;
        }
        let write = how.wants_write();
        if path.starts_with("/sys") && !write {
            probes.push(path.clone());
            continue;
        }
        let anchor = granted
            .package_paths
            .iter()
            .find(|root| path.starts_with(root))
            .cloned()
            .or_else(|| {
                path.ancestors()
                    .find(|a| {
                        a.file_name().is_some_and(|n| {
                            n == "node_modules" || n == "site-packages" || n == "dist-packages"
                        })
                    })
                    .map(Path::to_owned)
            })
            .unwrap_or_else(|| {
                if path.is_dir() && !write {
                    path.clone()
                } else {
                    path.parent().unwrap_or(path).to_owned()
                }
            });
        anchors.entry(anchor).or_default().merge(how);
    }
    // What may not be granted goes first, so that it hides nothing inside it.
    let mut withheld = Vec::new();
    let mut refused = Vec::new();
    let mut kept: BTreeMap<PathBuf, Use> = BTreeMap::new();
    for (path, how) in anchors {
        if let Some(protected) = granted
            .protected
            .iter()
            .find(|p| path.starts_with(p) || p.starts_with(&path))
        {
            withheld.push((path, protected.clone()));
            continue;
        }
        let home = granted.home.as_deref();
        if let Some(why) = refusal(&path, how.wants_write(), home) {
            refused.push((path.clone(), how, why));
            // What it read there may still be granted, read-only.
            if how.wants_write() && how.read && refusal(&path, false, home).is_none() {
                kept.insert(
                    path,
                    Use {
                        read: true,
                        ..Use::default()
                    },
                );
            }
            continue;
        }
        kept.insert(path, how);
    }
    // A grant inside another that already covers it is left out.
    let mut dirs = Vec::new();
    let mut confirm = Vec::new();
    for (path, how) in &kept {
        if kept
            .iter()
            .any(|(outer, over)| outer != path && path.starts_with(outer) && over.covers(*how))
        {
            continue;
        }
        if how.written {
            dirs.push((path.clone(), true));
            continue;
        }
        if how.read {
            dirs.push((path.clone(), false));
        }
        if how.denied || how.unwritten {
            confirm.push((path.clone(), *how));
        }
    }
    Proposal {
        dirs,
        confirm,
        refused,
        withheld,
        net: observed.connects.iter().cloned().collect(),
        unix: observed.unix.iter().cloned().collect(),
        probes,
    }
}

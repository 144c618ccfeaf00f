//! A native server's own root: what its `/` holds, planned in the parent and
//! built in the cloned child, in its own mount namespace, before exec.
//!
//! Landlock refuses what an ungranted path holds, but not its name: a
//! server could `stat` any path, watch any directory with inotify and list
//! the host's pids through its `/proc`. So, as bubblewrap does, the server
//! gets a root of its own: a fresh tmpfs (read-only once built) holding only
//!
//! - the system directories `/usr`, `/lib*`, `/bin`, `/sbin`, `/opt` and
//!   `/etc`, bound read-only (merged-usr links are made again as links;
//!   Landlock still keeps the secrets of `/etc` out),
//! - the executable, its `#!` interpreter, their installation roots and
//!   every `measure` path (a package's store among them), read-only,
//! - each granted path at its own place, read-only unless granted `rw`,
//! - the working directory (empty unless something above holds it),
//! - the private `/tmp` (tmpfs) with the granted paths under the host's
//!   `/tmp` bound in,
//! - a `/proc` of the server's own PID namespace (no host pid is listed),
//! - a `/dev` of `null`, `zero`, `full`, `random`, `urandom` and `tty`
//!   (bound from the host's; whichever exist) and the `fd`, `stdin`,
//!   `stdout`, `stderr` links. No `/dev/shm`: Landlock grants none.
//!
//! The tree is built on a tmpfs mounted over `/tmp` of the child's mount
//! namespace (every source is opened first, so the host's `/tmp` hiding
//! does not matter), then `pivot_root` makes it `/` and the host's root is
//! detached. Every path is prepared here as a `CString`; the child only
//! makes raw system calls on them ([`build`]), allocating nothing.
//! Landlock stays the second layer: its rules name the same inodes.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::grants::DirMode;
use crate::grants::OpenedGrant;

mod build;
mod support;
#[cfg(test)]
mod tests;

pub use build::Failure;
pub(crate) use build::{build, fd_path, kept_mount_flags, seal};
pub use support::support;

/// `HOME` in a root of the server's own: a directory made in its private
/// `/tmp`, writable by it and by nothing else.
pub const PRIVATE_HOME: &str = "/tmp/home";

/// Where the new root is built in the child's mount namespace, before it
/// becomes `/`.
const BASE: &str = "/tmp";

/// Most sources one root opens before the host's `/tmp` is covered.
pub const MAX_SOURCES: usize = 256;

/// Device nodes bound into the server's `/dev`, where the host has them.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// The system directories of every root (links are made again as links).
const SYSTEM: &[&str] = &[
    "/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt", "/etc",
];

/// Why a root could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error("planning the server's own root: {operation} {path}: {source}")]
    Io {
        operation: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "planning the server's own root: more than {MAX_SOURCES} paths to place in it (at {path})"
    )]
    TooMany { path: PathBuf },
}

/// A step of building the root in the child, named in launch errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootStep {
    Source,
    Mount,
    Place,
    Bind,
    ReadOnly,
    Proc,
    Pivot,
    Detach,
}

/// What a bind's source is in the child.
#[derive(Debug)]
pub(crate) enum Source {
    /// A host path, opened `O_PATH` by the child before `/tmp` is covered.
    Path(CString),
    /// A grant: opened by the child with no link followed anywhere in the
    /// path, and bound only if it is still the inode Moat opened and checked
    /// (a bind's source must be a mount of the child's own namespace, so
    /// Moat's descriptor cannot be bound itself).
    Checked { path: CString, dev: u64, ino: u64 },
}

/// One thing to make in the new root, in order. Targets carry the prefix of
/// where the root is built.
#[derive(Debug)]
pub(crate) enum Entry {
    Dir(CString),
    /// An empty file, for something to be mounted over after the pivot.
    File(CString),
    Symlink {
        link: CString,
        target: CString,
    },
    Bind {
        source: Source,
        target: CString,
        dir: bool,
        writable: bool,
    },
    Tmpfs {
        target: CString,
        options: CString,
        flags: libc::c_ulong,
    },
    Proc(CString),
}

/// The planned root of one server.
#[derive(Debug)]
pub struct RootPlan {
    base: CString,
    entries: Vec<Entry>,
    /// The host path of each entry, for errors.
    subjects: Vec<PathBuf>,
    /// Made read-only after the pivot (paths in the new root): `/dev`, `/`.
    read_only: Vec<CString>,
    cwd: CString,
    /// The evidence line.
    pub summary: String,
}

impl RootPlan {
    /// The host path of each of the child's entries, to name one in an
    /// error.
    pub fn subjects(&self) -> &[PathBuf] {
        &self.subjects
    }
}

/// What a root is planned from.
pub struct RootInputs<'a> {
    pub executable: &'a Path,
    pub interpreter: Option<&'a Path>,
    /// Their installation roots, as the implicit grants chose them
    /// ([`super::implicit_roots`]: never one that holds Moat's files or a
    /// key, never the home directory or `$HOME/.local` whole).
    pub roots: &'a [PathBuf],
    pub measure: &'a [PathBuf],
    pub dirs: &'a [OpenedGrant],
    pub cwd: &'a Path,
    /// The private /tmp's tmpfs options (`size=...,mode=1777`).
    pub tmp_options: &'a CString,
    /// A file to be covered by Moat's resolv.conf after the pivot: where
    /// `/etc/resolv.conf` leads, made if it lies outside what is bound.
    pub resolv_conf: bool,
}

#[derive(Debug)]
enum Kind {
    Tmpfs(CString, libc::c_ulong),
    Proc,
    Symlink(PathBuf),
    Bind { source: Source, writable: bool },
    Dir,
    File,
}

impl Kind {
    /// Which of two items at one path is placed: mounts first, then a
    /// writable bind over a read-only one.
    fn rank(&self) -> u8 {
        match self {
            Kind::Tmpfs(..) | Kind::Proc | Kind::Symlink(_) => 0,
            Kind::Bind { writable: true, .. } => 1,
            Kind::Bind { .. } => 2,
            Kind::Dir | Kind::File => 3,
        }
    }
}

fn cstring(path: &Path) -> Result<CString, RootError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| RootError::Io {
        operation: "a NUL byte in",
        path: path.to_owned(),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })
}

fn prefixed(path: &Path) -> Result<CString, RootError> {
    let mut bytes = BASE.as_bytes().to_vec();
    if path != Path::new("/") {
        bytes.extend_from_slice(path.as_os_str().as_bytes());
    }
    CString::new(bytes).map_err(|_| RootError::Io {
        operation: "a NUL byte in",
        path: path.to_owned(),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })
}

/// Plans the root for one launch.
pub fn plan(inputs: &RootInputs<'_>) -> Result<RootPlan, RootError> {
    let io = |operation: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| RootError::Io {
            operation,
            path,
            source,
        }
    };
    let mut items: Vec<(PathBuf, Kind)> = Vec::new();
    for dir in SYSTEM {
        let path = Path::new(dir);
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(path).map_err(io("readlink", path))?;
            items.push((path.to_owned(), Kind::Symlink(target)));
        } else if meta.is_dir() {
            items.push((
                path.to_owned(),
                Kind::Bind {
                    source: Source::Path(cstring(path)?),
                    writable: false,
                },
            ));
        }
    }
    // What starts the server, read-only: canonical, so no link of the
    // host's is followed while the root is built.
    let mut starting: Vec<PathBuf> = vec![inputs.executable.to_owned()];
    starting.extend(inputs.interpreter.map(Path::to_owned));
    starting.extend(inputs.roots.iter().cloned());
    starting.extend(inputs.measure.iter().cloned());
    for path in starting {
        let canonical = std::fs::canonicalize(&path).map_err(io("canonicalize", &path))?;
        items.push((
            canonical.clone(),
            Kind::Bind {
                source: Source::Path(cstring(&canonical)?),
                writable: false,
            },
        ));
    }
    for grant in inputs.dirs {
        let stat = rustix::fs::fstat(&grant.fd).map_err(|e| RootError::Io {
            operation: "fstat",
            path: grant.grant.host.clone(),
            source: e.into(),
        })?;
        items.push((
            grant.grant.host.clone(),
            Kind::Bind {
                source: Source::Checked {
                    path: cstring(&grant.grant.host)?,
                    dev: stat.st_dev,
                    ino: stat.st_ino,
                },
                writable: grant.grant.mode == DirMode::Rw,
            },
        ));
    }
    items.push((
        PathBuf::from("/tmp"),
        Kind::Tmpfs(inputs.tmp_options.clone(), libc::MS_NOSUID | libc::MS_NODEV),
    ));
    items.push((PathBuf::from("/proc"), Kind::Proc));
    items.push((
        PathBuf::from("/dev"),
        Kind::Tmpfs(
            CString::from(c"mode=0755,size=65536"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        ),
    ));
    let mut devices = Vec::new();
    for device in DEVICES {
        let path = Path::new(device);
        if std::fs::metadata(path).is_ok() {
            devices.push(*device);
            items.push((
                path.to_owned(),
                Kind::Bind {
                    source: Source::Path(cstring(path)?),
                    // Landlock decides what may be written.
                    writable: true,
                },
            ));
        }
    }
    for (link, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        items.push((PathBuf::from(link), Kind::Symlink(PathBuf::from(target))));
    }
    let cwd = std::fs::canonicalize(inputs.cwd).unwrap_or_else(|_| inputs.cwd.to_owned());
    items.push((cwd.clone(), Kind::Dir));
    // The server's HOME (see `native::env`), in its private /tmp.
    items.push((PathBuf::from(PRIVATE_HOME), Kind::Dir));
    if inputs.resolv_conf
        && let Ok(target) = std::fs::canonicalize("/etc/resolv.conf")
        && !target.starts_with("/etc")
    {
        items.push((target, Kind::File));
    }
    // Parents before what lies inside them; at one path, one item.
    items.sort_by(|(a, ka), (b, kb)| {
        a.as_os_str()
            .as_bytes()
            .cmp(b.as_os_str().as_bytes())
            .then(ka.rank().cmp(&kb.rank()))
    });
    items.dedup_by(|later, earlier| later.0 == earlier.0);

    let mut entries = Vec::new();
    let mut subjects = Vec::new();
    // (path, writable) of what is bound or mounted so far; dirs made.
    let mut placed: Vec<(PathBuf, Option<bool>)> = Vec::new();
    let mut made: Vec<PathBuf> = Vec::new();
    let mut sources = 0usize;
    for (path, kind) in items {
        // The innermost thing placed that holds this path.
        let holder = placed
            .iter()
            .rev()
            .find(|(p, _)| path.starts_with(p))
            .map(|(_, writable)| *writable);
        let inside_bind = matches!(holder, Some(Some(_)));
        match (&kind, holder) {
            // Already there, with the same mode.
            (Kind::Bind { writable, .. }, Some(Some(outer))) if *writable == outer => continue,
            (Kind::Dir | Kind::File, Some(Some(_))) => continue,
            _ => {}
        }
        if path == Path::new("/tmp") && matches!(kind, Kind::Bind { .. }) {
            // A grant of /tmp itself: the private /tmp stands in for it.
            continue;
        }
        // Every parent not yet there (nothing to make inside a bind: the
        // host's tree has them).
        if !inside_bind {
            let mut ancestors: Vec<&Path> = path
                .ancestors()
                .skip(1)
                .take_while(|a| *a != Path::new("/"))
                .collect();
            ancestors.reverse();
            for ancestor in ancestors {
                // A mount point exists; inside a bind, the host's tree
                // holds everything.
                let held = placed.iter().any(|(p, writable)| {
                    ancestor == p || (writable.is_some() && ancestor.starts_with(p))
                });
                if held || made.iter().any(|m| m == ancestor) {
                    continue;
                }
                entries.push(Entry::Dir(prefixed(ancestor)?));
                subjects.push(ancestor.to_owned());
                made.push(ancestor.to_owned());
            }
        }
        let target = prefixed(&path)?;
        let entry = match kind {
            Kind::Tmpfs(options, flags) => {
                placed.push((path.clone(), None));
                Entry::Tmpfs {
                    target,
                    options,
                    flags,
                }
            }
            Kind::Proc => {
                placed.push((path.clone(), None));
                Entry::Proc(target)
            }
            Kind::Symlink(to) => Entry::Symlink {
                link: target,
                target: cstring(&to)?,
            },
            Kind::Dir => {
                made.push(path.clone());
                Entry::Dir(target)
            }
            Kind::File => Entry::File(target),
            Kind::Bind { source, writable } => {
                let dir = match &source {
                    Source::Checked { .. } => inputs
                        .dirs
                        .iter()
                        .find(|g| g.grant.host == path)
                        .is_none_or(|g| g.dir),
                    Source::Path(_) => std::fs::metadata(&path)
                        .map_err(io("stat", &path))?
                        .is_dir(),
                };
                {
                    sources += 1;
                    if sources > MAX_SOURCES {
                        return Err(RootError::TooMany { path });
                    }
                }
                placed.push((path.clone(), Some(writable)));
                Entry::Bind {
                    source,
                    target,
                    dir,
                    writable,
                }
            }
        };
        entries.push(entry);
        subjects.push(path);
    }
    let summary = format!(
        "own root: the server's / is a tmpfs of its own, read-only, holding only the system directories (read-only), the executable, its interpreter and measure paths (read-only), its grants at their paths, its working directory, its private /tmp, a /proc of its own PID namespace (readable: it shows the server's own processes only, so each reads its own /proc/self) and a /dev of {}; no other host path exists there (stat, inotify and /proc reveal no name outside it)",
        devices
            .iter()
            .map(|d| d.trim_start_matches("/dev/"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(RootPlan {
        base: CString::new(BASE).unwrap_or_default(),
        entries,
        subjects,
        read_only: vec![CString::from(c"/dev"), CString::from(c"/")],
        cwd: cstring(&cwd)?,
        summary,
    })
}

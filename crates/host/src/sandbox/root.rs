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
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::grants::DirMode;
use crate::grants::OpenedGrant;

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

/// A failed step of [`build`]: the step, the entry it was at (if any) and
/// the errno.
pub type Failure = (RootStep, Option<usize>, i32);

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `/proc/self/fd/N` for `fd`, written into `buf` with its NUL.
fn fd_path(fd: i32, buf: &mut [u8; 32]) -> *const libc::c_char {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 12];
    let mut n = fd.unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[PREFIX.len() + i] = digits[len - 1 - i];
    }
    buf[PREFIX.len() + len] = 0;
    buf.as_ptr().cast()
}

/// Remounts the mount at `target` read-only, keeping the flags the kernel
/// locked on it (nosuid, nodev, noexec, atime).
///
/// # Safety
///
/// Only in the cloned child, in its own mount namespace.
unsafe fn remount_read_only(target: &std::ffi::CStr) -> bool {
    // SAFETY: raw system calls on a NUL-terminated path and a stack struct.
    unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(target.as_ptr(), &mut stat) != 0 {
            return false;
        }
        let kept = [
            (libc::ST_NOSUID, libc::MS_NOSUID),
            (libc::ST_NODEV, libc::MS_NODEV),
            (libc::ST_NOEXEC, libc::MS_NOEXEC),
            (libc::ST_NOATIME, libc::MS_NOATIME),
            (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
            (libc::ST_RELATIME, libc::MS_RELATIME),
        ]
        .iter()
        .filter(|(st, _)| stat.f_flag & st != 0)
        .fold(0, |flags, (_, ms)| flags | ms);
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | kept,
            std::ptr::null(),
        ) == 0
    }
}

/// Builds `plan` and pivots into it; the host's root is detached. The
/// caller then covers what it must (resolv.conf) and calls [`seal`].
///
/// # Safety
///
/// Only in the freshly cloned child, in its own mount namespace (made
/// private), with its own PID namespace: raw system calls on memory
/// prepared before the clone, no allocation.
pub(crate) unsafe fn build(plan: &RootPlan) -> Result<(), Failure> {
    // SAFETY: every call is a raw system call on NUL-terminated strings and
    // stack memory prepared before the clone; see the contract.
    unsafe {
        let at = |step: RootStep, index: usize| (step, Some(index), errno());
        // Every source is opened while the host's /tmp is still visible.
        let mut fds = [-1i32; MAX_SOURCES];
        let mut opened = 0;
        for (index, entry) in plan.entries.iter().enumerate() {
            let Entry::Bind { source, .. } = entry else {
                continue;
            };
            let fd = match source {
                Source::Path(path) => libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC),
                Source::Checked { path, dev, ino } => {
                    /// struct open_how of openat2(2).
                    #[repr(C)]
                    struct OpenHow {
                        flags: u64,
                        mode: u64,
                        resolve: u64,
                    }
                    const RESOLVE_NO_SYMLINKS: u64 = 0x04;
                    let how = OpenHow {
                        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
                        mode: 0,
                        resolve: RESOLVE_NO_SYMLINKS,
                    };
                    let fd = libc::syscall(
                        libc::SYS_openat2,
                        libc::AT_FDCWD,
                        path.as_ptr(),
                        &how as *const OpenHow,
                        std::mem::size_of::<OpenHow>(),
                    ) as libc::c_int;
                    let mut stat: libc::stat = std::mem::zeroed();
                    if fd >= 0
                        && (libc::fstat(fd, &mut stat) != 0
                            || stat.st_dev != *dev
                            || stat.st_ino != *ino)
                    {
                        // Not what was granted: refused, as ESTALE.
                        return Err((RootStep::Source, Some(index), libc::ESTALE));
                    }
                    fd
                }
            };
            if fd < 0 || opened == MAX_SOURCES {
                return Err(at(RootStep::Source, index));
            }
            fds[opened] = fd;
            opened += 1;
        }
        if libc::mount(
            c"tmpfs".as_ptr(),
            plan.base.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            c"mode=0755,size=1048576".as_ptr().cast(),
        ) != 0
        {
            return Err((RootStep::Mount, None, errno()));
        }
        let mut next = 0;
        for (index, entry) in plan.entries.iter().enumerate() {
            let made = |result: libc::c_int| result == 0 || errno() == libc::EEXIST;
            match entry {
                Entry::Dir(target) => {
                    if !made(libc::mkdir(target.as_ptr(), 0o755)) {
                        return Err(at(RootStep::Place, index));
                    }
                }
                Entry::File(target) => {
                    if !made(make_file(target)) {
                        return Err(at(RootStep::Place, index));
                    }
                }
                Entry::Symlink { link, target } => {
                    if !made(libc::symlink(target.as_ptr(), link.as_ptr())) {
                        return Err(at(RootStep::Place, index));
                    }
                }
                Entry::Tmpfs {
                    target,
                    options,
                    flags,
                } => {
                    if !made(libc::mkdir(target.as_ptr(), 0o755)) {
                        return Err(at(RootStep::Place, index));
                    }
                    if libc::mount(
                        c"tmpfs".as_ptr(),
                        target.as_ptr(),
                        c"tmpfs".as_ptr(),
                        *flags,
                        options.as_ptr().cast(),
                    ) != 0
                    {
                        return Err(at(RootStep::Mount, index));
                    }
                }
                Entry::Proc(target) => {
                    if !made(libc::mkdir(target.as_ptr(), 0o555)) {
                        return Err(at(RootStep::Place, index));
                    }
                    if libc::mount(
                        c"proc".as_ptr(),
                        target.as_ptr(),
                        c"proc".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(at(RootStep::Proc, index));
                    }
                }
                Entry::Bind {
                    target,
                    dir,
                    writable,
                    ..
                } => {
                    next += 1;
                    let fd = fds[next - 1];
                    let result = if *dir {
                        libc::mkdir(target.as_ptr(), 0o755)
                    } else {
                        make_file(target)
                    };
                    if !made(result) {
                        return Err(at(RootStep::Place, index));
                    }
                    let mut path = [0u8; 32];
                    if libc::mount(
                        fd_path(fd, &mut path),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(at(RootStep::Bind, index));
                    }
                    libc::close(fd);
                    if !*writable && !remount_read_only(target) {
                        return Err(at(RootStep::ReadOnly, index));
                    }
                }
            }
        }
        // The new root becomes / and the host's is stacked beneath it, then
        // detached (pivot_root(".", ".")).
        if libc::chdir(plan.base.as_ptr()) != 0
            || libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) != 0
        {
            return Err((RootStep::Pivot, None, errno()));
        }
        if libc::umount2(c".".as_ptr(), libc::MNT_DETACH) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
            return Err((RootStep::Detach, None, errno()));
        }
        Ok(())
    }
}

/// After [`build`] (and whatever the caller mounts in the new root): makes
/// `/dev` and `/` read-only and enters the working directory.
///
/// # Safety
///
/// As [`build`], after it.
pub(crate) unsafe fn seal(plan: &RootPlan) -> Result<(), Failure> {
    // SAFETY: raw system calls on NUL-terminated strings; see the contract.
    unsafe {
        for target in &plan.read_only {
            if !remount_read_only(target) {
                return Err((RootStep::ReadOnly, None, errno()));
            }
        }
        if libc::chdir(plan.cwd.as_ptr()) != 0 {
            return Err((RootStep::Place, None, errno()));
        }
        Ok(())
    }
}

/// An empty file at `target` (0 or -1 with errno).
///
/// # Safety
///
/// Only in the cloned child.
unsafe fn make_file(target: &std::ffi::CStr) -> libc::c_int {
    // SAFETY: a NUL-terminated path; the descriptor is closed at once.
    unsafe {
        let fd = libc::open(
            target.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        );
        if fd >= 0 {
            libc::close(fd);
        }
        fd.min(0)
    }
}

/// Why this kernel cannot give a server a root of its own: the system call,
/// the path and the errno of the first step that failed in a trial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    pub syscall: &'static str,
    pub path: &'static str,
    pub errno: i32,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.syscall,
            self.path,
            std::io::Error::from_raw_os_error(self.errno)
        )
    }
}

/// The trial's steps: (system call, path).
const TRIAL: [(&str, &str); 8] = [
    ("write", "/proc/self/uid_map"),
    ("mount(MS_REC|MS_PRIVATE)", "/"),
    ("mount(tmpfs)", "/tmp"),
    ("mkdir", "/tmp/proc"),
    ("mount(proc)", "/tmp/proc"),
    ("pivot_root", "/tmp"),
    ("umount2(MNT_DETACH)", "the host's root"),
    ("clone", "(new user, mount and PID namespaces)"),
];

/// Whether a server can have a root of its own here, found once per process
/// by building a small one in a child (in a user namespace when `user`).
pub fn support(user: bool) -> Result<(), Unsupported> {
    static SUPPORT: OnceLock<Result<(), Unsupported>> = OnceLock::new();
    SUPPORT.get_or_init(|| trial(user)).clone()
}

fn trial(user: bool) -> Result<(), Unsupported> {
    let failed = |step: usize, errno: i32| Unsupported {
        syscall: TRIAL[step].0,
        path: TRIAL[step].1,
        errno,
    };
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let uid_map = format!("{uid} {uid} 1\n");
    let gid_map = format!("{gid} {gid} 1\n");
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| failed(7, e.raw_os_error()))?;
    let mut flags = libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::SIGCHLD;
    if user {
        flags |= libc::CLONE_NEWUSER;
    }
    let write_fd = write.as_raw_fd();
    // SAFETY: a fork-like clone (no CLONE_VM): the child has its own copy of
    // memory, runs only raw system calls on memory prepared above and
    // leaves with `_exit`.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        // SAFETY: the freshly cloned child; see above.
        unsafe {
            let report = |step: u32| -> ! {
                let mut buf = [0u8; 8];
                buf[..4].copy_from_slice(&step.to_le_bytes());
                buf[4..].copy_from_slice(&errno().to_le_bytes());
                libc::write(write_fd, buf.as_ptr().cast(), 8);
                libc::_exit(1)
            };
            let write_file = |path: &std::ffi::CStr, bytes: &[u8]| {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, bytes.as_ptr().cast(), bytes.len()) < 0 {
                    report(0);
                }
                libc::close(fd);
            };
            if user {
                write_file(c"/proc/self/setgroups", b"deny");
                write_file(c"/proc/self/uid_map", uid_map.as_bytes());
                write_file(c"/proc/self/gid_map", gid_map.as_bytes());
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                report(1);
            }
            if libc::mount(
                c"tmpfs".as_ptr(),
                c"/tmp".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=0755,size=65536".as_ptr().cast(),
            ) != 0
            {
                report(2);
            }
            if libc::mkdir(c"/tmp/proc".as_ptr(), 0o555) != 0 {
                report(3);
            }
            if libc::mount(
                c"proc".as_ptr(),
                c"/tmp/proc".as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ) != 0
            {
                report(4);
            }
            if libc::chdir(c"/tmp".as_ptr()) != 0
                || libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) != 0
            {
                report(5);
            }
            if libc::umount2(c".".as_ptr(), libc::MNT_DETACH) != 0 {
                report(6);
            }
            libc::_exit(0)
        }
    }
    if pid < 0 {
        return Err(failed(7, errno()));
    }
    drop(write);
    let mut buf = [0u8; 8];
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::io::read(&read, &mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child just made; `status` is a valid pointer.
    unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::__WALL) };
    if filled < buf.len() {
        return Ok(());
    }
    let step = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let errno = i32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    Err(failed(step.min(TRIAL.len() - 1), errno))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_holds_parents_first_and_nothing_twice() {
        let options = CString::new("size=1024,mode=1777").unwrap();
        let plan = plan(&RootInputs {
            executable: Path::new("/bin/sh"),
            interpreter: None,
            roots: &[],
            measure: &[],
            dirs: &[],
            cwd: Path::new("/"),
            tmp_options: &options,
            resolv_conf: false,
        })
        .unwrap();
        let targets: Vec<String> = plan
            .subjects
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        // /bin/sh lies in /usr (or /bin): bound with it, not again.
        assert!(!targets.iter().any(|t| t.ends_with("/sh")), "{targets:?}");
        for needed in ["/usr", "/etc", "/tmp", "/proc", "/dev", "/dev/null"] {
            assert!(targets.iter().any(|t| t == needed), "{needed}: {targets:?}");
        }
        let position = |p: &str| targets.iter().position(|t| t == p).unwrap();
        assert!(position("/dev") < position("/dev/null"));
        let mut sorted = targets.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), targets.len());
    }
}

//! `moat learn`: one run of a native server with every file readable and
//! its network open, watched, to find the `dirs` and `net` entries it needs.
//!
//! This module owns the watched run and what is made of it. The server is
//! started as every native server is (namespaces, a private /tmp, no
//! capabilities, the seccomp deny-list), without a network namespace, and
//! under a Landlock ruleset of its own ([`crate::sandbox::learn_plan`]): it
//! may read and execute everything, and write only its private /tmp,
//! `/dev/null`, its config's `rw` dirs and the directories the user names
//! with `--write`. Nothing else of the host is changed, even when Moat is
//! root. A second seccomp filter stops it at each system call that names a
//! file or an address (`open*`, `creat`, `exec*`, `mkdir*`, `mknod*`,
//! `unlink*`, `rmdir`, `rename*`, `link*`, `symlink*`, `truncate`,
//! `connect`) for a tracer thread of Moat's, which reads the path or address
//! from the server's memory and records it. A call that would change a file
//! is also stopped at its return: a refusal (EACCES, EPERM, EROFS, EXDEV) is
//! recorded as a write that was wanted and denied; a file opened for writing
//! is compared, after the run, with its state before the open, so a write
//! that wrote nothing is not taken for one.
//!
//! [`propose`] then turns what was recorded into grants: paths already
//! granted by default are left out, files are grouped under their package
//! directory (`node_modules`, `site-packages`, a `PYTHONPATH` or `NODE_PATH`
//! entry) or their own directory. A grant is `rw` only where something was
//! written; a denied write, or an open for writing that wrote nothing, is a
//! suggestion to confirm, never a grant. Some grants are never proposed
//! (see [`refusal`]): `rw` in a system directory, any grant of `/`, of the
//! home directory or what holds it, or of a system directory itself, and
//! anything overlapping Moat's own files; the proposal says which and why.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::spawn;

/// Why a learn run was refused before it started.
#[derive(Debug, thiserror::Error)]
pub enum LearnError {
    #[error(
        "moat learn --write {path}: refused: {why}; name a directory of the server's own (its data or output directory)"
    )]
    Refused { path: PathBuf, why: &'static str },
    #[error("moat learn --write {path}: {source}")]
    Writable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One learn run: where it records, and the directories the user let it
/// write (`--write`), canonical.
#[derive(Clone, Debug, Default)]
pub struct Run {
    pub observed: Arc<Mutex<Observed>>,
    pub writable: Vec<PathBuf>,
}

/// How a watched run used one path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Use {
    /// Opened to read, executed, or named by a call that changed nothing.
    pub read: bool,
    /// Changed: made, removed or renamed, or opened for writing and found
    /// changed (contents, size or times) after the run.
    pub written: bool,
    /// A change refused (EACCES, EPERM, EROFS, EXDEV): by the learn run's
    /// Landlock ruleset, or by the file's own permissions.
    pub denied: bool,
    /// Opened for writing, and found unchanged after the run.
    pub unwritten: bool,
}

impl Use {
    /// Whether it tried to change the path, whatever came of it.
    pub fn wants_write(self) -> bool {
        self.written || self.denied || self.unwritten
    }

    fn merge(&mut self, other: Use) {
        self.read |= other.read;
        self.written |= other.written;
        self.denied |= other.denied;
        self.unwritten |= other.unwritten;
    }

    /// Whether a grant made for `self` would also cover `inner`.
    fn covers(self, inner: Use) -> bool {
        self.written
            || ((!inner.read || self.read)
                && (!inner.denied || self.denied)
                && (!inner.unwritten || self.unwritten)
                && !inner.written)
    }
}

/// What a file was before a watched open for writing: compared after the
/// run to tell whether anything was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// What a watched run saw: every file it named, with how it used it, and
/// every address it connected to.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Files and directories the server opened, executed or changed
    /// (resolved on the host; names that did not exist are left out).
    pub files: BTreeMap<PathBuf, Use>,
    /// `host:port` of every IPv4 and IPv6 connect.
    pub connects: BTreeSet<String>,
    /// Paths of Unix sockets it tried to reach.
    pub unix: BTreeSet<PathBuf>,
    /// Files opened for writing, with what they were before the first such
    /// open (`None`: not there yet), until [`Observed::settle`].
    pub opened_for_writing: BTreeMap<PathBuf, Option<Stamp>>,
}

impl Observed {
    /// After the run: each file opened for writing is `written` if it was
    /// made or changed since, `unwritten` otherwise.
    pub fn settle(&mut self) {
        for (path, before) in std::mem::take(&mut self.opened_for_writing) {
            let changed = before.is_none() || Stamp::of(&path) != before;
            let seen = self.files.entry(path).or_default();
            if changed {
                seen.written = true;
            } else {
                seen.unwritten = true;
            }
        }
    }

    fn note(&mut self, path: PathBuf, how: Use) {
        self.files.entry(path).or_default().merge(how);
    }
}

/// System calls the watch stops at.
const WATCHED: &[libc::c_long] = &[
    libc::SYS_open,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_creat,
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_mknod,
    libc::SYS_mknodat,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_rmdir,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_link,
    libc::SYS_linkat,
    libc::SYS_symlink,
    libc::SYS_symlinkat,
    libc::SYS_truncate,
    libc::SYS_connect,
];

/// The filter that hands each watched call to the tracer.
pub fn watch_filter() -> Result<seccompiler::BpfProgram, String> {
    let arch: seccompiler::TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    let filter = seccompiler::SeccompFilter::new(
        WATCHED.iter().map(|n| (*n, Vec::new())).collect(),
        seccompiler::SeccompAction::Allow,
        seccompiler::SeccompAction::Trace(0),
        arch,
    )
    .map_err(|e| e.to_string())?;
    seccompiler::BpfProgram::try_from(filter).map_err(|e| e.to_string())
}

/// The exit of the watched server, from the tracer thread.
pub type Exit = tokio::sync::oneshot::Receiver<super::WaitStatus>;

/// Starts `plan` in a tracer thread, which seizes the child before it
/// execs and then serves its stops until every traced process is gone.
pub fn start(
    plan: spawn::ChildPlan,
    observed: Arc<Mutex<Observed>>,
) -> Result<(spawn::Child, Exit), spawn::SpawnFailure> {
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (exit_tx, exit_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("moat-learn".into())
        .spawn(move || {
            // This thread makes the child, so it is the thread that may trace
            // and wait for it.
            let started = spawn::spawn_gated(&plan, seize);
            drop(plan);
            let pid = started.as_ref().map(|(child, _)| child.pid).ok();
            let _ = started_tx.send(started);
            if let Some(pid) = pid {
                let _ = exit_tx.send(trace(pid, &observed));
            }
        })
        .map_err(|e| spawn::SpawnFailure::Parent("starting the tracer thread", e))?;
    let (child, pending) = started_rx.recv().map_err(|_| {
        spawn::SpawnFailure::Parent(
            "the tracer thread",
            std::io::Error::other("it ended before the server started"),
        )
    })??;
    // While the tracer lets the child through its exec, read the outcome.
    pending.finish()?;
    Ok((child, exit_rx))
}

/// Attaches to `pid` (stopped at its gate, before exec), following its
/// threads and children and stopping at the watch filter's calls.
fn seize(pid: i32) -> std::io::Result<()> {
    let options = libc::PTRACE_O_TRACESECCOMP
        | libc::PTRACE_O_TRACESYSGOOD
        | libc::PTRACE_O_TRACECLONE
        | libc::PTRACE_O_TRACEFORK
        | libc::PTRACE_O_TRACEVFORK
        | libc::PTRACE_O_TRACEEXEC
        | libc::PTRACE_O_EXITKILL;
    // SAFETY: PTRACE_SEIZE takes a pid and an options word; no memory.
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            options as usize as *mut libc::c_void,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Resumes a stopped tracee with `signal`: to its next watched call
/// (`PTRACE_CONT`) or, with `to_return`, to the return of the call it is
/// in (`PTRACE_SYSCALL`, whose next stop is that call's syscall-exit-stop).
fn resume(pid: i32, signal: i32, to_return: bool) {
    let request = if to_return {
        libc::PTRACE_SYSCALL
    } else {
        libc::PTRACE_CONT
    };
    // SAFETY: PTRACE_CONT or PTRACE_SYSCALL of a stopped tracee with a
    // signal number; no memory.
    unsafe {
        libc::ptrace(
            request,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            signal as usize as *mut libc::c_void,
        );
    }
}

/// Serves the stops of `main` and everything it starts until none is left;
/// returns `main`'s exit.
fn trace(main: i32, observed: &Mutex<Observed>) -> super::WaitStatus {
    let mut exit = None;
    // Tasks stopped in a call that changes files, waiting for its return.
    let mut waiting: HashMap<i32, Vec<Change>> = HashMap::new();
    loop {
        let mut status = 0;
        // SAFETY: waits for any traced task or child; `status` is ours.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
        if pid < 0 {
            match std::io::Error::last_os_error() {
                error if error.raw_os_error() == Some(libc::EINTR) => continue,
                // ECHILD: nothing is left to wait for.
                error => {
                    return exit.unwrap_or(Err(error));
                }
            }
        }
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            waiting.remove(&pid);
            if pid == main {
                let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
                let signal = libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status));
                exit = Some(Ok((code, signal, 0)));
            }
            continue;
        }
        if !libc::WIFSTOPPED(status) {
            continue;
        }
        let signal = libc::WSTOPSIG(status);
        let event = (status >> 16) & 0xff;
        if signal == libc::SIGTRAP | 0x80 {
            // A syscall-exit-stop (PTRACE_O_TRACESYSGOOD): the return of a
            // call that changes files.
            match waiting.remove(&pid) {
                Some(changes) => match returned(pid) {
                    Some(result) => {
                        settle_call(changes, result, observed);
                        resume(pid, 0, false);
                    }
                    // Not the exit of that call: wait on.
                    None => {
                        waiting.insert(pid, changes);
                        resume(pid, 0, true);
                    }
                },
                None => resume(pid, 0, false),
            }
        } else if signal == libc::SIGTRAP && event == libc::PTRACE_EVENT_SECCOMP {
            let changes = record(pid, observed);
            let to_return = !changes.is_empty();
            if to_return {
                waiting.insert(pid, changes);
            }
            resume(pid, 0, to_return);
        } else if event != 0 || signal == libc::SIGTRAP {
            // Clone, fork, exec and seize stops: nothing to deliver.
            resume(pid, 0, waiting.contains_key(&pid));
        } else {
            // A signal on its way to the server: deliver it.
            resume(pid, signal, waiting.contains_key(&pid));
        }
    }
}

/// The kernel's `struct ptrace_syscall_info` for a seccomp stop.
#[repr(C)]
#[derive(Default)]
struct SyscallInfo {
    op: u8,
    pad: [u8; 3],
    arch: u32,
    instruction_pointer: u64,
    stack_pointer: u64,
    nr: u64,
    args: [u64; 6],
    ret_data: u32,
    reserved: u32,
}

/// The kernel's `struct ptrace_syscall_info` for a syscall-exit-stop.
#[repr(C)]
#[derive(Default)]
struct SyscallReturn {
    op: u8,
    pad: [u8; 3],
    arch: u32,
    instruction_pointer: u64,
    stack_pointer: u64,
    rval: i64,
    is_error: u8,
    pad2: [u8; 7],
}

/// `PTRACE_SYSCALL_INFO_EXIT`.
const SYSCALL_INFO_EXIT: u8 = 2;

/// What the call `pid` is returning from returned: `Ok` or the errno;
/// `None` when `pid` is not at a syscall-exit-stop.
fn returned(pid: i32) -> Option<Result<(), i32>> {
    let mut info = SyscallReturn::default();
    // SAFETY: the kernel writes at most `size_of::<SyscallReturn>()` bytes
    // into `info`.
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_GET_SYSCALL_INFO,
            pid,
            std::mem::size_of::<SyscallReturn>() as *mut libc::c_void,
            &mut info as *mut SyscallReturn as *mut libc::c_void,
        )
    };
    if rc <= 0 || info.op != SYSCALL_INFO_EXIT {
        return None;
    }
    Some(if info.is_error != 0 {
        Err(i32::try_from(-info.rval).unwrap_or(0))
    } else {
        Ok(())
    })
}

/// A name that a watched call may change, until the call returns.
struct Change {
    path: PathBuf,
    kind: ChangeKind,
}

enum ChangeKind {
    /// Opened for writing: what it was before, for [`Observed::settle`].
    Open(Option<Stamp>),
    /// Made, removed, renamed, linked or truncated: changed if the call
    /// succeeds.
    Direct,
}

/// Records the outcome of a call that changes files.
fn settle_call(changes: Vec<Change>, result: Result<(), i32>, observed: &Mutex<Observed>) {
    let mut seen = observed.lock().unwrap_or_else(|e| e.into_inner());
    for Change { path, kind } in changes {
        match (result, kind) {
            (Ok(()), ChangeKind::Open(before)) => {
                seen.opened_for_writing.entry(path).or_insert(before);
            }
            (Ok(()), ChangeKind::Direct) => seen.note(
                path,
                Use {
                    written: true,
                    ..Use::default()
                },
            ),
            // Landlock answers EACCES (EXDEV for a rename or link it would
            // let in place but not across); permissions EACCES or EPERM; a
            // read-only mount EROFS.
            (Err(libc::EACCES | libc::EPERM | libc::EROFS | libc::EXDEV), _) => seen.note(
                path,
                Use {
                    denied: true,
                    ..Use::default()
                },
            ),
            // Anything else (no such directory, exists, not a directory):
            // a name it used, if there is something by that name.
            (Err(_), _) => {
                if path.exists() {
                    seen.note(
                        path,
                        Use {
                            read: true,
                            ..Use::default()
                        },
                    );
                }
            }
        }
    }
}

/// Reads up to `len` bytes at `address` in `pid`'s memory, page by page,
/// stopping early at a NUL when `string`.
fn read_memory(pid: i32, address: u64, len: usize, string: bool) -> Vec<u8> {
    const PAGE: u64 = 4096;
    let mut out = Vec::new();
    let mut at = address;
    while out.len() < len {
        let room = (PAGE - at % PAGE).min((len - out.len()) as u64) as usize;
        let mut buf = vec![0u8; room];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: room,
        };
        let remote = libc::iovec {
            iov_base: at as *mut libc::c_void,
            iov_len: room,
        };
        // SAFETY: copies from the tracee into `buf`, which has `room` bytes.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            break;
        }
        let n = n as usize;
        if string && let Some(end) = buf[..n].iter().position(|b| *b == 0) {
            out.extend_from_slice(&buf[..end]);
            return out;
        }
        out.extend_from_slice(&buf[..n]);
        at += n as u64;
    }
    out
}

fn read_path(pid: i32, address: u64) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let bytes = read_memory(pid, address, 4096, true);
    (!bytes.is_empty()).then(|| PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

/// `path` as the process `pid` names it relative to `dirfd`, absolute.
fn absolute(pid: i32, dirfd: i64, path: PathBuf) -> Option<PathBuf> {
    if path.is_absolute() {
        return Some(path);
    }
    let base = if dirfd == libc::AT_FDCWD as i64 {
        std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?
    } else {
        std::fs::read_link(format!("/proc/{pid}/fd/{dirfd}")).ok()?
    };
    Some(base.join(path))
}

/// The host's name for what `path` reaches: canonical when it exists; for
/// a name being made, its canonical directory joined with the name.
fn on_host(path: &Path, making: bool) -> Option<PathBuf> {
    if let Ok(real) = std::fs::canonicalize(path) {
        return Some(real);
    }
    if making {
        let parent = std::fs::canonicalize(path.parent()?).ok()?;
        return Some(parent.join(path.file_name()?));
    }
    None
}

/// How a watched call uses one name.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Naming {
    Read,
    /// Opened for writing (write access, `O_CREAT` or `O_TRUNC`).
    Open,
    /// Made, removed, renamed, linked or truncated by name.
    Change,
}

/// Records the names the call `pid` is stopped in uses; returns those it
/// may change, to settle when it returns.
fn record(pid: i32, observed: &Mutex<Observed>) -> Vec<Change> {
    let mut info = SyscallInfo::default();
    // SAFETY: the kernel writes at most `size_of::<SyscallInfo>()` bytes
    // into `info`.
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_GET_SYSCALL_INFO,
            pid,
            std::mem::size_of::<SyscallInfo>() as *mut libc::c_void,
            &mut info as *mut SyscallInfo as *mut libc::c_void,
        )
    };
    if rc <= 0 {
        return Vec::new();
    }
    let nr = info.nr as libc::c_long;
    let a = info.args;
    let at_cwd = libc::AT_FDCWD as i64;
    let opens = |flags: u64| {
        let flags = flags as i32;
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & (libc::O_CREAT | libc::O_TRUNC) != 0
        {
            Naming::Open
        } else {
            Naming::Read
        }
    };
    use Naming::{Change as Changes, Read};
    // (dirfd, path address, how)
    let named: Vec<(i64, u64, Naming)> = match nr {
        libc::SYS_open => vec![(at_cwd, a[0], opens(a[1]))],
        libc::SYS_openat => vec![(a[0] as i64, a[1], opens(a[2]))],
        libc::SYS_openat2 => {
            // struct open_how { u64 flags; u64 mode; u64 resolve; }
            let how = read_memory(pid, a[2], 8, false);
            let flags = how
                .get(..8)
                .map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])));
            vec![(a[0] as i64, a[1], opens(flags))]
        }
        libc::SYS_creat => vec![(at_cwd, a[0], Naming::Open)],
        libc::SYS_execve => vec![(at_cwd, a[0], Read)],
        libc::SYS_execveat => vec![(a[0] as i64, a[1], Read)],
        libc::SYS_mkdir | libc::SYS_mknod | libc::SYS_unlink | libc::SYS_rmdir => {
            vec![(at_cwd, a[0], Changes)]
        }
        libc::SYS_truncate => vec![(at_cwd, a[0], Changes)],
        libc::SYS_mkdirat | libc::SYS_mknodat | libc::SYS_unlinkat => {
            vec![(a[0] as i64, a[1], Changes)]
        }
        libc::SYS_rename | libc::SYS_link => {
            vec![(at_cwd, a[0], Changes), (at_cwd, a[1], Changes)]
        }
        // The link is made; what it points to is only text.
        libc::SYS_symlink => vec![(at_cwd, a[1], Changes)],
        libc::SYS_symlinkat => vec![(a[1] as i64, a[2], Changes)],
        libc::SYS_renameat | libc::SYS_renameat2 => {
            vec![(a[0] as i64, a[1], Changes), (a[2] as i64, a[3], Changes)]
        }
        // linkat(olddirfd, oldpath, newdirfd, newpath): the old name is
        // only read.
        libc::SYS_linkat => vec![(a[0] as i64, a[1], Read), (a[2] as i64, a[3], Changes)],
        libc::SYS_connect => {
            record_connect(pid, a[1], a[2], observed);
            Vec::new()
        }
        _ => Vec::new(),
    };
    let mut changes = Vec::new();
    for (dirfd, address, how) in named {
        let Some(path) = read_path(pid, address).and_then(|p| absolute(pid, dirfd, p)) else {
            continue;
        };
        let Some(real) = on_host(&path, how != Read) else {
            continue;
        };
        match how {
            Read => {
                let mut seen = observed.lock().unwrap_or_else(|e| e.into_inner());
                seen.note(
                    real,
                    Use {
                        read: true,
                        ..Use::default()
                    },
                );
            }
            Naming::Open => {
                let before = Stamp::of(&real);
                changes.push(Change {
                    path: real,
                    kind: ChangeKind::Open(before),
                });
            }
            Changes => changes.push(Change {
                path: real,
                kind: ChangeKind::Direct,
            }),
        }
    }
    changes
}

fn record_connect(pid: i32, address: u64, len: u64, observed: &Mutex<Observed>) {
    let bytes = read_memory(pid, address, (len as usize).min(128), false);
    if bytes.len() < 2 {
        return;
    }
    let family = u16::from_ne_bytes([bytes[0], bytes[1]]) as i32;
    let port = |b: &[u8]| u16::from_be_bytes([b[2], b[3]]);
    let mut seen = observed.lock().unwrap_or_else(|e| e.into_inner());
    match family {
        libc::AF_INET if bytes.len() >= 8 => {
            let ip = std::net::Ipv4Addr::new(bytes[4], bytes[5], bytes[6], bytes[7]);
            seen.connects.insert(format!("{ip}:{}", port(&bytes)));
        }
        libc::AF_INET6 if bytes.len() >= 24 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&bytes[8..24]);
            let ip = std::net::Ipv6Addr::from(octets);
            seen.connects.insert(format!("[{ip}]:{}", port(&bytes)));
        }
        libc::AF_UNIX if bytes.len() > 2 && bytes[2] != 0 => {
            use std::os::unix::ffi::OsStrExt;
            let end = bytes[2..]
                .iter()
                .position(|b| *b == 0)
                .map_or(bytes.len(), |e| e + 2);
            let path = Path::new(std::ffi::OsStr::from_bytes(&bytes[2..end]));
            seen.unix.insert(path.to_owned());
        }
        _ => {}
    }
}

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

#[cfg(test)]
mod tests {
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
}

//! `moat learn`: one run of a native server without its file and network
//! rules, watched, to find the `dirs` and `net` entries it needs.
//!
//! This module owns the watched run and what is made of it. The server is
//! started as every native server is (namespaces, no capabilities, the
//! seccomp deny-list), but without Landlock and without a network namespace;
//! a second seccomp filter stops it at each system call that names a file or
//! an address (`open*`, `creat`, `exec*`, `mkdir*`, `unlink*`, `rename*`,
//! `connect`) for a tracer thread of Moat's, which reads the path or address
//! from the server's memory, records it and lets the call go on. Nothing is
//! refused that the sandbox would allow. [`propose`] then turns what was
//! recorded into grants: paths already granted by default are left out,
//! files are grouped under their package directory (`node_modules`,
//! `site-packages`, a `PYTHONPATH` or `NODE_PATH` entry) or their own
//! directory, and each grant is read-only unless something under it was
//! written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::spawn;

/// What a watched run saw: every file it named, with whether it wrote, and
/// every address it connected to.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Files and directories the server opened, executed or changed
    /// (resolved on the host; names that did not exist are left out), and
    /// whether it wrote.
    pub files: BTreeMap<PathBuf, bool>,
    /// `host:port` of every IPv4 and IPv6 connect.
    pub connects: BTreeSet<String>,
    /// Paths of Unix sockets it tried to reach.
    pub unix: BTreeSet<PathBuf>,
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
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
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

fn resume(pid: i32, signal: i32) {
    // SAFETY: PTRACE_CONT of a stopped tracee with a signal number.
    unsafe {
        libc::ptrace(
            libc::PTRACE_CONT,
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
        if signal == libc::SIGTRAP && event == libc::PTRACE_EVENT_SECCOMP {
            record(pid, observed);
            resume(pid, 0);
        } else if event != 0 || signal == libc::SIGTRAP {
            // Clone, fork, exec and seize stops: nothing to deliver.
            resume(pid, 0);
        } else {
            // A signal on its way to the server: deliver it.
            resume(pid, signal);
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

fn record(pid: i32, observed: &Mutex<Observed>) {
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
        return;
    }
    let nr = info.nr as libc::c_long;
    let a = info.args;
    let at_cwd = libc::AT_FDCWD as i64;
    let writes = |flags: u64| {
        let flags = flags as i32;
        flags & libc::O_ACCMODE != libc::O_RDONLY || flags & (libc::O_CREAT | libc::O_TRUNC) != 0
    };
    // (dirfd, path address, writes)
    let named: Vec<(i64, u64, bool)> = match nr {
        libc::SYS_open => vec![(at_cwd, a[0], writes(a[1]))],
        libc::SYS_openat => vec![(a[0] as i64, a[1], writes(a[2]))],
        libc::SYS_openat2 => {
            // struct open_how { u64 flags; u64 mode; u64 resolve; }
            let how = read_memory(pid, a[2], 8, false);
            let flags = how
                .get(..8)
                .map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])));
            vec![(a[0] as i64, a[1], writes(flags))]
        }
        libc::SYS_creat => vec![(at_cwd, a[0], true)],
        libc::SYS_execve => vec![(at_cwd, a[0], false)],
        libc::SYS_execveat => vec![(a[0] as i64, a[1], false)],
        libc::SYS_mkdir | libc::SYS_unlink => vec![(at_cwd, a[0], true)],
        libc::SYS_mkdirat | libc::SYS_unlinkat => vec![(a[0] as i64, a[1], true)],
        libc::SYS_rename => vec![(at_cwd, a[0], true), (at_cwd, a[1], true)],
        libc::SYS_renameat | libc::SYS_renameat2 => {
            vec![(a[0] as i64, a[1], true), (a[2] as i64, a[3], true)]
        }
        libc::SYS_connect => {
            record_connect(pid, a[1], a[2], observed);
            Vec::new()
        }
        _ => Vec::new(),
    };
    for (dirfd, address, write) in named {
        let Some(path) = read_path(pid, address).and_then(|p| absolute(pid, dirfd, p)) else {
            continue;
        };
        let Some(real) = on_host(&path, write) else {
            continue;
        };
        let mut seen = observed.lock().unwrap_or_else(|e| e.into_inner());
        *seen.files.entry(real).or_insert(false) |= write;
    }
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

/// Grants that would let the server do what it did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Proposal {
    /// Directories to grant, and whether to grant them read-write.
    pub dirs: Vec<(PathBuf, bool)>,
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
    pub dirs: &'a [crate::config::DirGrant],
    /// Package roots named in its environment (`PYTHONPATH`, `NODE_PATH`).
    pub package_paths: Vec<PathBuf>,
    /// What no grant may overlap.
    pub protected: Vec<PathBuf>,
    /// The installation roots granted without listing.
    pub roots: Vec<PathBuf>,
}

/// Turns what a watched run saw into grants (see the module's docs).
pub fn propose(observed: &Observed, granted: &Granted<'_>) -> Proposal {
    let covered = |path: &Path, write: bool| {
        crate::sandbox::granted_to_start(path, granted.executable, &granted.roots) && !write
            // What it writes under /tmp lands in its private /tmp; what it
            // reads there of the host's must be granted.
            || (path.starts_with("/tmp") && write)
            || path.starts_with("/proc")
            || granted
                .measure
                .iter()
                .any(|m| path.starts_with(m) && !write)
            || granted.dirs.iter().any(|d| {
                path.starts_with(&d.host) && (!write || d.mode == crate::config::DirMode::Rw)
            })
    };
    let mut anchors: BTreeMap<PathBuf, bool> = BTreeMap::new();
    let mut probes = Vec::new();
    for (path, write) in &observed.files {
        if covered(path, *write) {
            continue;
        }
        if path.starts_with("/sys") {
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
                if path.is_dir() && !*write {
                    path.clone()
                } else {
                    path.parent().unwrap_or(path).to_owned()
                }
            });
        *anchors.entry(anchor).or_insert(false) |= *write;
    }
    // A grant inside another is folded into it.
    let roots: Vec<(PathBuf, bool)> = anchors.clone().into_iter().collect();
    let mut dirs: Vec<(PathBuf, bool)> = Vec::new();
    for (path, write) in roots {
        if let Some(outer) = anchors
            .keys()
            .find(|other| **other != path && path.starts_with(other))
            .cloned()
        {
            *anchors.get_mut(&outer).unwrap_or(&mut false) |= write;
            continue;
        }
        dirs.push((path, write));
    }
    for (path, write) in &mut dirs {
        *write = anchors.get(path).copied().unwrap_or(*write);
    }
    let mut withheld = Vec::new();
    dirs.retain(|(path, _)| {
        match granted
            .protected
            .iter()
            .find(|kept| path.starts_with(kept) || kept.starts_with(path))
        {
            Some(kept) => {
                withheld.push((path.clone(), kept.clone()));
                false
            }
            None => true,
        }
    });
    Proposal {
        dirs,
        withheld,
        net: observed.connects.iter().cloned().collect(),
        unix: observed.unix.iter().cloned().collect(),
        probes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_grouped_by_package_root_and_granted_read_only_unless_written() {
        // Names only: propose looks at the filesystem only for a bare
        // directory, which none of these is.
        let root = PathBuf::from("/srv/moat-learn-test");
        let modules = root.join("app/node_modules");
        let site = root.join("py");
        let data = root.join("data");
        let mut observed = Observed::default();
        for (path, write) in [
            (modules.join("a/dist/index.js"), false),
            (modules.join("b/index.js"), false),
            (site.join("mcp/__init__.py"), false),
            (data.join("out.txt"), true),
            (PathBuf::from("/usr/lib/x.so"), false),
            (PathBuf::from("/etc/hosts"), false),
            (PathBuf::from("/tmp/scratch"), true),
            (PathBuf::from("/sys/fs/cgroup/cpu.max"), false),
        ] {
            observed.files.insert(path, write);
        }
        observed.connects.insert("127.0.0.1:8080".into());
        let proposal = propose(
            &observed,
            &Granted {
                executable: Path::new("/usr/bin/node"),
                measure: &[],
                dirs: &[],
                protected: Vec::new(),
                roots: Vec::new(),
                package_paths: vec![site.clone()],
            },
        );
        assert_eq!(
            proposal.dirs,
            [(modules, false), (data, true), (site, false)]
        );
        assert_eq!(proposal.net, ["127.0.0.1:8080"]);
        assert_eq!(proposal.probes, [PathBuf::from("/sys/fs/cgroup/cpu.max")]);
    }
}

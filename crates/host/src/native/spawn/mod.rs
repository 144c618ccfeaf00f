//! How a native server's process is made: one `clone` into fresh user, PID,
//! mount, IPC, UTS, cgroup and (without `net`) network namespaces, then, in
//! the child and before exec, every containment step in a fixed order.
//!
//! This module owns the child side of the native launch (planned by
//! `native::contain`): the namespaces, the
//! uid and gid maps, the server's own root (built by `sandbox::root`, which
//! holds its private `/tmp`; without one, a private `/tmp` over the host's
//! root), rlimits, no_new_privs, Landlock, the
//! descriptor sweep, the capability drop and the seccomp filters. The
//! standard library's `Command` cannot start a process in a new PID
//! namespace, so the process is made here with a raw `clone` (no `CLONE_VM`:
//! the child has its own copy of memory, as after `fork`), and the server is
//! PID 1 of its namespace. When PID 1 exits, the kernel kills every other
//! process of the namespace and reaps them before PID 1's own exit can be
//! waited for: once [`Child::wait`] returns, nothing the server started is
//! left, whatever it did with sessions or process groups.
//!
//! Between `clone` and `execve` the child runs only raw system calls on
//! memory prepared before the clone; it allocates nothing and takes no lock.
//! A step that fails is reported through a close-on-exec pipe as (step,
//! errno), and the launch fails naming that step: nothing is retried with
//! less containment.
//!
//! Here: the clone and the launch pipe. The child's steps are [`step`]'s,
//! the child itself [`child`]'s, its mounts [`mounts`]' and the egress
//! sockets it hands over [`sockets`]'.

use std::ffi::{CString, c_char};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use rustix::process::{Resource, Rlimit};

use super::contain::namespaces::{Namespaces, SERVER_NAMESPACES};

mod child;
mod mounts;
mod sockets;
mod step;

pub use sockets::{ProxyPlan, proxy_channel, receive_listener};
pub use step::Step;

/// Everything the child does, prepared in the parent.
pub struct ChildPlan {
    pub path: CString,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    pub cwd: CString,
    pub executable: RawFd,
    /// A script's interpreter, which `path` names: kept through the
    /// descriptor sweep, closed by exec itself.
    pub interpreter: Option<RawFd>,
    pub rlimits: Vec<(Resource, Rlimit)>,
    pub namespaces: Option<Namespaces>,
    /// The Landlock ruleset, with the rights for the child's /proc/self and
    /// its private /tmp.
    pub landlock: Option<(RawFd, u64, u64)>,
    /// Whether the bounding set and securebits can be changed (the child
    /// holds CAP_SETPCAP: root, or in its own user namespace).
    pub drop_bounding: bool,
    pub seccomp: Vec<seccompiler::BpfProgram>,
    /// In a network namespace with `net` grants: the child brings its
    /// loopback up, listens on 127.0.0.1:`port` (the proxy), binds UDP
    /// 127.0.0.1:53 (DNS) and listens at each relay address, and hands
    /// them all to Moat over `channel`, in that order.
    pub proxy: Option<ProxyPlan>,
}

/// A started child: its pidfd and the parent's ends of its stdio.
pub struct Child {
    pub pidfd: OwnedFd,
    pub pid: i32,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// Why a child could not be started.
#[derive(Debug)]
pub enum SpawnFailure {
    /// In the parent: the system call named, and its error.
    Parent(&'static str, std::io::Error),
    /// In the child, before exec: the step, and its errno.
    Child(Step, std::io::Error),
    /// In the child, before exec: the step, the host path it was placing in
    /// the server's own root, and its errno.
    ChildAt(Step, std::path::PathBuf, std::io::Error),
}

impl std::fmt::Display for SpawnFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpawnFailure::Parent(call, error) => write!(f, "{call}: {error}"),
            SpawnFailure::Child(step, error) => {
                write!(f, "in the child, {}: {error}", step.describe())
            }
            SpawnFailure::ChildAt(step, path, error) => {
                write!(
                    f,
                    "in the child, {} of {}: {error}",
                    step.describe(),
                    path.display()
                )
            }
        }
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), SpawnFailure> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SpawnFailure::Parent("pipe2", e.into()))?;
    // The child moves its ends onto 0, 1 and 2: keep every end above them, so
    // no move overwrites another end (Moat may run with 0..2 closed).
    let high = |fd: OwnedFd| {
        rustix::io::fcntl_dupfd_cloexec(&fd, 3)
            .map_err(|e| SpawnFailure::Parent("fcntl(F_DUPFD_CLOEXEC)", e.into()))
    };
    Ok((high(read)?, high(write)?))
}

/// Starts the child described by `plan`, in namespaces when it has them.
pub fn spawn(plan: &ChildPlan) -> Result<Child, SpawnFailure> {
    let (child, pending) = spawn_inner(plan, None::<fn(i32) -> std::io::Result<()>>)?;
    match pending {
        Some(pending) => pending.finish().map(|()| child),
        None => Ok(child),
    }
}

/// Like [`spawn`], but the child waits, once contained and just before its
/// seccomp filters and exec, until `before_exec` has run on its pid (the
/// learn run attaches its tracer there). The launch's outcome is read with
/// [`Pending::finish`], on another thread than a tracer's, which must be
/// free to let the child reach its exec.
pub fn spawn_gated(
    plan: &ChildPlan,
    before_exec: impl FnOnce(i32) -> std::io::Result<()>,
) -> Result<(Child, Pending), SpawnFailure> {
    let (child, pending) = spawn_inner(plan, Some(before_exec))?;
    let pending = pending
        .ok_or_else(|| SpawnFailure::Parent("spawn", std::io::Error::other("no launch pipe")))?;
    Ok((child, pending))
}

/// A gated launch whose outcome is yet to be read.
pub struct Pending {
    report: OwnedFd,
    life: OwnedFd,
    /// The host paths of the root's entries, to name one in an error.
    subjects: Vec<std::path::PathBuf>,
}

impl Pending {
    /// Blocks until the child has exec'd (`Ok`) or failed a step.
    pub fn finish(self) -> Result<(), SpawnFailure> {
        let report = read_report(&self.report, &self.subjects);
        drop(self.life);
        report.map_or(Ok(()), Err)
    }
}

fn spawn_inner(
    plan: &ChildPlan,
    before_exec: Option<impl FnOnce(i32) -> std::io::Result<()>>,
) -> Result<(Child, Option<Pending>), SpawnFailure> {
    let gated = before_exec.is_some();
    let gate = gated.then(pipe).transpose()?;
    let (stdin_read, stdin_write) = pipe()?;
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let (report_read, report_write) = pipe()?;
    // Held open by Moat until the child has exec'd: a child that finds it
    // closed knows its parent died before the death signal was armed.
    let (life_read, life_write) = pipe()?;
    let argv: Vec<*const c_char> = plan
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const c_char> = plan
        .env
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let mut flags = libc::CLONE_PIDFD | libc::SIGCHLD;
    if let Some(ns) = &plan.namespaces {
        flags |= SERVER_NAMESPACES;
        if ns.user.is_some() {
            flags |= libc::CLONE_NEWUSER;
        }
        if ns.net {
            flags |= libc::CLONE_NEWNET;
        }
    }
    let fds = ChildFds {
        stdin: stdin_read.as_raw_fd(),
        stdout: stdout_write.as_raw_fd(),
        stderr: stderr_write.as_raw_fd(),
        report: report_write.as_raw_fd(),
        life: life_read.as_raw_fd(),
        life_write: life_write.as_raw_fd(),
        gate: gate.as_ref().map(|(read, _)| read.as_raw_fd()),
        gate_write: gate.as_ref().map(|(_, write)| write.as_raw_fd()),
    };
    let mut pidfd: libc::c_int = -1;
    // SAFETY: a fork-like clone: no CLONE_VM and no new stack, so the child
    // runs on its own copy of this thread's stack and memory. It runs only
    // `child`, which never returns, makes raw system calls on memory
    // prepared above and allocates nothing. CLONE_PIDFD writes the pidfd
    // through the parent_tid argument, which points at `pidfd`.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags as libc::c_ulong,
            0usize,
            &mut pidfd as *mut libc::c_int,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        // SAFETY: we are the freshly cloned child (see above).
        unsafe { child::child(plan, &fds, &argv, &envp) }
    }
    if pid < 0 {
        return Err(SpawnFailure::Parent(
            "clone",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: CLONE_PIDFD succeeded, so `pidfd` is a descriptor we now own.
    let pidfd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) };
    drop((
        stdin_read,
        stdout_write,
        stderr_write,
        report_write,
        life_read,
    ));
    if let (Some(before_exec), Some((gate_read, gate_write))) = (before_exec, gate) {
        drop(gate_read);
        let opened = before_exec(pid as i32);
        // The child goes on when the gate opens (a byte) or closes (Moat
        // failed: the child then stops, reporting a lost parent).
        if let Err(error) = opened {
            drop(gate_write);
            drop(life_write);
            let _ = rustix::process::waitid(
                rustix::process::WaitId::PidFd(pidfd.as_fd()),
                rustix::process::WaitIdOptions::EXITED,
            );
            return Err(SpawnFailure::Parent("attaching to the child", error));
        }
        let _ = rustix::io::write(&gate_write, b"g");
    }
    let child = Child {
        pidfd,
        pid: pid as i32,
        stdin: stdin_write,
        stdout: stdout_read,
        stderr: stderr_read,
    };
    let pending = Pending {
        report: report_read,
        life: life_write,
        subjects: plan
            .namespaces
            .as_ref()
            .and_then(|ns| ns.root.as_ref())
            .map(|root| root.subjects().to_vec())
            .unwrap_or_default(),
    };
    if gated {
        // A tracer reaps the child; the caller reads the outcome.
        return Ok((child, Some(pending)));
    }
    if let Err(failure) = pending.finish() {
        // The child has left with `_exit`; reap it.
        let _ = rustix::process::waitid(
            rustix::process::WaitId::PidFd(child.pidfd.as_fd()),
            rustix::process::WaitIdOptions::EXITED,
        );
        return Err(failure);
    }
    Ok((child, None))
}

/// Reads the child's report: nothing (EOF at exec) or (step, errno,
/// subject): the subject, an entry of the server's root, is named by its
/// host path.
fn read_report(fd: &OwnedFd, subjects: &[std::path::PathBuf]) -> Option<SpawnFailure> {
    let mut buf = [0u8; 12];
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::io::read(fd, &mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(errno) => {
                return Some(SpawnFailure::Parent(
                    "read of the launch pipe",
                    errno.into(),
                ));
            }
        }
    }
    if filled == 0 {
        return None;
    }
    let step = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let errno = i32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let subject = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
    let step = Step::from_raw(step).unwrap_or(Step::Execve);
    let error = std::io::Error::from_raw_os_error(errno);
    match subjects.get(subject as usize) {
        Some(path) => Some(SpawnFailure::ChildAt(step, path.to_owned(), error)),
        None => Some(SpawnFailure::Child(step, error)),
    }
}

struct ChildFds {
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    report: RawFd,
    life: RawFd,
    life_write: RawFd,
    gate: Option<RawFd>,
    gate_write: Option<RawFd>,
}

/// Reports `step` failing with the current errno, and leaves.
///
/// # Safety
///
/// Only in the cloned child.
pub(super) unsafe fn fail(report: RawFd, step: Step, errno: i32) -> ! {
    // SAFETY: see the contract.
    unsafe { fail_at(report, step, errno, u32::MAX) }
}

/// Reports `step` failing with `errno` at entry `subject` of the server's
/// root (`u32::MAX`: none), and leaves.
///
/// # Safety
///
/// Only in the cloned child.
pub(super) unsafe fn fail_at(report: RawFd, step: Step, errno: i32, subject: u32) -> ! {
    let mut buf = [0u8; 12];
    buf[..4].copy_from_slice(&(step as u32).to_le_bytes());
    buf[4..8].copy_from_slice(&errno.to_le_bytes());
    buf[8..].copy_from_slice(&subject.to_le_bytes());
    // SAFETY: writes 12 bytes from the stack, then leaves without running
    // destructors (the parent's state is not ours to tear down).
    unsafe {
        libc::write(report, buf.as_ptr().cast(), buf.len());
        libc::_exit(127)
    }
}

pub(super) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Writes `bytes` to the file at `path` (a /proc file), or fails `step`.
///
/// # Safety
///
/// Only in the cloned child.
pub(super) unsafe fn write_proc(path: &std::ffi::CStr, bytes: &[u8], report: RawFd, step: Step) {
    // SAFETY: a static path; the descriptor is closed before returning.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            fail(report, step, errno());
        }
        if libc::write(fd, bytes.as_ptr().cast(), bytes.len()) != bytes.len() as isize {
            fail(report, step, errno());
        }
        libc::close(fd);
    }
}

/// Closes every descriptor from `from` to `to` inclusive.
///
/// # Safety
///
/// Only in the cloned child.
pub(super) unsafe fn close_range(from: u32, to: u32) -> bool {
    if from > to {
        return true;
    }
    // SAFETY: closes descriptors of this (child) process only.
    unsafe { libc::syscall(libc::SYS_close_range, from, to, 0u32) == 0 }
}

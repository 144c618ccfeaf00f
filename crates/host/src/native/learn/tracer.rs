//! The tracer thread of a learn run: the watch filter, the child seized
//! before its exec, and every stop served until the last traced process is
//! gone; a call that changes files is settled when it returns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::decode::{Change, ChangeKind, record};
use super::{Observed, Use};
use crate::native::reaper::WaitStatus;
use crate::native::spawn;

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
pub type Exit = tokio::sync::oneshot::Receiver<WaitStatus>;

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
fn trace(main: i32, observed: &Mutex<Observed>) -> WaitStatus {
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

//! The running child, from Moat's side: waited for and signalled through
//! its pidfd ([`Reaper`]), what is left of its process group killed, its
//! exit classified (a limit, a stop, a crash), and its stderr watched for
//! the allocator's out-of-memory message ([`OomWatch`]).

use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use rustix::process::{Pid, Signal};
use tokio::io::{AsyncRead, ReadBuf};

use crate::instance::Exit;
use crate::limits::{LimitHit, Limits};

/// Waits for a child through its pidfd, and signals it through the same
/// descriptor (never a recycled pid). A child not yet waited for when this
/// is dropped is killed and reaped.
pub(super) struct Reaper {
    pidfd: Arc<tokio::io::unix::AsyncFd<OwnedFd>>,
    pid: i32,
    pub(super) reaped: bool,
}

/// Signals a child through its pidfd.
#[derive(Clone)]
pub(super) struct Signaller(Arc<tokio::io::unix::AsyncFd<OwnedFd>>);

impl Signaller {
    pub(super) fn send(&self, signal: Signal) {
        // ESRCH: already exited.
        let _ = rustix::process::pidfd_send_signal(self.0.get_ref(), signal);
    }
}

/// Exit code, terminating signal, and the CPU seconds it had used.
pub(super) type WaitStatus = Result<(Option<i32>, Option<i32>, u64), std::io::Error>;

/// The fields of /proc/PID/stat after the command's closing parenthesis
/// (state, ppid, pgrp, ...), from `stat`'s text.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().collect())
}

/// CPU seconds (user and system) a process has used, read from
/// /proc/PID/stat; a zombie keeps them until it is reaped.
fn cpu_seconds_used(pid: i32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let Some(fields) = stat_fields(&stat) else {
        return 0;
    };
    // utime and stime are fields 14 and 15 of the whole line.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks / per_second
}

impl Reaper {
    pub(super) fn new(pidfd: OwnedFd, pid: i32) -> std::io::Result<Self> {
        // SAFETY: the AsyncFd takes ownership of the OwnedFd, so the
        // descriptor stays open and refers to the same pidfd for the
        // AsyncFd's whole life, and `as_raw_fd` always returns it.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
        }?;
        Ok(Self {
            pidfd: Arc::new(registered),
            pid,
            reaped: false,
        })
    }

    pub(super) fn signaller(&self) -> Signaller {
        Signaller(self.pidfd.clone())
    }

    /// The exit code or the terminating signal, once the child has exited.
    pub(super) async fn wait(mut self) -> WaitStatus {
        loop {
            let mut ready = self.pidfd.readable().await?;
            match rustix::process::waitid(
                rustix::process::WaitId::PidFd(self.pidfd.get_ref().as_fd()),
                rustix::process::WaitIdOptions::EXITED
                    | rustix::process::WaitIdOptions::NOHANG
                    | rustix::process::WaitIdOptions::NOWAIT,
            ) {
                Ok(Some(status)) => {
                    // Exited, not yet reaped (NOWAIT): read its CPU time,
                    // then reap it.
                    let cpu = cpu_seconds_used(self.pid);
                    let _ = rustix::process::waitid(
                        rustix::process::WaitId::PidFd(self.pidfd.get_ref().as_fd()),
                        rustix::process::WaitIdOptions::EXITED,
                    );
                    self.reaped = true;
                    return Ok((status.exit_status(), status.terminating_signal(), cpu));
                }
                Ok(None) => ready.clear_ready(),
                Err(rustix::io::Errno::INTR) => {}
                Err(errno) => {
                    self.reaped = true;
                    return Err(errno.into());
                }
            }
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        let _ = rustix::process::pidfd_send_signal(self.pidfd.get_ref(), Signal::KILL);
        let pidfd = self.pidfd.clone();
        let reap = move || {
            let _ = rustix::process::waitid(
                rustix::process::WaitId::PidFd(pidfd.get_ref().as_fd()),
                rustix::process::WaitIdOptions::EXITED,
            );
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn_blocking(reap)),
            Err(_) => reap(),
        }
    }
}

/// Processes (not zombies) whose process group is `pgid`, from /proc.
fn group_members(pgid: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let fields = stat_fields(&stat)?;
            let state = *fields.first()?;
            let pgrp: i32 = fields.get(2)?.parse().ok()?;
            (pgrp == pgid.as_raw_nonzero().get() && state != "Z" && state != "X")
                .then(|| Pid::from_raw(pid))
                .flatten()
        })
        .collect()
}

/// SIGKILLs process group `pgid` and waits, through pidfds, until every
/// member has died (bounded by `bound` per round, three rounds at most, for
/// members forked while the first kill was in flight).
pub(super) async fn kill_group_and_wait(pgid: Pid, bound: std::time::Duration) {
    for _ in 0..3 {
        let members = group_members(pgid);
        let pidfds: Vec<OwnedFd> = members
            .iter()
            .filter_map(|pid| {
                rustix::process::pidfd_open(*pid, rustix::process::PidfdFlags::empty()).ok()
            })
            .collect();
        // ESRCH: the group is already empty.
        let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
        if members.is_empty() {
            return;
        }
        let wait_all = async {
            for pidfd in pidfds {
                // A pidfd becomes readable once its process has exited.
                // SAFETY: the AsyncFd takes ownership of the OwnedFd, so the
                // descriptor stays open and refers to the same pidfd for the
                // AsyncFd's whole life, and `as_raw_fd` always returns it.
                let registered = unsafe {
                    tokio::io::unix::AsyncFd::register_with_interest(
                        pidfd,
                        tokio::io::Interest::READABLE,
                    )
                };
                if let Ok(fd) = registered {
                    let _ = fd.readable().await;
                }
            }
        };
        if tokio::time::timeout(bound, wait_all).await.is_err() {
            tracing::warn!(
                pgid = pgid.as_raw_nonzero().get(),
                "processes of a stopped server are still exiting"
            );
        }
    }
}

pub(super) fn classify(
    status: WaitStatus,
    stopped: bool,
    out_of_memory: bool,
    limits: &Limits,
) -> Exit {
    let (code, signal, cpu_used) = match status {
        Ok(status) => status,
        Err(error) => return Exit::Crashed(format!("waitid: {error}")),
    };
    // The allocator's message does not say which bound it met: the address
    // space when one is set below the data limit, else the data limit. A
    // runtime that catches the failure (Python's MemoryError) exits with a
    // code instead of a signal; the limit is still what stopped it.
    let memory_limit = || {
        Exit::Limit(if limits.address_space_bytes <= limits.data_bytes {
            LimitHit::AddressSpace {
                address_space_bytes: limits.address_space_bytes,
            }
        } else {
            LimitHit::Data {
                data_bytes: limits.data_bytes,
            }
        })
    };
    if let Some(code) = code {
        if code != 0 && out_of_memory {
            return memory_limit();
        }
        return Exit::Code(code);
    }
    let signal = signal.unwrap_or(0);
    // The server is PID 1 of its namespace, which ignores SIGXCPU: the CPU
    // limit then shows as SIGKILL at the hard limit, with the time used.
    if signal == Signal::XCPU.as_raw()
        || (signal == Signal::KILL.as_raw() && !stopped && cpu_used >= limits.cpu_seconds)
    {
        return Exit::Limit(LimitHit::CpuSeconds {
            cpu_seconds: limits.cpu_seconds,
        });
    }
    if out_of_memory {
        return memory_limit();
    }
    if stopped && (signal == Signal::TERM.as_raw() || signal == Signal::KILL.as_raw()) {
        return Exit::Stopped;
    }
    Exit::Crashed(format!("killed by signal {signal}"))
}

/// Passes stderr through, noting the allocator's out-of-memory message
/// (Rust's `memory allocation of N bytes failed`, glibc's `Cannot allocate
/// memory`): a process that dies of RLIMIT_AS says so only there.
pub(super) struct OomWatch<R> {
    inner: R,
    tail: Vec<u8>,
    hit: Arc<AtomicBool>,
}

impl<R> OomWatch<R> {
    pub(super) fn new(inner: R, hit: Arc<AtomicBool>) -> Self {
        Self {
            inner,
            tail: Vec::new(),
            hit,
        }
    }
}

const OOM_MARKERS: [&[u8]; 5] = [
    b"memory allocation of",
    b"Cannot allocate memory",
    b"JavaScript heap out of memory",
    b"MemoryError",
    b"fatal error: runtime: out of memory",
];

impl<R: AsyncRead + Unpin> AsyncRead for OomWatch<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &result {
            let new = buf.filled()[before..].to_vec();
            let this = &mut *self;
            this.tail.extend_from_slice(&new);
            if OOM_MARKERS
                .iter()
                .any(|m| this.tail.windows(m.len()).any(|w| w == *m))
            {
                this.hit.store(true, Ordering::SeqCst);
            }
            let keep = 64.min(this.tail.len());
            let drop_to = this.tail.len() - keep;
            this.tail.drain(..drop_to);
        }
        result
    }
}

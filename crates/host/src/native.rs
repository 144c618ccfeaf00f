//! The native launcher: runs an executable as a child process behind the one
//! transport, measured and bounded.
//!
//! Measured launch: the resolved executable is opened without following
//! links, hashed through that descriptor, and that same descriptor is run
//! (`/proc/self/fd/N`), so nothing can be swapped between hash and exec.
//! The child gets exactly the configured argv (no shell), cwd and
//! environment; it leads its own process group, has a parent-death signal
//! and no_new_privs, and runs under rlimits for CPU, address space, open
//! files, processes, file size and core size 0. Stopping it signals the
//! whole group, so grandchildren go too.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use rustix::fs::{Mode, OFlags};
use rustix::process::{Pid, Resource, Rlimit, Signal};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::watch;

use crate::LaunchError;
use crate::command::{ResolveError, Resolved};
use crate::identity::{Digest, DigestMismatch, Evidence, Expectation};
use crate::limits::{LimitHit, Limits};
use crate::transport::{Exit, Launched, Metrics, Tracker};

/// Errors of the native launcher, naming the operation and the path.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(
        "open(O_NOFOLLOW) {path}: refusing a symbolic link in place of the executable resolved when the config was loaded"
    )]
    Symlink { path: PathBuf },
    #[error("{syscall} {path}: {source}")]
    Io {
        syscall: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a regular file")]
    NotRegular { path: PathBuf },
    #[error("executable {path}: {mismatch}")]
    Digest {
        path: PathBuf,
        #[source]
        mismatch: DigestMismatch,
    },
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    #[error(
        "spawning {path} (fork; prctl PR_SET_PDEATHSIG and PR_SET_NO_NEW_PRIVS; setrlimit; landlock_restrict_self; execve of the measured descriptor): {source}"
    )]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Everything one native launch needs.
#[derive(Clone, Debug)]
pub struct NativeLaunch {
    /// The server's name, for logs and errors.
    pub name: String,
    /// The command, resolved.
    pub resolved: Resolved,
    /// Arguments after argv[0], passed exactly.
    pub args: Vec<String>,
    /// The exact environment.
    pub env: Vec<(String, String)>,
    /// The working directory.
    pub cwd: PathBuf,
    /// Files or directories whose digests join the identity.
    pub measure: Vec<PathBuf>,
    /// What the executable's bytes must hash to.
    pub expected: Expectation,
    /// Bounds.
    pub limits: Limits,
    /// Directories granted (Landlock).
    pub dirs: Vec<crate::config::DirGrant>,
    /// TCP destinations granted (Landlock: by port).
    pub net: Vec<crate::config::NetGrant>,
    /// Whether a rule the kernel cannot enforce refuses the launch.
    pub sandbox: crate::config::Sandbox,
}

/// The executable, opened without following links, with its digest when
/// one is pinned.
pub struct MeasuredExecutable {
    fd: OwnedFd,
    digest: Option<Digest>,
}

impl MeasuredExecutable {
    /// The digest of the bytes behind the descriptor, if measured.
    pub fn digest(&self) -> Option<Digest> {
        self.digest
    }
}

/// Opens `path` with O_NOFOLLOW and, when a digest is pinned, hashes it
/// through that descriptor and checks it. An unpinned launch is not hashed
/// (its evidence is `native-unmeasured`).
pub fn open_measured(
    path: &Path,
    expected: Expectation,
) -> Result<MeasuredExecutable, NativeError> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| {
        if errno == rustix::io::Errno::LOOP {
            NativeError::Symlink {
                path: path.to_owned(),
            }
        } else {
            NativeError::Io {
                syscall: "open(O_NOFOLLOW)",
                path: path.to_owned(),
                source: errno.into(),
            }
        }
    })?;
    let stat = rustix::fs::fstat(&fd).map_err(|errno| NativeError::Io {
        syscall: "fstat",
        path: path.to_owned(),
        source: errno.into(),
    })?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(NativeError::NotRegular {
            path: path.to_owned(),
        });
    }
    let digest = match expected {
        Expectation::Unpinned => None,
        Expectation::Pinned(_) | Expectation::Record => {
            // Read through a duplicate so the descriptor we execute stays put.
            let dup = fd.try_clone().map_err(|source| NativeError::Io {
                syscall: "dup",
                path: path.to_owned(),
                source,
            })?;
            let actual = hash_reader(std::fs::File::from(dup), path)?;
            expected
                .check(actual)
                .map_err(|mismatch| NativeError::Digest {
                    path: path.to_owned(),
                    mismatch,
                })?;
            Some(actual)
        }
    };
    Ok(MeasuredExecutable { fd, digest })
}

fn hash_reader(mut reader: impl Read, path: &Path) -> Result<Digest, NativeError> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader.read(&mut buf).map_err(|source| NativeError::Io {
            syscall: "read",
            path: path.to_owned(),
            source,
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(Digest::from_bytes(hasher.finalize().into()))
}

/// The digest of a measured file, or of a directory: every regular file
/// below it in path order, each as its relative path and digest. Links are
/// not followed.
pub fn measure_path(path: &Path) -> Result<Digest, NativeError> {
    let meta = std::fs::symlink_metadata(path).map_err(|source| NativeError::Io {
        syscall: "lstat",
        path: path.to_owned(),
        source,
    })?;
    if meta.is_file() {
        let file = std::fs::File::open(path).map_err(|source| NativeError::Io {
            syscall: "open",
            path: path.to_owned(),
            source,
        })?;
        return hash_reader(file, path);
    }
    if !meta.is_dir() {
        return Err(NativeError::NotRegular {
            path: path.to_owned(),
        });
    }
    let mut files = Vec::new();
    collect_files(path, path, &mut files)?;
    files.sort();
    let mut listing = String::new();
    for relative in files {
        let digest = measure_path(&path.join(&relative))?;
        listing.push_str(&format!("{digest}  {}\n", relative.display()));
    }
    Ok(Digest::of(listing.as_bytes()))
}

fn collect_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), NativeError> {
    let entries = std::fs::read_dir(dir).map_err(|source| NativeError::Io {
        syscall: "opendir",
        path: dir.to_owned(),
        source,
    })?;
    for entry in entries {
        let entry = entry.map_err(|source| NativeError::Io {
            syscall: "readdir",
            path: dir.to_owned(),
            source,
        })?;
        let path = entry.path();
        let kind = entry.file_type().map_err(|source| NativeError::Io {
            syscall: "lstat",
            path: path.clone(),
            source,
        })?;
        if kind.is_dir() {
            collect_files(root, &path, out)?;
        } else if kind.is_file() {
            out.push(path.strip_prefix(root).unwrap_or(&path).to_owned());
        }
    }
    Ok(())
}

/// A transport that runs an executable already opened (and measured) by
/// [`open_measured`]: whatever happens to the path afterwards, the bytes
/// behind the descriptor are what runs. `launch.measure` is measured at
/// connect.
pub fn transport(
    launch: NativeLaunch,
    executable: MeasuredExecutable,
) -> crate::transport::ServerTransport {
    crate::transport::ServerTransport::new(
        launch.name.clone(),
        launch.limits.clone(),
        move |tracker| async move {
            let measured = measure_all(launch.measure.clone(), &launch.resolved.target).await?;
            Ok(spawn(&launch, executable, measured, &tracker)?)
        },
    )
}

/// Digests of every `measure` path, off the async runtime. `executable`
/// names the launch in errors.
async fn measure_all(
    paths: Vec<PathBuf>,
    executable: &Path,
) -> Result<Vec<(PathBuf, Digest)>, NativeError> {
    tokio::task::spawn_blocking(move || {
        paths
            .iter()
            .map(|path| measure_path(path).map(|digest| (path.clone(), digest)))
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|error| NativeError::Spawn {
        path: executable.to_owned(),
        source: std::io::Error::other(error.to_string()),
    })?
}

/// Launches a native server for the transport.
pub(crate) async fn launch(
    launch: NativeLaunch,
    tracker: Arc<Tracker>,
) -> Result<Launched, LaunchError> {
    let target = launch.resolved.target.clone();
    let expected = launch.expected;
    let executable = tokio::task::spawn_blocking(move || open_measured(&target, expected))
        .await
        .map_err(|error| NativeError::Spawn {
            path: launch.resolved.target.clone(),
            source: std::io::Error::other(error.to_string()),
        })??;
    let measured = measure_all(launch.measure.clone(), &launch.resolved.target).await?;
    for (path, digest) in &measured {
        tracing::debug!(server = %launch.name, path = %path.display(), %digest, "measured");
    }
    Ok(spawn(&launch, executable, measured, &tracker)?)
}

fn spawn(
    launch: &NativeLaunch,
    executable: MeasuredExecutable,
    measured: Vec<(PathBuf, Digest)>,
    tracker: &Arc<Tracker>,
) -> Result<Launched, NativeError> {
    let fd = executable.fd.as_raw_fd();
    let mut cmd = tokio::process::Command::new(format!("/proc/self/fd/{fd}"));
    cmd.arg0(&launch.resolved.configured)
        .args(&launch.args)
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&launch.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let rlimits = rlimits(&launch.limits);
    let sandbox = crate::sandbox::plan(&crate::sandbox::Grants {
        executable: executable.fd.as_fd(),
        executable_path: &launch.resolved.target,
        measure: &launch.measure,
        dirs: &launch.dirs,
        net: &launch.net,
        sandbox: launch.sandbox,
    })?;
    let ruleset = crate::sandbox::ruleset_fd(&sandbox);
    let proc_self_access = sandbox.proc_self_access;
    let parent = rustix::process::getpid();
    let exe_fd = executable
        .fd
        .try_clone()
        .map_err(|source| NativeError::Io {
            syscall: "dup",
            path: launch.resolved.target.clone(),
            source,
        })?;
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe operations are allowed. It makes raw system calls
    // through rustix (fcntl, prctl, getppid, setrlimit) on values computed
    // before the fork, and allocates nothing: errors are plain errno values.
    unsafe {
        cmd.pre_exec(move || {
            // Keep the measured descriptor open across exec, so a script's
            // interpreter can read it through /proc/self/fd/N.
            rustix::io::fcntl_setfd(&exe_fd, rustix::io::FdFlags::empty())?;
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // The parent may have died before the line above took effect.
            if rustix::process::getppid() != Some(parent) {
                return Err(rustix::io::Errno::SRCH.into());
            }
            rustix::thread::set_no_new_privs(true)?;
            for (resource, limit) in &rlimits {
                rustix::process::setrlimit(*resource, *limit)?;
            }
            if let Some(ruleset) = ruleset {
                // SAFETY (restrict_child): we are in the forked child,
                // no_new_privs is set, and `ruleset` is the Landlock ruleset
                // built before the fork.
                crate::sandbox::restrict_child(ruleset, proc_self_access)?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| NativeError::Spawn {
        path: launch.resolved.target.clone(),
        source,
    })?;
    drop(executable.fd);
    let mut sandbox_lines: Vec<String> = sandbox
        .enforced
        .iter()
        .map(|l| format!("enforced: {l}"))
        .collect();
    sandbox_lines.extend(
        sandbox
            .not_enforced
            .iter()
            .map(|l| format!("not enforced: {l}")),
    );
    drop(sandbox);
    let pid = child.id().and_then(|id| Pid::from_raw(id as i32));
    let (Some(pid), Some(stdin), Some(stdout), Some(stderr)) = (
        pid,
        child.stdin.take(),
        child.stdout.take(),
        child.stderr.take(),
    ) else {
        return Err(NativeError::Spawn {
            path: launch.resolved.target.clone(),
            source: std::io::Error::other("the child has no pid or stdio"),
        });
    };
    tracing::debug!(server = %launch.name, pid = pid.as_raw_nonzero().get(), "native server started");
    let stopped = Arc::new(AtomicBool::new(false));
    let out_of_memory = Arc::new(AtomicBool::new(false));
    let (exit_tx, exit) = watch::channel(None);
    let guard = tracker.enter();
    let limits = launch.limits.clone();
    let name = launch.name.clone();
    let task = tokio::spawn({
        let stopped = stopped.clone();
        let out_of_memory = out_of_memory.clone();
        async move {
            let _guard = guard;
            let status = child.wait().await;
            // The leader is gone; anything it left in its group goes too,
            // and is waited for, so "closed" means nothing is left running.
            kill_group_and_wait(pid, limits.close_grace()).await;
            let exit = classify(
                status,
                stopped.load(Ordering::SeqCst),
                out_of_memory.load(Ordering::SeqCst),
                &limits,
            );
            tracing::debug!(server = %name, ?exit, "native server exited");
            let _ = exit_tx.send(Some(exit));
        }
    });
    let signal_group = move |signal: Signal, stopped: &AtomicBool| {
        stopped.store(true, Ordering::SeqCst);
        // ESRCH: the group is already empty.
        let _ = rustix::process::kill_process_group(pid, signal);
    };
    let terminate = {
        let stopped = stopped.clone();
        move || signal_group(Signal::TERM, &stopped)
    };
    let kill = move || signal_group(Signal::KILL, &stopped);
    Ok(Launched {
        stdin: Box::new(stdin),
        stdout: Box::new(stdout),
        stderr: Box::new(OomWatch::new(stderr, out_of_memory)),
        exit,
        task,
        terminate: Box::new(terminate),
        stop: Box::new(kill),
        on_request: Box::new(|| {}),
        metrics: Arc::new(Metrics::default()),
        digest: executable.digest,
        measured,
        sandbox: sandbox_lines,
        evidence: if executable.digest.is_some() {
            Evidence::NativeMeasured
        } else {
            Evidence::NativeUnmeasured
        },
    })
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
            // Fields after the command's closing parenthesis: state ppid pgrp ...
            let (_, rest) = stat.rsplit_once(')')?;
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let pgrp: i32 = fields.nth(1)?.parse().ok()?;
            (pgrp == pgid.as_raw_nonzero().get() && state != "Z" && state != "X")
                .then(|| Pid::from_raw(pid))
                .flatten()
        })
        .collect()
}

/// SIGKILLs process group `pgid` and waits, through pidfds, until every
/// member has died (bounded by `bound` per round, three rounds at most, for
/// members forked while the first kill was in flight).
async fn kill_group_and_wait(pgid: Pid, bound: std::time::Duration) {
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

fn rlimits(limits: &Limits) -> Vec<(Resource, Rlimit)> {
    let both = |value: u64| Rlimit {
        current: Some(value),
        maximum: Some(value),
    };
    vec![
        // SIGXCPU at the soft limit, SIGKILL a second later.
        (
            Resource::Cpu,
            Rlimit {
                current: Some(limits.cpu_seconds),
                maximum: Some(limits.cpu_seconds.saturating_add(1)),
            },
        ),
        (Resource::As, both(limits.address_space_bytes)),
        (Resource::Nofile, both(limits.open_files)),
        (Resource::Nproc, both(limits.processes)),
        (Resource::Fsize, both(limits.file_size_bytes)),
        (Resource::Core, both(0)),
    ]
}

fn classify(
    status: std::io::Result<std::process::ExitStatus>,
    stopped: bool,
    out_of_memory: bool,
    limits: &Limits,
) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    let status = match status {
        Ok(status) => status,
        Err(error) => return Exit::Crashed(format!("waitpid: {error}")),
    };
    if let Some(code) = status.code() {
        return Exit::Code(code);
    }
    let signal = status.signal().unwrap_or(0);
    if signal == Signal::XCPU.as_raw() {
        return Exit::Limit(LimitHit::CpuSeconds {
            cpu_seconds: limits.cpu_seconds,
        });
    }
    if out_of_memory {
        return Exit::Limit(LimitHit::AddressSpace {
            address_space_bytes: limits.address_space_bytes,
        });
    }
    if stopped && (signal == Signal::TERM.as_raw() || signal == Signal::KILL.as_raw()) {
        return Exit::Stopped;
    }
    Exit::Crashed(format!("killed by signal {signal}"))
}

/// Passes stderr through, noting the allocator's out-of-memory message
/// (Rust's `memory allocation of N bytes failed`, glibc's `Cannot allocate
/// memory`): a process that dies of RLIMIT_AS says so only there.
struct OomWatch<R> {
    inner: R,
    tail: Vec<u8>,
    hit: Arc<AtomicBool>,
}

impl<R> OomWatch<R> {
    fn new(inner: R, hit: Arc<AtomicBool>) -> Self {
        Self {
            inner,
            tail: Vec::new(),
            hit,
        }
    }
}

const OOM_MARKERS: [&[u8]; 3] = [
    b"memory allocation of",
    b"Cannot allocate memory",
    b"JavaScript heap out of memory",
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

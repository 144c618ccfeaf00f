//! The native launcher: runs an executable as a child process behind the one
//! transport, measured and bounded.
//!
//! Measured launch: the resolved executable is opened without following
//! links, hashed through that descriptor, and that same descriptor is run
//! (`/proc/self/fd/N`), so nothing can be swapped between hash and exec.
//! A `#!` script is read once: its bytes are copied into a sealed memfd as
//! they are hashed, and that copy is what its interpreter reads (bound
//! read-only over the script's path in the server's mount namespace), so a
//! rewrite of the file after the hash, even in place, changes nothing.
//! The child gets exactly the configured argv (no shell), cwd and
//! environment. It is made in namespaces of its own and contained before it
//! runs (see [`spawn`]): PID 1 of its own PID namespace, a private /tmp,
//! its own SysV IPC, hostname and cgroup root, no network without `net`, no
//! capabilities, a seccomp deny-list and socket-family allow-list, Landlock,
//! no inherited descriptors, a parent-death signal and rlimits for CPU,
//! address space, open files, processes, file size and core size 0.
//! [`isolation`] decides what this kernel allows and refuses, under
//! `sandbox = "required"`, what it does not. It is waited for and signalled
//! through a pidfd; when it exits, its namespace is already empty.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use rustix::fs::{Mode, OFlags};
use rustix::process::{Pid, Resource, Rlimit, Signal};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::watch;

use crate::command::{ResolveError, Resolved};
use crate::identity::{Digest, DigestMismatch, Evidence, Expectation};
use crate::instance::{Exit, Identity, Launched, Metrics, SandboxReport, Tracker};
use crate::limits::{LimitHit, Limits};
use crate::script::{ScriptError, resolve_interpreter, shebang};

pub mod env;
pub mod learn;
mod spawn;

/// Errors of the native launcher, naming the operation and the path.
#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Grant(Box<crate::grants::GrantError>),
    #[error("measuring {link} (a link to {text}): {why}", text = text.display())]
    MeasureLink {
        link: PathBuf,
        text: PathBuf,
        why: String,
    },
    #[error(
        "open(O_NOFOLLOW) {path}: refusing a symbolic link in place of the executable resolved when the config was loaded"
    )]
    Symlink { path: PathBuf },
    #[error("script {path}: {detail}")]
    Script { path: PathBuf, detail: String },
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
    #[error(transparent)]
    Root(#[from] crate::sandbox::root::RootError),
    #[error("{path}: {what} contains a NUL byte")]
    Nul { what: &'static str, path: PathBuf },
    #[error("spawning {path}: {source}")]
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
    pub dirs: Vec<crate::grants::DirGrant>,
    /// TCP destinations granted (Landlock: by port).
    pub net: Vec<crate::grants::NetGrant>,
    /// Whether a rule the kernel cannot enforce refuses the launch.
    pub sandbox: crate::config::Sandbox,
    /// A learn run (`moat learn`): everything readable, writes only to its
    /// private /tmp, its `rw` dirs and the run's `--write` directories, no
    /// network rules; every file and address the server names is recorded.
    pub learn: Option<learn::Run>,
    /// Seals of executables' digests: an executable or interpreter
    /// unchanged since it was hashed is not hashed again (a script is
    /// always read, into its sealed copy).
    pub sealer: Option<crate::seal::Sealer>,
    /// Every `rw` grant of the config (see
    /// [`crate::config::ServerSpec::writers`]): none may overlap what this
    /// server runs or measures. Its own `rw` grants are checked as well.
    pub writers: Vec<crate::grants::Writer>,
    /// What its egress proxy's connections count against beside the
    /// server's own bound: its session's and its gateway's.
    pub egress: crate::egress::Shares,
    /// What the grants Moat makes without listing (the executable, its
    /// interpreter, their installation roots) must keep clear of.
    pub kept: crate::grants::Kept,
}

/// The executable, opened without following links, with its digest when
/// one is pinned.
pub struct MeasuredExecutable {
    fd: OwnedFd,
    digest: Option<Digest>,
    interpreter: Option<Interpreter>,
    /// A script's bytes, copied into a memfd as they were read (and hashed)
    /// and sealed against any change: what its interpreter reads.
    copy: Option<OwnedFd>,
}

/// A script's interpreter, from its `#!` line: resolved when the script was
/// opened, opened itself without following links, measured with it, and
/// executed through its own descriptor. The kernel never looks the `#!`
/// line up again, so neither the script nor its interpreter can be swapped
/// between the measurement and the exec.
pub struct Interpreter {
    fd: OwnedFd,
    /// The file that runs, every link resolved.
    pub path: PathBuf,
    /// Its argv[0]: the path as the `#!` line names it, as the kernel
    /// passes it (a virtualenv's Python finds its `pyvenv.cfg` beside
    /// that path, not beside the file it links to); for `#!/usr/bin/env`,
    /// the resolved file.
    pub argv0: String,
    /// Arguments from the `#!` line, before the script.
    pub args: Vec<String>,
    /// Its digest, when the launch is measured.
    pub digest: Option<Digest>,
}

impl MeasuredExecutable {
    /// The files this launch measures in its identity itself: `script`
    /// (the resolved executable) and its interpreter, if any.
    fn measured_files(&self, script: &Path) -> Vec<PathBuf> {
        std::iter::once(script.to_owned())
            .chain(self.interpreter.as_ref().map(|i| i.path.clone()))
            .collect()
    }

    /// The digest of the bytes behind the descriptor, if measured.
    pub fn digest(&self) -> Option<Digest> {
        self.digest
    }

    /// The interpreter, when the executable is a `#!` script.
    pub fn interpreter(&self) -> Option<&Interpreter> {
        self.interpreter.as_ref()
    }
}

/// Resolves, opens and (for a measured launch) hashes the interpreter the
/// script at `path` names (see [`resolve_interpreter`]).
fn open_interpreter(
    path: &Path,
    interpreter: &str,
    argument: Option<String>,
    measure: Option<Option<&crate::seal::Sealer>>,
) -> Result<Interpreter, NativeError> {
    let script = |detail: String| NativeError::Script {
        path: path.to_owned(),
        detail,
    };
    let (target, args, is_env) = resolve_interpreter(path, interpreter, argument)?;
    let fd = rustix::fs::open(
        &target,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| NativeError::Io {
        syscall: "open(O_NOFOLLOW) of the #! interpreter",
        path: target.clone(),
        source: errno.into(),
    })?;
    if let Some((nested, argument)) = shebang(&fd, &target)? {
        let nested = match argument {
            Some(argument) => format!("{nested} {argument}"),
            None => nested,
        };
        return Err(script(format!(
            "its interpreter {} is itself a script (#!{nested}): Moat runs one level of #! only; point the #! line, or `command`, at the real interpreter (under pyenv: `pyenv which python3`)",
            target.display()
        )));
    }
    let digest = match measure {
        Some(sealer) => Some(hash_fd(&fd, &target, sealer)?),
        None => None,
    };
    let argv0 = if is_env {
        target.to_string_lossy().into_owned()
    } else {
        interpreter.to_owned()
    };
    Ok(Interpreter {
        fd,
        argv0,
        path: target,
        args,
        digest,
    })
}

/// Opens `path` with O_NOFOLLOW and, when a digest is pinned, hashes it
/// through that descriptor and checks it. An unpinned launch is not hashed
/// (its evidence is `native-unmeasured`). A `#!` script is copied into a
/// sealed memfd as it is hashed (see [`sealed_copy`]); its interpreter is
/// resolved from the copy's `#!` line.
pub fn open_measured(
    path: &Path,
    expected: Expectation,
    sealer: Option<&crate::seal::Sealer>,
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
    let mut head = [0u8; 2];
    let read = rustix::io::pread(&fd, &mut head, 0).map_err(|errno| NativeError::Io {
        syscall: "pread",
        path: path.to_owned(),
        source: errno.into(),
    })?;
    let measured = !matches!(expected, Expectation::Unpinned);
    if &head[..read] == b"#!" {
        // A script is read once, into a sealed copy, hashing as it goes:
        // its #! line, its digest and what its interpreter reads are all
        // those same bytes, whatever happens to the file afterwards.
        let (copy, digest) = sealed_copy(&fd, path, measured)?;
        let Some((interpreter, argument)) = shebang(&copy, path)? else {
            return Err(NativeError::Script {
                path: path.to_owned(),
                detail: "its #! line changed while it was read".to_owned(),
            });
        };
        let interpreter =
            open_interpreter(path, &interpreter, argument, measured.then_some(sealer))?;
        if let Some(actual) = digest {
            expected
                .check(actual)
                .map_err(|mismatch| NativeError::Digest {
                    path: path.to_owned(),
                    mismatch,
                })?;
        }
        return Ok(MeasuredExecutable {
            fd,
            digest,
            interpreter: Some(interpreter),
            copy: Some(copy),
        });
    }
    let digest = if measured {
        // Read through a duplicate so the descriptor we execute stays put.
        let actual = hash_fd(&fd, path, sealer)?;
        expected
            .check(actual)
            .map_err(|mismatch| NativeError::Digest {
                path: path.to_owned(),
                mismatch,
            })?;
        Some(actual)
    } else {
        None
    };
    Ok(MeasuredExecutable {
        fd,
        digest,
        interpreter: None,
        copy: None,
    })
}

/// Copies the file behind `fd` (at `path`) into a new memfd, hashing the
/// bytes as they are copied when `hash`, then seals the copy against
/// writing, growing, shrinking and further sealing (runc's answer to
/// CVE-2019-5736): the digest is of exactly the bytes the copy holds, and
/// they can no longer change. Returns the copy, at offset 0, and the digest.
fn sealed_copy(
    fd: &OwnedFd,
    path: &Path,
    hash: bool,
) -> Result<(OwnedFd, Option<Digest>), NativeError> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let io = |syscall: &'static str| {
        move |errno: rustix::io::Errno| NativeError::Io {
            syscall,
            path: path.to_owned(),
            source: errno.into(),
        }
    };
    let copy = rustix::fs::memfd_create(
        "moat-script",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .map_err(io("memfd_create"))?;
    let mut hasher = hash.then(Sha256::new);
    let mut buf = vec![0u8; 1 << 16];
    let mut offset = 0u64;
    loop {
        let n = match rustix::io::pread(fd, &mut buf, offset) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(errno) => return Err(io("pread")(errno)),
        };
        if n == 0 {
            break;
        }
        if let Some(hasher) = &mut hasher {
            hasher.update(&buf[..n]);
        }
        let mut written = 0;
        while written < n {
            match rustix::io::write(&copy, &buf[written..n]) {
                Ok(w) => written += w,
                Err(rustix::io::Errno::INTR) => {}
                Err(errno) => return Err(io("write to the memfd")(errno)),
            }
        }
        offset += n as u64;
    }
    rustix::fs::fcntl_add_seals(
        &copy,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )
    .map_err(io("fcntl(F_ADD_SEALS)"))?;
    rustix::fs::seek(&copy, rustix::fs::SeekFrom::Start(0)).map_err(io("lseek"))?;
    Ok((
        copy,
        hasher.map(|h| Digest::from_bytes(h.finalize().into())),
    ))
}

/// The digest of the file behind `fd` (at `path`): from its seal when it
/// is unchanged since it was hashed, else read through a duplicate (so the
/// descriptor to execute keeps its offset) and hashed.
fn hash_fd(
    fd: &OwnedFd,
    path: &Path,
    sealer: Option<&crate::seal::Sealer>,
) -> Result<Digest, NativeError> {
    let io = |syscall: &'static str| {
        move |source| NativeError::Io {
            syscall,
            path: path.to_owned(),
            source,
        }
    };
    let file = std::fs::File::from(fd.try_clone().map_err(io("dup"))?);
    let Some(sealer) = sealer else {
        return hash_reader(file, path);
    };
    let meta = file.metadata().map_err(io("fstat"))?;
    let (digest, source) = sealer.digest(path, &meta, || hash_reader(&file, path))?;
    tracing::trace!(path = %path.display(), ?source, "executable digest");
    Ok(digest)
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
/// below it in path order, each as its relative path and digest, and every
/// link as its relative path and its text. A link must stay inside `path` or
/// reach into another of `roots` (the other measured paths, canonical), so
/// whatever it can reach is measured too; one that leaves them, or whose
/// target is missing, is refused.
pub fn measure_path(path: &Path, roots: &[PathBuf]) -> Result<Digest, NativeError> {
    let meta = std::fs::symlink_metadata(path).map_err(|source| NativeError::Io {
        syscall: "lstat",
        path: path.to_owned(),
        source,
    })?;
    if meta.is_symlink() {
        return Err(NativeError::MeasureLink {
            link: path.to_owned(),
            text: std::fs::read_link(path).unwrap_or_default(),
            why: format!(
                "a measure path may not be a link: measure its target {}",
                std::fs::canonicalize(path)
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|_| "(missing)".into())
            ),
        });
    }
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
    let root = std::fs::canonicalize(path).map_err(|source| NativeError::Io {
        syscall: "realpath",
        path: path.to_owned(),
        source,
    })?;
    let mut entries = Vec::new();
    collect_files(path, path, &mut entries)?;
    entries.sort();
    let mut listing = String::new();
    for (relative, link) in entries {
        let full = path.join(&relative);
        match link {
            None => {
                let digest = measure_path(&full, roots)?;
                listing.push_str(&format!("{digest}  {}\n", relative.display()));
            }
            Some(text) => {
                let why = match std::fs::canonicalize(&full) {
                    Err(_) => Some("its target does not exist".to_owned()),
                    Ok(reached)
                        if !reached.starts_with(&root)
                            && !roots.iter().any(|r| reached.starts_with(r)) =>
                    {
                        Some(format!(
                            "it reaches {}, outside {} and every other measured path: measure that too, or remove the link",
                            reached.display(),
                            path.display()
                        ))
                    }
                    Ok(_) => None,
                };
                if let Some(why) = why {
                    return Err(NativeError::MeasureLink {
                        link: full,
                        text,
                        why,
                    });
                }
                listing.push_str(&format!(
                    "link  {} -> {}\n",
                    relative.display(),
                    text.display()
                ));
            }
        }
    }
    Ok(Digest::of(listing.as_bytes()))
}

/// Every regular file (`None`) and link (`Some(text)`) below `dir`, relative
/// to `root`; links are listed, never followed.
fn collect_files(
    root: &Path,
    dir: &Path,
    out: &mut Vec<(PathBuf, Option<PathBuf>)>,
) -> Result<(), NativeError> {
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
        let relative = || path.strip_prefix(root).unwrap_or(&path).to_owned();
        if kind.is_dir() {
            collect_files(root, &path, out)?;
        } else if kind.is_file() {
            out.push((relative(), None));
        } else if kind.is_symlink() {
            let text = std::fs::read_link(&path).map_err(|source| NativeError::Io {
                syscall: "readlink",
                path: path.clone(),
                source,
            })?;
            out.push((relative(), Some(text)));
        }
    }
    Ok(())
}

/// Starts an executable already opened (and measured) by [`open_measured`]:
/// whatever happens to the path afterwards, the bytes behind the descriptor
/// are what runs. `launch.measure` is measured now.
pub async fn start_opened(
    launch: NativeLaunch,
    executable: MeasuredExecutable,
    tracker: Arc<Tracker>,
) -> Result<Launched, NativeError> {
    let also = executable.measured_files(&launch.resolved.target);
    let measured = measure_all(launch.measure.clone(), &launch.resolved.target, also).await?;
    for (path, digest) in &measured {
        tracing::debug!(server = %launch.name, path = %path.display(), %digest, "measured");
    }
    spawn(&launch, executable, measured, &tracker)
}

/// Digests of every `measure` path, off the async runtime. `executable`
/// names the launch in errors; a link in a measured directory may also
/// reach the files in `also` (the executable and its interpreter, measured
/// in the identity themselves), as a virtualenv's `bin/python` does.
async fn measure_all(
    paths: Vec<PathBuf>,
    executable: &Path,
    also: Vec<PathBuf>,
) -> Result<Vec<(PathBuf, Digest)>, NativeError> {
    tokio::task::spawn_blocking(move || {
        let roots: Vec<PathBuf> = paths
            .iter()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .chain(also)
            .collect();
        paths
            .iter()
            .map(|path| measure_path(path, &roots).map(|digest| (path.clone(), digest)))
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
) -> Result<Launched, NativeError> {
    let target = launch.resolved.target.clone();
    let expected = launch.expected;
    let sealer = launch.sealer.clone();
    let executable =
        tokio::task::spawn_blocking(move || open_measured(&target, expected, sealer.as_ref()))
            .await
            .map_err(|error| NativeError::Spawn {
                path: launch.resolved.target.clone(),
                source: std::io::Error::other(error.to_string()),
            })??;
    start_opened(launch, executable, tracker).await
}

fn spawn(
    launch: &NativeLaunch,
    executable: MeasuredExecutable,
    measured: Vec<(PathBuf, Digest)>,
    tracker: &Arc<Tracker>,
) -> Result<Launched, NativeError> {
    let path = &launch.resolved.target;
    // A script's interpreter is part of what runs: in the identity with its
    // digest, and named in the evidence.
    let mut measured = measured;
    let mut report = SandboxReport::default();
    // No `rw` grant of this config may reach what this server runs.
    let own: Vec<crate::grants::Writer> = launch
        .dirs
        .iter()
        .filter(|d| d.mode == crate::grants::DirMode::Rw)
        .map(|d| crate::grants::Writer {
            server: launch.name.clone(),
            grant: d.host.clone(),
        })
        .collect();
    crate::grants::check_runs(
        &crate::grants::Runs {
            server: &launch.name,
            executable: Some(path),
            interpreter: executable.interpreter.as_ref().map(|i| i.path.as_path()),
            measure: &launch.measure,
        },
        &[own.as_slice(), launch.writers.as_slice()].concat(),
    )?;
    if let Some(interpreter) = &executable.interpreter
        && let Some(digest) = interpreter.digest
    {
        measured.push((interpreter.path.clone(), digest));
    }
    let dirs = crate::grants::open_all(&launch.name, &launch.dirs)?;
    report.granted = launch
        .dirs
        .iter()
        .map(|d| (d.host.clone(), d.mode == crate::grants::DirMode::Rw))
        .collect();
    // What is granted without listing goes through the same check as what
    // is listed: never a key, never Moat's directories, never $HOME or
    // $HOME/.local whole.
    let interpreter_path = executable
        .interpreter
        .as_ref()
        .map(|interpreter| interpreter.path.as_path());
    for file in std::iter::once(path.as_path()).chain(interpreter_path) {
        launch.kept.check_file(&launch.name, file)?;
    }
    let roots = crate::sandbox::implicit_roots(path, interpreter_path, &launch.kept);
    for line in &roots.held_back {
        tracing::warn!(server = %launch.name, "{line}");
    }
    let proxied = proxied(launch);
    let mut isolation = isolation(launch, &roots)?;
    // A learn run without a private /tmp writes in a scratch directory of
    // its own instead, removed when it stops.
    let scratch = match &launch.learn {
        Some(_)
            if isolation
                .namespaces
                .as_ref()
                .is_none_or(|ns| ns.tmp.is_none()) =>
        {
            Some(
                tempfile::Builder::new()
                    .prefix("moat-learn-")
                    .tempdir()
                    .map_err(|source| NativeError::Io {
                        syscall: "mkdtemp of the learn run's scratch directory",
                        path: std::env::temp_dir(),
                        source,
                    })?,
            )
        }
        _ => None,
    };
    let sandbox = match &launch.learn {
        Some(run) => {
            let writable: Vec<crate::grants::DirGrant> = run
                .writable
                .iter()
                .map(|host| crate::grants::DirGrant {
                    host: host.clone(),
                    guest: host.display().to_string(),
                    mode: crate::grants::DirMode::Rw,
                    inode: None,
                })
                .collect();
            let writable = crate::grants::open_all(&launch.name, &writable)?;
            crate::sandbox::learn_plan(&crate::sandbox::LearnGrants {
                dirs: &dirs,
                writable: &writable,
                scratch: scratch.as_ref().map(tempfile::TempDir::path),
                sandbox: launch.sandbox,
            })?
        }
        None => crate::sandbox::plan(&crate::sandbox::Grants {
            proxy_port: proxied.then_some(crate::egress::PROXY_PORT),
            executable: executable.fd.as_fd(),
            executable_path: path,
            interpreter: executable
                .interpreter
                .as_ref()
                .map(|interpreter| (interpreter.fd.as_fd(), interpreter.path.as_path())),
            roots: &roots,
            measure: &launch.measure,
            dirs: &dirs,
            net: &launch.net,
            sandbox: launch.sandbox,
        })?,
    };
    if isolation.own_root
        && let Some(ns) = isolation.namespaces.as_mut()
        && let Some(tmp_options) = &ns.tmp
    {
        let root = crate::sandbox::root::plan(&crate::sandbox::root::RootInputs {
            executable: path,
            interpreter: executable
                .interpreter
                .as_ref()
                .map(|interpreter| interpreter.path.as_path()),
            roots: &roots.granted,
            measure: &launch.measure,
            dirs: &dirs,
            cwd: &launch.cwd,
            tmp_options,
            resolv_conf: ns.resolv,
        })?;
        isolation.enforced.push(root.summary.clone());
        ns.root = Some(root);
    }
    let cstring = |what: &'static str, text: &str| {
        std::ffi::CString::new(text).map_err(|_| NativeError::Nul {
            what,
            path: path.clone(),
        })
    };
    // A script's sealed copy stays open across exec; the rest of the
    // executable's descriptors are Moat's.
    let fd = executable
        .copy
        .as_ref()
        .unwrap_or(&executable.fd)
        .as_raw_fd();
    // A script runs as its interpreter's descriptor, reading the sealed
    // copy of the script: bound read-only over the script's own path in
    // the server's mount namespace when it has a private /tmp to copy it
    // into (so the script's directory, `__file__` and relative imports are
    // as on the host), else through /proc/self/fd/N.
    let (exec_fd, mut argv) = match &executable.interpreter {
        None => (fd, vec![cstring("argv[0]", &launch.resolved.configured)?]),
        Some(interpreter) => {
            let mut argv = vec![cstring("the interpreter path", &interpreter.argv0)?];
            for arg in &interpreter.args {
                argv.push(cstring("the #! argument", arg)?);
            }
            let target = cstring("the script path", &path.to_string_lossy())?;
            let bound = match isolation.namespaces.as_mut() {
                Some(ns) if ns.tmp.is_some() => {
                    ns.script = Some(spawn::ScriptBind {
                        copy: fd,
                        target: target.clone(),
                    });
                    true
                }
                _ => false,
            };
            report.enforced(format!(
                "#! interpreter {}{}, run through the descriptor that was {}, reading the script's sealed copy (a memfd filled as it was {}){}",
                interpreter.path.display(),
                if interpreter.args.is_empty() {
                    String::new()
                } else {
                    format!(" {}", interpreter.args.join(" "))
                },
                if interpreter.digest.is_some() {
                    "measured"
                } else {
                    "opened"
                },
                if executable.digest.is_some() {
                    "hashed"
                } else {
                    "read"
                },
                if bound {
                    format!(", bound read-only over {}", path.display())
                } else {
                    format!(" as /proc/self/fd/{fd} (no private /tmp to copy it into)")
                },
            ));
            argv.push(if bound {
                target
            } else {
                cstring("the script path", &format!("/proc/self/fd/{fd}"))?
            });
            (interpreter.fd.as_raw_fd(), argv)
        }
    };
    for arg in &launch.args {
        argv.push(cstring("an argument", arg)?);
    }
    // Behind the egress proxy, the proxy variables are Moat's, whatever the
    // config says.
    let mut moat_env = if proxied {
        crate::egress::proxy_environment()
    } else {
        Vec::new()
    };
    // A learn run's scratch directory is its TMPDIR.
    if let Some(scratch) = &scratch {
        moat_env.push(("TMPDIR".to_owned(), scratch.path().display().to_string()));
    }
    let base = env::base(
        path,
        executable
            .interpreter
            .as_ref()
            .map(|interpreter| interpreter.path.as_path()),
        match (&scratch, &isolation.namespaces) {
            (Some(scratch), _) => env::Scratch::Dir(scratch.path()),
            (None, Some(ns)) if ns.root.is_some() => env::Scratch::OwnRoot,
            (None, Some(ns)) if ns.tmp.is_some() => env::Scratch::PrivateTmp,
            _ => env::Scratch::None,
        },
    );
    report.enforced(env::describe(&base, &launch.env));
    let env = env::merge(base, &launch.env, &moat_env)
        .iter()
        .map(|(k, v)| cstring("an environment variable", &format!("{k}={v}")))
        .collect::<Result<Vec<_>, _>>()?;
    let layout = crate::egress::Layout::of(&launch.net, ipv6());
    let channel = if proxied {
        Some(
            spawn::proxy_channel().map_err(|failure| NativeError::Spawn {
                path: path.clone(),
                source: std::io::Error::other(failure.to_string()),
            })?,
        )
    } else {
        None
    };
    // With a PID namespace, the kernel empties it before the server can be
    // reaped: there is no group to scan for after it.
    let namespaced = isolation.namespaces.is_some();
    let plan = spawn::ChildPlan {
        path: cstring("the executable path", &format!("/proc/self/fd/{exec_fd}"))?,
        argv,
        env,
        cwd: std::ffi::CString::new(launch.cwd.as_os_str().as_encoded_bytes()).map_err(|_| {
            NativeError::Nul {
                what: "the working directory",
                path: path.clone(),
            }
        })?,
        executable: fd,
        interpreter: executable
            .interpreter
            .as_ref()
            .map(|interpreter| interpreter.fd.as_raw_fd()),
        rlimits: rlimits(&launch.limits),
        namespaces: isolation.namespaces,
        landlock: crate::sandbox::ruleset_fd(&sandbox)
            .map(|ruleset| (ruleset, sandbox.proc_self_access, sandbox.tmp_access)),
        drop_bounding: isolation.drop_bounding,
        seccomp: isolation.seccomp,
        proxy: channel.as_ref().map(|(_, child)| spawn::ProxyPlan {
            channel: child.as_raw_fd(),
            port: crate::egress::PROXY_PORT,
            aliases: layout.aliases.iter().map(|a| a.octets()).collect(),
            relays: layout.relays.iter().map(|r| r.inside).collect(),
        }),
    };
    let spawn_error = |failure: spawn::SpawnFailure| NativeError::Spawn {
        path: path.clone(),
        source: std::io::Error::other(failure.to_string()),
    };
    let (child, learn_exit) = match &launch.learn {
        Some(run) => {
            let (child, exit) = learn::start(plan, run.observed.clone()).map_err(spawn_error)?;
            (child, Some(exit))
        }
        None => {
            let child = spawn::spawn(&plan).map_err(spawn_error)?;
            drop(plan);
            (child, None)
        }
    };
    drop(executable.fd);
    // The child has exec'd: its egress listener is waiting on the channel.
    let egress = match channel {
        Some((moat, child_end)) => {
            drop(child_end);
            let received = |what| {
                spawn::receive_listener(&moat).map_err(|source| NativeError::Io {
                    syscall: what,
                    path: path.clone(),
                    source,
                })
            };
            let proxy = received("recvmsg of the egress listener")?;
            let dns = received("recvmsg of the DNS socket")?;
            let relays = layout
                .relays
                .iter()
                .map(|_| {
                    received("recvmsg of an egress relay listener").map(std::net::TcpListener::from)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let task = crate::egress::serve(
                launch.name.clone(),
                crate::egress::Sockets {
                    proxy: std::net::TcpListener::from(proxy),
                    dns: std::net::UdpSocket::from(dns),
                    relays,
                },
                layout,
                launch.net.clone(),
                launch.egress.clone(),
            )
            .map_err(|source| NativeError::Io {
                syscall: "registering the egress listener",
                path: path.clone(),
                source,
            })?;
            Some(AbortOnDrop(task))
        }
        None => None,
    };
    for rule in sandbox.enforced.iter().chain(&isolation.enforced) {
        report.enforced(rule.clone());
    }
    for rule in sandbox.not_enforced.iter().chain(&isolation.not_enforced) {
        report.not_enforced(rule.clone());
    }
    // A learn run's ruleset reads everything: a failure under it is not the
    // sandbox's doing.
    report.kernel_filesystem = sandbox.ruleset.is_some() && launch.learn.is_none();
    drop(sandbox);
    let spawn::Child {
        pidfd,
        pid,
        stdin,
        stdout,
        stderr,
    } = child;
    let io = |what: &'static str| {
        let path = path.clone();
        move |source| NativeError::Io {
            syscall: what,
            path,
            source,
        }
    };
    let stdin = tokio::net::unix::pipe::Sender::from_owned_fd(stdin)
        .map_err(io("registering the stdin pipe"))?;
    let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout)
        .map_err(io("registering the stdout pipe"))?;
    let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(stderr)
        .map_err(io("registering the stderr pipe"))?;
    let mut reaper = Reaper::new(pidfd, pid).map_err(io("registering the pidfd"))?;
    if learn_exit.is_some() {
        // The tracer thread waits for the server and reaps it.
        reaper.reaped = true;
    }
    let pid = Pid::from_raw(pid).ok_or_else(|| NativeError::Spawn {
        path: path.clone(),
        source: std::io::Error::other("clone returned no pid"),
    })?;
    tracing::debug!(server = %launch.name, pid = pid.as_raw_nonzero().get(), "native server started");
    let stopped = Arc::new(AtomicBool::new(false));
    let out_of_memory = Arc::new(AtomicBool::new(false));
    let (exit_tx, exit) = watch::channel(None);
    let guard = tracker.enter();
    let limits = launch.limits.clone();
    let name = launch.name.clone();
    let signals = reaper.signaller();
    let task = tokio::spawn({
        let stopped = stopped.clone();
        let out_of_memory = out_of_memory.clone();
        async move {
            let _guard = guard;
            // The proxy serves the server for as long as it runs.
            let _egress = egress;
            // A learn run's scratch directory goes when the server has.
            let _scratch = scratch;
            let status = match learn_exit {
                Some(exit) => exit
                    .await
                    .unwrap_or_else(|_| Err(std::io::Error::other("the tracer thread ended"))),
                None => reaper.wait().await,
            };
            // With a PID namespace the kernel has already killed and reaped
            // every other process of the server's namespace. Without one,
            // anything the server left in its group goes too, and is
            // waited for, so "closed" means nothing is left running.
            if !namespaced {
                kill_group_and_wait(pid, limits.close_grace()).await;
            }
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
    let signal_all = move |signal: Signal, stopped: &AtomicBool| {
        stopped.store(true, Ordering::SeqCst);
        signals.send(signal);
        // ESRCH: the group is already empty.
        let _ = rustix::process::kill_process_group(pid, signal);
    };
    let terminate = {
        let stopped = stopped.clone();
        let signal_all = signal_all.clone();
        move || signal_all(Signal::TERM, &stopped)
    };
    let kill = move || signal_all(Signal::KILL, &stopped);
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
        identity: Identity {
            digest: executable.digest,
            measured,
            sandbox: report,
            evidence: if executable.digest.is_some() {
                Evidence::NativeMeasured
            } else {
                Evidence::NativeUnmeasured
            },
            component: None,
            oci: None,
        },
        answers_deadlines: false,
    })
}

/// The namespaces, capability drop and seccomp filters for one launch, with
/// the lines that say what they enforce.
struct Isolation {
    namespaces: Option<spawn::Namespaces>,
    /// The server gets a root of its own (planned once its grants are
    /// open).
    own_root: bool,
    drop_bounding: bool,
    seccomp: Vec<seccompiler::BpfProgram>,
    enforced: Vec<String>,
    not_enforced: Vec<String>,
}

/// Decides the isolation of `launch` on this kernel: refuses, under
/// Whether `launch` goes out through the egress proxy: it has `net` grants,
/// is not a learn run, and can have a network namespace of its own.
fn proxied(launch: &NativeLaunch) -> bool {
    !launch.net.is_empty() && launch.learn.is_none() && spawn::namespace_support().available
}

/// Whether the kernel has IPv6 (a namespace's `lo` then has `::1`).
fn ipv6() -> bool {
    Path::new("/proc/net/if_inet6").exists()
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `sandbox = "required"`, what cannot be enforced, naming it.
fn isolation(
    launch: &NativeLaunch,
    roots: &crate::sandbox::ImplicitRoots,
) -> Result<Isolation, NativeError> {
    use crate::sandbox::SandboxError;
    let required = launch.sandbox == crate::config::Sandbox::Required;
    let mut enforced = Vec::new();
    let mut not_enforced = Vec::new();
    let missing = |feature: String, not_enforced: &mut Vec<String>| {
        if required {
            Err(NativeError::Sandbox(SandboxError::Unsupported { feature }))
        } else {
            not_enforced.push(feature);
            Ok(())
        }
    };
    let support = spawn::namespace_support();
    let root = rustix::process::geteuid().is_root();
    let mut own_root = false;
    let namespaces = if support.available {
        let user = support.user.then(|| {
            let uid = rustix::process::geteuid().as_raw();
            let gid = rustix::process::getegid().as_raw();
            (
                format!("{uid} {uid} 1\n").into_bytes(),
                format!("{gid} {gid} 1\n").into_bytes(),
            )
        });
        // A learn run has its private /tmp too: it is where it may write.
        let tmp = Path::new("/tmp").is_dir().then(|| {
            std::ffi::CString::new(format!("size={},mode=1777", launch.limits.tmp_bytes))
                .unwrap_or_default()
        });
        enforced.push(format!(
            "PID namespace{}: the server is PID 1 of its own namespace; every process it starts dies with it",
            if support.user {
                " (in a user namespace of its own)"
            } else {
                ""
            }
        ));
        enforced.push(
            "IPC, UTS and cgroup namespaces: the host's SysV shared memory, message queues and semaphores are out of reach (no key or id of the host's exists there); the hostname and the cgroup root are the server's own"
                .to_owned(),
        );
        match &tmp {
            Some(_) => enforced.push(format!(
                "mount namespace: a private, empty /tmp (tmpfs, {} bytes), gone when the server stops",
                launch.limits.tmp_bytes
            )),
            None => not_enforced.push("a private /tmp (the host has no /tmp)".to_owned()),
        }
        // A learn run keeps the host's network, to see where it connects.
        let net = launch.learn.is_none();
        if net && launch.net.is_empty() {
            enforced.push(
                "network namespace: no network at all (TCP, UDP, raw sockets and abstract Unix sockets reach nothing outside the server)"
                    .to_owned(),
            );
        } else if net {
            let layout = crate::egress::Layout::of(&launch.net, ipv6());
            let relays: Vec<String> = layout
                .relays
                .iter()
                .map(|relay| {
                    let entry = crate::grants::NetGrant {
                        host: relay.host.clone(),
                        port: relay.port,
                    };
                    if relay.inside.ip().to_string() == relay.host {
                        entry.to_string()
                    } else {
                        format!("{entry} at {}", relay.inside)
                    }
                })
                .collect();
            enforced.push(format!(
                "network namespace: out only through Moat, to {} at the addresses resolved at launch: relayed transparently ({}), and through the proxy at 127.0.0.1:{} (HTTP_PROXY and HTTPS_PROXY set); no other address is routed",
                crate::grants::net_line(&launch.net),
                if relays.is_empty() { "none".to_owned() } else { relays.join(", ") },
                crate::egress::PROXY_PORT,
            ));
            if !layout.proxy_only.is_empty() {
                not_enforced.push(format!(
                    "a transparent relay for {} (reached through the proxy only)",
                    crate::grants::net_line(&layout.proxy_only)
                ));
            }
        }
        // Behind Moat, names resolve through Moat: listed ones only.
        let resolv = net
            && !launch.net.is_empty()
            && tmp.is_some()
            && Path::new("/etc/resolv.conf").exists();
        if net && !launch.net.is_empty() {
            let names = crate::egress::listed_names(&launch.net);
            if resolv || !Path::new("/etc/resolv.conf").exists() {
                enforced.push(format!(
                    "DNS: answered by Moat at 127.0.0.1:{} (resolv.conf{}), for {} only (each with its relay address); any other name is NXDOMAIN",
                    crate::egress::DNS_PORT,
                    if resolv { " covered, read-only" } else { " absent: the default" },
                    if names.is_empty() { "no name".to_owned() } else { names.join(", ") }
                ));
            } else {
                not_enforced.push(
                    "DNS through Moat (no private /tmp to hold its resolv.conf): names do not resolve inside the namespace".to_owned(),
                );
            }
        }
        // A root of the server's own, built on the private /tmp's place:
        // not for a learn run, which is to see what the host holds.
        if launch.learn.is_none() {
            let why = match (&tmp, crate::sandbox::root::support(support.user)) {
                (Some(_), Ok(())) => None,
                (Some(_), Err(unsupported)) => Some(unsupported.to_string()),
                (None, _) => Some("the host has no /tmp to build it on".to_owned()),
            };
            match why {
                None => own_root = true,
                Some(why) => missing(
                    format!(
                        "a root of the server's own, hiding every host path outside its grants ({why})"
                    ),
                    &mut not_enforced,
                )?,
            }
        }
        // Granted paths under /tmp stay where they were: each is bound into
        // the private /tmp (used only without a root of the server's own).
        let mut binds = Vec::new();
        if tmp.is_some() && !own_root {
            // Everything the server is granted or runs from (the
            // executable, its installation root, dirs, measure paths) keeps
            // its place; a path inside another is bound with it.
            let mut granted: Vec<PathBuf> = launch
                .dirs
                .iter()
                .map(|d| d.host.clone())
                .chain(launch.measure.iter().cloned())
                .chain([launch.resolved.target.clone()])
                .chain(roots.granted.iter().cloned())
                .filter(|p| p.starts_with("/tmp") && p != Path::new("/tmp"))
                .collect();
            granted.sort();
            granted.dedup();
            // Parents before what lies inside them, each bound with its own
            // mode: an rw grant inside a read-only package stays writable.
            for path in &granted {
                if binds.len() == spawn::MAX_BINDS {
                    return Err(NativeError::Io {
                        syscall: "binding granted paths into the private /tmp",
                        path: path.clone(),
                        source: std::io::Error::other(format!(
                            "more than {} granted paths under /tmp",
                            spawn::MAX_BINDS
                        )),
                    });
                }
                let writable = launch
                    .dirs
                    .iter()
                    .any(|d| d.mode == crate::grants::DirMode::Rw && path.starts_with(&d.host));
                binds.push(
                    spawn::Bind::new(path, writable).map_err(|source| NativeError::Io {
                        syscall: "stat of a granted path under /tmp",
                        path: path.clone(),
                        source,
                    })?,
                );
            }
        }
        Some(spawn::Namespaces {
            user,
            net,
            tmp,
            binds,
            resolv,
            script: None,
            root: None,
        })
    } else {
        let why = std::io::Error::from_raw_os_error(support.errno);
        missing(
            format!(
                "PID, mount, IPC, UTS, cgroup and network namespaces (clone with CLONE_NEWUSER: {why}; unprivileged user namespaces may be disabled)"
            ),
            &mut not_enforced,
        )?;
        None
    };
    if !launch.net.is_empty() && !proxied(launch) {
        not_enforced.push(
            "network: with `net` grants, UDP datagrams (DNS included) may go to any host"
                .to_owned(),
        );
    }
    // Pathname Unix sockets are reached through the filesystem, where
    // neither the network namespace nor Landlock (before ABI 9) applies:
    // socket(AF_UNIX) is refused instead.
    // The same for every launch: compiled once per process.
    static FILTERS: std::sync::OnceLock<Result<crate::sandbox::seccomp::Filters, String>> =
        std::sync::OnceLock::new();
    let filters = FILTERS
        .get_or_init(|| crate::sandbox::seccomp::filters(true).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|detail| {
            NativeError::Sandbox(SandboxError::Ruleset {
                operation: "seccomp",
                detail: detail.clone(),
            })
        })?;
    enforced.push(filters.summary.clone());
    let mut seccomp = filters.programs.clone();
    if launch.learn.is_some() {
        seccomp.push(learn::watch_filter().map_err(|detail| {
            NativeError::Sandbox(SandboxError::Ruleset {
                operation: "seccomp (learn)",
                detail,
            })
        })?);
    }
    let drop_bounding = support.available && support.user || root;
    enforced.push(if drop_bounding {
        "capabilities: none (bounding, permitted, effective, inheritable and ambient sets empty, securebits locked), no_new_privs".to_owned()
    } else {
        "capabilities: none (permitted, effective, inheritable and ambient sets empty), no_new_privs".to_owned()
    });
    enforced.push(
        "descriptors: only stdin, stdout, stderr and the measured executable are open at exec"
            .to_owned(),
    );
    Ok(Isolation {
        namespaces,
        own_root,
        drop_bounding,
        seccomp,
        enforced,
        not_enforced,
    })
}

/// Waits for a child through its pidfd, and signals it through the same
/// descriptor (never a recycled pid). A child not yet waited for when this
/// is dropped is killed and reaped.
struct Reaper {
    pidfd: Arc<tokio::io::unix::AsyncFd<OwnedFd>>,
    pid: i32,
    reaped: bool,
}

/// Signals a child through its pidfd.
#[derive(Clone)]
struct Signaller(Arc<tokio::io::unix::AsyncFd<OwnedFd>>);

impl Signaller {
    fn send(&self, signal: Signal) {
        // ESRCH: already exited.
        let _ = rustix::process::pidfd_send_signal(self.0.get_ref(), signal);
    }
}

/// Exit code, terminating signal, and the CPU seconds it had used.
type WaitStatus = Result<(Option<i32>, Option<i32>, u64), std::io::Error>;

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
    fn new(pidfd: OwnedFd, pid: i32) -> std::io::Result<Self> {
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

    fn signaller(&self) -> Signaller {
        Signaller(self.pidfd.clone())
    }

    /// The exit code or the terminating signal, once the child has exited.
    async fn wait(mut self) -> WaitStatus {
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
        (Resource::Data, both(limits.data_bytes)),
        // u64::MAX is RLIM_INFINITY: no bound (the default).
        (Resource::As, both(limits.address_space_bytes)),
        (Resource::Nofile, both(limits.open_files)),
        (Resource::Nproc, both(limits.processes)),
        (Resource::Fsize, both(limits.file_size_bytes)),
        (Resource::Core, both(0)),
    ]
}

fn classify(status: WaitStatus, stopped: bool, out_of_memory: bool, limits: &Limits) -> Exit {
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

#[cfg(unix)]
impl From<crate::grants::GrantError> for NativeError {
    fn from(error: crate::grants::GrantError) -> Self {
        Self::Grant(Box::new(error))
    }
}

impl From<ScriptError> for NativeError {
    fn from(error: ScriptError) -> Self {
        match error {
            ScriptError::Io {
                syscall,
                path,
                source,
            } => Self::Io {
                syscall,
                path,
                source,
            },
            ScriptError::Script { path, detail } => Self::Script { path, detail },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 12, item 3: pnpm's `node_modules` is mostly links. A link's
    /// text is part of the digest, so re-pointing it changes the identity;
    /// a link out of the measured set is refused unless its target is
    /// measured too.
    #[test]
    fn links_are_measured_and_may_not_leave_the_measured_paths() {
        let root = tempfile::tempdir().unwrap();
        let package = root.path().join("package");
        std::fs::create_dir(&package).unwrap();
        std::fs::write(package.join("a.js"), "good").unwrap();
        std::fs::write(package.join("b.js"), "evil").unwrap();
        std::os::unix::fs::symlink("a.js", package.join("entry.js")).unwrap();
        let before = measure_path(&package, &[]).unwrap();
        std::fs::remove_file(package.join("entry.js")).unwrap();
        std::os::unix::fs::symlink("b.js", package.join("entry.js")).unwrap();
        let after = measure_path(&package, &[]).unwrap();
        assert_ne!(before, after, "a re-pointed link changes the digest");

        let outside = root.path().join("store");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("lib.js"), "lib").unwrap();
        std::os::unix::fs::symlink(outside.join("lib.js"), package.join("lib.js")).unwrap();
        match measure_path(&package, &[]).unwrap_err() {
            NativeError::MeasureLink { link, why, .. } => {
                assert_eq!(link, package.join("lib.js"));
                assert!(why.contains("outside"), "{why}");
            }
            other => panic!("{other}"),
        }
        let roots = [std::fs::canonicalize(&outside).unwrap()];
        measure_path(&package, &roots).expect("the target is measured explicitly");

        std::os::unix::fs::symlink("missing.js", package.join("gone.js")).unwrap();
        match measure_path(&package, &roots).unwrap_err() {
            NativeError::MeasureLink { why, .. } => {
                assert_eq!(why, "its target does not exist")
            }
            other => panic!("{other}"),
        }
        std::fs::remove_file(package.join("gone.js")).unwrap();

        // A measure path that is itself a link names its target.
        let alias = root.path().join("alias");
        std::os::unix::fs::symlink(&package, &alias).unwrap();
        assert!(matches!(
            measure_path(&alias, &roots).unwrap_err(),
            NativeError::MeasureLink { .. }
        ));
    }
}

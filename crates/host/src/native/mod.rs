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
//! [`contain`] decides what this kernel allows and refuses, under
//! `sandbox = "required"`, what it does not. It is waited for and signalled
//! through a pidfd; when it exits, its namespace is already empty.
//!
//! Here: the launch and its errors. [`measure`] opens and hashes what runs,
//! [`contain`] plans the containment, [`exec`] the argv and environment,
//! [`start`] spawns the child ([`spawn`]) and serves its egress, and
//! [`reaper`] waits for it and says how it ended. [`learn`] is `moat learn`.

use std::path::PathBuf;
use std::sync::Arc;

use crate::command::{ResolveError, Resolved};
use crate::identity::{DigestMismatch, Expectation};
use crate::instance::{Launched, Tracker};
use crate::limits::Limits;
use crate::script::ScriptError;

mod contain;
pub(crate) mod env;
mod exec;
pub mod learn;
mod measure;
mod reaper;
mod spawn;
mod start;

pub use env::SYSTEM_PATH;
pub use measure::{Interpreter, MeasuredExecutable, measure_path, open_measured};

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

/// Starts an executable already opened (and measured) by [`open_measured`]:
/// whatever happens to the path afterwards, the bytes behind the descriptor
/// are what runs. `launch.measure` is measured now.
pub async fn start_opened(
    launch: NativeLaunch,
    executable: MeasuredExecutable,
    tracker: Arc<Tracker>,
) -> Result<Launched, NativeError> {
    let also = executable.measured_files(&launch.resolved.target);
    let measured =
        measure::measure_all(launch.measure.clone(), &launch.resolved.target, also).await?;
    for (path, digest) in &measured {
        tracing::debug!(server = %launch.name, path = %path.display(), %digest, "measured");
    }
    start::start(&launch, executable, measured, &tracker)
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

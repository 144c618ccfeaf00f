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

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::command::{ResolveError, Resolved};
use crate::config::{ServerKind, ServerSpec};
use crate::identity::{DigestMismatch, Expectation};
use crate::instance::{Launched, Tracker};
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

/// One native launch: the server as configured, and what planning it
/// added (the resolved command, the environment read from the host, the
/// expectation, and what the host lends it). Everything else (name, args,
/// limits, grants, sandbox, writers; the kind's cwd and measure paths) is
/// read from the spec, not copied.
#[derive(Clone, Debug)]
pub struct NativeLaunch {
    /// The server as configured; its kind is [`ServerKind::Native`].
    /// Shared, not copied: the launch and its caller hold the same spec.
    spec: Arc<ServerSpec>,
    /// The command, resolved.
    pub resolved: Resolved,
    /// The exact environment (the `env` grant resolved, read when the
    /// launch was planned).
    pub env: Vec<(String, String)>,
    /// What the executable's bytes must hash to.
    pub expected: Expectation,
    /// A learn run (`moat learn`): everything readable, writes only to its
    /// private /tmp, its `rw` dirs and the run's `--write` directories, no
    /// network rules; every file and address the server names is recorded.
    pub learn: Option<learn::Run>,
    /// Seals of executables' digests: an executable or interpreter
    /// unchanged since it was hashed is not hashed again (a script is
    /// always read, into its sealed copy).
    pub sealer: Option<crate::seal::Sealer>,
    /// What its egress proxy's connections count against beside the
    /// server's own bound: its session's and its gateway's.
    pub egress: crate::egress::Shares,
    /// What the grants Moat makes without listing (the executable, its
    /// interpreter, their installation roots) must keep clear of.
    pub kept: crate::grants::Kept,
}

impl NativeLaunch {
    /// A launch of `spec` (a native server) running `resolved`, whose bytes
    /// must meet `expected`; its environment is read from the host now. No
    /// learn run, no sealer, no shared egress bound and nothing kept clear
    /// of: set those fields when the launch needs them.
    ///
    /// # Panics
    ///
    /// When `spec` is not a native server.
    pub fn new(
        spec: impl Into<Arc<ServerSpec>>,
        resolved: Resolved,
        expected: Expectation,
    ) -> Self {
        let spec = spec.into();
        assert!(
            matches!(spec.kind, ServerKind::Native { .. }),
            "server `{}`: a native launch of a server that is not native",
            spec.name
        );
        Self {
            env: spec.env.resolve(),
            spec,
            resolved,
            expected,
            learn: None,
            sealer: None,
            egress: Default::default(),
            kept: Default::default(),
        }
    }

    /// The server as configured.
    pub fn spec(&self) -> &ServerSpec {
        &self.spec
    }

    /// The working directory.
    pub fn cwd(&self) -> &Path {
        self.native().0
    }

    /// Files or directories whose digests join the identity.
    pub fn measure(&self) -> &[PathBuf] {
        self.native().1
    }

    fn native(&self) -> (&Path, &[PathBuf]) {
        match &self.spec.kind {
            ServerKind::Native { cwd, measure, .. } => (cwd, measure),
            _ => unreachable!("NativeLaunch::new takes native servers only"),
        }
    }
}

/// Starts an executable already opened (and measured) by [`open_measured`]:
/// whatever happens to the path afterwards, the bytes behind the descriptor
/// are what runs. `launch.measure()` is measured now.
pub async fn start_opened(
    launch: NativeLaunch,
    executable: MeasuredExecutable,
    tracker: Arc<Tracker>,
) -> Result<Launched, NativeError> {
    let also = executable.measured_files(&launch.resolved.target);
    let measured =
        measure::measure_all(launch.measure().to_vec(), &launch.resolved.target, also).await?;
    for (path, digest) in &measured {
        tracing::debug!(server = %launch.spec.name, path = %path.display(), %digest, "measured");
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

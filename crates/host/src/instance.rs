//! The launch contract: what a launcher hands the transport and the layers
//! above. A launched instance (its stdio, how to learn of its exit and how to
//! stop it), its identity (the digests of what runs, the evidence class, and
//! a typed report of what the sandbox enforces), its exit, the counters a
//! launcher keeps while it runs, and the tracker that proves nothing is left
//! behind. Nothing here knows a launcher or the protocol: the transport
//! imports only this module and [`crate::limits`].

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::identity::{Digest, Evidence};
use crate::limits::LimitHit;

/// How a server stopped running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It exited (or its `run` returned) with this code.
    Code(i32),
    /// It hit a limit and was stopped.
    Limit(LimitHit),
    /// It trapped (wasm) or was killed by a signal (native).
    Crashed(String),
    /// The host stopped it (close or deadline).
    Stopped,
}

/// What a launcher hands the transport: the server's stdio, how to learn of
/// its exit, and how to stop it.
pub struct Launched {
    /// The server's stdin.
    pub stdin: Box<dyn AsyncWrite + Send + Unpin>,
    /// The server's stdout: protocol only.
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    /// The server's stderr: diagnostics only.
    pub stderr: Box<dyn AsyncRead + Send + Unpin>,
    /// Becomes `Some` once the server has stopped.
    pub exit: watch::Receiver<Option<Exit>>,
    /// The task that owns the running server; it ends when the server does.
    pub task: JoinHandle<()>,
    /// Asks the server to stop (native: SIGTERM to its process group; wasm:
    /// the same as `stop`).
    pub terminate: Box<dyn Fn() + Send + Sync>,
    /// Stops the server at once (drop the instance, or SIGKILL the group).
    pub stop: Box<dyn Fn() + Send + Sync>,
    /// Called each time a request is sent: starts a fresh CPU budget.
    pub on_request: Box<dyn Fn() + Send + Sync>,
    /// Counters the launcher keeps while the server runs.
    pub metrics: Arc<Metrics>,
    /// What was measured about it, computed once by its launcher.
    pub identity: Identity,
    /// Whether the server answers every request within its deadline itself
    /// (a typed component's tool server fails only the late call). The
    /// transport then stops it only if an answer is later still, by a
    /// grace period.
    pub answers_deadlines: bool,
}

/// A server that runs as a task of Moat's own (a wasm instance, the tool
/// server of a typed component, the bridge to a remote server), before it
/// is started: its side of the stdio and what it hands up. [`Self::spawn`]
/// makes the one [`Launched`] every such launcher hands the transport.
pub struct InProcess {
    /// The host's end of the server's stdin.
    pub stdin: Box<dyn AsyncWrite + Send + Unpin>,
    /// The host's end of the server's stdout.
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    /// The host's end of the server's stderr.
    pub stderr: Box<dyn AsyncRead + Send + Unpin>,
    /// What was measured about it.
    pub identity: Identity,
    /// Counters it keeps while it runs.
    pub metrics: Arc<Metrics>,
    /// Called each time a request is sent (a fresh CPU budget); `None`
    /// when there is none to refresh.
    pub on_request: Option<Box<dyn Fn() + Send + Sync>>,
    /// Asks it to stop; `None` to stop it at once (abort its task).
    pub terminate: Option<Box<dyn Fn() + Send + Sync>>,
    /// See [`Launched::answers_deadlines`].
    pub answers_deadlines: bool,
}

impl InProcess {
    /// Runs `run` as a task the tracker counts; its result is the exit.
    /// Stopping aborts the task. `what` names it in the debug log.
    pub fn spawn(
        self,
        server: &str,
        what: &'static str,
        tracker: &Arc<Tracker>,
        run: impl std::future::Future<Output = Exit> + Send + 'static,
    ) -> Launched {
        let (exit_tx, exit) = watch::channel(None);
        let guard = tracker.enter();
        let server = server.to_owned();
        let task = tokio::spawn(async move {
            let _guard = guard;
            let status = run.await;
            tracing::debug!(%server, ?status, "{what} stopped");
            let _ = exit_tx.send(Some(status));
        });
        let abort = task.abort_handle();
        let terminate = self.terminate.unwrap_or_else({
            let abort = task.abort_handle();
            move || Box::new(move || abort.abort())
        });
        Launched {
            stdin: self.stdin,
            stdout: self.stdout,
            stderr: self.stderr,
            exit,
            task,
            terminate,
            stop: Box::new(move || abort.abort()),
            on_request: self.on_request.unwrap_or_else(|| Box::new(|| {})),
            metrics: self.metrics,
            identity: self.identity,
            answers_deadlines: self.answers_deadlines,
        }
    }
}

/// What was measured about a running server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The digest of the bytes that run, when measured.
    pub digest: Option<Digest>,
    /// Extra files measured into the identity, with their digests.
    pub measured: Vec<(PathBuf, Digest)>,
    /// What the sandbox enforces, and what it could not.
    pub sandbox: SandboxReport,
    /// The evidence class.
    pub evidence: Evidence,
    /// For a wasm component: its kind, and the exported functions that are
    /// not tools.
    pub component: Option<ComponentReport>,
    /// For a component pulled from a registry: where from, by which
    /// manifest and layer.
    pub oci: Option<OciOrigin>,
}

impl Identity {
    /// Whether what answers for this server is Moat's own code (a typed
    /// component's tool server), so a [`FAULT_META`] mark on a result is
    /// Moat's word, not the server's: a stdio server could write any
    /// `_meta`, and its mark is never believed.
    pub fn marks_faults(&self) -> bool {
        self.component
            .as_ref()
            .is_some_and(|c| c.kind == ComponentKind::Typed)
    }
}

/// The `_meta` key of a call that failed in the host's hands (a trap or a
/// limit), not by the tool's own error, on a launcher that
/// [`Identity::marks_faults`]: `{"class": "crash" | "limit" | "hang",
/// "detail": "...", "limit": NAME}` (`limit` for a limit or a deadline:
/// the limit's configured name).
pub const FAULT_META: &str = "moat/fault";

/// The limit a [`FAULT_META`] mark in `meta` names, as one of
/// [`LimitHit::NAMES`](crate::limits::LimitHit::NAMES); `None` without a
/// mark or with a name that is not a limit's.
pub fn marked_limit(
    meta: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Option<&'static str> {
    let limit = meta?.get(FAULT_META)?.get("limit")?.as_str()?;
    crate::limits::LimitHit::NAMES
        .iter()
        .copied()
        .find(|name| *name == limit)
}

/// Where a pulled component came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciOrigin {
    /// The reference as configured (`oci://...`), without the resolved
    /// digest when it named a tag only.
    pub reference: String,
    /// The manifest's digest.
    pub manifest: Digest,
    /// The component layer's digest: the component's sha256.
    pub layer: Digest,
}

/// What kind of server a component is, told apart at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComponentKind {
    /// It exports `wasi:cli/run`: an MCP server on its stdio.
    Stdio,
    /// A typed tool component: each exported function is a tool.
    Typed,
}

impl std::fmt::Display for ComponentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Stdio => "stdio component (MCP on wasi:cli/run)",
            Self::Typed => "typed tool component (exported functions are tools)",
        })
    }
}

/// What a wasm launcher found in a component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentReport {
    /// Its kind.
    pub kind: ComponentKind,
    /// Exported functions that are not tools: `export: reason`.
    pub not_tools: Vec<String>,
    /// The digest of the snapshot of its initialised state, when that is
    /// what runs instead of the measured bytes themselves.
    pub snapshot: Option<Digest>,
}

/// What a launcher's sandbox enforces for one instance, and what it could
/// not, in the order the launcher applied it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxReport {
    /// Every rule, enforced or not.
    pub rules: Vec<SandboxRule>,
    /// Whether the instance's filesystem access is confined by the kernel
    /// (Landlock) rather than by the wasm host's preopens or not at all.
    pub kernel_filesystem: bool,
    /// The directories granted (host path, and whether read-write), to
    /// tell a refusal under a read-only grant from one outside every grant.
    pub granted: Vec<(std::path::PathBuf, bool)>,
}

/// One rule of a [`SandboxReport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxRule {
    /// Whether it holds for this instance.
    pub enforced: bool,
    /// What it is: the mechanism and what it covers.
    pub what: String,
}

impl SandboxReport {
    /// Adds a rule that holds.
    pub fn enforced(&mut self, what: impl Into<String>) {
        self.rules.push(SandboxRule {
            enforced: true,
            what: what.into(),
        });
    }

    /// Adds a rule that could not be applied.
    pub fn not_enforced(&mut self, what: impl Into<String>) {
        self.rules.push(SandboxRule {
            enforced: false,
            what: what.into(),
        });
    }

    /// One line a rule, as `moat inspect` prints them: `enforced: …` or
    /// `not enforced: …`.
    pub fn lines(&self) -> Vec<String> {
        self.rules.iter().map(SandboxRule::to_string).collect()
    }
}

impl std::fmt::Display for SandboxRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = if self.enforced {
            "enforced"
        } else {
            "not enforced"
        };
        write!(f, "{state}: {}", self.what)
    }
}

/// What a launcher counts while a server runs. A launcher that cannot count
/// something leaves it at zero.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Calls from the guest into the host (wasm).
    pub hostcalls: AtomicU64,
    /// Fuel the guest has used, over its whole life (wasm).
    pub fuel_consumed: AtomicU64,
}

impl Metrics {
    /// Calls from the guest into the host so far.
    pub fn hostcalls(&self) -> u64 {
        self.hostcalls.load(Ordering::SeqCst)
    }

    /// Fuel used so far.
    pub fn fuel_consumed(&self) -> u64 {
        self.fuel_consumed.load(Ordering::SeqCst)
    }
}

/// Counts the live tasks and instances of one transport, so tests and the
/// gateway can assert that nothing is left behind.
#[derive(Debug, Default)]
pub struct Tracker {
    live: AtomicUsize,
    started: AtomicUsize,
    changed: Notify,
}

impl Tracker {
    /// Tasks (and server instances) of this transport still alive.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Tasks (and server instances) ever started.
    pub fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// Resolves once something has been started.
    pub async fn wait_started(&self) {
        loop {
            let notified = self.changed.notified();
            if self.started() > 0 {
                return;
            }
            notified.await;
        }
    }

    /// Resolves once nothing is alive.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.changed.notified();
            if self.live() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Registers one live thing; it counts until the guard drops.
    pub fn enter(self: &Arc<Self>) -> TrackGuard {
        self.live.fetch_add(1, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        TrackGuard(self.clone())
    }
}

/// Keeps one tracked task counted while alive.
#[derive(Debug)]
pub struct TrackGuard(Arc<Tracker>);

impl Drop for TrackGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

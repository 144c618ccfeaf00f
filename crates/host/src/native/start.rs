//! One native server started: its containment planned ([`contain`]), its
//! argv and environment made ([`exec`]), the child spawned ([`spawn`], or
//! under a learn run's tracer), its egress served, and the task that waits
//! for its exit ([`super::reaper`]), handed up as [`Launched`].

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::process::{Pid, Signal};
use tokio::sync::watch;

use super::contain::{self, Contained};
use super::reaper::{OomWatch, Reaper, classify, kill_group_and_wait};
use super::{MeasuredExecutable, NativeError, NativeLaunch, exec, learn, spawn};
use crate::identity::{Digest, Evidence};
use crate::instance::{Identity, Launched, Metrics, Tracker};

/// Starts `executable` (measured, with `measured` the digests of its
/// `measure` paths) as `launch` describes, contained.
pub(super) fn start(
    launch: &NativeLaunch,
    executable: MeasuredExecutable,
    measured: Vec<(PathBuf, Digest)>,
    tracker: &Arc<Tracker>,
) -> Result<Launched, NativeError> {
    let path = &launch.resolved.target;
    // A script's interpreter is part of what runs: in the identity with its
    // digest, and named in the evidence.
    let mut measured = measured;
    if let Some(interpreter) = &executable.interpreter
        && let Some(digest) = interpreter.digest
    {
        measured.push((interpreter.path.clone(), digest));
    }
    let Contained {
        mut report,
        mut isolation,
        sandbox,
        scratch,
        proxied,
    } = contain::plan(launch, &executable)?;
    let (exec_fd, fd, argv) = exec::argv(
        launch,
        &executable,
        isolation.namespaces.as_mut(),
        &mut report,
    )?;
    let env = exec::env(
        launch,
        &executable,
        proxied,
        scratch.as_ref(),
        isolation.namespaces.as_ref(),
        &mut report,
    )?;
    let cstring = |what: &'static str, text: &str| exec::cstring(path, what, text);
    let layout = crate::egress::Layout::of(&launch.spec.net, contain::ipv6());
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
        cwd: std::ffi::CString::new(launch.cwd().as_os_str().as_encoded_bytes()).map_err(|_| {
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
        rlimits: contain::rlimits(&launch.spec.limits),
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
                launch.spec.name.clone(),
                crate::egress::Sockets {
                    proxy: std::net::TcpListener::from(proxy),
                    dns: std::net::UdpSocket::from(dns),
                    relays,
                },
                layout,
                launch.spec.net.clone(),
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
    tracing::debug!(server = %launch.spec.name, pid = pid.as_raw_nonzero().get(), "native server started");
    let stopped = Arc::new(AtomicBool::new(false));
    let out_of_memory = Arc::new(AtomicBool::new(false));
    let (exit_tx, exit) = watch::channel(None);
    let guard = tracker.enter();
    let limits = launch.spec.limits.clone();
    let name = launch.spec.name.clone();
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

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

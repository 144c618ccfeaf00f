//! The containment of one native launch, planned before the child is
//! made: what `rw` grants may not reach, the grants opened, the implicit
//! roots, the namespaces ([`namespaces`]), the Landlock ruleset and the
//! server's own root (`crate::sandbox`), the seccomp filters ([`seccomp`]),
//! the capabilities and rlimits ([`limits`]), and the lines that say what is
//! enforced and what is not. Required or best-effort is decided by
//! `crate::sandbox::enforce_or_report`. The child applies it (`spawn`).

use std::os::fd::AsFd;

use super::{MeasuredExecutable, NativeError, NativeLaunch};
use crate::instance::SandboxReport;

mod limits;
pub(super) mod namespaces;
mod seccomp;

pub(super) use limits::rlimits;
pub(super) use namespaces::ipv6;

/// A launch's containment, planned: the report so far (its grants), the
/// isolation, the Landlock plan, a learn run's scratch directory, and
/// whether it goes out through the egress proxy.
pub(super) struct Contained {
    pub(super) report: SandboxReport,
    pub(super) isolation: Isolation,
    pub(super) sandbox: crate::sandbox::Plan,
    pub(super) scratch: Option<tempfile::TempDir>,
    pub(super) proxied: bool,
}

/// Plans the containment of `launch`, running `executable`.
pub(super) fn plan(
    launch: &NativeLaunch,
    executable: &MeasuredExecutable,
) -> Result<Contained, NativeError> {
    let path = &launch.resolved.target;
    let mut report = SandboxReport::default();
    // No `rw` grant of this config may reach what this server runs.
    let own: Vec<crate::grants::Writer> = launch
        .spec
        .dirs
        .iter()
        .filter(|d| d.mode == crate::grants::DirMode::Rw)
        .map(|d| crate::grants::Writer {
            server: launch.spec.name.clone(),
            grant: d.host.clone(),
        })
        .collect();
    crate::grants::check_runs(
        &crate::grants::Runs {
            server: &launch.spec.name,
            executable: Some(path),
            interpreter: executable.interpreter.as_ref().map(|i| i.path.as_path()),
            measure: launch.measure(),
        },
        &[own.as_slice(), launch.spec.writers.as_slice()].concat(),
    )?;
    let dirs = crate::grants::open_all(&launch.spec.name, &launch.spec.dirs)?;
    report.granted = launch
        .spec
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
        launch.kept.check_file(&launch.spec.name, file)?;
    }
    let roots = crate::sandbox::implicit_roots(path, interpreter_path, &launch.kept);
    for line in &roots.held_back {
        tracing::warn!(server = %launch.spec.name, "{line}");
    }
    let proxied = namespaces::proxied(launch);
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
                .map(|host| crate::grants::DirGrant::native_rw(host))
                .collect();
            let writable = crate::grants::open_all(&launch.spec.name, &writable)?;
            crate::sandbox::learn_plan(&crate::sandbox::LearnGrants {
                dirs: &dirs,
                writable: &writable,
                scratch: scratch.as_ref().map(tempfile::TempDir::path),
                sandbox: launch.spec.sandbox,
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
            measure: launch.measure(),
            dirs: &dirs,
            net: &launch.spec.net,
            sandbox: launch.spec.sandbox,
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
            measure: launch.measure(),
            dirs: &dirs,
            cwd: launch.cwd(),
            tmp_options,
            resolv_conf: ns.resolv,
        })?;
        isolation.enforced.push(root.summary.clone());
        ns.root = Some(root);
    }
    Ok(Contained {
        report,
        isolation,
        sandbox,
        scratch,
        proxied,
    })
}

/// The namespaces, capability drop and seccomp filters for one launch, with
/// the lines that say what they enforce.
pub(super) struct Isolation {
    pub(super) namespaces: Option<namespaces::Namespaces>,
    /// The server gets a root of its own (planned once its grants are
    /// open).
    own_root: bool,
    pub(super) drop_bounding: bool,
    pub(super) seccomp: Vec<seccompiler::BpfProgram>,
    pub(super) enforced: Vec<String>,
    pub(super) not_enforced: Vec<String>,
}

/// Decides the isolation of `launch` on this kernel: refuses, under
/// `sandbox = "required"`, what cannot be enforced, naming it.
fn isolation(
    launch: &NativeLaunch,
    roots: &crate::sandbox::ImplicitRoots,
) -> Result<Isolation, NativeError> {
    let mut enforced = Vec::new();
    let mut not_enforced = Vec::new();
    let support = namespaces::namespace_support();
    let root = rustix::process::geteuid().is_root();
    let (namespaces, own_root) =
        namespaces::plan(launch, roots, support, &mut enforced, &mut not_enforced)?;
    if !launch.spec.net.is_empty() && !namespaces::proxied(launch) {
        not_enforced.push(
            "network: with `net` grants, UDP datagrams (DNS included) may go to any host"
                .to_owned(),
        );
    }
    let seccomp = seccomp::programs(launch.learn.is_some(), &mut enforced)?;
    let drop_bounding = limits::capabilities(support, root, &mut enforced);
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

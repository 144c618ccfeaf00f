//! What the child runs: its argv (a script through its interpreter's
//! descriptor, reading its sealed copy) and its exact environment, as the C
//! strings the child is given, with the lines that describe them.

use std::ffi::CString;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

use super::contain::namespaces::{Namespaces, ScriptBind};
use super::{MeasuredExecutable, NativeError, NativeLaunch, env};
use crate::instance::SandboxReport;

/// `text` as a C string, or the error naming `what` of the launch of
/// `path` for its NUL byte.
pub(super) fn cstring(path: &Path, what: &'static str, text: &str) -> Result<CString, NativeError> {
    CString::new(text).map_err(|_| NativeError::Nul {
        what,
        path: path.to_owned(),
    })
}

/// The descriptor to execute, the measured descriptor that stays open
/// across exec (the executable, or a script's sealed copy), and argv. A
/// script bound over its path is recorded in `namespaces`.
pub(super) fn argv(
    launch: &NativeLaunch,
    executable: &MeasuredExecutable,
    namespaces: Option<&mut Namespaces>,
    report: &mut SandboxReport,
) -> Result<(RawFd, RawFd, Vec<CString>), NativeError> {
    let path = &launch.resolved.target;
    let cstring = |what: &'static str, text: &str| cstring(path, what, text);
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
            let bound = match namespaces {
                Some(ns) if ns.tmp.is_some() => {
                    ns.script = Some(ScriptBind {
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
    for arg in &launch.spec.args {
        argv.push(cstring("an argument", arg)?);
    }
    Ok((exec_fd, fd, argv))
}

/// The environment: the configured one over the base (see [`env`]), with
/// Moat's proxy variables behind the egress proxy and a learn run's
/// scratch directory as its TMPDIR.
pub(super) fn env(
    launch: &NativeLaunch,
    executable: &MeasuredExecutable,
    proxied: bool,
    scratch: Option<&tempfile::TempDir>,
    namespaces: Option<&Namespaces>,
    report: &mut SandboxReport,
) -> Result<Vec<CString>, NativeError> {
    let path = &launch.resolved.target;
    let cstring = |what: &'static str, text: &str| cstring(path, what, text);
    // Behind the egress proxy, the proxy variables are Moat's, whatever the
    // config says.
    let mut moat_env = if proxied {
        crate::egress::proxy_environment()
    } else {
        Vec::new()
    };
    // A learn run's scratch directory is its TMPDIR.
    if let Some(scratch) = scratch {
        moat_env.push(("TMPDIR".to_owned(), scratch.path().display().to_string()));
    }
    let base = env::base(
        path,
        executable
            .interpreter
            .as_ref()
            .map(|interpreter| interpreter.path.as_path()),
        match (scratch, namespaces) {
            (Some(scratch), _) => env::Scratch::Dir(scratch.path()),
            (None, Some(ns)) if ns.root.is_some() => env::Scratch::OwnRoot,
            (None, Some(ns)) if ns.tmp.is_some() => env::Scratch::PrivateTmp,
            _ => env::Scratch::None,
        },
    );
    report.enforced(crate::grants::env::describe(&base, &launch.env));
    let env = crate::grants::env::merge(base, &launch.env, &moat_env)
        .iter()
        .map(|(k, v)| cstring("an environment variable", &format!("{k}={v}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(env)
}

//! `#!` scripts: the interpreter a script names on its first line, read
//! as the kernel reads it and resolved as a command is. Native launches
//! open and measure what this resolves; the config checks it when loaded
//! (no `rw` grant may cover what another server runs).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// Why a script's interpreter could not be read or resolved.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("script {path}: {detail}")]
    Script { path: PathBuf, detail: String },
    #[error("{syscall} {path}: {source}")]
    Io {
        syscall: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The longest `#!` line read, as the kernel's (BINPRM_BUF_SIZE).
const SHEBANG_BYTES: usize = 256;

/// The `#!` line of the file behind `fd`, when it has one: the interpreter
/// and its optional argument, split as the kernel splits them (at the first
/// blank after the interpreter).
pub fn shebang(fd: &OwnedFd, path: &Path) -> Result<Option<(String, Option<String>)>, ScriptError> {
    let mut buf = [0u8; SHEBANG_BYTES];
    let n = rustix::io::pread(fd, &mut buf, 0).map_err(|errno| ScriptError::Io {
        syscall: "pread",
        path: path.to_owned(),
        source: errno.into(),
    })?;
    let Some(line) = buf[..n].strip_prefix(b"#!") else {
        return Ok(None);
    };
    let script = |detail: &str| ScriptError::Script {
        path: path.to_owned(),
        detail: detail.to_owned(),
    };
    let end = line
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| script(&format!("the #! line is longer than {SHEBANG_BYTES} bytes")))?;
    let line = std::str::from_utf8(&line[..end])
        .map_err(|_| script("the #! line is not UTF-8"))?
        .trim_matches(|c| c == ' ' || c == '\t' || c == '\r');
    let (interpreter, argument) = match line.split_once([' ', '\t']) {
        Some((interpreter, rest)) => {
            let rest = rest.trim_matches([' ', '\t']);
            (interpreter, (!rest.is_empty()).then(|| rest.to_owned()))
        }
        None => (line, None),
    };
    if interpreter.is_empty() {
        return Err(script("the #! line names no interpreter"));
    }
    Ok(Some((interpreter.to_owned(), argument)))
}

/// Resolves the interpreter the script at `path` names on its `#!` line:
/// the file that runs, the arguments before the script, and whether it was
/// found through `env`. `#!/usr/bin/env NAME` looks NAME up on Moat's PATH,
/// as commands are; `env -S` splits the rest into words.
pub fn resolve_interpreter(
    path: &Path,
    interpreter: &str,
    argument: Option<String>,
) -> Result<(PathBuf, Vec<String>, bool), ScriptError> {
    let script = |detail: String| ScriptError::Script {
        path: path.to_owned(),
        detail,
    };
    let is_env = Path::new(interpreter).file_name() == Some(std::ffi::OsStr::new("env"));
    if is_env {
        let rest =
            argument.ok_or_else(|| script(format!("`#!{interpreter}` names no program to run")))?;
        let words: Vec<String> = match rest.strip_prefix("-S") {
            Some(split) => split.split_whitespace().map(str::to_owned).collect(),
            None if rest.starts_with('-') => {
                return Err(script(format!(
                    "`#!{interpreter} {rest}`: env options other than -S are not supported; name the interpreter directly"
                )));
            }
            None => vec![rest],
        };
        let (name, args) = words
            .split_first()
            .ok_or_else(|| script(format!("`#!{interpreter} -S` names no program")))?;
        let resolved =
            crate::command::resolve(name, Path::new("/"), std::env::var_os("PATH").as_deref())
                .map_err(|error| script(format!("its #! interpreter: {error}")))?;
        Ok((resolved.target, args.to_vec(), true))
    } else {
        let target = std::fs::canonicalize(interpreter).map_err(|error| {
            script(format!(
                "its #! interpreter {interpreter} does not exist ({error})"
            ))
        })?;
        Ok((target, argument.into_iter().collect(), false))
    }
}

/// The interpreter the file at `path` names on its `#!` line, resolved,
/// when it is a readable script whose interpreter resolves (what a config
/// is checked against when it is loaded; the launch resolves it again).
pub fn script_interpreter(path: &Path) -> Option<PathBuf> {
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let (interpreter, argument) = shebang(&fd, path).ok()??;
    resolve_interpreter(path, &interpreter, argument)
        .ok()
        .map(|(target, _, _)| target)
}

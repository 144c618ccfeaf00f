//! Command resolution: from a configured command to the file that will run,
//! never through a shell. On Unix a name without a slash is looked up on
//! PATH; a path is taken relative to the config file. Links are resolved
//! once, and both paths kept (argv[0] stays as configured). Windows rules
//! (PATH and PATHEXT, `.cmd`/`.bat` through `%ComSpec% /d /s /c` with every
//! argument quoted) are a pure function, tested everywhere.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// Why a command could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("command `{command}` not found on PATH ({searched})")]
    NotFound { command: String, searched: String },
    #[error("command `{command}`: {path} does not exist or is not an executable file")]
    NotExecutable { command: String, path: PathBuf },
    #[error("command `{command}`: resolving links of {path}: {detail}")]
    Canonicalize {
        command: String,
        path: PathBuf,
        detail: String,
    },
    #[error(
        "command `{command}`: argument {index} contains a line break, which cannot be passed to a batch file"
    )]
    BatchArgument { command: String, index: usize },
}

/// A command resolved to a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The command as configured; becomes argv[0].
    pub configured: String,
    /// Where it was found (may be a link).
    pub found: PathBuf,
    /// The file itself, every link resolved: what is opened, hashed and run.
    pub target: PathBuf,
}

fn is_executable_file(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        std::fs::metadata(path).is_ok_and(|m| m.is_file())
    }
}

/// Resolves `command` the Unix way: a name without a slash on `path_var`
/// (Moat's own PATH: the server's environment is exact and usually has
/// none), a path relative to `base_dir`.
pub fn resolve(
    command: &str,
    base_dir: &Path,
    path_var: Option<&OsStr>,
) -> Result<Resolved, ResolveError> {
    let found = if command.contains('/') {
        let path = base_dir.join(command);
        if !is_executable_file(&path) {
            return Err(ResolveError::NotExecutable {
                command: command.to_owned(),
                path,
            });
        }
        path
    } else {
        let dirs: Vec<PathBuf> = path_var
            .map(|p| std::env::split_paths(p).collect())
            .unwrap_or_default();
        dirs.iter()
            .filter(|dir| !dir.as_os_str().is_empty())
            .map(|dir| dir.join(command))
            .find(|candidate| is_executable_file(candidate))
            .ok_or_else(|| ResolveError::NotFound {
                command: command.to_owned(),
                searched: if dirs.is_empty() {
                    "PATH is not set".to_owned()
                } else {
                    format!(
                        "searched {}",
                        dirs.iter()
                            .map(|d| d.display().to_string())
                            .collect::<Vec<_>>()
                            .join(":")
                    )
                },
            })?
    };
    let target = found
        .canonicalize()
        .map_err(|error| ResolveError::Canonicalize {
            command: command.to_owned(),
            path: found.clone(),
            detail: error.to_string(),
        })?;
    Ok(Resolved {
        configured: command.to_owned(),
        found,
        target,
    })
}

/// How to start a command on Windows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowsLaunch {
    /// Run the program directly with these arguments (the platform quotes
    /// them for `CreateProcess`).
    Direct { program: String, args: Vec<String> },
    /// Run `%ComSpec%` with this exact command line (a `.cmd` or `.bat`).
    Shell {
        comspec: String,
        command_line: String,
    },
}

/// Resolves `command` as Windows does, without touching the file system:
/// `exists` answers whether a path is a file. A name is searched in each
/// `path_var` directory with each `pathext` extension (a name that already
/// has one of them is searched as is); a path is checked as given. `.exe`
/// and `.com` run directly; `.cmd` and `.bat` run through
/// `comspec /d /s /c "..."` with every argument quoted for cmd.exe.
pub fn resolve_windows(
    command: &str,
    args: &[String],
    path_var: &str,
    pathext: &str,
    comspec: &str,
    exists: impl Fn(&str) -> bool,
) -> Result<WindowsLaunch, ResolveError> {
    let extensions: Vec<String> = pathext
        .split(';')
        .filter(|e| !e.is_empty())
        .map(|e| e.to_ascii_lowercase())
        .collect();
    let lower = command.to_ascii_lowercase();
    let has_extension = extensions.iter().any(|e| lower.ends_with(e.as_str()));
    let suffixes: Vec<&str> = if has_extension {
        vec![""]
    } else {
        extensions.iter().map(String::as_str).collect()
    };
    let is_path = command.contains(['\\', '/', ':']);
    let mut candidates = Vec::new();
    if is_path {
        for suffix in &suffixes {
            candidates.push(format!("{command}{suffix}"));
        }
    } else {
        for dir in path_var.split(';').filter(|d| !d.is_empty()) {
            let dir = dir.trim_end_matches(['\\', '/']);
            for suffix in &suffixes {
                candidates.push(format!("{dir}\\{command}{suffix}"));
            }
        }
    }
    let found =
        candidates
            .into_iter()
            .find(|c| exists(c))
            .ok_or_else(|| ResolveError::NotFound {
                command: command.to_owned(),
                searched: format!("PATH={path_var}; PATHEXT={pathext}"),
            })?;
    let found_lower = found.to_ascii_lowercase();
    if found_lower.ends_with(".cmd") || found_lower.ends_with(".bat") {
        let mut line = String::from("/d /s /c \"");
        line.push_str(&quote_for_cmd(&found));
        for (index, arg) in args.iter().enumerate() {
            if arg.contains(['\r', '\n']) {
                return Err(ResolveError::BatchArgument {
                    command: command.to_owned(),
                    index,
                });
            }
            line.push(' ');
            line.push_str(&quote_for_cmd(arg));
        }
        line.push('"');
        Ok(WindowsLaunch::Shell {
            comspec: comspec.to_owned(),
            command_line: line,
        })
    } else {
        Ok(WindowsLaunch::Direct {
            program: found,
            args: args.to_vec(),
        })
    }
}

/// Quotes one argument for a batch file run by `cmd.exe /d /s /c "..."`.
/// Every argument is quoted so cmd's metacharacters (`& | < > ( ) ^ !`) are
/// literal; `"` is doubled; backslashes before a quote are doubled (the C
/// runtime's rule); `%` becomes `%%cd:~,%`, which expands to nothing before
/// a literal `%`, so no variable can be expanded.
fn quote_for_cmd(arg: &str) -> String {
    let mut out = String::with_capacity(arg.len() + 2);
    out.push('"');
    let mut backslashes = 0usize;
    for c in arg.chars() {
        match c {
            '\\' => {
                backslashes += 1;
                out.push('\\');
            }
            '"' => {
                out.extend(std::iter::repeat_n('\\', backslashes));
                out.push_str("\"\"");
                backslashes = 0;
            }
            '%' => {
                out.push_str("%%cd:~,%");
                backslashes = 0;
            }
            other => {
                out.push(other);
                backslashes = 0;
            }
        }
    }
    // A trailing run of backslashes would escape the closing quote.
    out.extend(std::iter::repeat_n('\\', backslashes));
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATHEXT: &str = ".COM;.EXE;.BAT;.CMD";

    fn files(list: &'static [&'static str]) -> impl Fn(&str) -> bool {
        move |p| list.iter().any(|f| f.eq_ignore_ascii_case(p))
    }

    #[test]
    fn windows_exe_on_path_runs_directly() {
        let launch = resolve_windows(
            "node",
            &["server.js".into()],
            r"C:\Windows;C:\Program Files\nodejs\",
            PATHEXT,
            r"C:\Windows\system32\cmd.exe",
            files(&[r"C:\Program Files\nodejs\node.exe"]),
        )
        .unwrap();
        assert_eq!(
            launch,
            WindowsLaunch::Direct {
                program: r"C:\Program Files\nodejs\node.exe".into(),
                args: vec!["server.js".into()]
            }
        );
    }

    #[test]
    fn windows_pathext_order_wins_and_cmd_goes_through_comspec() {
        let launch = resolve_windows(
            "npx",
            &[
                "-y".into(),
                "a b".into(),
                "x&calc".into(),
                "50%".into(),
                r#"say "hi""#.into(),
            ],
            r"C:\nodejs",
            PATHEXT,
            r"C:\Windows\system32\cmd.exe",
            files(&[r"C:\nodejs\npx.cmd", r"C:\nodejs\npx"]),
        )
        .unwrap();
        assert_eq!(
            launch,
            WindowsLaunch::Shell {
                comspec: r"C:\Windows\system32\cmd.exe".into(),
                command_line: r#"/d /s /c ""C:\nodejs\npx.cmd" "-y" "a b" "x&calc" "50%%cd:~,%" "say ""hi"""""#
                    .into()
            }
        );
    }

    #[test]
    fn windows_explicit_extension_and_paths() {
        let launch = resolve_windows(
            r".\tools\run.bat",
            &[],
            "",
            PATHEXT,
            "cmd.exe",
            files(&[r".\tools\run.bat"]),
        )
        .unwrap();
        assert_eq!(
            launch,
            WindowsLaunch::Shell {
                comspec: "cmd.exe".into(),
                command_line: r#"/d /s /c "".\tools\run.bat"""#.into()
            }
        );
        let err =
            resolve_windows("missing", &[], r"C:\bin", PATHEXT, "cmd.exe", files(&[])).unwrap_err();
        assert!(matches!(err, ResolveError::NotFound { .. }));
        assert!(err.to_string().contains(r"PATH=C:\bin"));
    }

    #[test]
    fn windows_batch_refuses_line_breaks() {
        let err = resolve_windows(
            "x.cmd",
            &["ok".into(), "a\nb".into()],
            r"C:\bin",
            PATHEXT,
            "cmd.exe",
            files(&[r"C:\bin\x.cmd"]),
        )
        .unwrap_err();
        assert_eq!(
            err,
            ResolveError::BatchArgument {
                command: "x.cmd".into(),
                index: 1
            }
        );
    }

    #[test]
    fn cmd_quoting_handles_backslashes_before_quotes_and_at_the_end() {
        assert_eq!(quote_for_cmd(r"C:\dir\"), r#""C:\dir\\""#);
        assert_eq!(quote_for_cmd(r#"a\"b"#), r#""a\\""b""#);
        assert_eq!(quote_for_cmd(""), r#""""#);
        assert_eq!(quote_for_cmd("^!()<>|"), r#""^!()<>|""#);
    }

    #[test]
    fn unix_resolution_on_path_and_relative_with_links() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let real = dir.path().join("real-server");
        std::fs::write(&real, b"#!/bin/sh\n").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::os::unix::fs::symlink(&real, bin.join("server")).unwrap();
        }
        let path_var = std::env::join_paths([Path::new("/nonexistent"), &bin]).unwrap();
        let resolved = resolve("server", Path::new("/"), Some(&path_var)).unwrap();
        assert_eq!(resolved.configured, "server");
        assert_eq!(resolved.found, bin.join("server"));
        assert_eq!(resolved.target, real.canonicalize().unwrap());

        let relative = resolve("./real-server", dir.path(), None).unwrap();
        assert_eq!(relative.target, real.canonicalize().unwrap());

        match resolve("server", Path::new("/"), Some(OsStr::new("/nonexistent"))) {
            Err(ResolveError::NotFound { command, searched }) => {
                assert_eq!(command, "server");
                assert_eq!(searched, "searched /nonexistent");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            resolve("server", Path::new("/"), None),
            Err(ResolveError::NotFound { searched, .. }) if searched == "PATH is not set"
        ));
        assert!(matches!(
            resolve("./missing", dir.path(), None),
            Err(ResolveError::NotExecutable { .. })
        ));
    }
}

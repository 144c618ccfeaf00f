//! `python -m MODULE` with a local MODULE: where Python would find it
//! without installing anything, so that no package of the same name is
//! installed from the index in its place, and its directory granted.

use std::path::{Path, PathBuf};

use super::Inferred;

/// Where `python -m MODULE` found MODULE without anything installed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalModule {
    /// The working directory it runs in (where it was found, for `cwd`).
    pub workdir: PathBuf,
    /// The directory of its module path that holds it.
    pub dir: PathBuf,
    /// The module's file or directory in `dir`.
    pub found: PathBuf,
    /// How `dir` is on the module path: `cwd` or `PYTHONPATH`.
    pub via: &'static str,
}

/// The working directories a client would run an entry in: its `cwd`
/// (relative to the client config's directory `base`) when it names one;
/// otherwise this process's, the client config's, and for a VS Code
/// `.vscode/mcp.json` the workspace above it.
pub(super) fn workdirs(cwd: Option<&str>, base: &Path) -> Vec<PathBuf> {
    let base = std::fs::canonicalize(base).unwrap_or_else(|_| base.to_owned());
    if let Some(cwd) = cwd {
        let dir = base.join(cwd);
        return vec![std::fs::canonicalize(&dir).unwrap_or(dir)];
    }
    let mut dirs: Vec<PathBuf> = std::env::current_dir().into_iter().collect();
    dirs.push(base.clone());
    if base.file_name() == Some(std::ffi::OsStr::new(".vscode"))
        && let Some(workspace) = base.parent()
    {
        dirs.push(workspace.to_owned());
    }
    dirs.dedup();
    dirs
}

/// The top-level module `top` in `dir`, as Python's path finder would
/// find it: a `top/` directory (a package, with or without `__init__.py`,
/// or one run by its `__main__.py`), `top.py`, or an extension module.
fn module_in(dir: &Path, top: &str) -> Option<PathBuf> {
    let package = dir.join(top);
    if package.is_dir() {
        return Some(package);
    }
    let source = dir.join(format!("{top}.py"));
    if source.is_file() {
        return Some(source);
    }
    std::fs::read_dir(dir).ok()?.flatten().find_map(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        let extension = name
            .strip_prefix(top)
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|rest| rest.ends_with(".so") || rest == "so" || rest == "pyc");
        (extension && entry.path().is_file()).then(|| entry.path())
    })
}

/// Where `python -m module` finds `module` (its top-level name) without
/// installing anything, when run in one of `workdirs` with `pythonpath`
/// (the entry's `PYTHONPATH`, relative entries taken from the working
/// directory): the working directory first, as `-m` puts it first on the
/// module path, then `PYTHONPATH`. `None` when it is nowhere local.
pub fn local_module(
    module: &str,
    workdirs: &[PathBuf],
    pythonpath: Option<&str>,
) -> Option<LocalModule> {
    let top = module.split('.').next().unwrap_or(module);
    for workdir in workdirs {
        let path = std::iter::once((workdir.clone(), "cwd")).chain(
            pythonpath
                .unwrap_or_default()
                .split(':')
                .filter(|p| !p.is_empty())
                .map(|p| (workdir.join(p), "PYTHONPATH")),
        );
        for (dir, via) in path {
            if let Some(found) = module_in(&dir, top) {
                let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
                return Some(LocalModule {
                    workdir: workdir.clone(),
                    dir,
                    found,
                    via,
                });
            }
        }
    }
    None
}

/// Grants and measures the directory a local `python -m` module was found
/// in, read-only, and says so; a directory no implicit grant may be (the
/// home directory, one holding Moat's own) is left to the operator.
pub(super) fn keep_local(
    inferred: &mut Inferred,
    original: &str,
    command: &str,
    module: &str,
    found: &LocalModule,
) {
    let python = command.rsplit('/').next().unwrap_or(command);
    #[cfg(unix)]
    let refusal = crate::grants::Kept::from_env(&[]).refusal(&found.dir);
    #[cfg(not(unix))]
    let refusal: Option<String> = None;
    let granted = match refusal {
        None => {
            inferred.measure.insert(0, found.dir.clone());
            inferred.dirs.insert(0, (found.dir.clone(), false));
            format!("{} is measured and granted read-only", found.dir.display())
        }
        Some(why) => format!(
            "{} is neither measured nor granted ({why}): grant what it needs with a `dirs` entry",
            found.dir.display()
        ),
    };
    inferred.notes.push(format!(
        "`{original}`: {python} -m {module}: kept local: {} is importable from {} {}; not installed from PyPI; runs in {}, and {granted}",
        found.found.display(),
        found.via,
        found.dir.display(),
        found.workdir.display(),
    ));
}

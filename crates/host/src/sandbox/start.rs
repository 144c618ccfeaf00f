//! What every native server may read to start without a grant: the
//! system directories, `/etc` less its secrets, a few devices, and the
//! installation roots of its executable and interpreter
//! ([`implicit_roots`]), each kept clear of what Moat protects.

use std::path::{Path, PathBuf};

/// Secrets under /etc that the system grant leaves out (paths relative to
/// /etc; a directory holding one is granted entry by entry).
pub(super) const ETC_SECRETS: &[&str] = &[
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "sudoers",
    "sudoers.d",
    "ssh",
    "ssl/private",
    "security/opasswd",
    "credstore",
    "credstore.encrypted",
];

/// Every path under `dir` (relative `prefix` to /etc) except the secrets,
/// as few rules as possible: whole entries unless they hold a secret.
pub(super) fn etc_grants(dir: &Path, prefix: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let relative = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        if ETC_SECRETS.contains(&relative.as_str()) {
            continue;
        }
        let holds_secret = ETC_SECRETS
            .iter()
            .any(|s| s.starts_with(&format!("{relative}/")));
        if holds_secret && entry.file_type().is_ok_and(|t| t.is_dir()) {
            etc_grants(&entry.path(), &relative, out);
        } else {
            out.push(entry.path());
        }
    }
}
pub(super) const SYSTEM_DIRS: &[&str] =
    &["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt"];
pub(super) const DEVICES_RO: &[&str] = &["/dev/zero", "/dev/urandom", "/dev/random"];

/// The installation root of an interpreter or runtime outside the system
/// directories (pyenv, uv, conda, nvm, asdf, a virtualenv): the prefix that
/// holds the executable's `bin/` and a `lib/`, so its standard library is
/// readable. `None` for an executable that is not in a `bin/` beside a
/// `lib/`, or under the system directories (granted anyway). Whether it
/// may be granted is [`implicit_roots`]' question.
fn install_root(executable: &Path) -> Option<PathBuf> {
    let bin = executable.parent()?;
    if bin.file_name()? != "bin" {
        return None;
    }
    let root = bin.parent()?;
    if SYSTEM_DIRS.iter().any(|dir| root.starts_with(dir)) {
        return None;
    }
    ["lib", "lib64"]
        .iter()
        .any(|lib| root.join(lib).is_dir())
        .then(|| root.to_owned())
}

/// The read-only roots a launch is granted without the user listing them,
/// and the ones held back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImplicitRoots {
    /// Granted read-only.
    pub granted: Vec<PathBuf>,
    /// One line per installation root not granted: which, why, and what was
    /// granted instead.
    pub held_back: Vec<String>,
}

/// The Python version directory name an executable or interpreter named
/// `name` reads its libraries from: `python3.12` for `python3.12`; `None`
/// (any `python3.*`) for `python3` or `python`; no match at all for a name
/// that is not Python's.
fn python_version(name: &str) -> Option<Option<&str>> {
    let version = name.strip_prefix("python")?;
    if version.is_empty() || version == "3" {
        return Some(None);
    }
    let mut parts = version.split('.');
    let numeric =
        |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    (numeric(parts.next()) && numeric(parts.next()) && parts.next().is_none()).then_some(Some(name))
}

/// The installation roots to grant read-only for `executable` and its
/// `#!` interpreter (both with every link resolved). Each goes through
/// `kept` ([`crate::grants::Kept::refusal`]): a root that is `/`, the home
/// directory, `$HOME/.local` as a whole, or holds Moat's state, data, cache
/// or configuration (or lies inside what holds a key) is not granted.
/// For such a root, the narrowest part Python needs is granted instead
/// when the program is Python's (a `pip --user` console script in
/// `~/.local/bin` reads `~/.local/lib/pythonX.Y`, X.Y its interpreter's),
/// and nothing otherwise; each held-back root is said, for the evidence.
pub fn implicit_roots(
    executable: &Path,
    interpreter: Option<&Path>,
    kept: &crate::grants::Kept,
) -> ImplicitRoots {
    let mut roots = ImplicitRoots::default();
    let name = |path: &Path| {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    // Whose libraries each root's programs read: the interpreter's, for a
    // script.
    let runs = name(interpreter.unwrap_or(executable));
    let programs = std::iter::once((executable, runs.clone()))
        .chain(interpreter.map(|path| (path, name(path))));
    for (program, runs) in programs {
        let Some(root) = install_root(program) else {
            continue;
        };
        if roots.granted.contains(&root) {
            continue;
        }
        let Some(why) = kept.refusal(&root) else {
            roots.granted.push(root);
            continue;
        };
        let mut instead = Vec::new();
        if let Some(version) = python_version(&runs) {
            for lib in ["lib", "lib64"] {
                let Ok(entries) = std::fs::read_dir(root.join(lib)) else {
                    continue;
                };
                let mut found: Vec<PathBuf> = entries
                    .flatten()
                    .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
                    .filter(|entry| {
                        let dir = entry.file_name().to_string_lossy().into_owned();
                        match version {
                            Some(exact) => dir == exact,
                            None => python_version(&dir).is_some_and(|v| v.is_some()),
                        }
                    })
                    .map(|entry| entry.path())
                    .filter(|dir| kept.refusal(dir).is_none())
                    .collect();
                found.sort();
                instead.append(&mut found);
            }
        }
        roots.held_back.push(format!(
            "not granted: the installation root {} of {} ({why}); {}; grant what the server needs there with a `dirs` entry",
            root.display(),
            program.display(),
            if instead.is_empty() {
                "nothing granted instead".to_owned()
            } else {
                format!(
                    "granted instead, read-only: {}",
                    instead
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ));
        for dir in instead {
            if !roots.granted.contains(&dir) {
                roots.granted.push(dir);
            }
        }
    }
    roots
}

/// Whether `path` is readable by every native server without a grant: what
/// starting needs (the system directories, /etc less its secrets, the
/// devices, the executable and the installation `roots` granted for it).
pub fn granted_to_start(path: &Path, executable: &Path, roots: &[PathBuf]) -> bool {
    if SYSTEM_DIRS.iter().any(|dir| path.starts_with(dir))
        || DEVICES_RO.iter().any(|dev| path == Path::new(dev))
        || path == Path::new("/dev/null")
        || path == executable
        || roots.iter().any(|root| path.starts_with(root))
    {
        return true;
    }
    match path.strip_prefix("/etc") {
        Ok(relative) => !ETC_SECRETS
            .iter()
            .any(|secret| relative.starts_with(secret)),
        Err(_) => false,
    }
}

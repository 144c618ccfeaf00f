//! Packages installed ahead of time: what `npx -y PKG`, `bunx`, `pnpm dlx`,
//! `uvx PKG`, `pipx run PKG` and `python -m MOD` would fetch and run at
//! every launch is instead resolved to an exact version and installed once,
//! with the ecosystem's own installer (npm, or pip for Python packages),
//! into Moat's package store. The server then runs as `interpreter + entry
//! point` from there, with the installed tree measured and granted
//! read-only, and nothing is fetched at run time.
//!
//! The store (`$MOAT_DATA_DIR/store`, else `$XDG_DATA_HOME/moat/store`,
//! else `~/.local/share/moat/store`) holds one directory per install,
//! named by the sha256 of its lockfile (`package-lock.json`, or a
//! `requirements.txt` with every archive's `--hash`): the lockfile pins
//! every archive's digest, so one name always holds the same bytes. The
//! tree's own digest is what the server's identity measures.
//!
//! Installing never runs package code: npm runs with `--ignore-scripts` and
//! pip with `--only-binary=:all:` (no source builds), and an install is
//! built in a temporary directory beside its final place and renamed into
//! it whole.
//!
//! [`update`] moves an installed server to a newer version, with the
//! tools' diff shown first.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use crate::config::{Ecosystem, PackageRecord};
use crate::identity::Digest;

/// Why a package could not be recognised, resolved or installed.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("`{launcher}`: {detail}")]
    Arguments { launcher: String, detail: String },
    #[error("installing {package}: `{program}` could not be run: {source}")]
    Spawn {
        package: String,
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("installing {package}: `{command}` failed ({status}){output}")]
    Installer {
        package: String,
        command: String,
        status: String,
        output: String,
    },
    #[error("installing {package}: {path}: {source}")]
    Io {
        package: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("installing {package}: {detail}")]
    Layout { package: String, detail: String },
    #[error("no package store: set MOAT_DATA_DIR, XDG_DATA_HOME or HOME")]
    NoStore,
}

/// A launcher command recognised in a client config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub ecosystem: Ecosystem,
    /// The package, without a version.
    pub name: String,
    /// Its extras (Python's `pkg[extra]`), installed with it.
    pub extras: Vec<String>,
    /// The version asked for, if any (exact or a range, the ecosystem's
    /// syntax).
    pub version: Option<String>,
    /// Other requirements installed beside it, each as the installer takes
    /// it (`name@version` for npm, `name[extra]==version` for pip):
    /// `uvx --with REQ`, every `npx -p PKG` but the one that is run.
    pub with: Vec<String>,
    /// What to run from it: an npm `bin` or console script name (`None`:
    /// the package's only one, or the one named like it), or a module.
    pub entry: Entry,
    /// The server's own arguments.
    pub args: Vec<String>,
    /// The launcher as configured (`npx`, `uvx`, ...), for messages.
    pub launcher: String,
}

/// What a request runs from its package.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// An npm `bin` or a console script; `None` picks the package's own.
    Program(Option<String>),
    /// `python -m MODULE`.
    Module(String),
}

fn arguments(launcher: &str, detail: impl Into<String>) -> PackageError {
    PackageError::Arguments {
        launcher: launcher.to_owned(),
        detail: detail.into(),
    }
}

/// Recognises `command args` as a package launcher: `npx`, `bunx`,
/// `pnpm dlx`, `uvx`, `pipx run` or `python -m` (any path to them).
/// `None` for any other command.
pub fn recognise(command: &str, args: &[String]) -> Option<Result<Request, PackageError>> {
    let base = command.rsplit('/').next().unwrap_or(command);
    let python = base == "python" || base == "python3" || base.starts_with("python3.");
    let (ecosystem, rest) = match base {
        "npx" | "bunx" => (Ecosystem::Npm, args),
        "pnpm" if args.first().map(String::as_str) == Some("dlx") => (Ecosystem::Npm, &args[1..]),
        "uvx" => (Ecosystem::Python, args),
        "pipx" if args.first().map(String::as_str) == Some("run") => {
            (Ecosystem::Python, &args[1..])
        }
        _ if python && args.first().map(String::as_str) == Some("-m") => {
            return Some(python_module(base, &args[1..]));
        }
        _ => return None,
    };
    let launcher = if rest.len() < args.len() {
        format!("{base} {}", args[0])
    } else {
        base.to_owned()
    };
    Some(launcher_request(ecosystem, &launcher, rest))
}

fn python_module(base: &str, args: &[String]) -> Result<Request, PackageError> {
    let launcher = format!("{base} -m");
    let module = args
        .first()
        .filter(|m| {
            !m.is_empty()
                && m.chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
        })
        .ok_or_else(|| arguments(&launcher, "expected a module name after -m"))?;
    Ok(Request {
        ecosystem: Ecosystem::Python,
        name: module.split('.').next().unwrap_or(module).replace('_', "-"),
        extras: Vec::new(),
        version: None,
        with: Vec::new(),
        entry: Entry::Module(module.clone()),
        args: args[1..].to_vec(),
        launcher,
    })
}

/// What a launcher's option does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flag {
    /// Takes no value and changes nothing Moat does.
    Quiet,
    /// Names the package to install (repeatable for npm: `-p a -p b`);
    /// the positional argument is then the program to run.
    Package,
    /// Names another requirement to install beside it (`uvx --with`).
    With,
}

/// The options a launcher takes that Moat understands; any other is
/// refused by name rather than guessed at.
fn flag(launcher: &str, name: &str) -> Option<Flag> {
    let program = launcher.split(' ').next().unwrap_or(launcher);
    match (program, name) {
        (_, "-y" | "--yes" | "-q" | "--quiet" | "--silent") => Some(Flag::Quiet),
        ("bunx", "--bun") => Some(Flag::Quiet),
        ("npx" | "bunx" | "pnpm", "-p" | "--package") => Some(Flag::Package),
        ("uvx", "--from") => Some(Flag::Package),
        ("uvx", "--with") => Some(Flag::With),
        ("pipx", "--spec") => Some(Flag::Package),
        _ => None,
    }
}

fn launcher_request(
    ecosystem: Ecosystem,
    launcher: &str,
    args: &[String],
) -> Result<Request, PackageError> {
    let mut packages: Vec<String> = Vec::new();
    let mut with: Vec<String> = Vec::new();
    let mut index = 0;
    while let Some(arg) = args.get(index) {
        index += 1;
        if arg == "--" {
            break;
        }
        if !arg.starts_with('-') {
            index -= 1;
            break;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_owned())),
            _ => (arg.as_str(), None),
        };
        let kind = flag(launcher, name).ok_or_else(|| {
            arguments(
                launcher,
                format!(
                    "option {name} is not understood by Moat's import (it knows {}); run the package's program directly",
                    known_flags(launcher)
                ),
            )
        })?;
        if kind == Flag::Quiet {
            if inline.is_some() {
                return Err(arguments(launcher, format!("option {name} takes no value")));
            }
            continue;
        }
        let value = match inline {
            Some(value) => value,
            None => {
                index += 1;
                args.get(index - 1).cloned().ok_or_else(|| {
                    arguments(launcher, format!("option {name} needs a package after it"))
                })?
            }
        };
        match kind {
            Flag::Package if ecosystem == Ecosystem::Python && !packages.is_empty() => {
                return Err(arguments(
                    launcher,
                    format!(
                        "option {name} is given more than once; name other requirements with --with"
                    ),
                ));
            }
            Flag::Package => packages.push(value),
            Flag::With => with.push(value),
            Flag::Quiet => {}
        }
    }
    let positional = args.get(index).cloned();
    let rest = args.get(index + 1..).unwrap_or_default().to_vec();
    let (specs, program) = match (packages.is_empty(), positional) {
        (false, Some(program)) => (packages, Some(program)),
        (true, Some(package)) => (vec![package], None),
        (false, None) => {
            return Err(arguments(
                launcher,
                "the package is named with an option, but no program to run from it follows",
            ));
        }
        (true, None) => return Err(arguments(launcher, "no package is named")),
    };
    let mut requirements = specs
        .iter()
        .map(|spec| requirement(ecosystem, launcher, spec))
        .collect::<Result<Vec<_>, _>>()?;
    // Of several npm packages, the one run is the one named like the
    // program, else the first; the others are installed beside it.
    let primary = program
        .as_deref()
        .and_then(|program| {
            requirements
                .iter()
                .position(|r| r.name.rsplit('/').next() == Some(program))
        })
        .unwrap_or(0);
    let main = requirements.remove(primary);
    let mut extra: Vec<String> = requirements.iter().map(|r| r.render(ecosystem)).collect();
    for spec in &with {
        extra.push(requirement(ecosystem, launcher, spec)?.render(ecosystem));
    }
    let entry = match (ecosystem, program) {
        (_, Some(program)) => Some(program),
        // uvx and pipx run the console script named like the package.
        (Ecosystem::Python, None) => Some(main.name.clone()),
        (Ecosystem::Npm, None) => None,
    };
    Ok(Request {
        ecosystem,
        name: main.name,
        extras: main.extras,
        version: main.version,
        with: extra,
        entry: Entry::Program(entry),
        args: rest,
        launcher: launcher.to_owned(),
    })
}

/// The options [`flag`] knows for `launcher`, for an error message.
fn known_flags(launcher: &str) -> String {
    let program = launcher.split(' ').next().unwrap_or(launcher);
    match program {
        "uvx" => "--from PKG, --with REQ and -q",
        "pipx" => "--spec PKG and -q",
        "bunx" => "-p/--package PKG, --bun and -y",
        _ => "-p/--package PKG and -y",
    }
    .to_owned()
}

/// One package to install: a registry name, its extras (Python) and the
/// version asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    name: String,
    extras: Vec<String>,
    version: Option<String>,
}

impl Requirement {
    /// As the ecosystem's installer takes it.
    fn render(&self, ecosystem: Ecosystem) -> String {
        requirement_text(ecosystem, &self.name, &self.extras, self.version.as_deref())
    }
}

/// `name`, its extras and `version` as the installer takes them:
/// `name@version` (npm), `name[a,b]==version` or `name[a,b]>=range` (pip).
fn requirement_text(
    ecosystem: Ecosystem,
    name: &str,
    extras: &[String],
    version: Option<&str>,
) -> String {
    match ecosystem {
        Ecosystem::Npm => match version {
            Some(version) => format!("{name}@{version}"),
            None => name.to_owned(),
        },
        Ecosystem::Python => {
            let extras = if extras.is_empty() {
                String::new()
            } else {
                format!("[{}]", extras.join(","))
            };
            match version {
                Some(v) if v.starts_with(['=', '<', '>', '~', '!']) => {
                    format!("{name}{extras}{v}")
                }
                Some(v) => format!("{name}{extras}=={v}"),
                None => format!("{name}{extras}"),
            }
        }
    }
}

/// `spec` as a registry requirement, or why it is not one.
fn requirement(
    ecosystem: Ecosystem,
    launcher: &str,
    spec: &str,
) -> Result<Requirement, PackageError> {
    let (name, version) = split_spec(ecosystem, spec);
    let (name, extras) = match (ecosystem, name.split_once('[')) {
        (Ecosystem::Python, Some((name, extras))) => {
            let extras = extras.strip_suffix(']').ok_or_else(|| {
                arguments(
                    launcher,
                    format!("{spec:?}: its extras are not closed with `]`"),
                )
            })?;
            let extras: Vec<String> = extras.split(',').map(|e| e.trim().to_owned()).collect();
            if let Some(bad) = extras.iter().find(|e| !valid_name(Ecosystem::Python, e)) {
                return Err(arguments(
                    launcher,
                    format!("{spec:?}: {bad:?} is not an extra's name"),
                ));
            }
            (name.trim().to_owned(), extras)
        }
        _ => (name, Vec::new()),
    };
    if !valid_name(ecosystem, &name) {
        return Err(arguments(
            launcher,
            format!(
                "{spec:?} is not a registry package name (paths, URLs and git sources are not installed by Moat)"
            ),
        ));
    }
    if let Some(version) = version.as_deref().filter(|v| !valid_version(v)) {
        return Err(arguments(
            launcher,
            format!("{version:?} is not a version (URLs and markers are not installed by Moat)"),
        ));
    }
    Ok(Requirement {
        name,
        extras,
        version,
    })
}

/// Whether `name` is a registry package name: npm's `[@scope/]name`
/// (lower case, digits, `-._~`), or a Python distribution name (PEP 508:
/// letters, digits, `-._`, alphanumeric at both ends). Nothing that could
/// be a path, a URL or an option.
fn valid_name(ecosystem: Ecosystem, name: &str) -> bool {
    let part = |p: &str, extra: &str| {
        !p.is_empty()
            && !p.starts_with(['.', '-', '_'])
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
    };
    match ecosystem {
        Ecosystem::Npm => {
            let lower = name.chars().all(|c| !c.is_ascii_uppercase());
            let unscoped = match name.strip_prefix('@') {
                Some(scoped) => match scoped.split_once('/') {
                    Some((scope, rest)) if part(scope, "-._~") => rest,
                    _ => return false,
                },
                None => name,
            };
            lower && name.len() <= 214 && part(unscoped, "-._~")
        }
        Ecosystem::Python => {
            part(name, "-._") && !name.ends_with(['.', '-', '_']) && name.len() <= 200
        }
    }
}

/// Whether `version` is a version or range in either ecosystem's syntax:
/// digits, letters, `.*+!<>=~^,-` and `|` or spaces between npm ranges;
/// never `@`, `/`, `:` or `;` (a URL, a path or an environment marker).
fn valid_version(version: &str) -> bool {
    !version.is_empty()
        && version.len() <= 100
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".*+!<>=~^,-| ".contains(c))
}

/// `name@version` (npm; a scope's `@` is not a separator), or for Python
/// `name@version`, `name==version` and other PEP 440 specifiers.
fn split_spec(ecosystem: Ecosystem, spec: &str) -> (String, Option<String>) {
    let at = match ecosystem {
        Ecosystem::Npm => spec.get(1..).and_then(|s| s.find('@')).map(|i| i + 1),
        Ecosystem::Python => spec.find('@'),
    };
    if let Some(at) = at {
        let version = &spec[at + 1..];
        return (
            spec[..at].to_owned(),
            (!version.is_empty() && version != "latest").then(|| version.to_owned()),
        );
    }
    if ecosystem == Ecosystem::Python
        && let Some(i) = spec.find(['=', '<', '>', '~', '!'])
    {
        return (
            spec[..i].trim().to_owned(),
            Some(spec[i..].trim().to_owned()),
        );
    }
    (spec.to_owned(), None)
}

/// One install, ready to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    pub record: PackageRecord,
    /// The interpreter that runs it (every link resolved).
    pub interpreter: PathBuf,
    /// Whether the store already held this exact install.
    pub reused: bool,
}

/// The file in each install that says what request it was made for, so an
/// exact version asked again is taken from the store, not resolved again.
pub const INSTALL_RECORD: &str = "moat-install.json";

/// What an install was made for: the request's package, extras, exact
/// version, the requirements beside it and the entry point.
fn request_key(request: &Request, version: &str) -> serde_json::Value {
    serde_json::json!({
        "ecosystem": request.ecosystem.to_string(),
        "name": request.name,
        "extras": request.extras,
        "version": version,
        "with": request.with,
        "entry": match &request.entry {
            Entry::Program(program) => format!("program:{}", program.as_deref().unwrap_or("")),
            Entry::Module(module) => format!("module:{module}"),
        },
    })
}

/// Whether `version` names one release exactly (`1.2.3`, `2026.8.31`,
/// `1.0.0-rc.1`), not a range or a tag.
fn exact_version(version: &str) -> bool {
    let core = version.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-.+".contains(c))
}

/// An install of `request` at exactly `version` already in `store`.
fn in_store(store: &Path, request: &Request, version: &str) -> Option<PackageRecord> {
    let key = request_key(request, version);
    let prefix = format!("{}-", request.ecosystem);
    for entry in std::fs::read_dir(store).ok()?.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let Ok(bytes) = std::fs::read(entry.path().join(INSTALL_RECORD)) else {
            continue;
        };
        let Ok(saved) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            continue;
        };
        if saved["request"] != key {
            continue;
        }
        let Ok(record) = serde_json::from_value::<PackageRecord>(saved["record"].clone()) else {
            continue;
        };
        // The lockfile it names must still be the one there.
        let lockfile = record.store.join(request.ecosystem.lockfile());
        if record.store == entry.path()
            && std::fs::read(&lockfile)
                .is_ok_and(|b| hex_of(&Digest::of(&b)) == record.lockfile_sha256)
        {
            return Some(record);
        }
    }
    None
}

/// Resolves `request` (at `version` when given, else at what it asks for,
/// else the newest) and installs it into `store`, with the ecosystem's
/// installer found on `path_var`. Progress goes to stderr. With `reuse`,
/// an exact version already installed for the same request is taken from
/// the store as it is, with no installer run and no registry asked.
pub fn install(
    store: &Path,
    request: &Request,
    version: Option<&str>,
    path_var: Option<&OsStr>,
    reuse: bool,
) -> Result<Installed, PackageError> {
    let package = format!("{} package {}", request.ecosystem, request.name);
    let io = |path: &Path| {
        let package = package.clone();
        let path = path.to_owned();
        move |source| PackageError::Io {
            package,
            path,
            source,
        }
    };
    std::fs::create_dir_all(store).map_err(io(store))?;
    let interpreter = interpreter(request.ecosystem, &package, path_var)?;
    let asked = version.or(request.version.as_deref());
    if reuse
        && let Some(exact) = asked.filter(|v| exact_version(v))
        && let Some(record) = in_store(store, request, exact)
    {
        eprintln!(
            "moat: {package} {exact} is in the store already ({}): not resolved again (`moat update` resolves it anew)",
            record.store.display()
        );
        return Ok(Installed {
            record,
            interpreter,
            reused: true,
        });
    }
    let scratch = tempfile::Builder::new()
        .prefix(".install-")
        .tempdir_in(store)
        .map_err(io(store))?;
    let tmp = scratch.path();
    let version = version.or(request.version.as_deref());
    eprintln!(
        "moat: installing {package}{}{} with {} (once, into {})",
        version.map(|v| format!(" {v}")).unwrap_or_default(),
        if request.with.is_empty() {
            String::new()
        } else {
            format!(" and beside it {}", request.with.join(", "))
        },
        match request.ecosystem {
            Ecosystem::Npm => "npm",
            Ecosystem::Python => "pip",
        },
        store.display()
    );
    let (exact, entry, entry_args_in) = match request.ecosystem {
        Ecosystem::Npm => install_npm(tmp, request, version, path_var, &package)?,
        Ecosystem::Python => install_python(tmp, request, version, &interpreter, &package)?,
    };
    let lockfile = tmp.join(request.ecosystem.lockfile());
    let bytes = std::fs::read(&lockfile).map_err(io(&lockfile))?;
    let lock_digest = Digest::of(&bytes);
    let hex = lock_digest.to_string();
    let hex = hex.strip_prefix("sha256:").unwrap_or(&hex);
    let dir = store.join(format!("{}-{}", request.ecosystem, &hex[..32]));
    let reused = dir.is_dir();
    let entry_args = entry_args_in
        .iter()
        .map(|rel| dir.join(rel).display().to_string())
        .collect::<Vec<_>>();
    let entry_args = match request.ecosystem {
        Ecosystem::Npm => entry_args,
        Ecosystem::Python => std::iter::once("-I".to_owned()).chain(entry_args).collect(),
    };
    let record = PackageRecord {
        ecosystem: request.ecosystem,
        name: request.name.clone(),
        version: exact,
        extras: request.extras.clone(),
        with: request.with.clone(),
        entry,
        entry_args,
        store: dir.clone(),
        lockfile_sha256: hex_of(&lock_digest),
    };
    if !reused {
        // What it was made for, beside it (and so in its tree digest).
        let saved = serde_json::json!({
            "request": request_key(request, &record.version),
            "record": record,
        });
        let path = tmp.join(INSTALL_RECORD);
        std::fs::write(&path, saved.to_string()).map_err(io(&path))?;
        match std::fs::rename(tmp, &dir) {
            Ok(()) => {}
            // Another install of the same lockfile won the race: same bytes.
            Err(_) if dir.is_dir() => {}
            Err(source) => return Err(io(&dir)(source)),
        }
    }
    Ok(Installed {
        record,
        interpreter,
        reused,
    })
}

fn hex_of(digest: &Digest) -> String {
    let text = digest.to_string();
    text.strip_prefix("sha256:").unwrap_or(&text).to_owned()
}

/// The interpreter that runs an ecosystem's packages, found on `path_var`
/// with every link resolved. A Python found through a shim (pyenv, asdf) is
/// asked for its real executable.
fn interpreter(
    ecosystem: Ecosystem,
    package: &str,
    path_var: Option<&OsStr>,
) -> Result<PathBuf, PackageError> {
    let name = ecosystem.interpreter();
    let found = crate::command::resolve(name, Path::new("/"), path_var).map_err(|error| {
        PackageError::Layout {
            package: package.to_owned(),
            detail: format!("its interpreter: {error}"),
        }
    })?;
    if ecosystem == Ecosystem::Npm {
        return Ok(found.target);
    }
    let output = Command::new(&found.target)
        .args(["-I", "-c", "import sys; print(sys.executable)"])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| PackageError::Spawn {
            package: package.to_owned(),
            program: found.target.display().to_string(),
            source,
        })?;
    let real = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !output.status.success() || real.is_empty() {
        return Err(PackageError::Layout {
            package: package.to_owned(),
            detail: format!("{} did not name its executable", found.target.display()),
        });
    }
    std::fs::canonicalize(&real).map_err(|source| PackageError::Io {
        package: package.to_owned(),
        path: real.into(),
        source,
    })
}

/// How often a running install says how far it has got.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs an installer for `package`, writing into `dir`: every
/// [`PROGRESS_EVERY`] a line on stderr says how long it has run and how
/// much it has written, and its end says how long it took.
fn run(package: &str, command: &mut Command, dir: &Path) -> Result<(), PackageError> {
    run_telling(package, command, dir, PROGRESS_EVERY, &mut |line| {
        eprintln!("{line}")
    })
}

fn run_telling(
    package: &str,
    command: &mut Command,
    dir: &Path,
    every: std::time::Duration,
    tell: &mut dyn FnMut(String),
) -> Result<(), PackageError> {
    use std::io::Read;
    let shown = format!("{command:?}").replace('"', "");
    let started = std::time::Instant::now();
    let program = command.get_program().to_string_lossy().into_owned();
    let spawn_error = |source| PackageError::Spawn {
        package: package.to_owned(),
        program: program.clone(),
        source,
    };
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let (done, finished) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let status = child.wait();
        let _ = done.send(());
        status
    });
    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(every) {
        tell(format!(
            "moat: still installing {package}: {} s, {} written so far",
            started.elapsed().as_secs(),
            human_bytes(tree_bytes(dir))
        ));
    }
    let status = waiter
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the installer's waiter panicked")))
        .map_err(|source| PackageError::Spawn {
            package: package.to_owned(),
            program: shown.clone(),
            source,
        })?;
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    if status.success() {
        tell(format!(
            "moat: installed {package} in {:.1} s ({})",
            started.elapsed().as_secs_f64(),
            human_bytes(tree_bytes(dir))
        ));
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&stdout));
    let tail: Vec<&str> = text.lines().rev().take(12).collect();
    let mut shown_output = String::new();
    for line in tail.iter().rev() {
        let _ = write!(shown_output, "\n  {}", crate::text::printable(line));
    }
    Err(PackageError::Installer {
        package: package.to_owned(),
        command: shown,
        status: status.to_string(),
        output: shown_output,
    })
}

/// The bytes of the files under `dir` (links not followed).
fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => pending.push(entry.path()),
                Ok(kind) if kind.is_file() => {
                    total += entry.metadata().map(|m| m.len()).unwrap_or(0);
                }
                _ => {}
            }
        }
    }
    total
}

fn human_bytes(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20)),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / f64::from(1u32 << 10)),
        b => format!("{b} B"),
    }
}

/// npm: a private package.json of Moat's (so the lockfile does not name
/// the temporary directory), `npm install --save-exact --ignore-scripts`,
/// then the installed version and `bin` read from the package.
fn install_npm(
    tmp: &Path,
    request: &Request,
    version: Option<&str>,
    path_var: Option<&OsStr>,
    package: &str,
) -> Result<(String, String, Vec<PathBuf>), PackageError> {
    let layout = |detail: String| PackageError::Layout {
        package: package.to_owned(),
        detail,
    };
    let npm = crate::command::resolve("npm", Path::new("/"), path_var)
        .map_err(|error| layout(format!("the installer: {error}")))?;
    let manifest = tmp.join("package.json");
    std::fs::write(
        &manifest,
        "{\"name\": \"moat-package\", \"private\": true}\n",
    )
    .map_err(|source| PackageError::Io {
        package: package.to_owned(),
        path: manifest.clone(),
        source,
    })?;
    let spec = requirement_text(Ecosystem::Npm, &request.name, &[], version);
    let mut command = Command::new(&npm.found);
    command
        .args([
            "install",
            "--save-exact",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
        ])
        .args(["--loglevel=error", "--no-update-notifier", "--prefix"])
        .arg(tmp)
        .arg("--")
        .arg(&spec)
        .args(&request.with);
    if let Some(path) = path_var {
        command.env("PATH", path);
    }
    run(package, &mut command, tmp)?;
    let meta = |name: &str| -> Result<serde_json::Value, PackageError> {
        let path = tmp.join("node_modules").join(name).join("package.json");
        std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| layout(format!("{} is missing or not JSON", path.display())))
    };
    let main = meta(&request.name)?;
    let exact = main["version"]
        .as_str()
        .ok_or_else(|| layout("its package.json has no version".into()))?
        .to_owned();
    let wanted = match &request.entry {
        Entry::Program(program) => program.clone(),
        Entry::Module(_) => None,
    };
    // The program is the package's own; one named with `-p` beside it
    // (`npx -p a -p b PROG`) may come from any of them, as npx runs it.
    let mut found =
        bin_of(&request.name, &main, wanted.as_deref()).map(|b| (request.name.clone(), b));
    if let (None, Some(_)) = (&found, &wanted) {
        for other in &request.with {
            let (name, _) = split_spec(Ecosystem::Npm, other);
            if let Some(bin) = bin_of(&name, &meta(&name)?, wanted.as_deref()) {
                found = Some((name, bin));
                break;
            }
        }
    }
    let Some((owner, (bin, script))) = found else {
        let unscoped = request.name.rsplit('/').next().unwrap_or(&request.name);
        return Err(layout(match &main["bin"] {
            serde_json::Value::Object(bins) => format!(
                "{exact} has no program {} among its bins {:?}{}",
                wanted.as_deref().unwrap_or(unscoped),
                bins.keys().collect::<Vec<_>>(),
                if request.with.is_empty() {
                    ""
                } else {
                    ", nor has any package named beside it"
                }
            ),
            serde_json::Value::String(_) => format!(
                "{exact} has no program {} (its one bin is `{unscoped}`){}",
                wanted.as_deref().unwrap_or(unscoped),
                if request.with.is_empty() {
                    ""
                } else {
                    ", nor has any package named beside it"
                }
            ),
            _ => format!("{exact} declares no `bin` to run"),
        }));
    };
    let relative = Path::new("node_modules").join(&owner).join(&script);
    let normal = relative.components().all(|c| {
        matches!(
            c,
            std::path::Component::Normal(_) | std::path::Component::CurDir
        )
    });
    if !normal || !tmp.join(&relative).is_file() {
        return Err(layout(format!(
            "bin `{bin}` names {script:?}, which is not a file inside the package"
        )));
    }
    Ok((exact, bin, vec![relative]))
}

/// The `bin` of npm package `name` (its `package.json` is `meta`) that
/// runs `wanted` (`None`: its only one, or the one named like the
/// package), as (bin name, script path inside the package).
fn bin_of(name: &str, meta: &serde_json::Value, wanted: Option<&str>) -> Option<(String, String)> {
    let unscoped = name.rsplit('/').next().unwrap_or(name);
    match &meta["bin"] {
        serde_json::Value::String(script) if wanted.is_none_or(|w| w == unscoped) => {
            Some((unscoped.to_owned(), script.clone()))
        }
        serde_json::Value::Object(bins) => {
            let pick = match wanted {
                Some(want) => bins.get_key_value(want),
                None if bins.len() == 1 => bins.iter().next(),
                None => bins.get_key_value(unscoped),
            };
            match pick {
                Some((name, serde_json::Value::String(script))) => {
                    Some((name.clone(), script.clone()))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// pip: `pip install --target site --report` (wheels only), a
/// `requirements.txt` with every archive's hash written from the report,
/// and `moat-entry.py`, which puts `site` first on sys.path and calls the
/// console script's function (or runs the module).
fn install_python(
    tmp: &Path,
    request: &Request,
    version: Option<&str>,
    interpreter: &Path,
    package: &str,
) -> Result<(String, String, Vec<PathBuf>), PackageError> {
    let layout = |detail: String| PackageError::Layout {
        package: package.to_owned(),
        detail,
    };
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| PackageError::Io {
            package: package.to_owned(),
            path,
            source,
        }
    };
    let requirement = requirement_text(Ecosystem::Python, &request.name, &request.extras, version);
    let report = tmp.join("report.json");
    let mut command = Command::new(interpreter);
    command
        .args([
            "-I",
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args([
            "--no-input",
            "--no-compile",
            "--only-binary=:all:",
            "--target",
        ])
        .arg(tmp.join("site"))
        .arg("--report")
        .arg(&report)
        .arg(&requirement)
        .args(&request.with);
    run(package, &mut command, tmp)?;
    let parsed: serde_json::Value = std::fs::read(&report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| layout("pip wrote no readable --report".into()))?;
    let _ = std::fs::remove_file(&report);
    let mut lines = Vec::new();
    let mut exact = None;
    let normal = |n: &str| n.to_ascii_lowercase().replace(['_', '.'], "-");
    for item in parsed["install"].as_array().into_iter().flatten() {
        let name = item["metadata"]["name"].as_str().unwrap_or_default();
        let ver = item["metadata"]["version"].as_str().unwrap_or_default();
        let hash = item["download_info"]["archive_info"]["hashes"]["sha256"]
            .as_str()
            .ok_or_else(|| layout(format!("{name} {ver} came without an archive sha256")))?;
        lines.push(format!("{name}=={ver} --hash=sha256:{hash}"));
        if normal(name) == normal(&request.name) {
            exact = Some(ver.to_owned());
        }
    }
    let exact = exact.ok_or_else(|| layout(format!("pip did not install {}", request.name)))?;
    lines.sort();
    let lockfile = tmp.join("requirements.txt");
    std::fs::write(&lockfile, lines.join("\n") + "\n").map_err(io(&lockfile))?;
    let (entry, body) = match &request.entry {
        Entry::Module(module) => (
            format!("-m {module}"),
            format!(
                "import runpy\nrunpy.run_module({}, run_name=\"__main__\", alter_sys=True)\n",
                serde_json::Value::from(module.as_str())
            ),
        ),
        Entry::Program(program) => {
            let scripts = console_scripts(&tmp.join("site"), &request.name);
            let want = program.clone().unwrap_or_else(|| request.name.clone());
            // The package's own script, else (as uvx runs it) one of a
            // requirement installed beside it.
            let beside = || {
                request.with.iter().find_map(|other| {
                    let (name, _) = split_spec(Ecosystem::Python, other);
                    let name = name.split('[').next().unwrap_or(&name).to_owned();
                    console_scripts(&tmp.join("site"), &name)
                        .into_iter()
                        .find(|(script, _)| *script == want)
                })
            };
            let target = scripts
                .iter()
                .find(|(name, _)| *name == want)
                .or_else(|| (program.is_none() && scripts.len() == 1).then(|| &scripts[0]))
                .cloned()
                .or_else(beside)
                .ok_or_else(|| {
                    let names: Vec<&str> = scripts.iter().map(|(n, _)| n.as_str()).collect();
                    layout(format!(
                        "{exact} has no console script `{want}` (it has {names:?}){}",
                        if request.with.is_empty() {
                            ""
                        } else {
                            ", nor has any requirement named beside it"
                        }
                    ))
                })?;
            let (module, attr) = target.1.split_once(':').unwrap_or((&target.1, ""));
            let attr = attr.split('[').next().unwrap_or("").trim();
            (
                target.0.clone(),
                format!(
                    "import importlib\nsys.argv[0] = {}\ntarget = importlib.import_module({})\nfor part in {}.split('.'):\n    if part:\n        target = getattr(target, part)\nsys.exit(target())\n",
                    serde_json::Value::from(target.0.as_str()),
                    serde_json::Value::from(module.trim()),
                    serde_json::Value::from(attr),
                ),
            )
        }
    };
    let script = tmp.join("moat-entry.py");
    let text = format!(
        "# Written by Moat: runs {entry} of {} {exact} from site/ beside this file.\nimport os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), \"site\"))\n{body}",
        request.name
    );
    std::fs::write(&script, text).map_err(io(&script))?;
    Ok((exact, entry, vec![PathBuf::from("moat-entry.py")]))
}

/// The `[console_scripts]` of distribution `name` installed under `site`,
/// as (script, `module:attr`).
fn console_scripts(site: &Path, name: &str) -> Vec<(String, String)> {
    let normal = |n: &str| n.to_ascii_lowercase().replace(['-', '.'], "_");
    let Ok(entries) = std::fs::read_dir(site) else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = file.strip_suffix(".dist-info") else {
            continue;
        };
        let dist = stem.rsplit_once('-').map_or(stem, |(d, _)| d);
        if normal(dist) != normal(name) {
            continue;
        }
        let text =
            std::fs::read_to_string(entry.path().join("entry_points.txt")).unwrap_or_default();
        let mut in_scripts = false;
        let mut out = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                in_scripts = line == "[console_scripts]";
            } else if let (true, Some((script, target))) = (in_scripts, line.split_once('=')) {
                out.push((script.trim().to_owned(), target.trim().to_owned()));
            }
        }
        return out;
    }
    Vec::new()
}

impl PackageRecord {
    /// The request that installs this package again (at another version).
    pub fn request(&self) -> Request {
        Request {
            ecosystem: self.ecosystem,
            name: self.name.clone(),
            extras: self.extras.clone(),
            version: None,
            with: self.with.clone(),
            entry: match self.entry.strip_prefix("-m ") {
                Some(module) => Entry::Module(module.to_owned()),
                None => Entry::Program(Some(self.entry.clone())),
            },
            args: Vec::new(),
            launcher: format!("{} package {}", self.ecosystem, self.name),
        }
    }
}

/// Why a server entry could not be moved to a new install.
#[derive(Debug, thiserror::Error)]
pub enum RepinError {
    #[error("{path}: {detail}")]
    Config { path: PathBuf, detail: String },
}

/// `spec` moved from its install `old` to `new`: the interpreter, the entry
/// arguments, the measured path and the read-only grant of the store.
pub fn respec(
    spec: &crate::config::ServerSpec,
    new: &Installed,
) -> Option<crate::config::ServerSpec> {
    let old = spec.package.as_ref()?;
    let mut spec = spec.clone();
    if !spec.args.starts_with(&old.entry_args) {
        return None;
    }
    spec.args.splice(
        ..old.entry_args.len(),
        new.record.entry_args.iter().cloned(),
    );
    if let crate::config::ServerKind::Native {
        command, measure, ..
    } = &mut spec.kind
    {
        *command = new.interpreter.display().to_string();
        for path in measure.iter_mut().filter(|p| **p == old.store) {
            *path = new.record.store.clone();
        }
    }
    for dir in spec.dirs.iter_mut().filter(|d| d.host == old.store) {
        dir.host = new.record.store.clone();
        dir.inode = None;
    }
    spec.sha256 = std::fs::read(&new.interpreter).ok().map(|b| Digest::of(&b));
    spec.package = Some(new.record.clone());
    Some(spec)
}

/// The text of moat.toml (at `path`) with server `name` moved to the new
/// install, as [`respec`] moves its spec; comments and the other entries
/// are kept as they were.
pub fn repin_config(
    path: &Path,
    text: &str,
    name: &str,
    new: &crate::config::ServerSpec,
) -> Result<String, RepinError> {
    use toml_edit::{Array, DocumentMut, Item, value};
    let fail = |detail: String| RepinError::Config {
        path: path.to_owned(),
        detail,
    };
    let mut doc: DocumentMut = text.parse().map_err(|e| fail(format!("{e}")))?;
    let record = new
        .package
        .as_ref()
        .ok_or_else(|| fail(format!("server `{name}` has no package")))?;
    let server = doc
        .get_mut("servers")
        .and_then(|s| s.get_mut(name))
        .and_then(Item::as_table_like_mut)
        .ok_or_else(|| fail(format!("no [servers.{name}] table")))?;
    let strings = |items: &mut dyn Iterator<Item = String>| -> Array { items.collect() };
    if let crate::config::ServerKind::Native {
        command, measure, ..
    } = &new.kind
    {
        server.insert("command", value(command.as_str()));
        server.insert(
            "measure",
            value(strings(
                &mut measure.iter().map(|p| p.display().to_string()),
            )),
        );
    }
    if let Some(sha256) = new.sha256 {
        server.insert("sha256", value(sha256.to_string()));
    }
    server.insert("args", value(strings(&mut new.args.iter().cloned())));
    let mut table = toml_edit::Table::new();
    table.insert("ecosystem", value(record.ecosystem.to_string()));
    table.insert("name", value(record.name.as_str()));
    table.insert("version", value(record.version.as_str()));
    for (key, items) in [("extras", &record.extras), ("with", &record.with)] {
        if !items.is_empty() {
            table.insert(key, value(strings(&mut items.iter().cloned())));
        }
    }
    table.insert("entry", value(record.entry.as_str()));
    table.insert(
        "entry_args",
        value(strings(&mut record.entry_args.iter().cloned())),
    );
    table.insert("store", value(record.store.display().to_string()));
    table.insert("lockfile_sha256", value(record.lockfile_sha256.as_str()));
    server.insert("package", Item::Table(table));
    if let Some(dirs) = server
        .get_mut("dirs")
        .and_then(Item::as_array_of_tables_mut)
    {
        for (dir, spec) in dirs.iter_mut().zip(&new.dirs) {
            dir.insert("host", value(spec.host.display().to_string()));
        }
    }
    let out = doc.to_string();
    crate::config::Config::parse(path, &out).map_err(|e| fail(format!("{e}")))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_exact_version_already_installed_is_found_in_the_store_and_nothing_else_is() {
        assert!(exact_version("2026.8.31") && exact_version("1.0.0-rc.1") && exact_version("0.25"));
        for range in ["^1.2.3", "~1.2", ">=1", "latest", "1", "1.x", "1.2.*"] {
            assert!(!exact_version(range), "{range}");
        }
        let store = tempfile::tempdir().unwrap();
        let dir = store.path().join("npm-0123456789abcdef");
        std::fs::create_dir(&dir).unwrap();
        let lock = b"{\"lockfileVersion\": 3}";
        std::fs::write(dir.join("package-lock.json"), lock).unwrap();
        let request = Request {
            ecosystem: Ecosystem::Npm,
            name: "@scope/server".into(),
            extras: Vec::new(),
            version: Some("1.2.3".into()),
            with: Vec::new(),
            entry: Entry::Program(None),
            args: Vec::new(),
            launcher: "npx".into(),
        };
        let record = PackageRecord {
            ecosystem: Ecosystem::Npm,
            name: "@scope/server".into(),
            version: "1.2.3".into(),
            extras: Vec::new(),
            with: Vec::new(),
            entry: "server".into(),
            entry_args: vec![
                dir.join("node_modules/@scope/server/dist/index.js")
                    .display()
                    .to_string(),
            ],
            store: dir.clone(),
            lockfile_sha256: hex_of(&Digest::of(lock)),
        };
        std::fs::write(
            dir.join(INSTALL_RECORD),
            serde_json::json!({"request": request_key(&request, "1.2.3"), "record": record})
                .to_string(),
        )
        .unwrap();
        assert_eq!(
            in_store(store.path(), &request, "1.2.3"),
            Some(record.clone())
        );
        assert_eq!(
            in_store(store.path(), &request, "1.2.4"),
            None,
            "another version"
        );
        let mut beside = request.clone();
        beside.with.push("is-number@7.0.0".into());
        assert_eq!(
            in_store(store.path(), &beside, "1.2.3"),
            None,
            "another request"
        );
        std::fs::write(dir.join("package-lock.json"), b"{}").unwrap();
        assert_eq!(
            in_store(store.path(), &request, "1.2.3"),
            None,
            "a lockfile changed since"
        );
    }

    #[test]
    fn a_long_install_says_how_far_it_has_got_and_how_long_it_took() {
        let dir = tempfile::tempdir().unwrap();
        let mut told = Vec::new();
        // The installer writes 300 KiB, then waits for its input to close
        // (a fifo nobody writes: it ends when the test's writer goes).
        let fifo = dir.path().join("fifo");
        assert!(
            Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let out = dir.path().join("site");
        std::fs::create_dir(&out).unwrap();
        let mut command = Command::new("sh");
        command.arg("-c").arg(format!(
            "head -c 307200 /dev/zero > {}/wheel; cat {} > /dev/null",
            out.display(),
            fifo.display()
        ));
        let progress = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let writer = std::thread::spawn({
            let fifo = fifo.clone();
            let out = out.clone();
            let progress = progress.clone();
            move || {
                // Opened for writing once the installer has written its
                // files and a progress line was told; closed at once,
                // which ends its `cat`.
                while tree_bytes(&out) < 307_200
                    || progress.load(std::sync::atomic::Ordering::SeqCst) == 0
                {
                    std::thread::yield_now();
                }
                let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
            }
        });
        run_telling(
            "npm package slow",
            &mut command,
            &out,
            std::time::Duration::from_millis(1),
            &mut |line| {
                progress.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                told.push(line)
            },
        )
        .unwrap();
        writer.join().unwrap();
        let last = told.pop().unwrap();
        assert!(
            last.starts_with("moat: installed npm package slow in ")
                && last.ends_with(" s (300.0 KiB)"),
            "{last}"
        );
        assert!(
            !told.is_empty()
                && told.iter().all(|l| {
                    l.starts_with("moat: still installing npm package slow: ")
                        && l.ends_with(" written so far")
                }),
            "{told:?}"
        );
        let failed = run_telling(
            "npm package broken",
            Command::new("sh").args(["-c", "echo 'E404 not found' >&2; exit 1"]),
            &out,
            PROGRESS_EVERY,
            &mut |_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(failed.contains("E404 not found"), "{failed}");
    }

    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn launchers_are_recognised() {
        let r = recognise(
            "npx",
            &strings(&["-y", "@modelcontextprotocol/server-filesystem", "/p", "-x"]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.ecosystem, Ecosystem::Npm);
        assert_eq!(r.name, "@modelcontextprotocol/server-filesystem");
        assert_eq!(r.version, None);
        assert_eq!(r.entry, Entry::Program(None));
        assert_eq!(r.args, ["/p", "-x"]);

        let r = recognise("/usr/bin/npx", &strings(&["--yes", "@a/b@1.2.3"]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.name.as_str(), r.version.as_deref()),
            ("@a/b", Some("1.2.3"))
        );
        let r = recognise("pnpm", &strings(&["dlx", "-p", "pkg@2", "tool", "a"]))
            .unwrap()
            .unwrap();
        assert_eq!(r.entry, Entry::Program(Some("tool".into())));
        assert_eq!((r.name.as_str(), r.version.as_deref()), ("pkg", Some("2")));
        assert_eq!(r.launcher, "pnpm dlx");

        let r = recognise("uvx", &strings(&["mcp-server-git", "--repository", "/r"]))
            .unwrap()
            .unwrap();
        assert_eq!(r.ecosystem, Ecosystem::Python);
        assert_eq!(r.entry, Entry::Program(Some("mcp-server-git".into())));
        assert_eq!(r.args, ["--repository", "/r"]);
        let r = recognise("uvx", &strings(&["--from", "x==1.0", "x-cli"]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.name.as_str(), r.version.as_deref()),
            ("x", Some("==1.0"))
        );
        let r = recognise("uvx", &strings(&["mcp-server-time@2026.10.19"]))
            .unwrap()
            .unwrap();
        assert_eq!(r.version.as_deref(), Some("2026.10.19"));
        let r = recognise("pipx", &strings(&["run", "mcp-server-fetch"]))
            .unwrap()
            .unwrap();
        assert_eq!(r.name, "mcp-server-fetch");
        let r = recognise(
            "python3",
            &strings(&["-m", "mcp_server_time", "--tz", "UTC"]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.entry, Entry::Module("mcp_server_time".into()));
        assert_eq!(r.name, "mcp-server-time");
        assert_eq!(r.args, ["--tz", "UTC"]);

        assert!(recognise("node", &strings(&["x.js"])).is_none());
        assert!(recognise("pipx", &strings(&["install", "x"])).is_none());
        for (command, args, detail) in [
            ("npx", &["-y"][..], "no package is named"),
            (
                "npx",
                &["--registry", "r", "x"][..],
                "option --registry is not understood",
            ),
            ("uvx", &["./local"][..], "is not a registry package name"),
            (
                "uvx",
                &["--from", "a", "--from", "b", "c"][..],
                "option --from is given more than once",
            ),
            ("python3", &["-m", "os;x"][..], "expected a module name"),
            (
                "npx",
                &["@x/../../etc"][..],
                "is not a registry package name",
            ),
            ("npx", &["Upper"][..], "is not a registry package name"),
            (
                "uvx",
                &["pkg@ https://evil.example/x.whl"][..],
                "is not a version",
            ),
            (
                "uvx",
                &["--from", "pkg==1.0;python_version>'3'", "x"][..],
                "is not a version",
            ),
            (
                "uvx",
                &["git+https://example.com/x"][..],
                "is not a registry package name",
            ),
        ] {
            let error = recognise(command, &strings(args))
                .unwrap()
                .unwrap_err()
                .to_string();
            assert!(error.contains(detail), "{command} {args:?}: {error}");
        }
    }

    /// Issue 33: `uvx --with`, `uvx --from 'pkg[extra]==V' CMD`, `npx -p`
    /// (repeated, `--package=`), `pipx run --spec`: what is installed,
    /// beside what, and which program runs.
    #[test]
    fn launchers_name_extra_requirements_and_programs() {
        let r = recognise(
            "uvx",
            &strings(&[
                "--with",
                "tzdata==2025.2",
                "--with=six",
                "mcp-server-time@2026.10.19",
                "--local-timezone",
                "UTC",
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.name.as_str(), r.version.as_deref()),
            ("mcp-server-time", Some("2026.10.19"))
        );
        assert_eq!(r.with, ["tzdata==2025.2", "six"]);
        assert_eq!(r.entry, Entry::Program(Some("mcp-server-time".into())));
        assert_eq!(r.args, ["--local-timezone", "UTC"]);

        let r = recognise(
            "uvx",
            &strings(&[
                "--from",
                "excel-mcp-server[dev, docs]==2.2.2",
                "excel-mcp",
                "stdio",
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.name, "excel-mcp-server");
        assert_eq!(r.extras, ["dev", "docs"]);
        assert_eq!(r.version.as_deref(), Some("==2.2.2"));
        assert_eq!(r.entry, Entry::Program(Some("excel-mcp".into())));
        assert_eq!(r.args, ["stdio"]);
        assert_eq!(
            requirement_text(Ecosystem::Python, &r.name, &r.extras, r.version.as_deref()),
            "excel-mcp-server[dev,docs]==2.2.2"
        );
        let r = recognise(
            "uvx",
            &strings(&["--with", "b[x]@1.0", "--from", "a", "cmd"]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.name.as_str(), r.with.as_slice()),
            ("a", &["b[x]==1.0".to_owned()][..])
        );

        // npx: every -p is installed; the program's own package is the one
        // recorded, whatever its place.
        let r = recognise(
            "npx",
            &strings(&[
                "-y",
                "-p",
                "zod@3",
                "--package=@modelcontextprotocol/server-memory@2026.8.31",
                "server-memory",
                "--flag",
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.name, "@modelcontextprotocol/server-memory");
        assert_eq!(r.version.as_deref(), Some("2026.8.31"));
        assert_eq!(r.with, ["zod@3"]);
        assert_eq!(r.entry, Entry::Program(Some("server-memory".into())));
        assert_eq!(r.args, ["--flag"]);
        let r = recognise("npx", &strings(&["-p", "a@1", "-p", "b", "tool"]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.name.as_str(), r.with.as_slice()),
            ("a", &["b".to_owned()][..])
        );

        let r = recognise(
            "pipx",
            &strings(&[
                "run",
                "--spec",
                "mcp-server-fetch==2026.10.24",
                "mcp-server-fetch",
                "-x",
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.name.as_str(), r.version.as_deref()),
            ("mcp-server-fetch", Some("==2026.10.24"))
        );
        assert_eq!(r.entry, Entry::Program(Some("mcp-server-fetch".into())));
        assert_eq!(r.args, ["-x"]);
        let r = recognise(
            "pipx",
            &strings(&["run", "mcp-server-git==2026.10.19", "--repository", "/r"]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.version.as_deref(), Some("==2026.10.19"));
        assert_eq!(r.entry, Entry::Program(Some("mcp-server-git".into())));
        assert_eq!(r.args, ["--repository", "/r"]);

        // An option a launcher does not have, or Moat does not know, is
        // refused by name, never taken for the package or the program.
        for (command, args, detail) in [
            (
                "uvx",
                &["--python", "3.12", "x"][..],
                "`uvx`: option --python is not understood",
            ),
            (
                "uvx",
                &["--with-editable", "./x", "y"][..],
                "option --with-editable is not understood",
            ),
            (
                "pipx",
                &["run", "--with", "a", "b"][..],
                "`pipx run`: option --with is not understood",
            ),
            (
                "pipx",
                &["run", "--from", "a", "b"][..],
                "option --from is not understood",
            ),
            (
                "npx",
                &["--with", "a", "b"][..],
                "option --with is not understood",
            ),
            ("npx", &["-c", "echo hi"][..], "option -c is not understood"),
            ("npx", &["-p", "a"][..], "no program to run from it follows"),
            ("uvx", &["--with"][..], "option --with needs a package"),
            (
                "uvx",
                &["--with", "./local", "x"][..],
                "is not a registry package name",
            ),
            ("uvx", &["--from", "x[a", "y"][..], "extras are not closed"),
            (
                "uvx",
                &["--from", "x[a/b]", "y"][..],
                "is not an extra's name",
            ),
            (
                "npx",
                &["-p", "a[x]", "y"][..],
                "is not a registry package name",
            ),
            ("npx", &["--yes=1", "a"][..], "option --yes takes no value"),
        ] {
            let error = recognise(command, &strings(args))
                .unwrap()
                .unwrap_err()
                .to_string();
            assert!(error.contains(detail), "{command} {args:?}: {error}");
        }
    }

    /// The extras and the requirements installed beside a package are
    /// kept in moat.toml, so `moat update` installs them again.
    #[test]
    fn extras_and_requirements_beside_are_recorded_for_update() {
        let text = r#"[servers.time]
command = "/usr/bin/python3"
allow_unmeasured = true
args = ["-I", "/s/python-x/moat-entry.py"]
[servers.time.package]
ecosystem = "python"
name = "mcp-server-time"
version = "2026.10.19"
extras = ["cli"]
with = ["tzdata==2025.2"]
entry = "mcp-server-time"
entry_args = ["-I", "/s/python-x/moat-entry.py"]
store = "/s/python-x"
lockfile_sha256 = "00"
"#;
        let path = Path::new("/etc/moat/moat.toml");
        let config = crate::config::Config::parse(path, text).unwrap();
        let spec = config.server("time").unwrap();
        let record = spec.package.as_ref().unwrap();
        assert_eq!(record.extras, ["cli"]);
        assert_eq!(record.with, ["tzdata==2025.2"]);
        let request = record.request();
        assert_eq!(request.extras, ["cli"]);
        assert_eq!(request.with, ["tzdata==2025.2"]);
        assert_eq!(
            request.entry,
            Entry::Program(Some("mcp-server-time".into()))
        );

        let mut new = spec.clone();
        new.package.as_mut().unwrap().with = vec!["tzdata==2026.1".into()];
        let written = repin_config(path, text, "time", &new).unwrap();
        let again = crate::config::Config::parse(path, &written).unwrap();
        let record = again.server("time").unwrap().package.clone().unwrap();
        assert_eq!(
            (record.extras.as_slice(), record.with.as_slice()),
            (&["cli".to_owned()][..], &["tzdata==2026.1".to_owned()][..])
        );
    }

    #[test]
    fn console_scripts_are_read_from_the_distribution() {
        let dir = tempfile::tempdir().unwrap();
        let info = dir.path().join("My_Pkg-1.0.dist-info");
        std::fs::create_dir(&info).unwrap();
        std::fs::write(
            info.join("entry_points.txt"),
            "[gui_scripts]\ng = m:g\n[console_scripts]\nmy-pkg = my_pkg.cli:main [extra]\n",
        )
        .unwrap();
        assert_eq!(
            console_scripts(dir.path(), "my-pkg"),
            [("my-pkg".to_owned(), "my_pkg.cli:main [extra]".to_owned())]
        );
        assert!(console_scripts(dir.path(), "other").is_empty());
    }
}

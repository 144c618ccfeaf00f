//! One install into the package store: an exact version already there is
//! taken as it is; otherwise the ecosystem's installer ([`super::npm`],
//! [`super::python`]) builds it in a temporary directory beside its place,
//! which is named by its lockfile's digest, and it is renamed in whole.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::npm::install_npm;
use super::python::install_python;
use super::{Ecosystem, Entry, PackageError, PackageRecord, Request};
use crate::identity::Digest;

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
pub(super) fn request_key(request: &Request, version: &str) -> serde_json::Value {
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
pub(super) fn exact_version(version: &str) -> bool {
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
pub(super) fn in_store(store: &Path, request: &Request, version: &str) -> Option<PackageRecord> {
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
    let started = std::time::Instant::now();
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
    // Installs may run several at a time (`moat import`): each says when
    // it is done, not only when it starts.
    eprintln!(
        "moat: installed {package} {} in {:.1} s",
        record.version,
        started.elapsed().as_secs_f64()
    );
    Ok(Installed {
        record,
        interpreter,
        reused,
    })
}

pub(super) fn hex_of(digest: &Digest) -> String {
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

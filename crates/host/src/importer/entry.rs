//! One client-config entry written as a `[servers.NAME]` table: the package
//! its launcher names installed (or the command pinned as configured), its
//! arguments, working directory, environment (secrets passed through, not
//! copied), measured paths and inferred grants.

use std::fmt::Write as _;
use std::path::Path;

use super::infer::{infer_env_grants, infer_grants, is_writer, looks_secret, script_package};
use super::local::{LocalModule, keep_local, local_module, workdirs};
use super::{Entry, Imported};
use crate::command::resolve;
use crate::grants::DirMode;
use crate::grants::toml::string as toml_string;
use crate::identity::Digest;

/// What an entry needs from outside Moat before it is written, found apart
/// from the writing so that entries can be prepared at the same time: a
/// local module `python -m` runs, or else the package its launcher names,
/// installed; and the notes made on the way.
pub(super) struct Prepared {
    local: Option<(String, LocalModule)>,
    package: Option<(crate::packages::Request, crate::packages::Installed)>,
    notes: Vec<String>,
}

/// Prepares `entry` (named `original` in the client config): the slow part
/// of an import, the install of its package into `store`.
pub(super) fn prepare(
    original: &str,
    entry: &Entry,
    base: &Path,
    path_var: Option<&std::ffi::OsStr>,
    store: Option<&Path>,
) -> Prepared {
    let command = entry.command.clone().unwrap_or_default();
    // `python -m MOD` runs a local MOD when one is importable where it
    // runs: that is no package, and installing one of the same name from
    // the index would run someone else's code with this entry's secrets.
    let local = match crate::packages::recognise(&command, &entry.args) {
        Some(Ok(crate::packages::Request {
            entry: crate::packages::Entry::Module(module),
            ..
        })) => local_module(
            &module,
            &workdirs(entry.cwd.as_deref(), base),
            entry.env.get("PYTHONPATH").map(String::as_str),
        )
        .map(|found| (module, found)),
        _ => None,
    };
    let mut notes = Vec::new();
    let package = if local.is_some() {
        None
    } else {
        install_package(&mut notes, original, &command, &entry.args, path_var, store)
    };
    Prepared {
        local,
        package,
        notes,
    }
}

/// The package a launcher entry names, installed into `store`; `None` (and
/// a note) when it is not a launcher or could not be installed.
fn install_package(
    notes: &mut Vec<String>,
    original: &str,
    command: &str,
    args: &[String],
    path_var: Option<&std::ffi::OsStr>,
    store: Option<&Path>,
) -> Option<(crate::packages::Request, crate::packages::Installed)> {
    let request = match crate::packages::recognise(command, args)? {
        Ok(request) => request,
        Err(error) => {
            notes.push(format!(
                "`{original}`: {error}; imported as configured, which fetches and runs other code at launch"
            ));
            return None;
        }
    };
    let Some(store) = store else {
        notes.push(format!(
            "`{original}`: `{}` fetches {} at launch and was not installed (no package store); pin the interpreter and add its script to `measure`",
            request.launcher, request.name
        ));
        return None;
    };
    if let crate::packages::Entry::Module(module) = &request.entry {
        notes.push(format!(
            "`{original}`: {} {module}: no {top}.py or {top}/ is importable from its working directory or PYTHONPATH, so it is a package: installing {} from PyPI",
            request.launcher,
            request.name,
            top = module.split('.').next().unwrap_or(module),
        ));
    }
    match crate::packages::install(store, &request, None, path_var, true) {
        Ok(installed) => Some((request, installed)),
        Err(error) => {
            notes.push(format!(
                "`{original}`: {error}; imported as configured, which fetches and runs other code at launch"
            ));
            None
        }
    }
}

/// Writes one `[servers.NAME]` entry for `entry`, [`prepare`]d, into
/// `imported`.
pub(super) fn import_entry(
    imported: &mut Imported,
    name: &str,
    original: &str,
    entry: &Entry,
    base: &Path,
    path_var: Option<&std::ffi::OsStr>,
    prepared: Prepared,
) {
    let Prepared {
        local,
        package,
        mut notes,
    } = prepared;
    imported.skipped.append(&mut notes);
    let command = entry.command.clone().unwrap_or_default();
    let _ = writeln!(imported.toml, "[servers.{name}]");
    let (args, mut inferred) = match &package {
        Some((request, installed)) => {
            let record = &installed.record;
            let interpreter = installed.interpreter.display().to_string();
            let _ = writeln!(imported.toml, "command = {}", toml_string(&interpreter));
            match std::fs::read(&installed.interpreter) {
                Ok(bytes) => {
                    let _ = writeln!(imported.toml, "sha256 = \"{}\"", Digest::of(&bytes));
                }
                Err(error) => {
                    let _ = writeln!(imported.toml, "allow_unmeasured = true");
                    imported.skipped.push(format!(
                        "`{original}`: could not read {interpreter} to pin it ({error}); imported unpinned"
                    ));
                }
            }
            imported.skipped.push(format!(
                "`{original}`: installed {}{} {}{} ({} `{}`) into {}{}; it runs from there, measured and read-only, and fetches nothing at launch",
                record.name,
                if record.extras.is_empty() { String::new() } else { format!("[{}]", record.extras.join(",")) },
                record.version,
                if record.with.is_empty() { String::new() } else { format!(" with {}", record.with.join(", ")) },
                record.ecosystem,
                record.entry,
                record.store.display(),
                if installed.reused { " (already in the store)" } else { "" }
            ));
            let mut inferred = infer_grants(&record.name, &request.args, original);
            inferred.measure.insert(0, record.store.clone());
            inferred.dirs.insert(0, (record.store.clone(), false));
            let args: Vec<String> = record
                .entry_args
                .iter()
                .chain(&request.args)
                .cloned()
                .collect();
            (args, inferred)
        }
        None => {
            // A bare name is written as the file it resolved to on Moat's
            // PATH at import: the digest pinned is that file's, and an
            // agent started with another PATH must not run another file
            // under the same name (and be refused as a digest mismatch).
            let written = match resolve(&command, base, path_var) {
                Ok(resolved) if !command.contains('/') => {
                    let found = resolved.found.display().to_string();
                    imported.skipped.push(format!(
                        "`{original}`: `{command}` is {found} on Moat's PATH at import; the config names that file, so another PATH cannot change what runs"
                    ));
                    found
                }
                _ => command.clone(),
            };
            let _ = writeln!(imported.toml, "command = {}", toml_string(&written));
            pin_command(imported, original, &written, base, path_var);
            let mut inferred = infer_grants(&command, &entry.args, original);
            if let Some((module, found)) = &local {
                keep_local(&mut inferred, original, &command, module, found);
            }
            let script = resolve(&command, base, path_var)
                .ok()
                .and_then(|resolved| script_package(&resolved.target));
            if let Some(package) = script {
                inferred.notes.push(format!(
                    "`{original}`: measures and grants read-only {}, the environment of its script",
                    package.display()
                ));
                inferred.measure.insert(0, package.clone());
                inferred.dirs.insert(0, (package, false));
            }
            (entry.args.clone(), inferred)
        }
    };
    if !args.is_empty() {
        let args: Vec<String> = args.iter().map(|a| toml_string(a)).collect();
        let _ = writeln!(imported.toml, "args = [{}]", args.join(", "));
    }
    match (&local, &entry.cwd) {
        (Some((_, found)), _) => {
            let cwd = found.workdir.display().to_string();
            let _ = writeln!(imported.toml, "cwd = {}", toml_string(&cwd));
        }
        (None, Some(cwd)) => {
            let _ = writeln!(imported.toml, "cwd = {}", toml_string(cwd));
        }
        (None, None) => {}
    }
    let (secret, plain): (Vec<_>, Vec<_>) =
        entry.env.iter().partition(|(name, _)| looks_secret(name));
    let writer = match &package {
        Some((_, installed)) => is_writer(&installed.record.name, &entry.args),
        None => is_writer(&command, &entry.args),
    };
    infer_env_grants(&mut inferred, &plain, writer, original);
    // Values are carried over; a secret's name only.
    imported
        .toml
        .push_str(&crate::grants::toml::env_lines(&crate::grants::EnvGrant {
            values: plain
                .iter()
                .map(|(k, v)| ((*k).clone(), (*v).clone()))
                .collect(),
            passthrough: secret.iter().map(|(k, _)| (*k).clone()).collect(),
        }));
    if !secret.is_empty() {
        for (name, _) in &secret {
            imported.skipped.push(format!(
                "`{original}`: env {name} looks like a secret: its value was not copied; it is passed through from Moat's environment, so set it there"
            ));
        }
    }
    if !inferred.measure.is_empty() {
        let paths: Vec<String> = inferred
            .measure
            .iter()
            .map(|p| toml_string(&p.display().to_string()))
            .collect();
        let _ = writeln!(imported.toml, "measure = [{}]", paths.join(", "));
    }
    if let Some((_, installed)) = &package {
        let record = &installed.record;
        let entry_args: Vec<String> = record.entry_args.iter().map(|a| toml_string(a)).collect();
        let list = |key: &str, items: &[String]| -> String {
            if items.is_empty() {
                return String::new();
            }
            let items: Vec<String> = items.iter().map(|a| toml_string(a)).collect();
            format!("{key} = [{}]\n", items.join(", "))
        };
        let _ = writeln!(
            imported.toml,
            "[servers.{name}.package]\necosystem = \"{}\"\nname = {}\nversion = {}\n{}{}entry = {}\nentry_args = [{}]\nstore = {}\nlockfile_sha256 = \"{}\"",
            record.ecosystem,
            toml_string(&record.name),
            toml_string(&record.version),
            list("extras", &record.extras),
            list("with", &record.with),
            toml_string(&record.entry),
            entry_args.join(", "),
            toml_string(&record.store.display().to_string()),
            record.lockfile_sha256,
        );
    }
    for (path, write) in &inferred.dirs {
        let _ = writeln!(
            imported.toml,
            "{}",
            crate::grants::toml::dir_entry(name, path, None, DirMode::of(*write))
        );
    }
    imported.skipped.append(&mut inferred.notes);
    if let Some(env_file) = &entry.env_file {
        imported
            .skipped
            .push(format!("`{original}`: envFile {env_file:?} not carried over (list the variables in env or env_passthrough)"));
    }
    imported.toml.push('\n');
}

/// Pins `command` as configured: its digest, or `allow_unmeasured` when it
/// cannot be read, said in `imported`.
fn pin_command(
    imported: &mut Imported,
    original: &str,
    command: &str,
    base: &Path,
    path_var: Option<&std::ffi::OsStr>,
) {
    match resolve(command, base, path_var) {
        Ok(resolved) => match std::fs::read(&resolved.target) {
            Ok(bytes) => {
                let _ = writeln!(
                    imported.toml,
                    "sha256 = \"{}\"  # {} at import",
                    Digest::of(&bytes),
                    crate::text::printable(&resolved.target.display().to_string())
                );
            }
            Err(error) => {
                let _ = writeln!(imported.toml, "allow_unmeasured = true");
                imported.skipped.push(format!(
                    "`{original}`: could not read {} to pin it ({error}); imported unpinned",
                    resolved.target.display()
                ));
            }
        },
        Err(error) => {
            let _ = writeln!(imported.toml, "allow_unmeasured = true");
            imported
                .skipped
                .push(format!("`{original}`: {error}; imported unpinned"));
        }
    }
}

//! Moving a configured server to another install (`moat update`): the
//! request that installs its package again, its spec moved to the new
//! install, and moat.toml's text rewritten to match.

use std::path::{Path, PathBuf};

use super::{Entry, Installed, PackageRecord, Request};
use crate::identity::Digest;

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
    let old = spec.package()?;
    let mut spec = spec.clone();
    if !spec.args.starts_with(&old.entry_args) {
        return None;
    }
    spec.args.splice(
        ..old.entry_args.len(),
        new.record.entry_args.iter().cloned(),
    );
    if let crate::config::ServerKind::Native {
        command,
        measure,
        package,
        ..
    } = &mut spec.kind
    {
        *command = new.interpreter.display().to_string();
        for path in measure.iter_mut().filter(|p| **p == old.store) {
            *path = new.record.store.clone();
        }
        *package = Some(new.record.clone());
    }
    for dir in spec.dirs.iter_mut().filter(|d| d.host == old.store) {
        dir.host = new.record.store.clone();
        dir.inode = None;
    }
    spec.sha256 = std::fs::read(&new.interpreter).ok().map(|b| Digest::of(&b));
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
        .package()
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

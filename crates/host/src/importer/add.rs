//! `moat add`: one server, from its command line, imported as
//! [`super::add`] does and appended to moat.toml (created when missing), or
//! put in place of the entry of the same name when asked.

use std::path::{Path, PathBuf};

use crate::config::{Config, ConfigError};
use crate::packages::PackageError;

/// Why a server could not be added to moat.toml.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// No command was given.
    #[error("moat add: give the server's command after `--`")]
    NoCommand,
    /// Reading moat.toml.
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The moat.toml there is not valid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A server of that name is configured, and replacing it was not asked.
    #[error(
        "{}: a server named `{name}` is already configured (choose another with --name, or replace it with --replace)",
        path.display()
    )]
    Taken { path: PathBuf, name: String },
    /// Installing needs a package store, and there is none.
    #[error(transparent)]
    Store(#[from] PackageError),
    /// The entry to replace could not be taken out.
    #[error("taking `{name}` out of {}: {detail}", path.display())]
    TakeOut {
        name: String,
        path: PathBuf,
        detail: String,
    },
    /// The config with the new entry would not parse.
    #[error("the new entry would not be a valid moat.toml")]
    Invalid(#[source] ConfigError),
    /// Writing moat.toml.
    #[error("writing {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What [`add_to_config`] did.
#[derive(Debug)]
pub struct Added {
    /// The server's name in moat.toml.
    pub name: String,
    /// Whether it replaced an entry of that name.
    pub replaced: bool,
    /// What was not carried over, one line each.
    pub skipped: Vec<String>,
}

/// `moat add`: imports `command` (the program and its arguments) as one
/// server named `name` (default: from the package or the program), its
/// package installed into Moat's store when `install`, and writes it to the
/// config at `config_path` (created when missing), in place of a server of
/// the same name only when `replace`. A name given and taken is refused
/// before anything is installed.
pub fn add_to_config(
    config_path: &Path,
    name: Option<&str>,
    command: &[String],
    install: bool,
    replace: bool,
) -> Result<Added, AddError> {
    let (program, args) = command.split_first().ok_or(AddError::NoCommand)?;
    let existing = match std::fs::read_to_string(config_path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(AddError::Read {
                path: config_path.to_owned(),
                source,
            });
        }
    };
    let configured = if existing.is_empty() {
        None
    } else {
        Some(Config::parse(config_path, &existing)?)
    };
    let taken = |name: &str| {
        configured
            .as_ref()
            .is_some_and(|config| config.servers.contains_key(name))
    };
    let refuse = |name: &str| AddError::Taken {
        path: config_path.to_owned(),
        name: name.to_owned(),
    };
    if let Some(name) = name
        && taken(name)
        && !replace
    {
        return Err(refuse(name));
    }
    let base = config_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let store = if install {
        Some(crate::dirs::store().ok_or(PackageError::NoStore)?)
    } else {
        None
    };
    let path_var = std::env::var_os("PATH");
    let (name, imported) = super::add(
        name,
        program,
        args,
        base,
        path_var.as_deref(),
        store.as_deref(),
    );
    let replaced = taken(&name);
    if replaced && !replace {
        return Err(refuse(&name));
    }
    let existing = if replaced {
        without_server(&existing, &name).map_err(|detail| AddError::TakeOut {
            name: name.clone(),
            path: config_path.to_owned(),
            detail,
        })?
    } else {
        existing
    };
    let combined = if existing.is_empty() || existing.ends_with("\n\n") {
        format!("{existing}{}", imported.toml)
    } else if existing.ends_with('\n') {
        format!("{existing}\n{}", imported.toml)
    } else {
        format!("{existing}\n\n{}", imported.toml)
    };
    Config::parse(config_path, &combined).map_err(AddError::Invalid)?;
    std::fs::write(config_path, combined).map_err(|source| AddError::Write {
        path: config_path.to_owned(),
        source,
    })?;
    Ok(Added {
        name,
        replaced,
        skipped: imported.skipped,
    })
}

/// `text` (a moat.toml) without server `name`'s tables, the rest kept as
/// written; or why not.
fn without_server(text: &str, name: &str) -> Result<String, String> {
    let mut doc: toml_edit::DocumentMut = text.parse().map_err(|e| format!("{e}"))?;
    let removed = doc
        .get_mut("servers")
        .and_then(toml_edit::Item::as_table_like_mut)
        .and_then(|servers| servers.remove(name));
    if removed.is_none() {
        return Err(format!("no [servers.{name}] table"));
    }
    Ok(doc.to_string())
}

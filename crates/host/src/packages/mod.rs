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

mod install;
mod npm;
mod python;
mod recognise;
mod repin;
mod requirement;
mod run;

use std::path::PathBuf;

pub use crate::config::{Ecosystem, PackageRecord};
pub use install::{Installed, install};
pub use recognise::recognise;
pub use repin::{RepinError, repin_config, respec};

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

#[cfg(test)]
mod tests;

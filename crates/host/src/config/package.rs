//! A server's `package` record: what Moat installed for it (see
//! [`crate::packages`]), from which ecosystem, and where.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The ecosystem a package comes from, which says how it is installed and
/// run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ecosystem {
    /// npm packages, installed with npm, run by node.
    Npm,
    /// Python distributions, installed with pip, run by python3.
    Python,
}

impl Ecosystem {
    /// The lockfile's name in an install.
    pub fn lockfile(self) -> &'static str {
        match self {
            Self::Npm => "package-lock.json",
            Self::Python => "requirements.txt",
        }
    }

    pub(crate) fn interpreter(self) -> &'static str {
        match self {
            Self::Npm => "node",
            Self::Python => "python3",
        }
    }
}

impl std::fmt::Display for Ecosystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Npm => "npm",
            Self::Python => "python",
        })
    }
}

/// A server's `package` record in moat.toml: what was installed, from what
/// request, and where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackageRecord {
    pub ecosystem: Ecosystem,
    /// The package (npm name or Python distribution).
    pub name: String,
    /// The exact version installed.
    pub version: String,
    /// Its extras as requested (Python: `pkg[extra]`), installed with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extras: Vec<String>,
    /// The other requirements installed beside it, as requested
    /// (`uvx --with REQ`, a second `npx -p PKG`): `moat update` moves the
    /// package on and installs these again as they are written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<String>,
    /// The program run: an npm `bin` name, a console script, or `-m MOD`.
    pub entry: String,
    /// The leading arguments that start the entry point; the server's own
    /// arguments follow them in `args`.
    pub entry_args: Vec<String>,
    /// The install in the store.
    pub store: PathBuf,
    /// The sha256 of its lockfile (inside `store`).
    pub lockfile_sha256: String,
}

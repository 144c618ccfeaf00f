//! The lock file, `moat.lock`: what `moat lock` approved for each server: its
//! digests, execution identity and evidence, and the canonical definition of
//! every tool with its pin. Human-readable TOML, written byte-identically
//! when nothing changed (sorted maps, sorted tools, canonical JSON).
//! [`relock`] holds the procedures that measure servers and rewrite it.
//!
//! Canonical definitions and the execution identity are [`canonical`];
//! the flags raised on untrusted text in definitions are [`flags`].

mod canonical;
mod flags;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::identity::Digest;

/// The version of the lock format this build writes and reads.
pub const LOCK_VERSION: u32 = 1;

/// Errors reading or writing a lock file.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("reading lock {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error(
        "lock {path} has version {found}; this moat reads version {LOCK_VERSION}: run `moat lock`"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("writing lock {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A whole `moat.lock`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    pub version: u32,
    #[serde(default)]
    pub servers: BTreeMap<String, LockedServer>,
    /// The kill switch: servers, tools and digests that must not run, in
    /// the order they were revoked (`moat revoke`). `moat lock` keeps them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revoked: Vec<Revocation>,
}

pub use crate::revoke::Revocation;
pub use canonical::{
    IdentityParts, canonical_json, canonical_listing, canonical_tool, execution_identity, tool_pin,
};
pub use flags::{
    INSTRUCTION_TAGS, OVERRIDE_PHRASES, SENSITIVE_PATHS, definition_flags,
    flag_cross_server_references, metadata_flags, text_flags,
};

/// What was approved for one server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedServer {
    /// `wasm`, `native` or `remote`.
    pub kind: String,
    /// The evidence class at lock time.
    pub evidence: String,
    /// The digest of the component or executable (empty for a remote
    /// server, whose identity is its endpoint).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    /// The execution identity: kind, digest, argv, cwd, environment names
    /// and measured files, hashed together.
    pub identity: String,
    /// Extra measured files or directories and their digests.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub measured: BTreeMap<String, String>,
    /// Every `dirs` grant, by host path, with the inode `moat lock` opened
    /// there: under the lock a grant that now opens another inode (the
    /// directory was replaced, or swapped for a link) is refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub grants: BTreeMap<String, u64>,
    /// Every tool the server listed, by name.
    #[serde(default)]
    pub tools: Vec<LockedTool>,
    /// Every prompt it listed, by name: pinned like tools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prompts: Vec<LockedTool>,
    /// Every resource it listed, by URI: pinned like tools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<LockedTool>,
    /// The package Moat installed it from, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<LockedPackage>,
    /// The registry artifact it was pulled from, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<LockedOci>,
}

impl LockedServer {
    /// The digests it was locked with: its bytes' and, for a pulled
    /// component, its manifest's (what a revoked digest is matched against
    /// before anything starts).
    pub fn digests(&self) -> Vec<Digest> {
        std::iter::once(&self.sha256)
            .chain(self.oci.as_ref().map(|oci| &oci.manifest))
            .filter_map(|d| d.parse().ok())
            .collect()
    }
}

/// A component pulled from an OCI registry, as locked. Under the lock the
/// manifest is what runs, pulled by its digest: a tag is not looked up
/// again, so a tag that moves changes nothing until `moat lock`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedOci {
    /// The reference as configured.
    pub reference: String,
    /// sha256 of the manifest.
    pub manifest: String,
    /// sha256 of the component layer (the same as the server's `sha256`).
    pub layer: String,
}

/// A package installed by Moat, as locked: what it is, the lockfile it was
/// installed from, and the digest of the installed tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedPackage {
    pub ecosystem: String,
    pub name: String,
    pub version: String,
    /// sha256 of its lockfile (`package-lock.json`, `requirements.txt`).
    pub lockfile_sha256: String,
    /// The digest of the installed tree (as `measured` lists it).
    pub sha256: String,
}

/// One tool's pinned definition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedTool {
    pub name: String,
    /// sha256 over the server's identity and the canonical definition.
    pub sha256: String,
    /// Canonical JSON: name, description, inputSchema, outputSchema.
    pub definition: String,
    /// Untrusted-metadata findings (control characters, escapes, zero-width).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
}

impl Lock {
    /// The revocations this lock holds, as the kill switch matches them.
    pub fn revocations(&self) -> crate::revoke::Revoked {
        crate::revoke::Revoked::of(&self.revoked)
    }

    /// `moat.lock` beside the config file.
    pub fn path_for(config: &Path) -> PathBuf {
        config.with_file_name("moat.lock")
    }

    /// Reads the lock at `path`; `Ok(None)` when there is none.
    pub fn load(path: &Path) -> Result<Option<Self>, LockError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(LockError::Read {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        Self::parse(path, &text).map(Some)
    }

    /// Validates `text` as the lock found at `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, LockError> {
        let lock: Self = toml::from_str(text).map_err(|error| {
            let (line, column) = error
                .span()
                .map_or((1, 1), |span| crate::text::line_column(text, span.start));
            LockError::Invalid {
                path: path.to_owned(),
                line,
                column,
                message: error.message().to_owned(),
            }
        })?;
        if lock.version != LOCK_VERSION {
            return Err(LockError::Version {
                path: path.to_owned(),
                found: lock.version,
            });
        }
        for (index, revocation) in lock.revoked.iter().enumerate() {
            if let Err(error) = revocation.target.parse::<crate::revoke::Target>() {
                let (line, column) = text
                    .find(&format!("{:?}", revocation.target))
                    .map_or((1, 1), |at| crate::text::line_column(text, at));
                return Err(LockError::Invalid {
                    path: path.to_owned(),
                    line,
                    column,
                    message: format!("revoked[{index}].target: {error}"),
                });
            }
        }
        Ok(lock)
    }

    /// The file's text: a header, then sorted TOML.
    pub fn to_text(&self) -> String {
        let body = toml::to_string(self).unwrap_or_default();
        format!(
            "# moat.lock: what `moat lock` approved: each server's digests and identity,\n# and the definition of every tool it may expose. Regenerate with `moat lock`.\n\n{body}"
        )
    }

    /// Writes the lock to `path` (through a temporary file and a rename).
    pub fn write(&self, path: &Path) -> Result<(), LockError> {
        let tmp = path.with_extension(format!("lock.tmp{}", std::process::id()));
        std::fs::write(&tmp, self.to_text())
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|source| LockError::Write {
                path: path.to_owned(),
                source,
            })
    }
}

#[cfg(test)]
mod tests;

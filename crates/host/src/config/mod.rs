//! Config: parses and validates `moat.toml`. No I/O beyond reading the file.
//!
//! Unknown keys and bad values are rejected with the file, line and column
//! they were found at.
//!
//! The document is read in [`parse`], each `[servers.NAME]` entry checked
//! and turned into a [`ServerSpec`] in [`server`] (its remote endpoint in
//! [`endpoint`]); `[serve]` and `[wasm]` are [`settings`], a server's kind
//! and grants are [`spec`], and an installed package's record is
//! [`package`]. The grants themselves (dirs, net, protection, their TOML)
//! live in [`crate::grants`].

mod endpoint;
mod node;
mod package;
mod parse;
mod server;
mod settings;
mod spec;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use crate::grants::{DirGrant, DirMode, HttpGrant, NetGrant, Writer, net_line};
pub use endpoint::parse_endpoint;
pub use node::NodeTarget;
pub use package::{Ecosystem, PackageRecord};
pub use server::SEPARATOR;
pub(crate) use server::valid_server_name;
pub use settings::{AllocatorSetting, CpuMetering, ServeSettings, WasmSettings};
pub use spec::{Instances, Sandbox, ServerKind, ServerSpec, WasmSource};

/// A loaded, validated `moat.toml`.
#[derive(Clone, Debug)]
pub struct Config {
    /// The file the config was read from.
    pub path: PathBuf,
    /// Servers by name, in name order.
    pub servers: BTreeMap<String, ServerSpec>,
    /// How `moat serve` runs agent sessions.
    pub serve: ServeSettings,
    /// How the wasm engine runs every wasm server.
    pub wasm: WasmSettings,
    /// Launch hosts (`[nodes.NAME]`) that servers here may run on.
    pub nodes: BTreeMap<String, NodeTarget>,
}

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config {path}: {source}")]
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
    #[cfg(unix)]
    #[error("{path}: {source}")]
    Writer {
        path: PathBuf,
        #[source]
        source: Box<crate::grants::GrantError>,
    },
    #[error("{path}: no server named `{name}` (configured: {known})")]
    UnknownServer {
        path: PathBuf,
        name: String,
        known: String,
    },
}

impl Config {
    /// Reads and validates the config at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// The server named `name`, or an error listing the configured names.
    pub fn server(&self, name: &str) -> Result<&ServerSpec, ConfigError> {
        self.servers
            .get(name)
            .ok_or_else(|| ConfigError::UnknownServer {
                path: self.path.clone(),
                name: name.to_owned(),
                known: if self.servers.is_empty() {
                    "none".to_owned()
                } else {
                    self.servers.keys().cloned().collect::<Vec<_>>().join(", ")
                },
            })
    }
}

#[cfg(test)]
mod tests;

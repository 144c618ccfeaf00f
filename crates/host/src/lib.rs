//! moat-host: runs MCP servers isolated, measured and bounded.
//!
//! Modules, dependencies pointing one way: [`config`] (parse and validate
//! `moat.toml`) → [`identity`] (digests, evidence) → [`command`] (command
//! resolution) → [`wasm`] and `native` (the launchers) → [`transport`] (the one client transport over any launcher) →
//! [`client`] (a connected session with a server, typed errors). [`remote`] is
//! the third launcher: a bridge to a server reached over streamable HTTP.
//! [`limits`] is shared vocabulary. [`fuzz`] drives a server with generated
//! cases through the client, as `moat fuzz`.

pub mod audit;
pub mod client;
pub mod command;
pub mod config;
#[cfg(target_os = "linux")]
pub mod egress;
pub mod fuzz;
pub mod gateway;
#[cfg(unix)]
pub mod grants;
pub mod identity;
pub mod importer;
pub mod keys;
pub mod limits;
pub mod lock;
pub mod lookup;
#[cfg(unix)]
pub mod native;
pub mod packages;
pub mod policy;
pub mod remote;
#[cfg(target_os = "linux")]
pub mod sandbox;
pub mod seal;
pub mod transport;
pub mod wasm;

pub use client::{ClientError, Handshake, Host, Session};
pub use config::{Config, ConfigError, ServerKind, ServerSpec};
pub use identity::{Digest, Evidence, Expectation};
pub use limits::{LimitHit, Limits};
/// The rmcp version Moat speaks, re-exported for its protocol types.
pub use rmcp;
pub use transport::{Fault, ServerTransport, TransportError};

/// Why a server could not be launched.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "server `{server}` has no sha256 pinned: refusing an unmeasured launch (pin it with `sha256 = \"...\"` from `moat digest`, or set `allow_unmeasured = true`)"
    )]
    Unmeasured { server: String },
    #[error(transparent)]
    Wasm(#[from] wasm::WasmError),
    #[cfg(unix)]
    #[error(transparent)]
    Native(#[from] native::NativeError),
    #[cfg(unix)]
    #[error(transparent)]
    Grant(Box<crate::grants::GrantError>),
    #[error(
        "server `{server}`: its package {package} {version} is not installed at {store} (the store was moved or cleaned): run `moat update {server} --version {version} --yes` to install it again", store = store.display()
    )]
    PackageMissing {
        server: String,
        package: String,
        version: String,
        store: std::path::PathBuf,
    },
    #[error("server `{server}`: native servers are not supported on this platform yet")]
    Unsupported { server: String },
    #[error(transparent)]
    Remote(#[from] remote::RemoteError),
    #[error(transparent)]
    Transport(#[from] TransportError),
}

#[cfg(unix)]
impl From<crate::grants::GrantError> for LaunchError {
    fn from(error: crate::grants::GrantError) -> Self {
        Self::Grant(Box::new(error))
    }
}

//! moat-host: runs MCP servers isolated, measured and bounded.
//!
//! Layers, each importing only from those below it:
//! 1. Vocabulary and data: [`text`] (untrusted text made printable),
//!    [`dirs`] (Moat's default directories), [`config`] (parse and validate `moat.toml`),
//!    [`identity`] (digests, evidence), [`limits`], [`lock`] (the file;
//!    its [`lock::relock`] is in layer 8), [`keys`],
//!    [`seal`], [`command`] (command resolution), [`grants`], [`oci`]
//!    (OCI references, the store of pulled components, and the pull),
//!    [`revoke`] (what the kill switch names, and matching it).
//! 2. The launch contract, [`instance`]: what a launcher hands up (the
//!    launched instance, its identity with a typed sandbox report, its exit,
//!    metrics and tracker).
//! 3. The launchers, each with its own error type: [`wasm`] (wasmtime, with
//!    its name lookup), `native` (a sandboxed child process, with `sandbox`
//!    and `egress`), [`remote`] (a bridge to streamable HTTP).
//! 4. [`transport`]: the one client transport over any launched instance;
//!    it imports only the contract and the limits.
//! 5. [`launch`]: which launcher runs a server, what is planned once and
//!    what starts per instance, and [`LaunchError`] over the launchers'
//!    errors.
//! 6. [`client`] (a connected session with a server, lock enforcement,
//!    typed errors), then [`gateway`] (`moat serve`'s agent sessions, with
//!    the [`metrics`] it counts), [`front`] (its agent-facing fronts:
//!    [`front::http`], streamable HTTP with its limits and probes, and
//!    [`front::stdio`], one agent on the process's stdio), [`tasks_2025`]
//!    (2025-11-25's task requests at the wire, which rmcp does not carry)
//!    and [`fuzz`].
//! 7. Bringing configs in: [`importer`] (client configs), [`packages`]
//!    (package launchers) and [`wassette`] (Wassette policies).
//! 8. What the CLI's commands call, each the procedure of one command:
//!    [`setup`] (a [`Host`] and a gateway from a config path: the engine,
//!    the lock, the paths no grant may overlap, the audit log),
//!    [`report`] (what `moat tools` and `moat inspect` show of a server, as
//!    data), [`lock::relock`] (`moat lock`, re-pinning one server, `moat
//!    revoke`), [`packages::update`] (`moat update`) and
//!    [`importer::add_to_config`] (`moat add`). Nothing below imports them.

pub mod audit;
pub mod client;
pub mod command;
pub mod config;
pub mod dirs;
#[cfg(target_os = "linux")]
pub mod egress;
pub mod front;
pub mod fuzz;
pub mod gateway;
pub mod grants;
pub mod identity;
pub mod importer;
pub mod instance;
pub mod keys;
pub mod launch;
pub mod limits;
pub mod lock;
pub mod metrics;
#[cfg(unix)]
pub mod native;
pub mod oci;
pub mod packages;
pub mod policy;
pub mod remote;
pub mod report;
pub mod revoke;
#[cfg(target_os = "linux")]
pub mod sandbox;
pub mod seal;
pub mod setup;
pub mod tasks_2025;
pub mod text;
pub mod trace;
pub mod transport;
pub mod wasm;
pub mod wassette;
pub mod watch;

pub use client::{ClientError, Handshake, Host, Session};
pub use config::{Config, ConfigError, ServerKind, ServerSpec};
pub use identity::{Digest, Evidence, Expectation};
pub use launch::LaunchError;
pub use limits::{LimitHit, Limits};
/// The rmcp version Moat speaks, re-exported for its protocol types.
pub use rmcp;
pub use transport::{Fault, TransportError};

pub use launch::ServerTransport;

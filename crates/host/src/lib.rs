//! moat-host: runs MCP servers isolated, measured and bounded.
//!
//! Layers: a module imports only from its own layer and those below, and
//! no two modules import each other, directly or round about. The table is
//! read and held against every module's `crate::` paths by a test
//! (`layers.rs`), so it cannot drift from the code.
//!
//! The surface: the modules declared `pub` below are what a caller drives
//! by name (the config, grants, lock and revocations; the launch contract
//! and the launchers; the audit log; the gateway, its fronts and `moat
//! fuzz`; importing; the commands' procedures). The rest are the crate's
//! own, and what callers need of them is re-exported at the root.
//!
//! | layer | modules | what they are |
//! | --- | --- | --- |
//! | 1 | `text`, `dirs`, `identity`, `limits`, `keys`, `seal`, `command`, `script`, `tasks_2025`, `watch`, `replica` | vocabulary: printable text, Moat's directories, digests and evidence, limits, keys, command and `#!` resolution, 2025-11-25's task wire, file watching, a replica's name in the ids it hands out |
//! | 2 | `grants`, `config`, `revoke`, `lock`, `signature`, `policy`, `oci`, `packages` | data: one module per capability, `moat.toml`, the kill switch, `moat.lock` and its pins, signed documents and their public keys, OCI references, package launchers |
//! | 3 | `instance` | the launch contract: what a launcher hands up (the instance, its identity with a typed sandbox report, exit, metrics, tracker) |
//! | 4 | `wasm`, `native`, `sandbox`, `egress`, `remote` | the launchers, each with its own error type |
//! | 5 | `transport` | the one client transport over any launched instance |
//! | 6 | `launch` | which launcher runs a server; planned once, started per instance |
//! | 7 | `session` | one connected server: calls, tasks, listings, pins, subscriptions |
//! | 8 | `host` | what may be launched under the lock; measure and learn |
//! | 9 | `audit`, `claim`, `metrics`, `trace` | what is recorded of a run, and the signed claim of each session |
//! | 10 | `gateway` | `moat serve`'s agent sessions |
//! | 11 | `front`, `fuzz`, `node` | the agent-facing fronts (streamable HTTP, stdio); `moat fuzz`; `moat node`'s launch by profile |
//! | 12 | `importer`, `wassette` | bringing configs in: client configs, Wassette policies, `moat add` |
//! | 13 | `setup`, `report`, `relock`, `update` | what the CLI's commands call, each the procedure of one command: a host and a gateway from a config path, what `moat tools` and `moat inspect` show, `moat lock` and `moat revoke`, `moat update` |

pub mod audit;
pub mod claim;
pub(crate) mod command;
pub mod config;
pub(crate) mod dirs;
#[cfg(target_os = "linux")]
pub mod egress;
pub mod front;
pub mod fuzz;
pub mod gateway;
pub mod grants;
pub(crate) mod host;
pub(crate) mod identity;
pub mod importer;
pub mod instance;
pub(crate) mod keys;
pub(crate) mod launch;
#[cfg(test)]
mod layers;
pub(crate) mod limits;
pub mod lock;
pub(crate) mod metrics;
#[cfg(unix)]
pub mod native;
pub mod node;
pub mod oci;
pub(crate) mod packages;
pub(crate) mod policy;
pub mod relock;
pub mod remote;
pub mod replica;
pub mod report;
pub mod revoke;
#[cfg(target_os = "linux")]
pub(crate) mod sandbox;
#[cfg(unix)]
pub(crate) mod script;
pub mod seal;
pub(crate) mod session;
pub mod setup;
pub mod signature;
pub(crate) mod tasks_2025;
pub(crate) mod text;
pub(crate) mod trace;
pub(crate) mod transport;
pub mod update;
pub mod wasm;
pub mod wassette;
pub(crate) mod watch;

// The surface: what the CLI, the benches and the tests use. Modules not
// named `pub` above are the crate's own; what of them callers need is
// here.
pub use command::{WindowsLaunch, resolve as resolve_command, resolve_windows};
pub use config::{Config, ConfigError, ServerKind, ServerSpec};
pub use dirs::store as store_dir;
pub use host::{ConnectError, Host, Learned};
pub use identity::{Digest, Evidence, Expectation};
pub use keys::Key;
pub use launch::{LaunchError, Planned, ServerTransport};
pub use limits::{LimitHit, Limits, raise_open_files};
pub use metrics::outcome_class;
pub use packages::PackageError;
pub use policy::{Pins, ToolStatus};
/// The rmcp version Moat speaks, re-exported for its protocol types.
pub use rmcp;
pub use session::{Handshake, Session, SessionError};
pub use text::{error_chain, printable};
pub use transport::{Fault, MAX_UNANSWERED_SERVER_REQUESTS, TransportError};
pub use watch::watch;

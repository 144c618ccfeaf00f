//! moat-host: runs MCP servers isolated, measured and bounded.
//!
//! Layers: a module imports only from its own layer and those below, and
//! no two modules import each other, directly or round about. The table is
//! read and held against every module's `crate::` paths by a test
//! (`layers.rs`), so it cannot drift from the code.
//!
//! | layer | modules | what they are |
//! | --- | --- | --- |
//! | 1 | `text`, `dirs`, `identity`, `limits`, `keys`, `seal`, `command`, `script`, `tasks_2025`, `watch` | vocabulary: printable text, Moat's directories, digests and evidence, limits, keys, command and `#!` resolution, 2025-11-25's task wire, file watching |
//! | 2 | `grants`, `config`, `revoke`, `lock`, `policy`, `oci`, `packages` | data: one module per capability, `moat.toml`, the kill switch, `moat.lock` and its pins, OCI references, package launchers |
//! | 3 | `instance` | the launch contract: what a launcher hands up (the instance, its identity with a typed sandbox report, exit, metrics, tracker) |
//! | 4 | `wasm`, `native`, `sandbox`, `egress`, `remote` | the launchers, each with its own error type |
//! | 5 | `transport` | the one client transport over any launched instance |
//! | 6 | `launch` | which launcher runs a server; planned once, started per instance |
//! | 7 | `session` | one connected server: calls, tasks, listings, pins, subscriptions |
//! | 8 | `host` | what may be launched under the lock; measure and learn |
//! | 9 | `audit`, `metrics`, `trace` | what is recorded of a run |
//! | 10 | `gateway` | `moat serve`'s agent sessions |
//! | 11 | `front`, `fuzz` | the agent-facing fronts (streamable HTTP, stdio); `moat fuzz` |
//! | 12 | `importer`, `wassette` | bringing configs in: client configs, Wassette policies, `moat add` |
//! | 13 | `setup`, `report`, `relock`, `update` | what the CLI's commands call, each the procedure of one command: a host and a gateway from a config path, what `moat tools` and `moat inspect` show, `moat lock` and `moat revoke`, `moat update` |

pub mod audit;
pub mod command;
pub mod config;
pub mod dirs;
#[cfg(target_os = "linux")]
pub mod egress;
pub mod front;
pub mod fuzz;
pub mod gateway;
pub mod grants;
pub mod host;
pub mod identity;
pub mod importer;
pub mod instance;
pub mod keys;
pub mod launch;
#[cfg(test)]
mod layers;
pub mod limits;
pub mod lock;
pub mod metrics;
#[cfg(unix)]
pub mod native;
pub mod oci;
pub mod packages;
pub mod policy;
pub mod relock;
pub mod remote;
pub mod report;
pub mod revoke;
#[cfg(target_os = "linux")]
pub mod sandbox;
#[cfg(unix)]
pub mod script;
pub mod seal;
pub mod session;
pub mod setup;
pub mod tasks_2025;
pub mod text;
pub mod trace;
pub mod transport;
pub mod update;
pub mod wasm;
pub mod wassette;
pub mod watch;

pub use config::{Config, ConfigError, ServerKind, ServerSpec};
pub use host::{ConnectError, Host};
pub use identity::{Digest, Evidence, Expectation};
pub use launch::LaunchError;
pub use limits::{LimitHit, Limits};
/// The rmcp version Moat speaks, re-exported for its protocol types.
pub use rmcp;
pub use session::{Handshake, Session, SessionError};
pub use transport::{Fault, TransportError};

pub use launch::ServerTransport;

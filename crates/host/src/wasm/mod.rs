//! The wasm launcher: measures, compiles (or loads from Moat's own cache),
//! pre-instantiates and runs WASI preview-2 command components, bounded by
//! fuel, memory and table limits, with stdio wired as in-memory pipes.
//!
//! The sha256 is computed over the very bytes that are compiled. Precompiled
//! components are cached on disk keyed by that digest and the engine's
//! compatibility hash. A compiled file is native code that Moat runs outside
//! every sandbox, so each one carries an HMAC-SHA256, under a per-user key
//! kept in the cache directory (mode 0600, created by Moat), over the
//! component's digest, the engine's hash and the payload: a file that Moat
//! did not write for this component and this engine is recompiled, never
//! loaded. Servers cannot reach the key: a grant that overlaps the cache is
//! refused at launch (see [`crate::grants::check_protected`]).

mod cache;
mod component;
mod engine;
pub(crate) mod http;
mod linker;
pub(crate) mod lookup;
pub(crate) mod pipe;
mod preinit;
mod run;
mod settings;
mod state;
pub mod typed;

pub use cache::CacheOutcome;
use cache::*;
use component::*;
pub use component::{LOOKUP_TIMEOUT, PreparedComponent, ResolvedNet, WasmLaunch};
pub use engine::WasmEngine;
pub use preinit::{INIT_EXPORT, PreinitError};
use run::*;
use settings::*;
pub use settings::{Allocator, EPOCH_TICK, Metering, Pool};
pub use state::HostState;
use state::*;

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::Sha256;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{CallHook, Config, Engine, ResourceLimiter, Store, Trap};
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::sockets::SocketAddrUse;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtx, WasiCtxView, WasiView};

use crate::grants::DirMode;

use crate::identity::{Digest, Evidence, Expectation};
use crate::instance::{
    ComponentKind, ComponentReport, Exit, Identity, Launched, Metrics, SandboxReport, Tracker,
};
use crate::limits::{LimitHit, Limits};

/// Errors of the wasm launcher, naming the operation and its subject.
#[derive(Debug, thiserror::Error)]
pub enum WasmError {
    #[cfg(unix)]
    #[error(transparent)]
    Grant(Box<crate::grants::GrantError>),
    #[error("configuring the wasm engine: {0}")]
    Engine(String),
    #[error("reading component {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("component {path}: {mismatch}")]
    Digest {
        path: PathBuf,
        #[source]
        mismatch: crate::identity::DigestMismatch,
    },
    #[error("compiling component {path}: {detail}")]
    Compile { path: PathBuf, detail: String },
    #[error(
        "snapshotting component {path} after its initialiser: {source}; \
         set `preinit = false` on the server to start it without a snapshot"
    )]
    Preinit {
        path: PathBuf,
        #[source]
        source: PreinitError,
    },
    #[error("pre-instantiating component {path}: {detail}")]
    Link { path: PathBuf, detail: String },
    #[error("opening directory {path} to preopen as {guest}: {detail}")]
    Preopen {
        path: PathBuf,
        guest: String,
        detail: String,
    },
    #[error("resolving net entry {grant}: {source}")]
    Resolve {
        grant: String,
        #[source]
        source: std::io::Error,
    },
}

pub use crate::seal::DigestSource;

#[cfg(unix)]
impl From<crate::grants::GrantError> for WasmError {
    fn from(error: crate::grants::GrantError) -> Self {
        Self::Grant(Box::new(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pooling_allocator_is_asked_for_and_sized_by_the_largest_memory_limit() {
        let parse = |text: &str| {
            crate::config::Config::parse(Path::new("/etc/moat/moat.toml"), text).unwrap()
        };
        let config = parse("[servers.a]\nwasm = \"a.wasm\"\n");
        assert_eq!(Allocator::of(&config), Allocator::OnDemand);
        let config = parse(
            "[wasm]\nallocator = \"pooling\"\npool_instances = 50\n\
             [servers.a]\nwasm = \"a.wasm\"\n\
             [servers.b]\nwasm = \"b.wasm\"\n[servers.b.limits]\nmemory_bytes = 1073741824\n",
        );
        assert_eq!(
            Allocator::of(&config),
            Allocator::Pooling(Pool {
                instances: 50,
                max_memory_bytes: 1 << 30,
            })
        );
    }
}

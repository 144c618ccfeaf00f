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
//! refused at launch (see `Host::check_grants`).

pub mod http;
pub mod lookup;
pub mod pipe;
pub mod typed;

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::Sha256;
use tokio::sync::watch;
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

/// Bytes that may wait in each in-memory stdio pipe (allocated only while
/// they wait): a writer beyond it waits for the reader.
const PIPE_BYTES: usize = 64 * 1024;
/// First bytes of every cache file Moat writes.
const CACHE_MAGIC: &[u8; 12] = b"MOAT-CWASM3\n";
/// How long a compile runs before a terminal is told it is happening.
const COMPILE_NOTICE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);
/// The cache key's file name, inside the cache directory.
const CACHE_KEY_FILE: &str = "cache.key";
/// How often an epoch-metered engine's timer advances its epoch. It bounds
/// how late a deadline can stop a spinning guest: one tick after the guest
/// last yielded, at most.
pub const EPOCH_TICK: std::time::Duration = std::time::Duration::from_millis(2);
/// Ticks a guest runs between yields to the runtime under epoch metering.
/// At each yield the runtime may abort the instance (its deadline passed)
/// or run another task on the thread.
const EPOCH_YIELD_TICKS: u64 = 1;

/// How an engine bounds the CPU its guests use.
///
/// Both bound wall clock: a running guest yields to the runtime at regular
/// points, where the per-request deadline (`request_timeout_ms`) can abort
/// it. They differ in cost and in what else they bound, which
/// `cargo bench --bench transport` (`cpu_limits`) measures side by side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Metering {
    /// Fuel: wasm operators are counted, each request gets
    /// `fuel_per_request` afresh, and the guest yields every
    /// `fuel_yield_interval` units. Deterministic; bounds work as well as
    /// time. The default.
    #[default]
    Fuel,
    /// Epoch interruption: a timer thread advances the engine's epoch every
    /// [`EPOCH_TICK`], and the guest yields at the next loop head or call
    /// after each tick. Cheaper per operator; bounds time only, so
    /// `fuel_per_request` is not enforced, and the sandbox report says so.
    Epoch,
    /// Neither: the baseline that the benches measure the other two
    /// against. A guest that spins holds its thread and no deadline can stop
    /// it, which the sandbox report says. Not reachable from a config;
    /// for measuring only.
    Unmetered,
}

/// How the engine allocates instances (memories, tables, instance state,
/// async stacks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Allocator {
    /// Each instance's memory is mapped when it is made and unmapped when
    /// it is dropped.
    #[default]
    OnDemand,
    /// Slots reserved once, at engine creation, and reused: an instance
    /// takes a slot whose mapping is already there, and gives it back
    /// reset (its pages discarded, a copy-on-write image mapped afresh).
    Pooling(Pool),
}

/// The pooling allocator's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool {
    /// Component instances alive at once, over every server: each stdio
    /// server's session instance and each typed call in flight takes one;
    /// one more is refused ("pool exhausted") until one ends.
    pub instances: u32,
    /// The largest linear memory any server may grow to: the largest
    /// `memory_bytes` configured. A slot is that large (reserved, not
    /// committed: pages are only used as the guest touches them).
    pub max_memory_bytes: u64,
}

impl Allocator {
    /// The allocator `config` asks for: a pooling allocator's slots are as
    /// large as the largest `memory_bytes` of any server.
    pub fn of(config: &crate::config::Config) -> Self {
        match config.wasm.allocator {
            crate::config::AllocatorSetting::OnDemand => Self::OnDemand,
            crate::config::AllocatorSetting::Pooling => Self::Pooling(Pool {
                instances: config.wasm.pool_instances.get(),
                max_memory_bytes: config
                    .servers
                    .values()
                    .map(|spec| spec.limits.memory_bytes)
                    .chain([Limits::default().memory_bytes])
                    .max()
                    .unwrap_or_default(),
            }),
        }
    }
}

impl Pool {
    /// Memories, tables and core instances per component instance, on
    /// average over the pool: a Rust wasip2 component has one core module
    /// with one memory and a few shims with tables; componentize-js and
    /// componentize-py components have a handful of each.
    const MEMORIES_PER_INSTANCE: u32 = 2;
    const TABLES_PER_INSTANCE: u32 = 4;
    const CORE_INSTANCES_PER_INSTANCE: u32 = 8;
    /// Elements per table slot: an interpreter's function table (the
    /// largest seen, componentize-py's, has some tens of thousands).
    const TABLE_ELEMENTS: usize = 100_000;

    fn config(&self) -> wasmtime::PoolingAllocationConfig {
        let mut pool = wasmtime::PoolingAllocationConfig::new();
        let memory = usize::try_from(self.max_memory_bytes).unwrap_or(usize::MAX);
        pool.total_component_instances(self.instances)
            .total_core_instances(
                self.instances
                    .saturating_mul(Self::CORE_INSTANCES_PER_INSTANCE),
            )
            .total_memories(self.instances.saturating_mul(Self::MEMORIES_PER_INSTANCE))
            .total_tables(self.instances.saturating_mul(Self::TABLES_PER_INSTANCE))
            .total_stacks(self.instances)
            .max_memory_size(memory)
            .table_elements(Self::TABLE_ELEMENTS);
        pool
    }
}

impl From<crate::config::CpuMetering> for Metering {
    fn from(metering: crate::config::CpuMetering) -> Self {
        match metering {
            crate::config::CpuMetering::Fuel => Self::Fuel,
            crate::config::CpuMetering::Epoch => Self::Epoch,
        }
    }
}

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

/// Where a compiled component came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from a cache file whose payload was read and its MAC
    /// verified (and the file then sealed).
    Hit,
    /// Mapped straight from a cache file whose seal says it is the file
    /// verified before: nothing read or hashed.
    Mapped,
    /// Compiled: no cache file, or no cache configured.
    Compiled,
    /// A cache file existed but was corrupt or foreign: compiled afresh and
    /// the file rewritten.
    Recompiled,
    /// Already prepared by this engine: reused from memory.
    Memory,
}

/// One wasmtime engine and linker, shared by every wasm server.
#[derive(Clone)]
pub struct WasmEngine {
    engine: Engine,
    linker: Arc<Linker<HostState>>,
    /// `linker` with wasi:http added, made when the first component that
    /// imports it is prepared: a start-up with none pays nothing for it.
    http_linker: Arc<std::sync::OnceLock<Result<Arc<Linker<HostState>>, String>>>,
    cache_dir: Option<PathBuf>,
    /// The cache MAC key, read or made at the first cache access.
    cache_key: Arc<std::sync::OnceLock<Option<crate::keys::Key>>>,
    prepared: Arc<Mutex<HashMap<Digest, PreparedComponent>>>,
    metering: Metering,
}

impl WasmEngine {
    /// An engine with fuel metering and async support, caching compiled
    /// components in `cache_dir` when given.
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Self, WasmError> {
        Self::with_metering(cache_dir, Metering::default())
    }

    /// An engine that bounds guests' CPU by `metering`. Compiled code
    /// differs between the two, and so does the cache file (its name holds
    /// the engine's compatibility hash).
    pub fn with_metering(
        cache_dir: Option<PathBuf>,
        metering: Metering,
    ) -> Result<Self, WasmError> {
        Self::with_options(cache_dir, metering, Allocator::default())
    }

    /// An engine bounding CPU by `metering` and allocating instances with
    /// `allocator`. A pool that cannot be reserved (an address-space limit
    /// on Moat itself) falls back to allocating on demand, with a warning.
    pub fn with_options(
        cache_dir: Option<PathBuf>,
        metering: Metering,
        allocator: Allocator,
    ) -> Result<Self, WasmError> {
        let mut config = Config::new();
        match metering {
            Metering::Fuel => config.consume_fuel(true),
            Metering::Epoch => config.epoch_interruption(true),
            Metering::Unmetered => &mut config,
        };
        config.wasm_component_model(true);
        let engine = match allocator {
            Allocator::OnDemand => Engine::new(&config),
            Allocator::Pooling(pool) => {
                let mut pooled = config.clone();
                pooled.allocation_strategy(pool.config());
                Engine::new(&pooled).or_else(|error| {
                    tracing::warn!(%error, ?pool, "no instance pool; allocating on demand");
                    Engine::new(&config)
                })
            }
        }
        .map_err(|e| WasmError::Engine(e.to_string()))?;
        if metering == Metering::Epoch {
            start_epoch_timer(&engine)?;
        }
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| WasmError::Engine(e.to_string()))?;
        crate::wasm::lookup::add_to_linker(&mut linker)
            .map_err(|e| WasmError::Engine(e.to_string()))?;
        Ok(Self {
            engine,
            linker: Arc::new(linker),
            http_linker: Arc::default(),
            cache_dir,
            cache_key: Arc::default(),
            prepared: Arc::default(),
            metering,
        })
    }

    /// The engine's compatibility hash: precompiled code is only valid for an
    /// engine with the same hash.
    pub fn compatibility_hash(&self) -> String {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.engine
            .precompile_compatibility_hash()
            .hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    }

    /// The cache directory, when one is configured.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache_dir.as_deref()
    }

    /// The cache key: read from the cache directory, or made there once.
    /// `None` (and no caching) when neither works.
    fn key(&self) -> Option<crate::keys::Key> {
        *self.cache_key.get_or_init(|| {
            let dir = self.cache_dir.as_ref()?;
            match crate::keys::user_key(dir, CACHE_KEY_FILE) {
                Ok(key) => Some(key),
                Err(error) => {
                    tracing::warn!(dir = %dir.display(), %error, "no cache key; compiled components are not cached");
                    None
                }
            }
        })
    }

    /// The cache file for a component with this digest.
    pub fn cache_path(&self, digest: Digest) -> Option<PathBuf> {
        self.cache_dir
            .as_ref()
            .map(|dir| dir.join(format!("{digest}-{}.cwasm", self.compatibility_hash())))
    }

    /// Seals of file digests, in the cache directory under the cache key.
    pub fn sealer(&self) -> Option<crate::seal::Sealer> {
        Some(crate::seal::Sealer::new(
            self.key()?,
            self.cache_dir.as_ref()?.join("seals"),
        ))
    }

    /// The component's digest: from its seal when the file is unchanged
    /// since it was last hashed (no read), else hashed from the bytes read
    /// through one descriptor (and sealed). The bytes, when they were read.
    fn measure(&self, path: &Path) -> Result<(Digest, Option<Vec<u8>>, DigestSource), WasmError> {
        use std::io::Read as _;
        let read_error = |source| WasmError::Read {
            path: path.to_owned(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(read_error)?;
        let meta = file.metadata().map_err(read_error)?;
        let mut bytes = None;
        let mut hash = || {
            let mut read = Vec::with_capacity(meta.len() as usize);
            file.read_to_end(&mut read).map_err(read_error)?;
            let digest = Digest::of(&read);
            bytes = Some(read);
            Ok::<_, WasmError>(digest)
        };
        let (digest, source) = match self.sealer() {
            Some(sealer) => sealer.digest(path, &meta, hash)?,
            None => (hash()?, DigestSource::Hashed),
        };
        Ok((digest, bytes, source))
    }

    /// Measures the component at `path` (see [`Self::measure`]), checks its
    /// digest against `expected`, and loads its compiled form from the cache
    /// (mapped, not copied, when its seal holds) or compiles the very bytes
    /// that were hashed, then pre-instantiates it. Compilation runs off the
    /// async runtime.
    pub async fn prepare(
        &self,
        path: &Path,
        expected: Expectation,
    ) -> Result<PreparedComponent, WasmError> {
        let (digest, bytes, source) = {
            let this = self.clone();
            let owned = path.to_owned();
            tokio::task::spawn_blocking(move || this.measure(&owned))
                .await
                .map_err(|e| WasmError::Compile {
                    path: path.to_owned(),
                    detail: e.to_string(),
                })??
        };
        expected
            .check(digest)
            .map_err(|mismatch| WasmError::Digest {
                path: path.to_owned(),
                mismatch,
            })?;
        let known = self
            .prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&digest)
            .cloned();
        if let Some(mut prepared) = known {
            prepared.cache = CacheOutcome::Memory;
            prepared.digest_source = source;
            return Ok(prepared);
        }
        let this = self.clone();
        let owned_path = path.to_owned();
        let (component, cache, bytes) =
            tokio::task::spawn_blocking(move || this.compile_or_load(&owned_path, digest, bytes))
                .await
                .map_err(|e| WasmError::Compile {
                    path: path.to_owned(),
                    detail: e.to_string(),
                })??;
        let instance_pre = self
            .linker_for(&component)
            .map_err(|detail| WasmError::Link {
                path: path.to_owned(),
                detail,
            })?
            .instantiate_pre(&component)
            .map_err(|e| WasmError::Link {
                path: path.to_owned(),
                detail: format!("{e:#}"),
            })?;
        let kind = if exports_cli_run(&component, &self.engine) {
            let pre = CommandPre::new(instance_pre).map_err(|e| WasmError::Link {
                path: path.to_owned(),
                detail: format!("not a wasi:cli command component: {e:#}"),
            })?;
            Kind::Command(pre)
        } else {
            // Docs are read from the measured bytes only.
            let bytes = match bytes {
                Some(bytes) => bytes,
                None => {
                    let owned = path.to_owned();
                    tokio::task::spawn_blocking(move || read_measured(&owned, digest))
                        .await
                        .map_err(|e| WasmError::Compile {
                            path: path.to_owned(),
                            detail: e.to_string(),
                        })??
                }
            };
            let docs = typed::schema::PackageDocs::find(&bytes);
            let typed = typed::TypedComponent::new(instance_pre, &component, &self.engine, docs)
                .map_err(|detail| WasmError::Link {
                    path: path.to_owned(),
                    detail,
                })?;
            for skipped in typed.skipped() {
                tracing::warn!(
                    component = %path.display(),
                    export = %skipped.export,
                    reason = %skipped.reason,
                    "exported function is not a tool"
                );
            }
            Kind::Typed(Arc::new(typed))
        };
        let prepared = PreparedComponent {
            engine: self.engine.clone(),
            metering: self.metering,
            digest,
            cache,
            digest_source: source,
            kind,
        };
        self.prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(digest, prepared.clone());
        Ok(prepared)
    }

    /// The linker for `component`: with wasi:http when it imports any of
    /// it (every request is then refused unless granted, see `http`).
    fn linker_for(&self, component: &Component) -> Result<Arc<Linker<HostState>>, String> {
        let imports_http = component
            .component_type()
            .imports(&self.engine)
            .any(|(name, _)| name.starts_with("wasi:http/"));
        if !imports_http {
            return Ok(self.linker.clone());
        }
        self.http_linker
            .get_or_init(|| {
                let mut linker = (*self.linker).clone();
                wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
                    .map(|()| Arc::new(linker))
                    .map_err(|e| format!("adding wasi:http to the linker: {e:#}"))
            })
            .clone()
    }

    fn compile_or_load(
        &self,
        path: &Path,
        digest: Digest,
        bytes: Option<Vec<u8>>,
    ) -> Result<(Component, CacheOutcome, Option<Vec<u8>>), WasmError> {
        let cached = match (self.cache_path(digest), self.key()) {
            (Some(cache_path), Some(key)) => Some((cache_path, key)),
            _ => None,
        };
        let outcome = match &cached {
            None => CacheOutcome::Compiled,
            Some((cache_path, key)) => {
                let context = MacContext {
                    key,
                    digest,
                    engine: self.compatibility_hash(),
                };
                match context.load(&self.engine, cache_path) {
                    Ok((component, outcome)) => return Ok((component, outcome, bytes)),
                    Err(outcome) => outcome,
                }
            }
        };
        // Compile exactly the bytes whose digest was checked: read them now
        // if the digest came from a seal, and hash them again.
        let bytes = match bytes {
            Some(bytes) => bytes,
            None => read_measured(path, digest)?,
        };
        let component = self.compile(path, &bytes)?;
        if let Some((cache_path, key)) = &cached {
            let context = MacContext {
                key,
                digest,
                engine: self.compatibility_hash(),
            };
            if let Err(error) = write_cache(cache_path, &context, &component) {
                tracing::warn!(path = %cache_path.display(), %error, "could not write cache file");
            }
        }
        Ok((component, outcome, Some(bytes)))
    }

    /// Compiles `bytes`. A compile that takes longer than
    /// [`COMPILE_NOTICE_AFTER`] says so on stderr when that is a terminal,
    /// and says when it is done: a first start is then never a silent wait.
    fn compile(&self, path: &Path, bytes: &[u8]) -> Result<Component, WasmError> {
        use std::io::IsTerminal as _;
        tracing::debug!(path = %path.display(), bytes = bytes.len(), "compiling component");
        let started = std::time::Instant::now();
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let notice = std::io::stderr().is_terminal().then(|| {
            let shown = crate::text::printable(&path.display().to_string());
            let size = bytes.len();
            std::thread::spawn(move || {
                match finished.recv_timeout(COMPILE_NOTICE_AFTER) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        eprintln!(
                            "moat: compiling {shown} ({} KiB; the first start only, it is cached afterwards)...",
                            size / 1024
                        );
                        let _ = finished.recv();
                        true
                    }
                    _ => false,
                }
            })
        });
        let compiled = Component::new(&self.engine, bytes).map_err(|e| WasmError::Compile {
            path: path.to_owned(),
            detail: format!("{e:#}"),
        });
        drop(done);
        if notice.is_some_and(|n| n.join().unwrap_or(false)) {
            eprintln!(
                "moat: compiled {} in {:.1} s",
                crate::text::printable(&path.display().to_string()),
                started.elapsed().as_secs_f64()
            );
        }
        compiled
    }
}

/// What a cache file's MAC binds: the key, the component and the engine.
struct MacContext<'a> {
    key: &'a crate::keys::Key,
    digest: Digest,
    engine: String,
}

impl MacContext<'_> {
    fn mac(&self, payload: &[u8]) -> hmac::Hmac<Sha256> {
        use hmac::Mac;
        let mut mac = self.key.mac();
        mac.update(CACHE_MAGIC);
        mac.update(self.digest.as_bytes());
        mac.update(self.engine.as_bytes());
        mac.update(payload);
        mac
    }

    /// What the seal of a verified cache file is for: this component on
    /// this engine.
    fn purpose(&self) -> Vec<u8> {
        let mut purpose = b"compiled component\n".to_vec();
        purpose.extend_from_slice(self.digest.as_bytes());
        purpose.extend_from_slice(self.engine.as_bytes());
        purpose
    }

    /// The component in `cache_path`: mapped straight from the file when
    /// its seal says it is the file verified before; else read, its MAC
    /// (in `cache_path.mac`) checked in constant time, and sealed. The
    /// outcome to report when it cannot be used.
    fn load(
        &self,
        engine: &Engine,
        cache_path: &Path,
    ) -> Result<(Component, CacheOutcome), CacheOutcome> {
        use hmac::Mac;
        use std::io::Read as _;
        let mac_path = with_suffix(cache_path, ".mac");
        let seal_path = with_suffix(cache_path, ".seal");
        let mut file = match crate::keys::open_private(cache_path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(CacheOutcome::Compiled);
            }
            Err(error) => {
                tracing::warn!(path = %cache_path.display(), %error, "unreadable cache file; recompiling");
                return Err(CacheOutcome::Recompiled);
            }
        };
        let stat = file
            .metadata()
            .ok()
            .as_ref()
            .and_then(crate::seal::Stat::of);
        let recorded = crate::keys::read_private(&mac_path).unwrap_or_default();
        let sealed = stat.as_ref().is_some_and(|stat| {
            crate::seal::read(&seal_path, self.key, &self.purpose(), stat)
                .is_some_and(|claim| !recorded.is_empty() && claim == recorded)
        });
        if sealed {
            // SAFETY: `Component::deserialize_file` maps the file and runs it
            // as native code. The file is the one whose payload MAC, under the
            // per-user key that only Moat reads, was verified for exactly this
            // component and engine, and it has not changed since (same inode,
            // size, mtime and ctime, sealed under the same key). Wasmtime
            // also checks the header for engine compatibility.
            match unsafe { Component::deserialize_file(engine, cache_path) } {
                Ok(component) => return Ok((component, CacheOutcome::Mapped)),
                Err(error) => {
                    tracing::warn!(path = %cache_path.display(), %error, "sealed cache file did not load; recompiling");
                    return Err(CacheOutcome::Recompiled);
                }
            }
        }
        let mut payload = Vec::new();
        if let Err(error) = file.read_to_end(&mut payload) {
            tracing::warn!(path = %cache_path.display(), %error, "unreadable cache file; recompiling");
            return Err(CacheOutcome::Recompiled);
        }
        if self.mac(&payload).verify_slice(&recorded).is_err() {
            tracing::warn!(path = %cache_path.display(), "cache file not written by Moat for this component and engine; recompiling");
            return Err(CacheOutcome::Recompiled);
        }
        // SAFETY: `Component::deserialize` runs the payload as native code.
        // The payload is only used when its MAC, under the per-user key that
        // only Moat reads, matches this component's digest, this engine's
        // compatibility hash and the payload: Moat wrote it for exactly this
        // component and engine. Wasmtime additionally checks the header for
        // engine compatibility.
        match unsafe { Component::deserialize(engine, &payload) } {
            Ok(component) => {
                if let Some(stat) = &stat
                    && let Err(error) =
                        crate::seal::write(&seal_path, self.key, &self.purpose(), stat, &recorded)
                {
                    tracing::debug!(path = %seal_path.display(), %error, "could not seal a cache file");
                }
                Ok((component, CacheOutcome::Hit))
            }
            Err(error) => {
                tracing::warn!(path = %cache_path.display(), %error, "foreign cache file; recompiling");
                Err(CacheOutcome::Recompiled)
            }
        }
    }
}

/// `path` with `suffix` appended to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Writes the compiled component as wasmtime serialized it (so it can be
/// mapped), with its MAC in `cache_path.mac`; the MAC goes first, so a
/// reader between the two sees a mismatch, never a match for other bytes.
fn write_cache(
    cache_path: &Path,
    context: &MacContext<'_>,
    component: &Component,
) -> std::io::Result<()> {
    use hmac::Mac;
    let payload = component
        .serialize()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mac = context.mac(&payload).finalize().into_bytes();
    crate::keys::write_private(&with_suffix(cache_path, ".mac"), &mac)?;
    crate::keys::write_private(cache_path, &payload)
}

/// A measured, compiled and pre-instantiated component, ready to launch as
/// many instances as wanted.
#[derive(Clone)]
pub struct PreparedComponent {
    engine: Engine,
    metering: Metering,
    digest: Digest,
    cache: CacheOutcome,
    digest_source: DigestSource,
    kind: Kind,
}

/// The two kinds of component, told apart at load.
#[derive(Clone)]
enum Kind {
    /// It exports `wasi:cli/run`: an MCP server on its stdio.
    Command(CommandPre<HostState>),
    /// Anything else: its exported functions are tools.
    Typed(Arc<typed::TypedComponent>),
}

/// Whether `component` exports any version of `wasi:cli/run`.
fn exports_cli_run(component: &Component, engine: &Engine) -> bool {
    component
        .component_type()
        .exports(engine)
        .any(|(name, _)| name.starts_with("wasi:cli/run@"))
}

pub use crate::seal::DigestSource;

/// What one instance gets: argv, exact environment, and its limits.
#[derive(Clone, Debug, Default)]
pub struct WasmLaunch {
    /// The server's name, used as argv[0] and in errors.
    pub name: String,
    /// Arguments after argv[0].
    pub args: Vec<String>,
    /// The exact environment.
    pub env: Vec<(String, String)>,
    /// Bounds.
    pub limits: Limits,
    /// Preopened directories.
    pub dirs: Vec<crate::grants::DirGrant>,
    /// TCP destinations allowed (names are resolved at launch).
    pub net: Vec<crate::grants::NetGrant>,
    /// HTTP origins allowed through wasi:http (names resolved at launch).
    pub http: Vec<crate::grants::HttpGrant>,
    /// For a typed tool component: an instance per call, or per session.
    pub instances: crate::config::Instances,
}

impl WasmLaunch {
    /// What `spec` grants one instance.
    pub fn from_spec(spec: &crate::config::ServerSpec) -> Self {
        Self {
            name: spec.name.clone(),
            args: spec.args.clone(),
            env: spec.environment(),
            limits: spec.limits.clone(),
            dirs: spec.dirs.clone(),
            net: spec.net.clone(),
            http: spec.http.clone(),
            instances: match &spec.kind {
                crate::config::ServerKind::Wasm { instances, .. } => *instances,
                _ => crate::config::Instances::default(),
            },
        }
    }

    /// The socket addresses `net` allows, and the names the guest may look
    /// up: IP literals as they are, names resolved now, each within
    /// [`LOOKUP_TIMEOUT`]. These are the only lookups a wasm server causes:
    /// its own are answered from this list (see [`crate::wasm::lookup`]).
    pub async fn resolve_net(&self) -> Result<ResolvedNet, WasmError> {
        let mut allowed = HashSet::new();
        let mut names = Vec::new();
        for grant in &self.net {
            let found = resolve(&grant.host, grant.port, &grant.to_string()).await?;
            names.push((
                grant.host.clone(),
                found.iter().map(|a| a.ip().to_canonical()).collect(),
            ));
            allowed.extend(found);
        }
        let mut http = Vec::new();
        for grant in &self.http {
            let found = resolve(&grant.host, grant.port, &grant.to_string()).await?;
            http.push((grant.clone(), found));
        }
        Ok(ResolvedNet {
            allowed,
            names: crate::wasm::lookup::Names::new(names),
            http,
        })
    }
}

/// The addresses of `host`:`port` now, within [`LOOKUP_TIMEOUT`]; errors
/// name the `grant`.
async fn resolve(host: &str, port: u16, grant: &str) -> Result<Vec<SocketAddr>, WasmError> {
    tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {LOOKUP_TIMEOUT:?}"),
            ))
        })
        .map(Iterator::collect)
        .map_err(|source| WasmError::Resolve {
            grant: grant.to_owned(),
            source,
        })
}

/// How long a launch waits for one `net` name to resolve.
pub const LOOKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What a launch resolved of `net`.
#[derive(Clone, Debug, Default)]
pub struct ResolvedNet {
    /// The socket addresses a guest may connect to.
    pub allowed: HashSet<SocketAddr>,
    /// The names it may look up, with their addresses.
    pub names: crate::wasm::lookup::Names,
    /// Each HTTP grant with the addresses its host has now: the only ones
    /// a wasi:http request to it connects to.
    pub http: Vec<(crate::grants::HttpGrant, Vec<SocketAddr>)>,
}

/// Whether a socket operation is allowed: connects (and listens) only to
/// listed addresses; binds to listed addresses or the implicit wildcard
/// bind that precedes an outgoing connection.
fn socket_allowed(allowed: &HashSet<SocketAddr>, addr: SocketAddr, use_: SocketAddrUse) -> bool {
    match use_ {
        SocketAddrUse::TcpBind | SocketAddrUse::UdpBind => {
            allowed.contains(&addr) || (addr.ip().is_unspecified() && addr.port() == 0)
        }
        _ => allowed.contains(&addr),
    }
}

impl PreparedComponent {
    /// The sha256 of the component's bytes.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// How the component's digest was known: hashed, or from its seal.
    pub fn digest_source(&self) -> DigestSource {
        self.digest_source
    }

    /// Whether compilation was served from the cache.
    pub fn cache_outcome(&self) -> CacheOutcome {
        self.cache
    }

    /// The typed tool component, when it is one.
    pub fn typed(&self) -> Option<&typed::TypedComponent> {
        match &self.kind {
            Kind::Typed(typed) => Some(typed),
            Kind::Command(_) => None,
        }
    }

    /// What kind of server the component is.
    pub fn kind(&self) -> ComponentKind {
        match self.kind {
            Kind::Command(_) => ComponentKind::Stdio,
            Kind::Typed(_) => ComponentKind::Typed,
        }
    }

    /// Starts a server on its own task, its stdio wired to in-memory pipes:
    /// a command component's instance, or a typed component's tool server
    /// (which starts an instance per call or per session). Nothing is
    /// granted beyond `launch`: no directories, no network.
    pub fn launch(
        &self,
        launch: &WasmLaunch,
        net: ResolvedNet,
        tracker: &Arc<Tracker>,
    ) -> Result<Launched, WasmError> {
        let setup = InstanceSetup::new(launch, net)?;
        let sandbox = self.sandbox_report(launch);
        let identity = Identity {
            digest: Some(self.digest),
            measured: Vec::new(),
            sandbox,
            evidence: Evidence::WasmMeasured,
            component: Some(ComponentReport {
                kind: self.kind(),
                not_tools: match &self.kind {
                    Kind::Command(_) => Vec::new(),
                    Kind::Typed(typed) => typed
                        .skipped()
                        .iter()
                        .map(|s| format!("{}: {}", s.export, s.reason))
                        .collect(),
                },
            }),
            oci: None,
        };
        let runner = Runner {
            engine: self.engine.clone(),
            metering: self.metering,
            limits: launch.limits.clone(),
        };
        match &self.kind {
            Kind::Command(pre) => {
                Ok(self.launch_command(pre, launch, setup, runner, identity, tracker)?)
            }
            Kind::Typed(typed) => Ok(typed::launch(
                typed.clone(),
                launch,
                setup,
                runner,
                identity,
                tracker,
            )),
        }
    }

    fn launch_command(
        &self,
        pre: &CommandPre<HostState>,
        launch: &WasmLaunch,
        setup: InstanceSetup,
        runner: Runner,
        identity: Identity,
        tracker: &Arc<Tracker>,
    ) -> Result<Launched, WasmError> {
        let (stdin_host, stdin_guest) = pipe::pipe(PIPE_BYTES);
        let (stdout_guest, stdout_host) = pipe::pipe(PIPE_BYTES);
        let (stderr_guest, stderr_host) = pipe::pipe(PIPE_BYTES);
        let requests = Arc::new(AtomicU64::new(0));
        let state = setup.state(stdin_guest, stdout_guest, stderr_guest, requests.clone())?;
        let metrics = setup.metrics.clone();
        let (exit_tx, exit) = watch::channel(None);
        let pre = pre.clone();
        let name = launch.name.clone();
        let guard = tracker.enter();
        let task = tokio::spawn(async move {
            let _guard = guard;
            // The grants' descriptors stay open while the instance runs.
            let _setup = setup;
            let status = runner.run_command(&pre, state).await;
            tracing::debug!(server = %name, ?status, "instance stopped");
            let _ = exit_tx.send(Some(status));
        });
        let abort = task.abort_handle();
        let terminate = task.abort_handle();
        Ok(Launched {
            stdin: Box::new(stdin_host),
            stdout: Box::new(stdout_host),
            stderr: Box::new(stderr_host),
            exit,
            task,
            terminate: Box::new(move || terminate.abort()),
            stop: Box::new(move || abort.abort()),
            on_request: Box::new(move || {
                requests.fetch_add(1, Ordering::SeqCst);
            }),
            metrics,
            identity,
            answers_deadlines: false,
        })
    }

    /// What the sandbox of an instance of `launch` enforces.
    fn sandbox_report(&self, launch: &WasmLaunch) -> SandboxReport {
        let mut sandbox = SandboxReport::default();
        match self.metering {
            Metering::Fuel => {}
            Metering::Epoch => sandbox.not_enforced(
                "CPU budget per request (fuel_per_request): this engine meters by epoch, \
                 which bounds time (request_timeout_ms), not work",
            ),
            Metering::Unmetered => sandbox.not_enforced(
                "CPU (fuel_per_request) and deadlines for a guest that never yields \
                 (request_timeout_ms): this engine does not meter guests",
            ),
        }
        sandbox.enforced(if launch.dirs.is_empty() {
            "filesystem (wasi): no directories".to_owned()
        } else {
            format!(
                "filesystem (wasi preopens): {}",
                launch
                    .dirs
                    .iter()
                    .map(|d| format!("{} as {} ({})", d.host.display(), d.guest, d.mode))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
        sandbox.enforced(if launch.net.is_empty() {
            "network (wasi): none".to_owned()
        } else {
            format!(
                "network (wasi socket check): connect only to {}",
                crate::grants::net_line(&launch.net)
            )
        });
        sandbox.enforced(if launch.http.is_empty() {
            "HTTP (wasi:http): every request refused".to_owned()
        } else {
            format!(
                "HTTP (wasi:http): requests only to {}, at the addresses resolved at launch, bodies up to max_http_response_bytes = {}",
                launch
                    .http
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                launch.limits.max_http_response_bytes
            )
        });
        if let Kind::Typed(_) = self.kind {
            sandbox.enforced(match launch.instances {
                crate::config::Instances::Call => {
                    "state (typed component): a fresh instance for every call"
                }
                crate::config::Instances::Session => {
                    "state (typed component): one instance a session, replaced after a failed call"
                }
            });
        }
        sandbox
    }
}

/// What every instance of one launch is given, prepared once: argv, the
/// exact environment, the opened directory grants, the network allowed and
/// the names it may look up, and the counters they share.
pub(crate) struct InstanceSetup {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    limits: Limits,
    /// (path to open, grant): the path is the grant's descriptor.
    preopens: Vec<(PathBuf, crate::grants::DirGrant)>,
    /// The grants' descriptors, open while any instance may need them.
    #[cfg(unix)]
    _opened: Vec<crate::grants::OpenedGrant>,
    allowed: Option<Arc<HashSet<SocketAddr>>>,
    names: crate::wasm::lookup::Names,
    http: http::Hooks,
    metrics: Arc<Metrics>,
}

impl InstanceSetup {
    /// Opens each grant once without following links (a preopen reopens
    /// that very inode through its descriptor).
    fn new(launch: &WasmLaunch, net: ResolvedNet) -> Result<Self, WasmError> {
        let ResolvedNet {
            allowed,
            names,
            http,
        } = net;
        #[cfg(unix)]
        let opened = crate::grants::open_all(&launch.name, &launch.dirs)?;
        #[cfg(unix)]
        let preopens: Vec<(PathBuf, crate::grants::DirGrant)> = opened
            .iter()
            .map(|o| (o.fd_path(), o.grant.clone()))
            .collect();
        #[cfg(not(unix))]
        let preopens: Vec<(PathBuf, crate::grants::DirGrant)> = launch
            .dirs
            .iter()
            .map(|d| (d.host.clone(), d.clone()))
            .collect();
        for (host_path, dir) in &preopens {
            if !host_path.is_dir() {
                return Err(WasmError::Preopen {
                    path: dir.host.clone(),
                    guest: dir.guest.clone(),
                    detail: "not a directory (a wasm guest is granted directories only)".into(),
                });
            }
        }
        let mut argv = vec![launch.name.clone()];
        argv.extend(launch.args.iter().cloned());
        Ok(Self {
            argv,
            env: launch.env.clone(),
            limits: launch.limits.clone(),
            preopens,
            #[cfg(unix)]
            _opened: opened,
            allowed: (!allowed.is_empty()).then(|| Arc::new(allowed)),
            names,
            http: http::Hooks {
                policy: Arc::new(http::HttpPolicy::new(
                    http,
                    launch.limits.max_http_response_bytes,
                )),
            },
            metrics: Arc::new(Metrics::default()),
        })
    }

    /// The host state of one instance, its stdio on these pipe ends.
    fn state(
        &self,
        stdin: pipe::PipeReader,
        stdout: pipe::PipeWriter,
        stderr: pipe::PipeWriter,
        requests: Arc<AtomicU64>,
    ) -> Result<HostState, WasmError> {
        let limits = &self.limits;
        let mut builder = WasiCtx::builder();
        builder
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr)
            .args(&self.argv)
            .envs(&self.env)
            .max_random_size(limits.max_random_bytes)
            .allow_udp(false);
        for (host_path, dir) in &self.preopens {
            let perms = match dir.mode {
                DirMode::Ro => FsPerms::ReadOnly,
                DirMode::Rw => FsPerms::ReadWrite,
            };
            builder
                .preopened_dir(host_path, &dir.guest, perms)
                .map_err(|e| WasmError::Preopen {
                    path: dir.host.clone(),
                    guest: dir.guest.clone(),
                    detail: format!("{e:#}"),
                })?;
        }
        match &self.allowed {
            None => {
                builder.allow_tcp(false).allow_ip_name_lookup(false);
            }
            Some(allowed) => {
                // Checked at the socket, for every connect and bind.
                let allowed = allowed.clone();
                builder
                    .inherit_network()
                    .allow_tcp(true)
                    .allow_ip_name_lookup(true)
                    .socket_addr_check(move |addr, use_| {
                        let ok = socket_allowed(&allowed, addr, use_);
                        if !ok {
                            tracing::debug!(%addr, ?use_, "socket denied");
                        }
                        Box::pin(std::future::ready(ok))
                    });
            }
        }
        let mut table = ResourceTable::new();
        table.set_max_capacity(
            usize::try_from(limits.resource_table_capacity).unwrap_or(usize::MAX),
        );
        Ok(HostState {
            wasi: builder.build(),
            table,
            limiter: Limiter::new(limits),
            requests,
            requests_seen: 0,
            fuel_per_request: limits.fuel_per_request,
            fuel_at_last_hook: limits.fuel_per_request,
            metrics: self.metrics.clone(),
            names: self.names.clone(),
            http: wasmtime_wasi_http::WasiHttpCtx::new(),
            http_hooks: self.http.clone(),
        })
    }
}

/// Runs instances of one server under its engine's metering and limits.
#[derive(Clone)]
pub(crate) struct Runner {
    engine: Engine,
    metering: Metering,
    limits: Limits,
}

impl Runner {
    /// A store for one instance: its limiter, host-call fuel, and CPU
    /// metering (fuel afresh for each request, or epoch yields), counting
    /// fuel and host calls into the instance's metrics.
    fn store(&self, state: HostState) -> Result<Store<HostState>, Exit> {
        let limits = &self.limits;
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limiter);
        store.set_hostcall_fuel(usize::try_from(limits.hostcall_fuel).unwrap_or(usize::MAX));
        match self.metering {
            Metering::Fuel => {
                if let Err(error) = store.set_fuel(limits.fuel_per_request).and_then(|()| {
                    store.fuel_async_yield_interval(Some(limits.fuel_yield_interval))
                }) {
                    return Err(Exit::Crashed(format!("configuring fuel: {error}")));
                }
                // Counts fuel and host calls at each guest-host transition,
                // and grants a fresh CPU budget each time the host has sent a
                // request: the guest's next call into the host (reading
                // stdin) sees the new request count.
                store.call_hook(|mut store, hook| {
                    let remaining = store.get_fuel()?;
                    let state = store.data_mut();
                    let used = state.fuel_at_last_hook.saturating_sub(remaining);
                    state.fuel_at_last_hook = remaining;
                    state
                        .metrics
                        .fuel_consumed
                        .fetch_add(used, Ordering::Relaxed);
                    count_hostcall(state, hook);
                    let now = state.requests.load(Ordering::SeqCst);
                    if now != state.requests_seen {
                        state.requests_seen = now;
                        let budget = state.fuel_per_request;
                        state.fuel_at_last_hook = budget;
                        store.set_fuel(budget)?;
                    }
                    Ok(())
                });
            }
            Metering::Epoch | Metering::Unmetered => {
                if self.metering == Metering::Epoch {
                    // Armed right before running: the deadline counts from now.
                    store.set_epoch_deadline(EPOCH_YIELD_TICKS);
                    store.epoch_deadline_async_yield_and_update(EPOCH_YIELD_TICKS);
                }
                store.call_hook(|mut store, hook| {
                    count_hostcall(store.data_mut(), hook);
                    Ok(())
                });
            }
        }
        Ok(store)
    }

    /// Runs a command component's `wasi:cli/run` to its end.
    async fn run_command(&self, pre: &CommandPre<HostState>, state: HostState) -> Exit {
        let mut store = match self.store(state) {
            Ok(store) => store,
            Err(exit) => return exit,
        };
        let result = match pre.instantiate_async(&mut store).await {
            Ok(command) => command.wasi_cli_run().call_run(&mut store).await,
            Err(error) => Err(error),
        };
        match result {
            Ok(Ok(())) => Exit::Code(0),
            Ok(Err(())) => Exit::Code(1),
            Err(error) => classify(&error, &store, &self.limits),
        }
    }
}

/// The bytes at `path`, which must still have `digest` (read afresh when
/// the digest came from a seal, and hashed again).
fn read_measured(path: &Path, digest: Digest) -> Result<Vec<u8>, WasmError> {
    let bytes = std::fs::read(path).map_err(|source| WasmError::Read {
        path: path.to_owned(),
        source,
    })?;
    if Digest::of(&bytes) != digest {
        return Err(WasmError::Read {
            path: path.to_owned(),
            source: std::io::Error::other("the file changed while it was prepared"),
        });
    }
    Ok(bytes)
}

/// Advances `engine`'s epoch every [`EPOCH_TICK`] on a thread of its own,
/// which ends once the engine is dropped.
fn start_epoch_timer(engine: &Engine) -> Result<(), WasmError> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("moat-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        .map(drop)
        .map_err(|e| WasmError::Engine(format!("starting the epoch timer thread: {e}")))
}

/// Counts a guest call into the host in the instance's metrics.
fn count_hostcall(state: &HostState, hook: CallHook) {
    if matches!(hook, CallHook::CallingHost) {
        state.metrics.hostcalls.fetch_add(1, Ordering::Relaxed);
    }
}

fn classify(error: &wasmtime::Error, store: &Store<HostState>, limits: &Limits) -> Exit {
    if let Some(exit) = error.downcast_ref::<I32Exit>() {
        return Exit::Code(exit.0);
    }
    if let Some(hit) = &store.data().limiter.hit {
        return Exit::Limit(hit.clone());
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => Exit::Limit(LimitHit::Fuel {
            fuel_per_request: limits.fuel_per_request,
        }),
        // A trap says "wasm trap: ..." itself.
        Some(trap) => Exit::Crashed(trap.to_string()),
        None => {
            let full = error.chain().any(|cause| {
                matches!(
                    cause.downcast_ref::<wasmtime::component::ResourceTableError>(),
                    Some(wasmtime::component::ResourceTableError::Full)
                )
            });
            if full {
                Exit::Limit(LimitHit::ResourceTable {
                    resource_table_capacity: limits.resource_table_capacity,
                })
            } else if is_random_limit(error, limits.max_random_bytes) {
                Exit::Limit(LimitHit::RandomBytes {
                    max_random_bytes: limits.max_random_bytes,
                })
            } else {
                Exit::Crashed(format!("{error:#}"))
            }
        }
    }
}

/// Whether `error` is wasmtime-wasi refusing a `get-random-bytes` call over
/// `max_random_size`. It reports that only as text ("requested len N exceeds
/// limit M"), so the text is matched, with the configured limit;
/// `tests/hostile.rs` (random-hog) pins the wording of the pinned version.
fn is_random_limit(error: &wasmtime::Error, max_random_bytes: u64) -> bool {
    // The root cause ends the alternate form, after any backtrace context.
    let text = format!("{error:#}");
    text.contains("requested len ") && text.ends_with(&format!(" exceeds limit {max_random_bytes}"))
}

/// Per-instance host state.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
    requests: Arc<AtomicU64>,
    requests_seen: u64,
    fuel_per_request: u64,
    fuel_at_last_hook: u64,
    metrics: Arc<Metrics>,
    /// The names the guest may look up.
    names: crate::wasm::lookup::Names,
    http: wasmtime_wasi_http::WasiHttpCtx,
    http_hooks: http::Hooks,
}

impl HostState {
    pub(crate) fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }

    pub(crate) fn names(&self) -> &crate::wasm::lookup::Names {
        &self.names
    }
}

impl wasmtime_wasi_http::WasiHttpView for HostState {
    fn http(&mut self) -> wasmtime_wasi_http::WasiHttpCtxView<'_> {
        wasmtime_wasi_http::WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Memory, table and instance limits that remember which one was hit: a
/// memory-limit failure is not a `Trap` variant.
struct Limiter {
    memory_bytes: u64,
    table_elements: u64,
    instances: usize,
    tables: usize,
    memories: usize,
    hit: Option<LimitHit>,
}

impl Limiter {
    fn new(limits: &Limits) -> Self {
        let count = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        Self {
            memory_bytes: limits.memory_bytes,
            table_elements: limits.table_elements,
            instances: count(limits.instances),
            tables: count(limits.tables),
            memories: count(limits.memories),
            hit: None,
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.memory_bytes {
            self.hit = Some(LimitHit::Memory {
                memory_bytes: self.memory_bytes,
            });
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.table_elements {
            self.hit = Some(LimitHit::TableElements {
                table_elements: self.table_elements,
            });
            return Ok(false);
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn tables(&self) -> usize {
        self.tables
    }

    fn memories(&self) -> usize {
        self.memories
    }
}

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

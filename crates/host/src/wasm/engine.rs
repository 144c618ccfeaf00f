//! The wasm engine: its configuration, and turning measured bytes into a
//! prepared, pre-instantiated component (compiled, or loaded from Moat's
//! own cache).

use super::*;

/// How long a compile runs before a terminal is told it is happening.
pub(super) const COMPILE_NOTICE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Snapshots refused, by component and the limits its initialiser ran
/// under (fuel, memory, deadline).
pub(super) type PreinitRefusals = Mutex<HashMap<(Digest, [u64; 3]), PreinitError>>;

/// A turn per component (and whether it may be snapshotted) being
/// prepared.
pub(super) type Turns = Mutex<HashMap<(Digest, bool), Arc<tokio::sync::Mutex<()>>>>;

/// One wasmtime engine and linker, shared by every wasm server.
#[derive(Clone)]
pub struct WasmEngine {
    pub(super) engine: Engine,
    /// The linkers components are instantiated with (`linker.rs`).
    pub(super) linkers: super::linker::Linkers,
    pub(super) cache_dir: Option<PathBuf>,
    /// The cache MAC key, read or made at the first cache access.
    pub(super) cache_key: Arc<std::sync::OnceLock<Option<crate::keys::Key>>>,
    pub(super) prepared: Arc<Mutex<HashMap<(Digest, bool), PreparedComponent>>>,
    /// Snapshots refused in this process, by component and the limits the
    /// initialiser ran under: asked again, the refusal is repeated without
    /// compiling and running the initialiser again.
    pub(super) preinit_refusals: Arc<PreinitRefusals>,
    /// A turn per component being prepared (see `prepare_with`).
    pub(super) preparing: Arc<Turns>,
    pub(super) metering: Metering,
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
        Ok(Self {
            engine,
            linkers: Default::default(),
            cache_dir,
            cache_key: Arc::default(),
            prepared: Arc::default(),
            preinit_refusals: Arc::default(),
            preparing: Arc::default(),
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
    pub(super) fn key(&self) -> Option<crate::keys::Key> {
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
    pub(super) fn measure(
        &self,
        path: &Path,
    ) -> Result<(Digest, Option<Vec<u8>>, DigestSource), WasmError> {
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
        self.prepare_with(path, expected, Some(&Limits::default()))
            .await
    }

    /// [`Self::prepare`], and when `preinit` is given and the component
    /// exports `wizer-initialize`, runs that once under those limits and
    /// prepares the snapshot of the initialised state instead (see
    /// [`super::preinit`]); the snapshot is cached beside the plain
    /// compile.
    pub async fn prepare_with(
        &self,
        path: &Path,
        expected: Expectation,
        preinit: Option<&Limits>,
    ) -> Result<PreparedComponent, WasmError> {
        let limits = preinit.cloned();
        let preinit = limits.is_some();
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
        let known = || {
            self.prepared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&(digest, preinit))
                .cloned()
                .map(|mut prepared| {
                    prepared.cache = CacheOutcome::Memory;
                    prepared.digest_source = source;
                    prepared
                })
        };
        if let Some(prepared) = known() {
            return Ok(prepared);
        }
        // One preparation of a component at a time: starts that arrive
        // together (sessions over HTTP on a cold cache) wait for the first
        // and take what it prepared, instead of each compiling (and, with
        // an initialiser, each snapshotting) it again.
        let gate = self
            .preparing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((digest, preinit))
            .or_default()
            .clone();
        let _turn = gate.lock().await;
        if let Some(prepared) = known() {
            return Ok(prepared);
        }
        let this = self.clone();
        let owned_path = path.to_owned();
        let Compiled {
            component,
            cache,
            bytes,
            snapshot,
        } = tokio::task::spawn_blocking(move || {
            this.compile_or_load(&owned_path, digest, bytes, limits.as_ref())
        })
        .await
        .map_err(|e| WasmError::Compile {
            path: path.to_owned(),
            detail: e.to_string(),
        })??;
        let instance_pre = self
            .linkers
            .for_component(&self.engine, &component)
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
            snapshot,
        };
        self.prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((digest, preinit), prepared.clone());
        Ok(prepared)
    }

    pub(super) fn compile_or_load(
        &self,
        path: &Path,
        digest: Digest,
        bytes: Option<Vec<u8>>,
        preinit: Option<&Limits>,
    ) -> Result<Compiled, WasmError> {
        let key = self.key();
        let context = |engine: String| {
            key.as_ref().map(|key| MacContext {
                key,
                digest,
                engine,
            })
        };
        let preinit = preinit.filter(|_| self.metering != Metering::Unmetered);
        let record = self.snapshot_cache_path(digest);
        let recorded = record.as_deref().and_then(read_snapshot_digest);
        let mut outcome = CacheOutcome::Compiled;
        if preinit.is_some()
            && let Some(snapshot) = recorded
            && let Some(path) = self.snapshot_compiled_path(digest, snapshot)
            && let Some(context) = context(self.snapshot_engine(snapshot))
        {
            match context.load(&self.engine, &path) {
                Ok((component, cache)) => {
                    return Ok(Compiled {
                        component,
                        cache,
                        bytes,
                        snapshot: Some(snapshot),
                    });
                }
                // A record naming a file that is not there is stale.
                Err(_) => outcome = CacheOutcome::Recompiled,
            }
        }
        let cached = self
            .cache_path(digest)
            .zip(context(self.compatibility_hash()));
        if let Some((cache_path, context)) = &cached {
            match context.load(&self.engine, cache_path) {
                // A plain compile of a component with an initialiser (made
                // with `preinit = false`) serves only when no snapshot is
                // wanted.
                Ok((component, cache))
                    if !(preinit.is_some()
                        && preinit::exports_initializer(&component, &self.engine)) =>
                {
                    return Ok(Compiled {
                        component,
                        cache,
                        bytes,
                        snapshot: None,
                    });
                }
                Ok(_) => {}
                Err(cache) => {
                    if outcome == CacheOutcome::Compiled {
                        outcome = cache;
                    }
                }
            }
        }
        // Compile exactly the bytes whose digest was checked: read them now
        // if the digest came from a seal, and hash them again.
        let bytes = match bytes {
            Some(bytes) => bytes,
            None => read_measured(path, digest)?,
        };
        if let Some(limits) = preinit
            && preinit::bytes_export_initializer(&bytes)
        {
            let runtime =
                tokio::runtime::Handle::try_current().map_err(|e| WasmError::Preinit {
                    path: path.to_owned(),
                    source: PreinitError::Instantiate(format!("no async runtime: {e}")),
                })?;
            let refusal_key = (
                digest,
                [
                    limits.fuel_per_request,
                    limits.memory_bytes,
                    limits.request_timeout_ms,
                ],
            );
            let refused = self
                .preinit_refusals
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&refusal_key)
                .cloned();
            if let Some(source) = refused {
                return Err(WasmError::Preinit {
                    path: path.to_owned(),
                    source,
                });
            }
            let linker = self
                .linkers
                .for_initialiser(&self.engine, &bytes)
                .map_err(|detail| WasmError::Link {
                    path: path.to_owned(),
                    detail,
                })?;
            let snapshot_bytes = preinit::snapshot(
                &self.engine,
                &linker,
                self.metering,
                limits,
                &bytes,
                &runtime,
                |instrumented| {
                    self.compile(path, instrumented)
                        .map_err(|e| PreinitError::Compile(e.to_string()))
                },
            )
            .map_err(|source| {
                // A deadline passed may pass the next time; the rest would
                // fail the same way.
                if !matches!(source, PreinitError::Timeout(_)) {
                    self.preinit_refusals
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(refusal_key, source.clone());
                }
                WasmError::Preinit {
                    path: path.to_owned(),
                    source,
                }
            })?;
            let snapshot = Digest::of(&snapshot_bytes);
            tracing::debug!(path = %path.display(), %snapshot, bytes = snapshot_bytes.len(), "snapshot of the initialised component");
            let component = self.compile(path, &snapshot_bytes)?;
            if let Some(record) = &record
                && let Some(compiled) = self.snapshot_compiled_path(digest, snapshot)
                && let Some(context) = context(self.snapshot_engine(snapshot))
            {
                let stale = recorded
                    .filter(|old| *old != snapshot)
                    .and_then(|old| self.snapshot_compiled_path(digest, old));
                if let Err(error) =
                    write_snapshot_cache(record, &compiled, &context, &component, snapshot, stale)
                {
                    tracing::warn!(path = %compiled.display(), %error, "could not write cache file");
                }
            }
            return Ok(Compiled {
                component,
                cache: outcome,
                bytes: Some(bytes),
                snapshot: Some(snapshot),
            });
        }
        let component = self.compile(path, &bytes)?;
        if let Some((cache_path, context)) = &cached
            && let Err(error) = write_cache(cache_path, context, &component)
        {
            tracing::warn!(path = %cache_path.display(), %error, "could not write cache file");
        }
        Ok(Compiled {
            component,
            cache: outcome,
            bytes: Some(bytes),
            snapshot: None,
        })
    }

    /// The record of which snapshot of the component with this digest is
    /// cached: the snapshot's digest, naming its compiled file
    /// ([`Self::snapshot_compiled_path`]).
    pub fn snapshot_cache_path(&self, digest: Digest) -> Option<PathBuf> {
        self.cache_dir
            .as_ref()
            .map(|dir| dir.join(format!("{digest}-{}.snapshot", self.compatibility_hash())))
    }

    /// The compiled file of one snapshot of the component with this
    /// digest. Each snapshot has its own (two starts that snapshot the same
    /// component at once write two files, never one file from both), and
    /// the record names the one in use.
    pub fn snapshot_compiled_path(&self, digest: Digest, snapshot: Digest) -> Option<PathBuf> {
        self.cache_dir.as_ref().map(|dir| {
            dir.join(format!(
                "{digest}-{}.snapshot-{snapshot}.cwasm",
                self.compatibility_hash()
            ))
        })
    }

    /// What a snapshot's cache MAC binds beside the source's digest: the
    /// engine and the snapshot's own digest.
    fn snapshot_engine(&self, snapshot: Digest) -> String {
        format!(
            "{} snapshot policy {} {snapshot}",
            self.compatibility_hash(),
            preinit::POLICY
        )
    }

    /// Compiles `bytes`. A compile that takes longer than
    /// [`COMPILE_NOTICE_AFTER`] says so on stderr when that is a terminal,
    /// and says when it is done: a first start is then never a silent wait.
    pub(super) fn compile(&self, path: &Path, bytes: &[u8]) -> Result<Component, WasmError> {
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

/// The bytes at `path`, which must still have `digest` (read afresh when
/// the digest came from a seal, and hashed again).
pub(super) fn read_measured(path: &Path, digest: Digest) -> Result<Vec<u8>, WasmError> {
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
pub(super) fn start_epoch_timer(engine: &Engine) -> Result<(), WasmError> {
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

/// A compiled component, where it came from, the measured bytes when they
/// were read, and the digest of the snapshot it was compiled from, if any.
pub(super) struct Compiled {
    pub(super) component: Component,
    pub(super) cache: CacheOutcome,
    pub(super) bytes: Option<Vec<u8>>,
    pub(super) snapshot: Option<Digest>,
}

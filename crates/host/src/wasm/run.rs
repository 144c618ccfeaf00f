//! One instance: its WASI context built from the grants (preopens, the
//! allowed sockets, the environment), its stdio pipes, and the task that
//! runs it to its exit, classified (an exit code, a limit, a trap).

use super::*;

/// Bytes that may wait in each in-memory stdio pipe (allocated only while
/// they wait): a writer beyond it waits for the reader.
pub(super) const PIPE_BYTES: usize = 64 * 1024;

/// What every instance of one launch is given, prepared once: the launch
/// (argv, the exact environment and the limits are its spec's), the opened
/// directory grants, the network allowed and the names it may look up, and
/// the counters they share.
pub(crate) struct InstanceSetup {
    pub(super) launch: WasmLaunch,
    /// (path to open, grant): the path is the grant's descriptor.
    pub(super) preopens: Vec<(PathBuf, crate::grants::DirGrant)>,
    /// The grants' descriptors, open while any instance may need them.
    #[cfg(unix)]
    pub(super) _opened: Vec<crate::grants::OpenedGrant>,
    pub(super) allowed: Option<Arc<HashSet<SocketAddr>>>,
    pub(super) names: crate::wasm::lookup::Names,
    pub(super) http: http::Hooks,
    pub(super) metrics: Arc<Metrics>,
}

impl InstanceSetup {
    /// Opens each grant once without following links (a preopen reopens
    /// that very inode through its descriptor).
    pub(super) fn new(launch: &WasmLaunch, net: ResolvedNet) -> Result<Self, WasmError> {
        let ResolvedNet {
            allowed,
            names,
            http,
        } = net;
        #[cfg(unix)]
        let opened = crate::grants::open_all(&launch.spec.name, &launch.spec.dirs)?;
        #[cfg(unix)]
        let preopens: Vec<(PathBuf, crate::grants::DirGrant)> = opened
            .iter()
            .map(|o| (o.fd_path(), o.grant.clone()))
            .collect();
        #[cfg(not(unix))]
        let preopens: Vec<(PathBuf, crate::grants::DirGrant)> = launch
            .spec
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
        Ok(Self {
            launch: launch.clone(),
            preopens,
            #[cfg(unix)]
            _opened: opened,
            allowed: (!allowed.is_empty()).then(|| Arc::new(allowed)),
            names,
            http: http::Hooks {
                policy: Arc::new(http::HttpPolicy::new(
                    http,
                    launch.spec.limits.max_http_response_bytes,
                )),
            },
            metrics: Arc::new(Metrics::default()),
        })
    }

    /// The host state of one instance, its stdio on these pipe ends.
    pub(super) fn state(
        &self,
        stdin: pipe::PipeReader,
        stdout: pipe::PipeWriter,
        stderr: pipe::PipeWriter,
        requests: Arc<AtomicU64>,
    ) -> Result<HostState, WasmError> {
        let limits = &self.launch.spec.limits;
        let mut builder = WasiCtx::builder();
        builder
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr)
            .arg(&self.launch.spec.name)
            .args(&self.launch.spec.args)
            .envs(&self.launch.env)
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
    pub(super) engine: Engine,
    pub(super) metering: Metering,
    pub(super) limits: Limits,
}

impl Runner {
    /// A store for one instance: its limiter, host-call fuel, and CPU
    /// metering (fuel afresh for each request, or epoch yields), counting
    /// fuel and host calls into the instance's metrics.
    pub(super) fn store(&self, state: HostState) -> Result<Store<HostState>, Exit> {
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
    pub(super) async fn run_command(&self, pre: &CommandPre<HostState>, state: HostState) -> Exit {
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

/// Counts a guest call into the host in the instance's metrics.
pub(super) fn count_hostcall(state: &HostState, hook: CallHook) {
    if matches!(hook, CallHook::CallingHost) {
        state.metrics.hostcalls.fetch_add(1, Ordering::Relaxed);
    }
}

pub(super) fn classify(error: &wasmtime::Error, store: &Store<HostState>, limits: &Limits) -> Exit {
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
pub(super) fn is_random_limit(error: &wasmtime::Error, max_random_bytes: u64) -> bool {
    // The root cause ends the alternate form, after any backtrace context.
    let text = format!("{error:#}");
    text.contains("requested len ") && text.ends_with(&format!(" exceeds limit {max_random_bytes}"))
}

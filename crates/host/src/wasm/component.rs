//! A prepared component and one launch of it: its kind (stdio command or
//! typed tool component), the `net` grants resolved at launch, and the
//! sandbox report of what the instance is given.

use super::*;

/// A measured, compiled and pre-instantiated component, ready to launch as
/// many instances as wanted.
#[derive(Clone)]
pub struct PreparedComponent {
    pub(super) engine: Engine,
    pub(super) metering: Metering,
    pub(super) digest: Digest,
    pub(super) cache: CacheOutcome,
    pub(super) digest_source: DigestSource,
    pub(super) kind: Kind,
    /// The digest of the snapshot of its initialised state, when that is
    /// what runs (see [`super::preinit`]).
    pub(super) snapshot: Option<Digest>,
}

/// The two kinds of component, told apart at load.
#[derive(Clone)]
pub(super) enum Kind {
    /// It exports `wasi:cli/run`: an MCP server on its stdio.
    Command(CommandPre<HostState>),
    /// Anything else: its exported functions are tools.
    Typed(Arc<typed::TypedComponent>),
}

/// Whether `component` exports any version of `wasi:cli/run`.
pub(super) fn exports_cli_run(component: &Component, engine: &Engine) -> bool {
    component
        .component_type()
        .exports(engine)
        .any(|(name, _)| name.starts_with("wasi:cli/run@"))
}

/// What one instance gets: the server as configured (its name is argv[0]
/// and names it in errors; then its args, limits, preopened `dirs`, `net`
/// destinations and, from its kind, its `http` origins and instances), and
/// the exact environment, read when the launch was planned.
#[derive(Clone, Debug)]
pub struct WasmLaunch {
    /// The server as configured, shared with every instance's setup.
    pub spec: Arc<crate::config::ServerSpec>,
    /// The exact environment: the `env` grant resolved
    /// ([`crate::grants::EnvGrant::resolve`]).
    pub env: Vec<(String, String)>,
}

impl WasmLaunch {
    /// What `spec` grants one instance.
    pub fn from_spec(spec: &crate::config::ServerSpec) -> Self {
        Self {
            env: spec.env.resolve(),
            spec: Arc::new(spec.clone()),
        }
    }

    /// For a typed tool component: an instance per call, or per session.
    pub fn instances(&self) -> crate::config::Instances {
        match &self.spec.kind {
            crate::config::ServerKind::Wasm { instances, .. } => *instances,
            _ => crate::config::Instances::default(),
        }
    }

    /// The socket addresses `net` allows, and the names the guest may look
    /// up: IP literals as they are, names resolved now, each within
    /// [`LOOKUP_TIMEOUT`]. These are the only lookups a wasm server causes:
    /// its own are answered from this list (see [`crate::wasm::lookup`]).
    pub async fn resolve_net(&self) -> Result<ResolvedNet, WasmError> {
        let mut allowed = HashSet::new();
        let mut names = Vec::new();
        for grant in &self.spec.net {
            let found = resolve(&grant.host, grant.port, &grant.to_string()).await?;
            names.push((
                grant.host.clone(),
                found.iter().map(|a| a.ip().to_canonical()).collect(),
            ));
            allowed.extend(found);
        }
        let mut http = Vec::new();
        for grant in self.spec.http() {
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
pub(super) async fn resolve(
    host: &str,
    port: u16,
    grant: &str,
) -> Result<Vec<SocketAddr>, WasmError> {
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
pub(super) fn socket_allowed(
    allowed: &HashSet<SocketAddr>,
    addr: SocketAddr,
    use_: SocketAddrUse,
) -> bool {
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

    /// The digest of the snapshot that runs, when the component's
    /// initialiser was run and its state snapshotted.
    pub fn snapshot(&self) -> Option<Digest> {
        self.snapshot
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
                snapshot: self.snapshot,
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
            limits: launch.spec.limits.clone(),
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

    pub(super) fn launch_command(
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
        let pre = pre.clone();
        let started = crate::instance::InProcess {
            stdin: Box::new(stdin_host),
            stdout: Box::new(stdout_host),
            stderr: Box::new(stderr_host),
            identity,
            metrics,
            on_request: Some(Box::new(move || {
                requests.fetch_add(1, Ordering::SeqCst);
            })),
            terminate: None,
            answers_deadlines: false,
        };
        Ok(
            started.spawn(&launch.spec.name, "instance", tracker, async move {
                // The grants' descriptors stay open while the instance runs.
                let _setup = setup;
                runner.run_command(&pre, state).await
            }),
        )
    }

    /// What the sandbox of an instance of `launch` enforces.
    pub(super) fn sandbox_report(&self, launch: &WasmLaunch) -> SandboxReport {
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
        let spec = &launch.spec;
        sandbox.enforced(if spec.dirs.is_empty() {
            "filesystem (wasi): no directories".to_owned()
        } else {
            format!(
                "filesystem (wasi preopens): {}",
                spec.dirs
                    .iter()
                    .map(|d| format!("{} as {} ({})", d.host.display(), d.guest, d.mode))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
        sandbox.enforced(if spec.net.is_empty() {
            "network (wasi): none".to_owned()
        } else {
            format!(
                "network (wasi socket check): connect only to {}",
                crate::grants::net_line(&spec.net)
            )
        });
        sandbox.enforced(crate::grants::env::describe(&[], &launch.env));
        sandbox.enforced(if spec.http().is_empty() {
            "HTTP (wasi:http): every request refused".to_owned()
        } else {
            format!(
                "HTTP (wasi:http): requests only to {}, at the addresses resolved at launch, bodies up to max_http_response_bytes = {}",
                spec.http()
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                spec.limits.max_http_response_bytes
            )
        });
        if let Kind::Typed(_) = self.kind {
            sandbox.enforced(match launch.instances() {
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

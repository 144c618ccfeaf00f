//! Launching, one layer above the launchers: which launcher runs a
//! configured server, what it prepares once (wasm: measure, compile or load
//! and pre-instantiate; native: resolve the command; remote: the endpoint)
//! and what it starts per instance, and [`LaunchError`], which wraps each
//! launcher's own error type. The launchers ([`crate::wasm`], `native`,
//! [`crate::remote`]) import only the contract ([`crate::instance`]) and
//! their own dependencies, never this module or the transport.

use std::sync::Arc;

use crate::config::{ServerKind, ServerSpec, WasmSource};
use crate::identity::Expectation;
use crate::transport::TransportError;
use crate::wasm::{WasmEngine, WasmLaunch};

/// The one client transport, launching through the launchers here.
pub type ServerTransport = crate::transport::ServerTransport<LaunchError>;

/// Why a server could not be launched.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "server `{server}` has no sha256 pinned: refusing an unmeasured launch (pin it with `sha256 = \"...\"` from `moat digest`, or set `allow_unmeasured = true`)"
    )]
    Unmeasured { server: String },
    #[error(transparent)]
    Wasm(#[from] crate::wasm::WasmError),
    #[error(transparent)]
    Oci(#[from] crate::oci::OciError),
    #[error(
        "server `{server}`: {reference} names the component sha256:{layer}, but sha256:{pinned} is pinned: refused (if the new component is the one to run, pin it, or run `moat lock`)"
    )]
    OciPin {
        server: String,
        reference: String,
        layer: crate::identity::Digest,
        pinned: crate::identity::Digest,
    },
    #[cfg(unix)]
    #[error(transparent)]
    Native(#[from] crate::native::NativeError),
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
    Remote(#[from] crate::remote::RemoteError),
    #[error(transparent)]
    Transport(#[from] TransportError),
}

#[cfg(unix)]
impl From<crate::grants::GrantError> for LaunchError {
    fn from(error: crate::grants::GrantError) -> Self {
        Self::Grant(Box::new(error))
    }
}

/// What is known of a server before any instance runs: its launcher and
/// everything resolved without starting it. [`Planned::start`] runs the
/// per-instance part; [`Planned::transport`] defers that to the connect.
pub enum Planned {
    /// A component: pulled into the store first when it comes from a
    /// registry, measured, compiled or loaded and pre-instantiated on the
    /// first start (the engine keeps it by digest), then instantiated.
    Wasm {
        engine: WasmEngine,
        source: WasmSource,
        expected: Expectation,
        launch: WasmLaunch,
    },
    /// An executable whose command is resolved: measured and spawned at
    /// start.
    #[cfg(unix)]
    Native(Box<crate::native::NativeLaunch>),
    /// An executable already opened and measured: spawned at start through
    /// its descriptor.
    #[cfg(unix)]
    NativeOpened(
        Box<(
            crate::native::NativeLaunch,
            crate::native::MeasuredExecutable,
        )>,
    ),
    /// A component already prepared: only its instance remains to start.
    WasmPrepared {
        prepared: crate::wasm::PreparedComponent,
        launch: WasmLaunch,
    },
    /// An endpoint: connected at start. Nothing of it runs here, so there
    /// are no bytes to measure.
    Remote(crate::remote::RemoteLaunch),
    /// A profile on a node: the node launches it at start and says, signed,
    /// what it launched.
    Node(crate::remote::node::NodeLaunch),
}

/// Plans `spec` on the launcher its kind names; its bytes must meet
/// `expected`. `learn`, for a native server, runs it watched, with
/// everything readable, and records what it uses; `egress`, the pools its
/// egress proxy shares; `protected` is what no grant may overlap, and what
/// the grants made without listing keep clear of.
pub fn plan(
    wasm: &WasmEngine,
    spec: &ServerSpec,
    expected: Expectation,
    #[cfg(unix)] learn: Option<crate::native::learn::Run>,
    #[cfg(unix)] egress: crate::egress::Shares,
    #[cfg(unix)] protected: &[crate::grants::Protected],
) -> Result<Planned, LaunchError> {
    match &spec.kind {
        ServerKind::Wasm { source, .. } => Ok(Planned::Wasm {
            engine: wasm.clone(),
            source: source.clone(),
            expected,
            launch: WasmLaunch::from_spec(spec),
        }),
        #[cfg(unix)]
        ServerKind::Native {
            command, base_dir, ..
        } => {
            let path_var = std::env::var_os("PATH");
            let resolved = crate::command::resolve(command, base_dir, path_var.as_deref())
                .map_err(crate::native::NativeError::from)?;
            let mut launch = crate::native::NativeLaunch::new(spec.clone(), resolved, expected);
            launch.learn = learn;
            launch.sealer = wasm.sealer();
            launch.egress = egress;
            launch.kept = crate::grants::Kept::from_env(protected);
            Ok(Planned::Native(Box::new(launch)))
        }
        #[cfg(not(unix))]
        ServerKind::Native { .. } => Err(LaunchError::Unsupported {
            server: spec.name.clone(),
        }),
        ServerKind::Remote {
            url,
            bearer_token_env,
        } => Ok(Planned::Remote(crate::remote::RemoteLaunch {
            name: spec.name.clone(),
            url: url.clone(),
            bearer_token_env: bearer_token_env.clone(),
            limits: spec.limits.clone(),
        })),
        ServerKind::Node {
            node,
            profile,
            revision,
        } => Ok(Planned::Node(crate::remote::node::NodeLaunch {
            name: spec.name.clone(),
            node: node.clone(),
            profile: profile.clone(),
            revision: *revision,
            limits: spec.limits.clone(),
        })),
    }
}

impl Planned {
    /// Starts one instance, registering what it runs with `tracker`.
    pub async fn start(
        self,
        tracker: Arc<crate::instance::Tracker>,
    ) -> Result<crate::instance::Launched, LaunchError> {
        match self {
            Self::Wasm {
                engine,
                source,
                expected,
                launch,
            } => {
                let (path, expected, origin) = match source {
                    WasmSource::File(path) => (path, expected, None),
                    WasmSource::Oci { reference, store } => {
                        let pulled = crate::oci::Store::new(store).pull(&reference).await?;
                        // The manifest names the component's digest: the
                        // bytes must hash to it, and to any pin as well.
                        if let Expectation::Pinned(pinned) = expected
                            && pinned != pulled.layer
                        {
                            return Err(LaunchError::OciPin {
                                server: launch.spec.name.clone(),
                                reference: reference.to_string(),
                                layer: pulled.layer,
                                pinned,
                            });
                        }
                        let origin = crate::instance::OciOrigin {
                            reference: reference.to_string(),
                            manifest: pulled.manifest,
                            layer: pulled.layer,
                        };
                        (pulled.path, Expectation::Pinned(pulled.layer), Some(origin))
                    }
                };
                let prepared = engine
                    .prepare_with(
                        &path,
                        expected,
                        launch.spec.preinit().then_some(&launch.spec.limits),
                    )
                    .await?;
                let net = launch.resolve_net().await?;
                let mut launched = prepared.launch(&launch, net, &tracker)?;
                launched.identity.oci = origin;
                Ok(launched)
            }
            Self::WasmPrepared { prepared, launch } => {
                let net = launch.resolve_net().await?;
                Ok(prepared.launch(&launch, net, &tracker)?)
            }
            #[cfg(unix)]
            Self::Native(launch) => Ok(crate::native::launch(*launch, tracker).await?),
            #[cfg(unix)]
            Self::NativeOpened(opened) => {
                let (launch, executable) = *opened;
                Ok(crate::native::start_opened(launch, executable, tracker).await?)
            }
            Self::Remote(launch) => Ok(crate::remote::launch(launch, tracker).await?),
            Self::Node(launch) => Ok(launch.start(tracker).await?),
        }
    }

    /// A transport for server `name` that starts one instance when
    /// connected.
    pub fn transport(self, name: &str, limits: crate::limits::Limits) -> ServerTransport {
        ServerTransport::new(name, limits, move |tracker| self.start(tracker))
    }
}

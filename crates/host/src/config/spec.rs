//! One server as configured ([`ServerSpec`]): what kind it is and where
//! its bytes come from, what it is granted, and what its launch expects of
//! its digest and environment. Checked on the way in by
//! [`super::server`].

use std::path::PathBuf;

use serde::Deserialize;

use super::{DirGrant, HttpGrant, NetGrant, PackageRecord, Writer};
use crate::identity::{Digest, Expectation};
use crate::limits::Limits;

/// One `[servers.NAME]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSpec {
    /// The name under which the server is configured.
    pub name: String,
    /// What to run.
    pub kind: ServerKind,
    /// The pinned digest, if any.
    pub sha256: Option<Digest>,
    /// Consent to launch without a pinned digest.
    pub allow_unmeasured: bool,
    /// Arguments after argv[0] (which is the server name).
    pub args: Vec<String>,
    /// `env` and `env_passthrough`: the exact environment.
    pub env: crate::grants::EnvGrant,
    /// Bounds on the server.
    pub limits: Limits,
    /// Directories granted to the server.
    pub dirs: Vec<DirGrant>,
    /// TCP destinations the server may connect to; none means no network.
    /// (A wasm server's HTTP origins are its kind's `http`.)
    pub net: Vec<NetGrant>,
    /// What happens when the kernel cannot enforce a rule.
    pub sandbox: Sandbox,
    /// Every `rw` grant of every server of the config this spec was loaded
    /// from (its own included): none may overlap what this server runs or
    /// measures, which is checked when the config is loaded and again at
    /// each launch. A spec made in code has none; its own `rw` grants are
    /// checked all the same.
    pub writers: Vec<Writer>,
}

/// Whether a rule the kernel cannot enforce refuses the launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sandbox {
    /// Refuse the launch, naming the missing kernel feature.
    #[default]
    Required,
    /// Launch, and record in the evidence what was and was not enforced.
    BestEffort,
}

impl std::fmt::Display for Sandbox {
    /// As written in `moat.toml`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sandbox::Required => "required",
            Sandbox::BestEffort => "best-effort",
        })
    }
}

/// What kind of server a spec describes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerKind {
    /// A WASI preview-2 component: a file, or an OCI artifact pulled into
    /// Moat's store.
    Wasm {
        source: WasmSource,
        /// For a typed tool component: an instance per call (the default)
        /// or one per session. A stdio component always runs one instance
        /// a session.
        instances: Instances,
        /// Whether a component that exports `wizer-initialize` starts from
        /// a snapshot of its initialised state (`preinit`, default true;
        /// see `wasm::preinit`). A component without it always starts
        /// afresh.
        preinit: bool,
        /// HTTP origins it may send requests to through wasi:http (`net`
        /// entries written `http://host[:port]` or `https://host[:port]`).
        /// A native server gets each as a TCP destination in `net` instead:
        /// the kernel cannot check a scheme.
        http: Vec<HttpGrant>,
    },
    /// A native executable run as a child process.
    Native {
        /// The command as configured: argv[0], and what is resolved (on
        /// PATH when it has no slash, else against `base_dir`).
        command: String,
        /// The config file's directory, for relative paths.
        base_dir: PathBuf,
        /// The working directory (default: the config file's directory).
        cwd: PathBuf,
        /// Extra files or directories whose digests join the identity (an
        /// interpreter's script, a package directory).
        measure: Vec<PathBuf>,
        /// For a server installed by Moat (`moat add`, `moat import`): the
        /// package, its version and its install in the store.
        package: Option<PackageRecord>,
    },
    /// A remote server reached over streamable HTTP at one exact endpoint.
    Remote {
        /// The endpoint (https, or http to a loopback address).
        url: String,
        /// The variable in Moat's environment holding the bearer token sent
        /// to that endpoint, if any. The token itself is never stored here.
        bearer_token_env: Option<String>,
    },
    /// A server launched on a node by profile and revision: the node runs
    /// it under its own config, lock and sandbox.
    Node {
        node: super::NodeTarget,
        /// The server's name in the node's config.
        profile: String,
        /// The digest of that profile the front expects the node to hold.
        revision: Digest,
    },
}

/// Where a component's bytes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WasmSource {
    /// A file, by path.
    File(PathBuf),
    /// An OCI artifact (`oci://...`), pulled into the store at `store` at
    /// its first launch (or by `moat pull`).
    Oci {
        reference: crate::oci::OciRef,
        store: PathBuf,
    },
}

impl std::fmt::Display for WasmSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) => write!(f, "{}", path.display()),
            Self::Oci { reference, .. } => write!(f, "{reference}"),
        }
    }
}

/// How many instances a typed tool component gets (`instance = ...`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Instances {
    /// A fresh instance for every call, as in Wassette: no state crosses
    /// calls, and a crash stays within its call.
    #[default]
    Call,
    /// One instance for the whole agent session, for components that hold
    /// state; a call that fails (trap or limit) replaces it.
    Session,
}

impl ServerSpec {
    /// A spec for a wasm component with default limits and nothing granted.
    pub fn wasm(name: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            kind: ServerKind::Wasm {
                source: WasmSource::File(path.into()),
                instances: Instances::default(),
                preinit: true,
                http: Vec::new(),
            },
            sha256: None,
            allow_unmeasured: false,
            args: Vec::new(),
            env: Default::default(),
            limits: Limits::default(),
            dirs: Vec::new(),
            net: Vec::new(),
            sandbox: Sandbox::default(),
            writers: Vec::new(),
        }
    }

    /// A spec for a native command with default limits and nothing granted.
    pub fn native(name: impl Into<String>, command: impl Into<String>) -> Self {
        let base_dir = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        Self {
            kind: ServerKind::Native {
                command: command.into(),
                cwd: base_dir.clone(),
                base_dir,
                measure: Vec::new(),
                package: None,
            },
            ..Self::wasm(name, "")
        }
    }

    /// The HTTP origins a wasm server may reach through wasi:http; none for
    /// any other kind.
    pub fn http(&self) -> &[HttpGrant] {
        match &self.kind {
            ServerKind::Wasm { http, .. } => http,
            _ => &[],
        }
    }

    /// The package a native server was installed from by Moat, if any.
    pub fn package(&self) -> Option<&PackageRecord> {
        match &self.kind {
            ServerKind::Native { package, .. } => package.as_ref(),
            _ => None,
        }
    }

    /// For a wasm server: whether it starts from a snapshot of its
    /// initialised state when its component has an initialiser.
    pub fn preinit(&self) -> bool {
        matches!(self.kind, ServerKind::Wasm { preinit: true, .. })
    }

    /// What the bytes must hash to, or `None` when the launch must be refused
    /// because nothing is pinned and `allow_unmeasured` is not set.
    ///
    /// An OCI reference with a manifest digest pins the component by
    /// itself: the manifest names the layer's digest, and the launch
    /// requires the component to hash to it. A tag alone pins nothing.
    pub fn expectation(&self) -> Option<Expectation> {
        let oci_pinned = matches!(
            &self.kind,
            ServerKind::Wasm {
                source: WasmSource::Oci { reference, .. },
                ..
            } if reference.digest.is_some()
        );
        match (self.sha256, self.allow_unmeasured || oci_pinned) {
            (Some(digest), _) => Some(Expectation::Pinned(digest)),
            (None, true) => Some(Expectation::Unpinned),
            (None, false) => None,
        }
    }
}

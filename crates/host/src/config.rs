//! Config: parses and validates `moat.toml`. No I/O beyond reading the file.
//!
//! Unknown keys and bad values are rejected with the file, line and column
//! they were found at.

use std::collections::BTreeMap;
use std::num::{NonZeroU64, NonZeroUsize};
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;

pub use crate::grants::{DirGrant, DirMode, HttpGrant, NetGrant, Writer, net_line};
use crate::identity::{Digest, Expectation};
use crate::limits::Limits;

/// A loaded, validated `moat.toml`.
#[derive(Clone, Debug)]
pub struct Config {
    /// The file the config was read from.
    pub path: PathBuf,
    /// Servers by name, in name order.
    pub servers: BTreeMap<String, ServerSpec>,
    /// How `moat serve` runs agent sessions.
    pub serve: ServeSettings,
    /// How the wasm engine runs every wasm server.
    pub wasm: WasmSettings,
}

/// `[wasm]`: how the one wasm engine runs every wasm server.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WasmSettings {
    /// How guests' CPU is bounded.
    pub metering: CpuMetering,
    /// How instances are allocated.
    pub allocator: AllocatorSetting,
    /// With the pooling allocator: component instances alive at once over
    /// every server (each stdio session's instance, each typed call in
    /// flight). Slots are address space reserved at start, not memory.
    pub pool_instances: std::num::NonZeroU32,
}

impl Default for WasmSettings {
    fn default() -> Self {
        Self {
            metering: CpuMetering::default(),
            allocator: AllocatorSetting::default(),
            pool_instances: std::num::NonZeroU32::new(1000).expect("non-zero"),
        }
    }
}

/// `[wasm] allocator`: where instances' memories and tables come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllocatorSetting {
    /// Slots reserved once and reused, reset between instances.
    Pooling,
    /// Mapped per instance, unmapped when it ends.
    #[default]
    OnDemand,
}

/// `[wasm] metering`: how guests' CPU is bounded. Both let the per-request
/// deadline (`request_timeout_ms`) stop a guest that spins; they differ in
/// cost and in whether `fuel_per_request` holds, which
/// `cargo bench --bench transport` (`cpu_limits`) measures side by side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuMetering {
    /// Wasm operators are counted: `fuel_per_request` bounds the work of
    /// each request, deterministically, as well as its time.
    #[default]
    Fuel,
    /// A timer interrupts guests every few milliseconds to yield: time is
    /// bounded, work is not (`fuel_per_request` is reported not enforced).
    Epoch,
}

/// `[serve]`: how `moat serve` runs agent sessions.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeSettings {
    /// How long closing a session waits for its in-flight calls to finish
    /// before cancelling them (then its servers are stopped). Long enough
    /// for an ordinary tool call; short enough that a shutdown is prompt.
    pub drain_timeout_ms: u64,
    /// `--http`: agent sessions alive at once. Each may hold a child per
    /// server, so this bounds the children (and memory) agents can make; an
    /// `initialize` beyond it is answered 503.
    pub max_sessions: NonZeroUsize,
    /// `--http`: a session with no request for this long is closed, with its
    /// children. Agents that leave without ending their session are the
    /// common case, not an attack.
    pub session_idle_ms: NonZeroU64,
    /// `--http`: connections open at once. At the limit, the oldest
    /// connection that has not yet sent a request is closed to make room;
    /// if there is none, the new one is answered 503.
    pub max_connections: NonZeroUsize,
    /// `--http`: how long a connection may take to send a request's
    /// headers (and may stay idle between requests) before it gets 408 and
    /// is closed.
    pub header_timeout_ms: NonZeroU64,
    /// `--http`: how long a whole request (head and body, from its first
    /// byte) may take to arrive; one still arriving then gets 408 and its
    /// connection is closed, so a body sent a byte at a time cannot hold a
    /// connection. (At `max_connections`, a connection whose body is still
    /// arriving is also closed to make room, as an idle one is.)
    pub request_timeout_ms: NonZeroU64,
    /// Native servers' connections through Moat's egress proxy, open at
    /// once across the gateway (every session and server together): each
    /// costs Moat two descriptors. At most a quarter of Moat's descriptor
    /// limit is used, whatever this says. Beyond it, the proxy answers 503
    /// naming the limit. Read at start: a reload does not change it.
    pub egress_connections: NonZeroUsize,
    /// The same, per agent session (all its native servers together).
    pub egress_connections_per_session: NonZeroUsize,
    /// The same, per native server: with the defaults, two servers at
    /// their bound leave a session's other servers half its share. Read at
    /// start, as `egress_connections` is.
    pub egress_connections_per_server: NonZeroUsize,
    /// `--http`: the largest request body accepted; a larger one gets 413.
    /// MCP requests are small JSON; this bounds what one request can make
    /// Moat buffer.
    pub max_body_bytes: NonZeroUsize,
    /// A tool call of an agent that declared the tasks extension
    /// (2026-07-28) that is still running after this long is made a task of
    /// Moat's: the agent gets the task at once and follows it with
    /// `tasks/get`, whatever the server's revision. Unset (the default),
    /// a call is answered when its server answers, or with a task the
    /// server itself made.
    pub task_after_ms: Option<NonZeroU64>,
}

impl Default for ServeSettings {
    fn default() -> Self {
        let usize_ = |n: usize| NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN);
        let u64_ = |n: u64| NonZeroU64::new(n).unwrap_or(NonZeroU64::MIN);
        Self {
            drain_timeout_ms: 30_000,
            max_sessions: usize_(64),
            session_idle_ms: u64_(300_000),
            max_connections: usize_(1024),
            header_timeout_ms: u64_(10_000),
            request_timeout_ms: u64_(30_000),
            egress_connections: usize_(4096),
            egress_connections_per_session: usize_(512),
            egress_connections_per_server: usize_(128),
            max_body_bytes: usize_(4 * 1024 * 1024),
            task_after_ms: None,
        }
    }
}

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
    /// Environment variables set to these exact values.
    pub env: BTreeMap<String, String>,
    /// Names of host environment variables passed through when set.
    pub env_passthrough: Vec<String>,
    /// Bounds on the server.
    pub limits: Limits,
    /// Directories granted to the server.
    pub dirs: Vec<DirGrant>,
    /// TCP destinations the server may connect to; none means no network.
    pub net: Vec<NetGrant>,
    /// HTTP origins a wasm server may send requests to through wasi:http
    /// (`net` entries written `http://host[:port]` or `https://host[:port]`).
    /// A native server gets each as a TCP destination in `net` instead: the
    /// kernel cannot check a scheme.
    pub http: Vec<HttpGrant>,
    /// What happens when the kernel cannot enforce a rule.
    pub sandbox: Sandbox,
    /// For a native server installed by Moat (`moat add`, `moat import`):
    /// the package, its version and its install in the store.
    pub package: Option<PackageRecord>,
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
    },
    /// A remote server reached over streamable HTTP at one exact endpoint.
    Remote {
        /// The endpoint (https, or http to a loopback address).
        url: String,
        /// The variable in Moat's environment holding the bearer token sent
        /// to that endpoint, if any. The token itself is never stored here.
        bearer_token_env: Option<String>,
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
            },
            sha256: None,
            allow_unmeasured: false,
            args: Vec::new(),
            env: BTreeMap::new(),
            env_passthrough: Vec::new(),
            limits: Limits::default(),
            dirs: Vec::new(),
            net: Vec::new(),
            http: Vec::new(),
            sandbox: Sandbox::default(),
            package: None,
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
            },
            ..Self::wasm(name, "")
        }
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

    /// The exact environment the server gets: `env` values, plus each
    /// `env_passthrough` name that is set on the host.
    pub fn environment(&self) -> Vec<(String, String)> {
        let mut vars: BTreeMap<String, String> = self.env.clone();
        for name in &self.env_passthrough {
            if let Ok(value) = std::env::var(name) {
                vars.entry(name.clone()).or_insert(value);
            }
        }
        vars.into_iter().collect()
    }
}

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[cfg(unix)]
    #[error("{path}: {source}")]
    Writer {
        path: PathBuf,
        #[source]
        source: Box<crate::grants::GrantError>,
    },
    #[error("{path}: no server named `{name}` (configured: {known})")]
    UnknownServer {
        path: PathBuf,
        name: String,
        known: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    servers: BTreeMap<Spanned<String>, Spanned<RawServer>>,
    #[serde(default)]
    serve: ServeSettings,
    #[serde(default)]
    wasm: WasmSettings,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    wasm: Option<Spanned<String>>,
    instance: Option<Spanned<Instances>>,
    command: Option<Spanned<String>>,
    url: Option<Spanned<String>>,
    bearer_token_env: Option<Spanned<String>>,
    cwd: Option<String>,
    #[serde(default)]
    measure: Vec<String>,
    sha256: Option<Spanned<String>>,
    #[serde(default)]
    allow_unmeasured: bool,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    env_passthrough: Vec<Spanned<String>>,
    #[serde(default)]
    limits: Option<Spanned<Limits>>,
    #[serde(default)]
    dirs: Vec<Spanned<RawDir>>,
    #[serde(default)]
    net: Vec<Spanned<String>>,
    #[serde(default)]
    sandbox: Sandbox,
    package: Option<Spanned<PackageRecord>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDir {
    host: String,
    guest: Option<String>,
    mode: DirMode,
}

/// The directory relative paths in the config at `path` are resolved
/// against, canonical: every path that enters an execution identity (a
/// server's `cwd`, its `measure` paths, its grants) is then the same
/// whichever way the config was named (`moat.toml`, `./moat.toml`, an
/// absolute path, a path through a symbolic link). A directory that cannot
/// be resolved (a config parsed from text alone) stays as written, made
/// absolute against the working directory where that is possible.
fn canonical_base(path: &Path) -> PathBuf {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::canonicalize(parent)
        .or_else(|_| std::path::absolute(parent))
        .unwrap_or_else(|_| parent.to_owned())
}

impl Config {
    /// Reads and validates the config at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Validates `text` as the config found at `path` (relative paths in it
    /// are resolved against `path`'s directory).
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let invalid = |span: Option<Range<usize>>, message: String| {
            let (line, column) =
                span.map_or((1, 1), |span| crate::text::line_column(text, span.start));
            ConfigError::Invalid {
                path: path.to_owned(),
                line,
                column,
                message,
            }
        };
        let raw: RawConfig = toml::from_str(text)
            .map_err(|error| invalid(error.span(), error.message().to_owned()))?;
        let base = canonical_base(path);
        let base = base.as_path();
        let mut servers = BTreeMap::new();
        for (name, server) in raw.servers {
            let name_span = name.span();
            let name = name.into_inner();
            if !valid_server_name(&name) {
                return Err(invalid(
                    Some(name_span),
                    format!(
                        "server name `{name}` must be 1-32 characters of A-Z, a-z, 0-9, `-` or `_`, without `__` and not beginning or ending with `_` (exposed names are `server__tool` and must split one way only)"
                    ),
                ));
            }
            let server_span = server.span();
            let server = server.into_inner();
            if let Some(instance) = &server.instance
                && server.wasm.is_none()
            {
                return Err(invalid(
                    Some(instance.span()),
                    format!("server `{name}`: `instance` applies to `wasm` servers only"),
                ));
            }
            if let Some(token) = &server.bearer_token_env
                && server.url.is_none()
            {
                return Err(invalid(
                    Some(token.span()),
                    format!(
                        "server `{name}`: `bearer_token_env` applies to remote `url` servers only"
                    ),
                ));
            }
            let kind = match (server.wasm, server.command, server.url) {
                (Some(wasm), None, None) => {
                    if server.cwd.is_some() || !server.measure.is_empty() {
                        return Err(invalid(
                            Some(wasm.span()),
                            format!(
                                "server `{name}`: `cwd` and `measure` apply to native `command` servers, not `wasm`"
                            ),
                        ));
                    }
                    let source = if wasm.get_ref().starts_with(crate::oci::SCHEME) {
                        let reference = wasm.get_ref().parse().map_err(|e| {
                            invalid(Some(wasm.span()), format!("server `{name}`: wasm: {e}"))
                        })?;
                        let store = crate::oci::Store::default_root().ok_or_else(|| {
                            invalid(
                                Some(wasm.span()),
                                format!("server `{name}`: an oci:// component is pulled into Moat's store, and there is none: set MOAT_DATA_DIR, XDG_DATA_HOME or HOME"),
                            )
                        })?;
                        WasmSource::Oci { reference, store }
                    } else {
                        WasmSource::File(base.join(wasm.get_ref()))
                    };
                    ServerKind::Wasm {
                        source,
                        instances: server.instance.map(Spanned::into_inner).unwrap_or_default(),
                    }
                }
                (None, Some(command), None) => {
                    if command.get_ref().is_empty() || command.get_ref().contains('\0') {
                        return Err(invalid(
                            Some(command.span()),
                            format!("server `{name}`: `command` must be a program name or path"),
                        ));
                    }
                    ServerKind::Native {
                        command: command.into_inner(),
                        base_dir: base.to_owned(),
                        cwd: server
                            .cwd
                            .map_or_else(|| base.to_owned(), |cwd| base.join(cwd)),
                        measure: server.measure.iter().map(|p| base.join(p)).collect(),
                    }
                }
                (None, None, Some(url)) => {
                    let span = url.span();
                    let url = parse_endpoint(url.get_ref()).map_err(|message| {
                        invalid(
                            Some(span.clone()),
                            format!("server `{name}`: url: {message}"),
                        )
                    })?;
                    if server.sandbox == Sandbox::Required {
                        return Err(invalid(
                            Some(span),
                            format!(
                                "server `{name}`: a remote server cannot be contained: no child process exists to sandbox, and `sandbox` is \"required\" (the default); set `sandbox = \"best-effort\"` to accept a server Moat does not run"
                            ),
                        ));
                    }
                    let local_only = [
                        ("cwd", server.cwd.is_some()),
                        ("measure", !server.measure.is_empty()),
                        ("sha256", server.sha256.is_some()),
                        ("allow_unmeasured", server.allow_unmeasured),
                        ("args", !server.args.is_empty()),
                        ("env", !server.env.is_empty()),
                        ("env_passthrough", !server.env_passthrough.is_empty()),
                        ("dirs", !server.dirs.is_empty()),
                        ("net", !server.net.is_empty()),
                    ];
                    if let Some((key, _)) = local_only.iter().find(|(_, set)| *set) {
                        return Err(invalid(
                            Some(span),
                            format!(
                                "server `{name}`: `{key}` applies to servers Moat runs, not to a remote `url`"
                            ),
                        ));
                    }
                    let bearer_token_env = match server.bearer_token_env {
                        None => None,
                        Some(var) => {
                            if !is_variable_name(var.get_ref()) {
                                return Err(invalid(
                                    Some(var.span()),
                                    format!(
                                        "server `{name}`: bearer_token_env: {:?} is not a variable name",
                                        var.get_ref()
                                    ),
                                ));
                            }
                            Some(var.into_inner())
                        }
                    };
                    ServerKind::Remote {
                        url,
                        bearer_token_env,
                    }
                }
                (None, None, None) => {
                    return Err(invalid(
                        Some(server_span),
                        format!(
                            "server `{name}`: one of `wasm = \"path\"`, `command = \"program\"` or `url = \"https://...\"` is required"
                        ),
                    ));
                }
                (wasm, command, url) => {
                    let span = [wasm, command, url]
                        .into_iter()
                        .flatten()
                        .map(|v| v.span())
                        .min_by_key(|span| span.start);
                    return Err(invalid(
                        span,
                        format!(
                            "server `{name}`: set one of `wasm`, `command` or `url`, not several"
                        ),
                    ));
                }
            };
            let sha256 = match server.sha256 {
                None => None,
                Some(value) => Some(value.get_ref().parse::<Digest>().map_err(|error| {
                    invalid(
                        Some(value.span()),
                        format!("server `{name}`: sha256: {error}"),
                    )
                })?),
            };
            for var in &server.env_passthrough {
                if !is_variable_name(var.get_ref()) {
                    return Err(invalid(
                        Some(var.span()),
                        format!(
                            "server `{name}`: env_passthrough: {:?} is not a variable name",
                            var.get_ref()
                        ),
                    ));
                }
            }
            for key in server.env.keys() {
                if !is_variable_name(key) {
                    return Err(invalid(
                        Some(server_span.clone()),
                        format!("server `{name}`: env: {key:?} is not a variable name"),
                    ));
                }
            }
            let limits = match server.limits {
                None => Limits::default(),
                Some(limits) => {
                    let span = limits.span();
                    let limits = limits.into_inner();
                    limits.validate().map_err(|message| {
                        invalid(Some(span), format!("server `{name}`: {message}"))
                    })?;
                    limits
                }
            };
            let is_wasm = matches!(kind, ServerKind::Wasm { .. });
            let mut dirs = Vec::new();
            for dir in server.dirs {
                let span = dir.span();
                let dir = dir.into_inner();
                let grant =
                    DirGrant::from_entry(&name, base, &dir.host, dir.guest, dir.mode, is_wasm)
                        .map_err(|message| invalid(Some(span), message))?;
                dirs.push(grant);
            }
            let package = match server.package {
                None => None,
                Some(record) if matches!(kind, ServerKind::Native { .. }) => {
                    Some(record.into_inner())
                }
                Some(record) => {
                    return Err(invalid(
                        Some(record.span()),
                        format!("server `{name}`: `package` applies to native `command` servers"),
                    ));
                }
            };
            let mut net = Vec::new();
            let mut http = Vec::new();
            for entry in &server.net {
                let at = |message| {
                    invalid(
                        Some(entry.span()),
                        format!("server `{name}`: net: {message}"),
                    )
                };
                match HttpGrant::parse(entry.get_ref()) {
                    Some(grant) => {
                        let grant = grant.map_err(at)?;
                        if is_wasm {
                            http.push(grant);
                        } else {
                            net.push(NetGrant {
                                host: grant.host,
                                port: grant.port,
                            });
                        }
                    }
                    None => net.push(entry.get_ref().parse::<NetGrant>().map_err(at)?),
                }
            }
            servers.insert(
                name.clone(),
                ServerSpec {
                    name,
                    kind,
                    sha256,
                    allow_unmeasured: server.allow_unmeasured,
                    args: server.args,
                    env: server.env,
                    env_passthrough: server
                        .env_passthrough
                        .into_iter()
                        .map(Spanned::into_inner)
                        .collect(),
                    limits,
                    dirs,
                    net,
                    http,
                    sandbox: server.sandbox,
                    package,
                    writers: Vec::new(),
                },
            );
        }
        let writers: Vec<Writer> = servers
            .values()
            .flat_map(|spec| {
                spec.dirs
                    .iter()
                    .filter(|d| d.mode == DirMode::Rw)
                    .map(|d| Writer {
                        server: spec.name.clone(),
                        grant: d.host.clone(),
                    })
            })
            .collect();
        for spec in servers.values_mut() {
            spec.writers = writers.clone();
        }
        #[cfg(unix)]
        for spec in servers.values() {
            check_writers(spec).map_err(|source| ConfigError::Writer {
                path: path.to_owned(),
                source: Box::new(source),
            })?;
        }
        Ok(Self {
            path: path.to_owned(),
            servers,
            serve: raw.serve,
            wasm: raw.wasm,
        })
    }

    /// The server named `name`, or an error listing the configured names.
    pub fn server(&self, name: &str) -> Result<&ServerSpec, ConfigError> {
        self.servers
            .get(name)
            .ok_or_else(|| ConfigError::UnknownServer {
                path: self.path.clone(),
                name: name.to_owned(),
                known: if self.servers.is_empty() {
                    "none".to_owned()
                } else {
                    self.servers.keys().cloned().collect::<Vec<_>>().join(", ")
                },
            })
    }
}

/// Refuses an `rw` grant of any server over what the native server `spec`
/// runs, as far as it can be known when the config is loaded: a command
/// that does not resolve yet, or a script that cannot be read, is checked
/// at its launch instead, which checks again in any case.
#[cfg(unix)]
fn check_writers(spec: &ServerSpec) -> Result<(), crate::grants::GrantError> {
    let ServerKind::Native {
        command,
        base_dir,
        measure,
        ..
    } = &spec.kind
    else {
        return Ok(());
    };
    let path_var = std::env::var_os("PATH");
    let executable = crate::command::resolve(command, base_dir, path_var.as_deref())
        .map(|resolved| resolved.target)
        .ok();
    let interpreter = executable
        .as_deref()
        .and_then(crate::script::script_interpreter);
    crate::grants::check_runs(
        &crate::grants::Runs {
            server: &spec.name,
            executable: executable.as_deref(),
            interpreter: interpreter.as_deref(),
            measure,
        },
        &spec.writers,
    )
}

/// Whether `name` can name an environment variable.
fn is_variable_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '\0'])
}

/// Separates the server name from the tool name in the names `moat serve`
/// exposes. Server names cannot contain it.
pub const SEPARATOR: &str = "__";

/// A server name: 1-32 of `[A-Za-z0-9_-]`, without `__` and not beginning
/// or ending with `_`, so that `server__tool` splits one way only (`a_` with
/// tool `x` and `a` with tool `_x` would both expose `a___x`).
pub(crate) fn valid_server_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && !name.contains(SEPARATOR)
        && !name.starts_with('_')
        && !name.ends_with('_')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Checks a configured endpoint and returns it normalised. Only `https`, or
/// `http` to a loopback address; no user name or password (use
/// `bearer_token_env`), no fragment.
pub fn parse_endpoint(text: &str) -> Result<String, String> {
    let url = url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    match url.scheme() {
        "https" => {}
        "http" if is_loopback(&url) => {}
        "http" => {
            return Err(format!(
                "{text:?}: plain http is allowed to loopback addresses only; use https"
            ));
        }
        other => return Err(format!("{text:?}: scheme `{other}` is not http or https")),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{text:?} has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "{:?} carries credentials; put a bearer token in the environment and name it with `bearer_token_env`",
            url.host_str().unwrap_or_default()
        ));
    }
    if url.fragment().is_some() {
        return Err(format!(
            "{text:?} has a fragment, which no endpoint receives"
        ));
    }
    Ok(url.to_string())
}

fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// The ecosystem a package comes from, which says how it is installed and
/// run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ecosystem {
    /// npm packages, installed with npm, run by node.
    Npm,
    /// Python distributions, installed with pip, run by python3.
    Python,
}

impl Ecosystem {
    /// The lockfile's name in an install.
    pub fn lockfile(self) -> &'static str {
        match self {
            Self::Npm => "package-lock.json",
            Self::Python => "requirements.txt",
        }
    }

    pub(crate) fn interpreter(self) -> &'static str {
        match self {
            Self::Npm => "node",
            Self::Python => "python3",
        }
    }
}

impl std::fmt::Display for Ecosystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Npm => "npm",
            Self::Python => "python",
        })
    }
}

/// A server's `package` record in moat.toml: what was installed, from what
/// request, and where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackageRecord {
    pub ecosystem: Ecosystem,
    /// The package (npm name or Python distribution).
    pub name: String,
    /// The exact version installed.
    pub version: String,
    /// Its extras as requested (Python: `pkg[extra]`), installed with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extras: Vec<String>,
    /// The other requirements installed beside it, as requested
    /// (`uvx --with REQ`, a second `npx -p PKG`): `moat update` moves the
    /// package on and installs these again as they are written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<String>,
    /// The program run: an npm `bin` name, a console script, or `-m MOD`.
    pub entry: String,
    /// The leading arguments that start the entry point; the server's own
    /// arguments follow them in `args`.
    pub entry_args: Vec<String>,
    /// The install in the store.
    pub store: PathBuf,
    /// The sha256 of its lockfile (inside `store`).
    pub lockfile_sha256: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/etc/moat/moat.toml"), text)
    }

    fn invalid_at(text: &str) -> (usize, usize, String) {
        match parse(text) {
            Err(ConfigError::Invalid {
                line,
                column,
                message,
                ..
            }) => (line, column, message),
            other => panic!("expected an invalid config, got {other:?}"),
        }
    }

    #[test]
    fn full_server_entry_parses_with_paths_relative_to_the_config() {
        let config = parse(
            r#"
[servers.everything]
wasm = "guests/everything.wasm"
sha256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
args = ["--verbose"]
env = { MODE = "test" }
env_passthrough = ["HOME"]
[servers.everything.limits]
fuel_per_request = 5
request_timeout_ms = 100
"#,
        )
        .unwrap();
        let server = config.server("everything").unwrap();
        assert_eq!(
            server.kind,
            ServerKind::Wasm {
                source: WasmSource::File(PathBuf::from("/etc/moat/guests/everything.wasm")),
                instances: Instances::Call,
            }
        );
        assert_eq!(server.limits.fuel_per_request, 5);
        assert_eq!(server.limits.request_timeout_ms, 100);
        assert_eq!(server.limits.memory_bytes, Limits::default().memory_bytes);
        assert_eq!(server.args, ["--verbose"]);
        assert!(matches!(server.expectation(), Some(Expectation::Pinned(_))));
    }

    #[test]
    fn endpoints_are_https_or_loopback_http_without_credentials() {
        assert_eq!(
            parse_endpoint("https://mcp.example.com/mcp").unwrap(),
            "https://mcp.example.com/mcp"
        );
        assert!(parse_endpoint("http://127.0.0.1:8080/mcp").is_ok());
        assert!(parse_endpoint("http://[::1]:8080/mcp").is_ok());
        assert!(parse_endpoint("http://localhost/mcp").is_ok());
        let plain = parse_endpoint("http://mcp.example.com/mcp").unwrap_err();
        assert!(
            plain.contains("plain http is allowed to loopback addresses only"),
            "{plain}"
        );
        let creds = parse_endpoint("https://user:hunter2@mcp.example.com/mcp").unwrap_err();
        assert!(creds.contains("bearer_token_env"), "{creds}");
        assert!(!creds.contains("hunter2"), "{creds}");
        assert!(
            parse_endpoint("ftp://mcp.example.com/")
                .unwrap_err()
                .contains("scheme `ftp`")
        );
        assert!(
            parse_endpoint("https://mcp.example.com/#x")
                .unwrap_err()
                .contains("fragment")
        );
        assert!(
            parse_endpoint("not a url")
                .unwrap_err()
                .contains("is not a URL")
        );
    }

    #[test]
    fn wasm_metering_is_fuel_unless_epoch_is_asked_for() {
        let config = parse("[servers.a]\nwasm = \"a.wasm\"\n").unwrap();
        assert_eq!(config.wasm.metering, CpuMetering::Fuel);
        let config =
            parse("[wasm]\nmetering = \"epoch\"\n[servers.a]\nwasm = \"a.wasm\"\n").unwrap();
        assert_eq!(config.wasm.metering, CpuMetering::Epoch);
        let (line, column, message) = invalid_at("[wasm]\nmetering = \"time\"\n");
        assert_eq!((line, column), (2, 12));
        assert!(
            message.contains("unknown variant `time`, expected `fuel` or `epoch`"),
            "{message}"
        );
    }

    #[test]
    fn a_bad_allocator_setting_is_refused_at_its_place() {
        let (line, column, message) = invalid_at("[wasm]\npool_instances = 0\n");
        assert_eq!((line, column), (2, 18));
        assert!(message.contains("nonzero"), "{message}");
        let (_, _, message) = invalid_at("[wasm]\nallocator = \"mmap\"\n");
        assert!(
            message.contains("expected `pooling` or `on-demand`"),
            "{message}"
        );
    }

    #[test]
    fn a_typed_component_gets_an_instance_per_call_unless_session_is_asked_for() {
        let instances = |text: &str| match &parse(text).unwrap().servers["a"].kind {
            ServerKind::Wasm { instances, .. } => *instances,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            instances("[servers.a]\nwasm = \"a.wasm\"\n"),
            Instances::Call
        );
        assert_eq!(
            instances("[servers.a]\nwasm = \"a.wasm\"\ninstance = \"session\"\n"),
            Instances::Session
        );
        let (line, column, message) =
            invalid_at("[servers.a]\nwasm = \"a.wasm\"\ninstance = \"sometimes\"\n");
        assert_eq!((line, column), (3, 12));
        assert!(
            message.contains("unknown variant `sometimes`, expected `call` or `session`"),
            "{message}"
        );
        let (line, _, message) =
            invalid_at("[servers.a]\nurl = \"https://mcp.example.com/mcp\"\ninstance = \"call\"\n");
        assert_eq!(line, 3);
        assert!(
            message.contains("`instance` applies to `wasm` servers only"),
            "{message}"
        );
    }

    #[test]
    fn http_net_entries_are_wasi_http_grants_for_wasm_and_tcp_for_native() {
        let config = parse(
            "[servers.w]\nwasm = \"w.wasm\"\nnet = [\"https://API.example.com\", \"http://127.0.0.1:8080\", \"10.0.0.1:22\"]\n\
             [servers.n]\ncommand = \"node\"\nnet = [\"https://api.example.com\"]\n",
        )
        .unwrap();
        let w = &config.servers["w"];
        assert_eq!(
            w.http.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["https://api.example.com:443", "http://127.0.0.1:8080"]
        );
        assert_eq!(
            w.net.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["10.0.0.1:22"]
        );
        let n = &config.servers["n"];
        assert!(n.http.is_empty());
        assert_eq!(
            n.net.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["api.example.com:443"]
        );
        let (line, _, message) =
            invalid_at("[servers.w]\nwasm = \"w.wasm\"\nnet = [\"https://api.example.com/v1\"]\n");
        assert_eq!(line, 3);
        assert!(message.contains("no path, query or user"), "{message}");
    }

    #[test]
    fn unknown_key_is_rejected_with_line_and_column() {
        let (line, column, message) =
            invalid_at("[servers.a]\nwasm = \"a.wasm\"\nwasn = \"typo\"\n");
        assert_eq!((line, column), (3, 1));
        assert!(message.contains("unknown field `wasn`"), "{message}");
    }

    #[test]
    fn unknown_limit_and_bad_value_are_rejected_where_they_are() {
        let (line, _, message) =
            invalid_at("[servers.a]\nwasm = \"a.wasm\"\n[servers.a.limits]\nfuel = 3\n");
        assert_eq!(line, 4);
        assert!(message.contains("unknown field `fuel`"), "{message}");
        let (line, column, message) = invalid_at(
            "[servers.a]\nwasm = \"a.wasm\"\n[servers.a.limits]\nmemory_bytes = \"lots\"\n",
        );
        assert_eq!((line, column), (4, 16));
        assert!(message.contains("invalid type"), "{message}");
    }

    #[test]
    fn bad_digest_names_server_and_position() {
        let (line, column, message) =
            invalid_at("[servers.a]\nwasm = \"a.wasm\"\nsha256 = \"1234\"\n");
        assert_eq!((line, column), (3, 10));
        assert!(message.contains("server `a`: sha256"), "{message}");
    }

    #[test]
    fn a_remote_server_must_not_claim_containment() {
        // sandbox = "required" is the default: a remote server cannot meet it.
        let (line, column, message) =
            invalid_at("[servers.gh]\nurl = \"https://mcp.example.com/mcp\"\n");
        assert_eq!((line, column), (2, 7));
        assert!(
            message.contains(
                "server `gh`: a remote server cannot be contained: no child process exists to sandbox"
            ),
            "{message}"
        );
        let config = parse(
            "[servers.gh]\nurl = \"https://mcp.example.com/mcp\"\nbearer_token_env = \"GH_TOKEN\"\nsandbox = \"best-effort\"\n",
        )
        .unwrap();
        assert_eq!(
            config.servers["gh"].kind,
            ServerKind::Remote {
                url: "https://mcp.example.com/mcp".into(),
                bearer_token_env: Some("GH_TOKEN".into()),
            }
        );
        // What only a local server can have is refused, by name.
        for (key, value) in [
            ("args", "[\"x\"]"),
            ("env", "{ A = \"b\" }"),
            ("net", "[\"example.com:443\"]"),
            ("sha256", &format!("\"{}\"", "0".repeat(64))),
        ] {
            let (_, _, message) = invalid_at(&format!(
                "[servers.gh]\nurl = \"https://mcp.example.com/mcp\"\nsandbox = \"best-effort\"\n{key} = {value}\n"
            ));
            assert!(
                message.contains(&format!(
                    "server `gh`: `{key}` applies to servers Moat runs, not to a remote `url`"
                )),
                "{key}: {message}"
            );
        }
        let (_, _, message) = invalid_at(
            "[servers.gh]\nurl = \"http://mcp.example.com/mcp\"\nsandbox = \"best-effort\"\n",
        );
        assert!(message.contains("plain http is allowed to loopback addresses only"));
        let (_, _, message) =
            invalid_at("[servers.gh]\nwasm = \"a.wasm\"\nurl = \"https://mcp.example.com/mcp\"\n");
        assert!(message.contains("set one of `wasm`, `command` or `url`, not several"));
        let (_, _, message) =
            invalid_at("[servers.gh]\nwasm = \"a.wasm\"\nbearer_token_env = \"T\"\n");
        assert!(message.contains("`bearer_token_env` applies to remote `url` servers only"));
    }

    #[test]
    fn zero_limit_and_missing_wasm_and_bad_name_are_rejected() {
        let (_, _, message) = invalid_at(
            "[servers.a]\nwasm = \"a.wasm\"\n[servers.a.limits]\nrequest_timeout_ms = 0\n",
        );
        assert!(message.contains("request_timeout_ms must be greater than 0"));
        let (line, _, message) = invalid_at("[serve]\nmax_body_bytes = 1024\nmax_sessions = 0\n");
        assert_eq!(line, 3, "{message}");
        assert!(message.contains("nonzero"), "{message}");
        let settings = parse("[serve]\nmax_sessions = 2\n").unwrap().serve;
        assert_eq!(settings.max_sessions.get(), 2);
        assert_eq!(
            settings.task_after_ms, None,
            "no task of Moat's unless asked"
        );
        let settings = parse("[serve]\ntask_after_ms = 250\n").unwrap().serve;
        assert_eq!(settings.task_after_ms.map(NonZeroU64::get), Some(250));
        let (line, _, message) = invalid_at("[serve]\ntask_after_ms = 0\n");
        assert_eq!(line, 2, "{message}");
        assert_eq!(
            settings.header_timeout_ms.get(),
            10_000,
            "the rest keep their defaults"
        );
        assert_eq!(settings.request_timeout_ms.get(), 30_000);
        let settings = parse("[serve]\nrequest_timeout_ms = 500\n").unwrap().serve;
        assert_eq!(settings.request_timeout_ms.get(), 500);
        let (_, _, message) = invalid_at("[servers.a]\nargs = []\n");
        assert!(message.contains(
            "one of `wasm = \"path\"`, `command = \"program\"` or `url = \"https://...\"` is required"
        ));
        let (line, _, message) = invalid_at("[servers.a]\nwasm = \"a.wasm\"\ncommand = \"node\"\n");
        assert_eq!(line, 2);
        assert!(
            message.contains("set one of `wasm`, `command` or `url`, not several"),
            "{message}"
        );
        let (_, _, message) = invalid_at("[servers.a]\nwasm = \"a.wasm\"\nmeasure = [\"x\"]\n");
        assert!(
            message.contains("`cwd` and `measure` apply to native"),
            "{message}"
        );
        let (_, _, message) = invalid_at("[servers.\"a__b\"]\nwasm = \"a.wasm\"\n");
        assert!(message.contains("server name `a__b`"));
        // `a_` (tool `x`) and `a` (tool `_x`) would both expose `a___x`.
        for name in ["a_", "_a"] {
            let (_, _, message) = invalid_at(&format!("[servers.{name}]\nwasm = \"a.wasm\"\n"));
            assert!(
                message.contains(&format!("server name `{name}`"))
                    && message.contains("not beginning or ending with `_`"),
                "{message}"
            );
        }
        assert!(valid_server_name("a_b") && valid_server_name("a-"));
    }

    #[test]
    fn native_server_entry_parses() {
        let config = parse(
            r#"
[servers.time]
command = "python3"
args = ["-m", "mcp_server_time", "$(touch X)"]
cwd = "work"
measure = ["venv/lib/site-packages/mcp_server_time"]
allow_unmeasured = true
[servers.time.limits]
cpu_seconds = 5
address_space_bytes = 1073741824
"#,
        )
        .unwrap();
        let server = config.server("time").unwrap();
        assert_eq!(
            server.kind,
            ServerKind::Native {
                command: "python3".into(),
                base_dir: PathBuf::from("/etc/moat"),
                cwd: PathBuf::from("/etc/moat/work"),
                measure: vec![PathBuf::from(
                    "/etc/moat/venv/lib/site-packages/mcp_server_time"
                )],
            }
        );
        assert_eq!(server.args[2], "$(touch X)");
        assert_eq!(server.limits.cpu_seconds, 5);
    }

    #[test]
    fn capabilities_parse_and_bad_ones_are_placed() {
        let config = parse(
            r#"
[servers.a]
wasm = "a.wasm"
net = ["127.0.0.1:8080", "[::1]:9", "example.org:443"]
sandbox = "best-effort"
[[servers.a.dirs]]
host = "data"
guest = "/data"
mode = "ro"
"#,
        )
        .unwrap();
        let server = config.server("a").unwrap();
        assert_eq!(server.sandbox, Sandbox::BestEffort);
        assert_eq!(
            server.dirs,
            [DirGrant {
                host: PathBuf::from("/etc/moat/data"),
                guest: "/data".into(),
                mode: DirMode::Ro,
                inode: None,
            }]
        );
        let shown: Vec<String> = server.net.iter().map(|n| n.to_string()).collect();
        assert_eq!(shown, ["127.0.0.1:8080", "[::1]:9", "example.org:443"]);

        let (line, column, message) =
            invalid_at("[servers.a]\nwasm = \"a.wasm\"\nnet = [\"localhost\"]\n");
        assert_eq!((line, column), (3, 8));
        assert!(message.contains("is not host:port"), "{message}");
        let (_, _, message) = invalid_at("[servers.a]\nwasm = \"a.wasm\"\nnet = [\"h:0\"]\n");
        assert!(message.contains("1-65535"), "{message}");
        let (line, _, message) = invalid_at(
            "[servers.a]\nwasm = \"a.wasm\"\n[[servers.a.dirs]]\nhost = \"d\"\nmode = \"rw\"\n",
        );
        assert_eq!(line, 3, "the [[servers.a.dirs]] entry");
        assert!(message.contains("needs `guest`"), "{message}");
        let (_, _, message) = invalid_at(
            "[servers.a]\nwasm = \"a.wasm\"\n[[servers.a.dirs]]\nhost = \"d\"\nguest = \"/d\"\nmode = \"rwx\"\n",
        );
        assert!(message.contains("unknown variant `rwx`"), "{message}");
        let (_, _, message) = invalid_at("[servers.a]\nwasm = \"a.wasm\"\nsandbox = \"off\"\n");
        assert!(message.contains("unknown variant `off`"), "{message}");
    }

    #[test]
    fn missing_digest_needs_consent() {
        let config = parse("[servers.a]\nwasm = \"a.wasm\"\n[servers.b]\nwasm = \"b.wasm\"\nallow_unmeasured = true\n").unwrap();
        assert_eq!(config.server("a").unwrap().expectation(), None);
        assert_eq!(
            config.server("b").unwrap().expectation(),
            Some(Expectation::Unpinned)
        );
        match config.server("c") {
            Err(ConfigError::UnknownServer { known, .. }) => assert_eq!(known, "a, b"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn environment_is_exact() {
        let mut spec = ServerSpec::wasm("a", "a.wasm");
        spec.env.insert("SET".into(), "1".into());
        spec.env_passthrough = vec!["PATH".into(), "MOAT_SURELY_UNSET_VAR".into()];
        let env = spec.environment();
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PATH", "SET"]);
    }
}

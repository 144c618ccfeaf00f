//! One `[servers.NAME]` entry, as written and checked: its kind (`wasm`,
//! `command` or `url`, and what applies to each), digest, environment,
//! limits, grants and package, turned into a [`ServerSpec`] or refused at
//! its place in the file; and what a server's name may be.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::{
    ConfigError, DirGrant, DirMode, HttpGrant, Instances, NetGrant, NodeTarget, PackageRecord,
    Sandbox, ServerKind, ServerSpec, WasmSource, parse_endpoint,
};
use crate::identity::Digest;
use crate::limits::Limits;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    wasm: Option<Spanned<String>>,
    instance: Option<Spanned<Instances>>,
    preinit: Option<Spanned<bool>>,
    command: Option<Spanned<String>>,
    url: Option<Spanned<String>>,
    /// A server launched on a node (`[nodes.NAME]`) by profile and revision.
    node: Option<Spanned<String>>,
    profile: Option<Spanned<String>>,
    revision: Option<Spanned<String>>,
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

/// The first key `server` sets that only a server Moat runs here can have.
fn local_only(server: &RawServer) -> Option<&'static str> {
    [
        ("cwd", server.cwd.is_some()),
        ("measure", !server.measure.is_empty()),
        ("sha256", server.sha256.is_some()),
        ("allow_unmeasured", server.allow_unmeasured),
        ("args", !server.args.is_empty()),
        ("env", !server.env.is_empty()),
        ("env_passthrough", !server.env_passthrough.is_empty()),
        ("dirs", !server.dirs.is_empty()),
        ("net", !server.net.is_empty()),
        ("instance", server.instance.is_some()),
        ("preinit", server.preinit.is_some()),
        ("package", server.package.is_some()),
    ]
    .into_iter()
    .find_map(|(key, set)| set.then_some(key))
}

/// The spec of server `name` from its entry `server`, or the error at the
/// place in the file (`invalid`) where the entry is wrong.
pub(super) fn spec(
    name: String,
    server: Spanned<RawServer>,
    base: &Path,
    nodes: &BTreeMap<String, NodeTarget>,
    invalid: &impl Fn(Option<Range<usize>>, String) -> ConfigError,
) -> Result<ServerSpec, ConfigError> {
    let server_span = server.span();
    let mut server = server.into_inner();
    let on_node = server.node.take();
    if on_node.is_none()
        && let Some(stray) = server.profile.as_ref().or(server.revision.as_ref())
    {
        return Err(invalid(
            Some(stray.span()),
            format!(
                "server `{name}`: `profile` and `revision` apply to a server on a node (`node = \"NAME\"`)"
            ),
        ));
    }
    if let Some(instance) = &server.instance
        && server.wasm.is_none()
    {
        return Err(invalid(
            Some(instance.span()),
            format!("server `{name}`: `instance` applies to `wasm` servers only"),
        ));
    }
    if let Some(preinit) = &server.preinit
        && server.wasm.is_none()
    {
        return Err(invalid(
            Some(preinit.span()),
            format!("server `{name}`: `preinit` applies to `wasm` servers only"),
        ));
    }
    if let Some(token) = &server.bearer_token_env
        && server.url.is_none()
    {
        return Err(invalid(
            Some(token.span()),
            format!("server `{name}`: `bearer_token_env` applies to remote `url` servers only"),
        ));
    }
    let local = local_only(&server);
    if let Some(node) = &on_node
        && let Some(other) = [&server.wasm, &server.command, &server.url]
            .into_iter()
            .flatten()
            .next()
    {
        return Err(invalid(
            Some(if other.span().start < node.span().start {
                other.span()
            } else {
                node.span()
            }),
            format!("server `{name}`: set one of `wasm`, `command`, `url` or `node`, not several"),
        ));
    }
    let mut kind = match (server.wasm, server.command, server.url) {
        (None, None, None) if let Some(node) = on_node => {
            if let Some(key) = local {
                return Err(invalid(
                    Some(node.span()),
                    format!(
                        "server `{name}`: `{key}` is the node's to set: a server on a node runs with the grants, limits and command of the node's own config"
                    ),
                ));
            }
            super::node::server_kind(
                &name,
                node,
                server.profile.take(),
                server.revision.take(),
                nodes,
                invalid,
            )?
        }
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
                preinit: server.preinit.is_none_or(Spanned::into_inner),
                http: Vec::new(),
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
                package: None,
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
            if let Some(key) = local {
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
                    crate::grants::env::check_name(var.get_ref()).map_err(|error| {
                        invalid(
                            Some(var.span()),
                            format!("server `{name}`: bearer_token_env: {error}"),
                        )
                    })?;
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
                    "server `{name}`: one of `wasm = \"path\"`, `command = \"program\"`, `url = \"https://...\"` or `node = \"NAME\"` is required"
                ),
            ));
        }
        (wasm, command, url) => {
            let span = [wasm, command, url, on_node]
                .into_iter()
                .flatten()
                .map(|v| v.span())
                .min_by_key(|span| span.start);
            return Err(invalid(
                span,
                format!(
                    "server `{name}`: set one of `wasm`, `command`, `url` or `node`, not several"
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
        crate::grants::env::check_name(var.get_ref()).map_err(|error| {
            invalid(
                Some(var.span()),
                format!("server `{name}`: env_passthrough: {error}"),
            )
        })?;
    }
    for key in server.env.keys() {
        crate::grants::env::check_name(key).map_err(|error| {
            invalid(
                Some(server_span.clone()),
                format!("server `{name}`: env: {error}"),
            )
        })?;
    }
    let limits = match server.limits {
        None => Limits::default(),
        Some(limits) => {
            let span = limits.span();
            let limits = limits.into_inner();
            limits
                .validate()
                .map_err(|message| invalid(Some(span), format!("server `{name}`: {message}")))?;
            limits
        }
    };
    let is_wasm = matches!(kind, ServerKind::Wasm { .. });
    let mut dirs = Vec::new();
    for dir in server.dirs {
        let span = dir.span();
        let dir = dir.into_inner();
        let grant = DirGrant::from_entry(&name, base, &dir.host, dir.guest, dir.mode, is_wasm)
            .map_err(|message| invalid(Some(span), message))?;
        dirs.push(grant);
    }
    if let Some(record) = server.package {
        match &mut kind {
            ServerKind::Native { package, .. } => *package = Some(record.into_inner()),
            _ => {
                return Err(invalid(
                    Some(record.span()),
                    format!("server `{name}`: `package` applies to native `command` servers"),
                ));
            }
        }
    }
    let mut net = Vec::new();
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
                match &mut kind {
                    ServerKind::Wasm { http, .. } => http.push(grant),
                    _ => net.push(NetGrant {
                        host: grant.host,
                        port: grant.port,
                    }),
                }
            }
            None => net.push(entry.get_ref().parse::<NetGrant>().map_err(at)?),
        }
    }
    Ok(ServerSpec {
        name,
        kind,
        sha256,
        allow_unmeasured: server.allow_unmeasured,
        args: server.args,
        env: crate::grants::EnvGrant {
            values: server.env,
            passthrough: server
                .env_passthrough
                .into_iter()
                .map(Spanned::into_inner)
                .collect(),
        },
        limits,
        dirs,
        net,
        sandbox: server.sandbox,
        writers: Vec::new(),
    })
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

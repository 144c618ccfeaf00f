//! Launch hosts as a front names them (`[nodes.NAME]`), and a server on one
//! (`node = "NAME"`, `profile`, `revision`): where the node listens (https
//! only: a node is never reached in the clear), the sha256 of the
//! certificate it must present, the Ed25519 public key its launch
//! statements must verify with, and the variable in Moat's environment
//! holding the token the front presents. Nothing here is sent to the node
//! but the profile and the revision.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, ServerKind};
use crate::identity::Digest;

/// A launch host the front may ask to run its servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeTarget {
    /// The name under `[nodes]`.
    pub name: String,
    /// `https://host:port`, with no path, query or credentials.
    pub url: String,
    /// The sha256 of the DER certificate the node must present.
    pub cert_sha256: Digest,
    /// The node's public key (64 hex digits), as `moat key show --public`
    /// prints it on the node.
    pub public_key: String,
    /// The variable in Moat's environment holding the front's token.
    pub token_env: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNode {
    url: Spanned<String>,
    cert_sha256: Spanned<String>,
    public_key: Spanned<String>,
    token_env: Spanned<String>,
}

/// The `[nodes]` table, checked.
pub(super) fn nodes(
    raw: BTreeMap<Spanned<String>, RawNode>,
    invalid: &impl Fn(Option<Range<usize>>, String) -> ConfigError,
) -> Result<BTreeMap<String, NodeTarget>, ConfigError> {
    let mut nodes = BTreeMap::new();
    for (name, raw) in raw {
        let span = name.span();
        let name = name.into_inner();
        if !super::valid_server_name(&name) {
            return Err(invalid(
                Some(span),
                format!("node name `{name}` must be 1-32 characters of A-Z, a-z, 0-9, `-` or `_`"),
            ));
        }
        let url = endpoint(raw.url.get_ref())
            .map_err(|m| invalid(Some(raw.url.span()), format!("node `{name}`: url: {m}")))?;
        let cert_sha256 = raw.cert_sha256.get_ref().parse::<Digest>().map_err(|e| {
            invalid(
                Some(raw.cert_sha256.span()),
                format!(
                    "node `{name}`: cert_sha256: {e} (the node prints its certificate's digest when it starts)"
                ),
            )
        })?;
        let key = raw.public_key.get_ref().trim();
        let hex_part = key.strip_prefix("ed25519:").unwrap_or(key);
        if hex_part.len() != 64 || !hex_part.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid(
                Some(raw.public_key.span()),
                format!(
                    "node `{name}`: public_key: {key:?} is not an Ed25519 public key (64 hex digits, as `moat key show --public` prints on the node)"
                ),
            ));
        }
        crate::grants::env::check_name(raw.token_env.get_ref()).map_err(|e| {
            invalid(
                Some(raw.token_env.span()),
                format!("node `{name}`: token_env: {e}"),
            )
        })?;
        nodes.insert(
            name.clone(),
            NodeTarget {
                name,
                url,
                cert_sha256,
                public_key: hex_part.to_ascii_lowercase(),
                token_env: raw.token_env.into_inner(),
            },
        );
    }
    Ok(nodes)
}

/// A node's address: `https://host[:port]`, nothing more.
fn endpoint(text: &str) -> Result<String, String> {
    let url = url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if url.scheme() != "https" {
        return Err(format!(
            "{text:?}: a node is reached over https only (its certificate is pinned by `cert_sha256`)"
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{text:?} has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "{text:?} carries credentials; name the variable holding the token with `token_env`"
        ));
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(format!(
            "{text:?}: give the node's address only (`https://host:port`), with no path, query or fragment"
        ));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// The kind of server `name` on node `node`, launched as `profile` at
/// `revision`.
pub(super) fn server_kind(
    name: &str,
    node: Spanned<String>,
    profile: Option<Spanned<String>>,
    revision: Option<Spanned<String>>,
    nodes: &BTreeMap<String, NodeTarget>,
    invalid: &impl Fn(Option<Range<usize>>, String) -> ConfigError,
) -> Result<ServerKind, ConfigError> {
    let span = node.span();
    let target = nodes.get(node.get_ref()).ok_or_else(|| {
        let known: Vec<&str> = nodes.keys().map(String::as_str).collect();
        invalid(
            Some(span.clone()),
            format!(
                "server `{name}`: node `{}` is not under [nodes] (named there: {})",
                node.get_ref(),
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ),
        )
    })?;
    let profile = match profile {
        Some(profile) if super::valid_server_name(profile.get_ref()) => profile.into_inner(),
        Some(profile) => {
            return Err(invalid(
                Some(profile.span()),
                format!(
                    "server `{name}`: profile {:?} is not a server name in a config",
                    profile.get_ref()
                ),
            ));
        }
        // The same name on the node as here.
        None => name.to_owned(),
    };
    let Some(revision) = revision else {
        return Err(invalid(
            Some(span),
            format!(
                "server `{name}`: a server on a node needs `revision`, the digest of the profile the node holds (`moat node revisions` on the node prints them)"
            ),
        ));
    };
    let revision = revision.get_ref().parse::<Digest>().map_err(|e| {
        invalid(
            Some(revision.span()),
            format!("server `{name}`: revision: {e}"),
        )
    })?;
    Ok(ServerKind::Node {
        node: target.clone(),
        profile,
        revision,
    })
}

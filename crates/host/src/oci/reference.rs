//! An OCI reference as written after `oci://`: `HOST/REPO[:TAG][@sha256:DIGEST]`,
//! each part checked against the distribution spec's grammar.

use std::fmt;
use std::str::FromStr;

use super::{OciError, SCHEME};
use crate::identity::Digest;

/// A component's place in a registry, as written after `oci://`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OciRef {
    /// `host` or `host:port`.
    pub registry: String,
    /// The repository path (lower-case components separated by `/`).
    pub repository: String,
    pub tag: Option<String>,
    /// The manifest's digest.
    pub digest: Option<Digest>,
}

impl fmt::Display for OciRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@sha256:{digest}")?;
        }
        Ok(())
    }
}

impl FromStr for OciRef {
    type Err = OciError;

    /// Parses `oci://HOST[:PORT]/REPO[:TAG][@sha256:DIGEST]`. The host is
    /// always explicit: no registry is assumed.
    fn from_str(text: &str) -> Result<Self, OciError> {
        let bad = |detail: &str| OciError::Reference {
            reference: crate::text::printable(text),
            detail: detail.to_owned(),
        };
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("an OCI reference starts with oci://"))?;
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("expected oci://HOST/REPOSITORY"))?;
        check_registry(registry).map_err(|d| bad(&d))?;
        let (name, digest) = match path.split_once('@') {
            Some((name, digest)) => {
                let hex = digest
                    .strip_prefix("sha256:")
                    .ok_or_else(|| bad("the digest after @ must be sha256:<64 hex digits>"))?;
                let digest: Digest = hex.parse().map_err(|e| bad(&format!("digest: {e}")))?;
                (name, Some(digest))
            }
            None => (path, None),
        };
        // A tag follows the last `:` after the last `/`.
        let last = name.rsplit('/').next().unwrap_or(name);
        let (repository, tag) = match last.rsplit_once(':') {
            Some((_, tag)) => (&name[..name.len() - tag.len() - 1], Some(tag.to_owned())),
            None => (name, None),
        };
        check_repository(repository).map_err(|d| bad(&d))?;
        if let Some(tag) = &tag {
            check_tag(tag).map_err(|d| bad(&d))?;
        }
        if tag.is_none() && digest.is_none() {
            return Err(bad(
                "name a tag (`:TAG`) or a manifest digest (`@sha256:...`), or both",
            ));
        }
        Ok(Self {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            tag,
            digest,
        })
    }
}

/// `host` or `host:port`: a DNS name, an IPv4 address or a bracketed IPv6
/// address; no user information.
fn check_registry(registry: &str) -> Result<(), String> {
    let host = host_of(registry)?;
    if host.is_empty() {
        return Err("the registry host is empty".into());
    }
    if registry.starts_with('[') {
        return host
            .parse::<std::net::Ipv6Addr>()
            .map(drop)
            .map_err(|_| format!("`{host}` is not an IPv6 address"));
    }
    let name_ok = host.split('.').all(|label| {
        !label.is_empty()
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    });
    if !name_ok {
        return Err(format!(
            "`{}` is not a registry host (a DNS name or an IP address, with an optional :PORT)",
            crate::text::printable(registry)
        ));
    }
    Ok(())
}

/// The host part of `host[:port]` (brackets removed), after checking the
/// port.
fn host_of(registry: &str) -> Result<&str, String> {
    let (host, port) = if let Some(inner) = registry.strip_prefix('[') {
        let (host, after) = inner
            .split_once(']')
            .ok_or_else(|| "an IPv6 registry is written [ADDRESS]:PORT".to_owned())?;
        match after {
            "" => (host, None),
            _ => (
                host,
                Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| "an IPv6 registry is written [ADDRESS]:PORT".to_owned())?,
                ),
            ),
        }
    } else {
        match registry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (registry, None),
        }
    };
    if let Some(port) = port
        && port.parse::<u16>().map_or(true, |p| p == 0)
    {
        return Err(format!(
            "`{}`: the port must be a number from 1 to 65535",
            crate::text::printable(registry)
        ));
    }
    Ok(host)
}

/// The distribution spec's repository grammar: lower-case alphanumeric
/// components separated by `/`, each with single `.`, `_`, `__` or `-`
/// runs between alphanumerics.
fn check_repository(repository: &str) -> Result<(), String> {
    let component_ok = |c: &str| {
        let bytes = c.as_bytes();
        !bytes.is_empty()
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
            && bytes.iter().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
            && !c.contains("..")
    };
    if repository.len() > 255 || !repository.split('/').all(component_ok) {
        return Err(format!(
            "`{}` is not a repository name (lower-case letters, digits and . _ - between them, in components separated by /)",
            crate::text::printable(repository)
        ));
    }
    Ok(())
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn check_tag(tag: &str) -> Result<(), String> {
    let bytes = tag.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= 128
        && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if !ok {
        return Err(format!(
            "`{}` is not a tag (letters, digits, _ . -, at most 128, not starting with . or -)",
            crate::text::printable(tag)
        ));
    }
    Ok(())
}

impl OciRef {
    /// Whether the registry is on loopback, and so reached over plain http.
    pub fn is_loopback(&self) -> bool {
        let Ok(host) = host_of(&self.registry) else {
            return false;
        };
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    /// This reference naming the manifest `digest` (its tag kept, for
    /// messages).
    pub fn with_digest(&self, digest: Digest) -> Self {
        Self {
            digest: Some(digest),
            ..self.clone()
        }
    }
}

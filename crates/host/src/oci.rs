//! Components from OCI registries: the reference syntax
//! (`oci://HOST/REPO[:TAG][@sha256:DIGEST]`), the content-addressed store
//! they are pulled into, and the pull itself, by Moat's own registry client
//! ([`registry`]; oci-client's manifest types parse what it fetches).
//!
//! The artifact layout is the one wkg, oras and Wassette's publishing
//! write: an OCI image manifest with exactly one layer of media type
//! `application/wasm`, the component. The layer's digest is therefore the
//! component's sha256, the digest Moat pins every server by.
//!
//! The store (`<package store>/oci`, see [`crate::dirs::store`])
//! keeps blobs by digest, as an OCI image layout does:
//! `blobs/sha256/<hex>` holds both manifests and components. A manifest is
//! kept only after its bytes hash to the digest it is named by, and a
//! component only after its bytes hash to the layer digest the manifest
//! names and its size is the size it declares; both are written to a
//! temporary file beside their place and renamed into it whole. A reference
//! with a digest whose manifest and layer are stored is resolved without
//! the network; a tag alone is looked up at every pull.
//!
//! Transport rules: https, verified against the platform's roots, except
//! that a registry on loopback (`localhost`, `127.0.0.0/8`, `[::1]`) is
//! reached over plain http. A redirect never leaves https for plain http,
//! and plain http never leaves loopback; a token realm is https, or plain
//! http on the loopback registry's own host. The `urls` a manifest may list
//! for a layer are never fetched, so a manifest cannot send the pull
//! elsewhere. Every answer is read with a cap as it streams (a manifest at
//! [`MAX_MANIFEST_BYTES`], a token answer at [`MAX_TOKEN_BYTES`],
//! a component at its declared size). Pulls are anonymous.

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use sha2::Digest as _;

use crate::identity::Digest;

mod registry;
pub use registry::MAX_TOKEN_BYTES;

/// The media type of the one layer of a wasm component artifact.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";

/// An OCI image manifest: what a component artifact's reference names.
const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// An image index (a manifest of manifests, one per platform): asked for
/// only to refuse it by name.
const OCI_INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// The largest manifest read, from the registry or the store. The
/// distribution spec lets registries refuse manifests above 4 MiB; a wasm
/// artifact's manifest is a few hundred bytes.
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// The largest component pulled: its declared size is checked before the
/// download, and the download stops at the declared size. Compiled, a
/// component is several times its size in memory; the largest real MCP
/// components (an interpreter with its standard library) are tens of MiB.
pub const MAX_COMPONENT_BYTES: u64 = 256 << 20;

/// The scheme of an OCI reference in `moat.toml`.
pub const SCHEME: &str = "oci://";

/// Why a component could not be named, pulled or stored.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("`{reference}`: {detail}")]
    Reference { reference: String, detail: String },
    #[error("pulling {reference}: {operation}: {detail}")]
    Registry {
        reference: String,
        operation: &'static str,
        detail: String,
    },
    #[error("pulling {reference}: {operation}: {url}: {detail}")]
    Http {
        reference: String,
        operation: &'static str,
        url: String,
        detail: String,
    },
    #[error(
        "pulling {reference}: {operation}: the answer from {url} runs past {limit} bytes ({bound}): refused"
    )]
    AnswerTooLarge {
        reference: String,
        operation: &'static str,
        url: String,
        limit: u64,
        bound: &'static str,
    },
    #[error("pulling {reference}: {operation}: refused the redirect from {from} to {to}: {why}")]
    Redirect {
        reference: String,
        operation: &'static str,
        from: String,
        to: String,
        why: &'static str,
    },
    #[error("pulling {reference}: {operation}: refused the token realm {realm}: {why}")]
    Realm {
        reference: String,
        operation: &'static str,
        realm: String,
        why: String,
    },
    #[error(
        "pulling {reference}: the registry's manifest hashes to sha256:{actual}, not the digest the reference names (sha256:{expected}): refused"
    )]
    ManifestDigest {
        reference: String,
        expected: Digest,
        actual: Digest,
    },
    #[error("pulling {reference}: not a wasm component artifact: {detail}")]
    Layout { reference: String, detail: String },
    #[error("pulling {reference}: the component is {size} bytes, above the limit of {limit} bytes")]
    TooLarge {
        reference: String,
        size: u64,
        limit: u64,
    },
    #[error(
        "pulling {reference}: the layer's bytes {detail}, not the layer sha256:{expected} the manifest names: refused"
    )]
    Layer {
        reference: String,
        expected: Digest,
        detail: String,
    },
    #[error("OCI store {path}: {source}", path = path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

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

/// A component resolved to the store: its reference (with the manifest's
/// digest), its manifest and layer digests, and its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pulled {
    pub reference: OciRef,
    pub manifest: Digest,
    /// The component's sha256.
    pub layer: Digest,
    pub size: u64,
    /// The component in the store.
    pub path: PathBuf,
    /// Whether anything was downloaded (false: the store had it).
    pub fetched: bool,
}

/// Moat's content-addressed store of OCI blobs.
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// The store at `root` (created at the first pull).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// `<package store>/oci`, when a data directory is known.
    pub fn default_root() -> Option<PathBuf> {
        crate::dirs::store().map(|store| store.join("oci"))
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn blobs(&self) -> PathBuf {
        self.root.join("blobs").join("sha256")
    }

    /// Where the blob with `digest` is kept.
    pub fn blob(&self, digest: Digest) -> PathBuf {
        self.blobs().join(digest.to_string())
    }

    /// The component that `reference` names, from the store alone: only a
    /// reference with a digest can be, and only when both its manifest and
    /// its layer are stored. The manifest is read and hashed again (a few
    /// hundred bytes); the component is measured at launch like any other.
    pub fn stored(&self, reference: &OciRef) -> Result<Option<Pulled>, OciError> {
        let Some(manifest) = reference.digest else {
            return Ok(None);
        };
        let path = self.blob(manifest);
        let raw = match read_bounded(&path, MAX_MANIFEST_BYTES) {
            Ok(raw) => raw,
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(OciError::Io { path, source }),
        };
        if Digest::of(&raw) != manifest {
            // Damaged or replaced: pulled again over it.
            tracing::warn!(path = %path.display(), "stored manifest does not match its digest; pulling it again");
            return Ok(None);
        }
        let (layer, size) = wasm_layer(reference, &raw)?;
        let component = self.blob(layer);
        match std::fs::metadata(&component) {
            Ok(meta) if meta.len() == size => Ok(Some(Pulled {
                reference: reference.clone(),
                manifest,
                layer,
                size,
                path: component,
                fetched: false,
            })),
            Ok(_) => Ok(None),
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(OciError::Io {
                path: component,
                source,
            }),
        }
    }

    /// Resolves `reference` to a stored component, downloading what the
    /// store lacks: with a digest and everything stored, nothing is
    /// fetched; a tag is looked up. Progress goes to stderr when it is a
    /// terminal.
    pub async fn pull(&self, reference: &OciRef) -> Result<Pulled, OciError> {
        if let Some(pulled) = self.stored(reference)? {
            return Ok(pulled);
        }
        let shown = reference.to_string();
        let mut registry = registry::Registry::new(reference)?;
        let target = match (reference.digest, &reference.tag) {
            (Some(digest), _) => format!("sha256:{digest}"),
            (None, Some(tag)) => tag.clone(),
            (None, None) => "latest".to_owned(),
        };
        tracing::info!(reference = %shown, "fetching manifest");
        let raw = registry
            .manifest(
                &target,
                &format!("{OCI_MANIFEST_MEDIA_TYPE}, {OCI_INDEX_MEDIA_TYPE}"),
                MAX_MANIFEST_BYTES as u64,
            )
            .await?;
        let manifest = Digest::of(&raw);
        if let Some(expected) = reference.digest
            && expected != manifest
        {
            return Err(OciError::ManifestDigest {
                reference: shown,
                expected,
                actual: manifest,
            });
        }
        let (layer, size) = wasm_layer(reference, &raw)?;
        let resolved = reference.with_digest(manifest);
        self.write_blob(manifest, &raw)?;
        if let Some(pulled) = self.stored(&resolved)? {
            return Ok(pulled);
        }
        let progress = Progress::start(&shown, size);
        let mut file = self.new_blob()?;
        let mut hasher = sha2::Sha256::new();
        let received = registry
            .blob(&format!("sha256:{layer}"), size, |chunk| {
                hasher.update(chunk);
                file.write_all(chunk).map_err(|source| OciError::Io {
                    path: file.path().to_owned(),
                    source,
                })
            })
            .await?;
        let actual = Digest::from_bytes(hasher.finalize().into());
        if received != size || actual != layer {
            return Err(OciError::Layer {
                reference: shown,
                expected: layer,
                detail: format!("are {received} bytes hashing to sha256:{actual}"),
            });
        }
        let path = self.keep_blob(file, layer)?;
        progress.done();
        Ok(Pulled {
            reference: resolved,
            manifest,
            layer,
            size,
            path,
            fetched: true,
        })
    }

    /// Writes a verified blob into its place whole.
    fn write_blob(&self, digest: Digest, bytes: &[u8]) -> Result<(), OciError> {
        let mut file = self.new_blob()?;
        file.write_all(bytes).map_err(|source| OciError::Io {
            path: file.path().to_owned(),
            source,
        })?;
        self.keep_blob(file, digest).map(drop)
    }

    /// A temporary file beside the blobs, gone unless kept.
    fn new_blob(&self) -> Result<tempfile::NamedTempFile, OciError> {
        let blobs = self.blobs();
        create_dir(&blobs)?;
        tempfile::NamedTempFile::new_in(&blobs).map_err(|source| OciError::Io {
            path: blobs,
            source,
        })
    }

    /// Syncs `file` and renames it into the place of the blob `digest`.
    fn keep_blob(
        &self,
        file: tempfile::NamedTempFile,
        digest: Digest,
    ) -> Result<PathBuf, OciError> {
        let path = self.blob(digest);
        file.as_file().sync_all().map_err(|source| OciError::Io {
            path: file.path().to_owned(),
            source,
        })?;
        file.persist(&path).map_err(|e| OciError::Io {
            path: path.clone(),
            source: e.error,
        })?;
        Ok(path)
    }
}

/// The one `application/wasm` layer of a manifest: its digest and size.
fn wasm_layer(reference: &OciRef, raw: &[u8]) -> Result<(Digest, u64), OciError> {
    let layout = |detail: String| OciError::Layout {
        reference: reference.to_string(),
        detail,
    };
    let value: serde_json::Value = serde_json::from_slice(raw)
        .map_err(|e| layout(format!("its manifest is not JSON: {e}")))?;
    let media_type = value.get("mediaType").and_then(|t| t.as_str());
    if media_type == Some(OCI_INDEX_MEDIA_TYPE) || value.get("manifests").is_some() {
        return Err(layout(
            "it is an image index (one manifest per platform); name the wasm manifest's own digest"
                .into(),
        ));
    }
    if let Some(other) = media_type.filter(|t| *t != OCI_MANIFEST_MEDIA_TYPE) {
        return Err(layout(format!(
            "its manifest has media type {}, not {OCI_MANIFEST_MEDIA_TYPE}",
            crate::text::printable(other)
        )));
    }
    let manifest: oci_client::manifest::OciImageManifest = serde_json::from_value(value)
        .map_err(|e| layout(format!("its manifest is not an OCI image manifest: {e}")))?;
    let [layer] = manifest.layers.as_slice() else {
        return Err(layout(format!(
            "it has {} layers; a component artifact has exactly one, of media type {WASM_LAYER_MEDIA_TYPE}",
            manifest.layers.len()
        )));
    };
    if layer.media_type != WASM_LAYER_MEDIA_TYPE {
        return Err(layout(format!(
            "its layer has media type {}, not {WASM_LAYER_MEDIA_TYPE}",
            crate::text::printable(&layer.media_type)
        )));
    }
    let digest: Digest = layer
        .digest
        .strip_prefix("sha256:")
        .ok_or_else(|| {
            layout(format!(
                "its layer digest {} is not sha256",
                crate::text::printable(&layer.digest)
            ))
        })?
        .parse()
        .map_err(|e| layout(format!("its layer digest: {e}")))?;
    let size = u64::try_from(layer.size)
        .map_err(|_| layout(format!("its layer size {} is negative", layer.size)))?;
    if size > MAX_COMPONENT_BYTES {
        return Err(OciError::TooLarge {
            reference: reference.to_string(),
            size,
            limit: MAX_COMPONENT_BYTES,
        });
    }
    Ok((digest, size))
}

fn create_dir(path: &Path) -> Result<(), OciError> {
    std::fs::create_dir_all(path).map_err(|source| OciError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Reads at most `limit` bytes of `path`; a longer file is an error.
fn read_bounded(path: &Path, limit: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(bytes)
}

/// The download's line on stderr, when that is a terminal.
struct Progress {
    shown: Option<(String, std::time::Instant)>,
}

impl Progress {
    fn start(reference: &str, size: u64) -> Self {
        use std::io::IsTerminal as _;
        tracing::info!(reference, bytes = size, "pulling component");
        let shown = std::io::stderr().is_terminal().then(|| {
            eprintln!(
                "moat: pulling {} ({} KiB)...",
                crate::text::printable(reference),
                size.div_ceil(1024)
            );
            (reference.to_owned(), std::time::Instant::now())
        });
        Self { shown }
    }

    fn done(self) {
        if let Some((reference, started)) = self.shown {
            eprintln!(
                "moat: pulled {} in {:.1} s",
                crate::text::printable(&reference),
                started.elapsed().as_secs_f64()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references_parse_and_print_back() {
        for text in [
            format!("oci://ghcr.io/microsoft/time-server-js@sha256:{HEX}"),
            format!("oci://127.0.0.1:5000/a/b:v1.2@sha256:{HEX}"),
            "oci://localhost:5000/x:latest".to_owned(),
            format!("oci://[::1]:5000/x@sha256:{HEX}"),
        ] {
            let parsed: OciRef = text.parse().unwrap();
            assert_eq!(parsed.to_string(), text);
        }
        let r: OciRef = "oci://reg.example:443/team/tool:1.0".parse().unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("reg.example:443", "team/tool", Some("1.0"))
        );
        assert!(!r.is_loopback());
        for loopback in [
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "[::1]:5000",
        ] {
            let r: OciRef = format!("oci://{loopback}/x:t").parse().unwrap();
            assert!(r.is_loopback(), "{loopback}");
        }
    }

    #[test]
    fn bad_references_name_what_is_wrong() {
        let cases = [
            ("https://ghcr.io/x:1", "starts with oci://"),
            ("oci://ghcr.io", "expected oci://HOST/REPOSITORY"),
            ("oci://ghcr.io/x", "name a tag"),
            ("oci://ghcr.io/X:1", "not a repository name"),
            ("oci://ghcr.io/x:-1", "not a tag"),
            ("oci://ghcr.io/x@md5:00", "sha256:<64 hex digits>"),
            ("oci://ghcr.io/x@sha256:00", "64 hex digits, found 2"),
            ("oci://user@ghcr.io/x:1", "not a registry host"),
            ("oci://ghcr.io:0/x:1", "port must be a number"),
            ("oci://ghcr.io:http/x:1", "port must be a number"),
            ("oci:///x:1", "registry host is empty"),
            ("oci://ghcr.io/a//b:1", "not a repository name"),
            ("oci://[::1/x:1", "[ADDRESS]:PORT"),
        ];
        for (text, expected) in cases {
            let error = text.parse::<OciRef>().unwrap_err().to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    fn manifest(layers: &str) -> Vec<u8> {
        format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST_MEDIA_TYPE}","config":{{"mediaType":"application/vnd.wasm.config.v0+json","digest":"sha256:{HEX}","size":2}},"layers":[{layers}]}}"#
        )
        .into_bytes()
    }

    #[test]
    fn only_one_wasm_layer_is_a_component() {
        let r: OciRef = "oci://localhost/x:t".parse().unwrap();
        let layer = |media: &str, size: i64| {
            format!(r#"{{"mediaType":"{media}","digest":"sha256:{HEX}","size":{size}}}"#)
        };
        let (digest, size) = wasm_layer(&r, &manifest(&layer("application/wasm", 7))).unwrap();
        assert_eq!((digest.to_string().as_str(), size), (HEX, 7));
        let cases = [
            (manifest(""), "it has 0 layers"),
            (
                manifest(&format!(
                    "{},{}",
                    layer("application/wasm", 1),
                    layer("application/wasm", 1)
                )),
                "it has 2 layers",
            ),
            (
                manifest(&layer("application/vnd.oci.image.layer.v1.tar", 1)),
                "media type application/vnd.oci.image.layer.v1.tar",
            ),
            (
                manifest(&layer("application/wasm", -1)),
                "size -1 is negative",
            ),
            (
                manifest(&layer("application/wasm", MAX_COMPONENT_BYTES as i64 + 1)),
                "above the limit",
            ),
            (
                br#"{"schemaVersion":2,"manifests":[]}"#.to_vec(),
                "image index",
            ),
            (b"not json".to_vec(), "not JSON"),
        ];
        for (raw, expected) in cases {
            let error = wasm_layer(&r, &raw).unwrap_err().to_string();
            assert!(error.contains(expected), "{expected}: {error}");
        }
    }

    #[test]
    fn a_stored_manifest_that_was_altered_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let component = b"\0asm component bytes";
        let layer = Digest::of(component);
        let raw = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST_MEDIA_TYPE}","config":{{"mediaType":"application/vnd.wasm.config.v0+json","digest":"sha256:{HEX}","size":2}},"layers":[{{"mediaType":"application/wasm","digest":"sha256:{layer}","size":{}}}]}}"#,
            component.len()
        );
        let manifest = Digest::of(raw.as_bytes());
        let reference: OciRef = format!("oci://localhost/x@sha256:{manifest}")
            .parse()
            .unwrap();
        assert_eq!(store.stored(&reference).unwrap(), None, "empty store");
        store.write_blob(manifest, raw.as_bytes()).unwrap();
        assert_eq!(store.stored(&reference).unwrap(), None, "no layer yet");
        store.write_blob(layer, component).unwrap();
        let pulled = store.stored(&reference).unwrap().unwrap();
        assert_eq!((pulled.layer, pulled.fetched), (layer, false));
        assert_eq!(std::fs::read(&pulled.path).unwrap(), component);
        std::fs::write(store.blob(manifest), raw.replace("wasm\"", "wasm \"")).unwrap();
        assert_eq!(store.stored(&reference).unwrap(), None, "altered manifest");
    }
}

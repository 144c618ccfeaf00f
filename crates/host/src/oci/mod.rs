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
//!
//! The reference is [`reference`], the store and the pull [`store`], the
//! manifest's one wasm layer [`manifest`], and the requests to the
//! registry [`registry`].

mod manifest;
mod reference;
mod registry;
mod store;

use std::path::PathBuf;

use crate::identity::Digest;

pub use reference::OciRef;
pub use registry::MAX_TOKEN_BYTES;
pub use store::Store;

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

#[cfg(test)]
mod tests;

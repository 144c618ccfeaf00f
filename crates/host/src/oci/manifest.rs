//! A component artifact's manifest: exactly one `application/wasm` layer,
//! whose digest and declared size are what the pull checks.

use super::{
    MAX_COMPONENT_BYTES, OCI_INDEX_MEDIA_TYPE, OCI_MANIFEST_MEDIA_TYPE, OciError, OciRef,
    WASM_LAYER_MEDIA_TYPE,
};
use crate::identity::Digest;

/// The one `application/wasm` layer of a manifest: its digest and size.
pub(super) fn wasm_layer(reference: &OciRef, raw: &[u8]) -> Result<(Digest, u64), OciError> {
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

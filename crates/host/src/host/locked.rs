//! A spec under the lock: refused when revoked, its grants pinned to the
//! inodes the lock saw, its OCI reference to the manifest the lock approved.

use super::ConnectError;
use crate::config::{ServerKind, ServerSpec, WasmSource};
use crate::identity::Digest;
use crate::lock::LockedServer;
use crate::revoke::Revoked;

/// The revocation that forbids launching `server` as `locked` pins it: of
/// its name, of its digest or of its OCI manifest. (Its tools' revocations
/// are the gateway's to enforce, per call.)
pub(crate) fn revoked_before_launch(
    revoked: &Revoked,
    server: &str,
    locked: &LockedServer,
) -> Option<String> {
    revoked
        .of_name(server, None)
        .or_else(|| revoked.of_digests(&locked.digests()))
        .map(crate::revoke::describe)
}

/// `spec` with each grant pinned to the inode the lock recorded for it. A
/// grant the lock does not list was added since `moat lock`: its path is
/// the error.
pub(crate) fn pin_grants(spec: &ServerSpec, locked: &LockedServer) -> Result<ServerSpec, String> {
    let mut spec = spec.clone();
    crate::grants::fs::pin(&mut spec.dirs, &locked.grants)
        .map_err(|host| host.display().to_string())?;
    Ok(spec)
}

/// `spec` with its OCI reference pinned to the manifest the lock approved:
/// a tag is not looked up again under the lock. A reference other than the
/// locked one is a conflict, and so is a digest other than the locked one.
pub(crate) fn pin_oci(
    mut spec: ServerSpec,
    locked: &LockedServer,
    lock_name: &str,
) -> Result<ServerSpec, Box<ConnectError>> {
    let ServerKind::Wasm {
        source: WasmSource::Oci { reference, .. },
        ..
    } = &mut spec.kind
    else {
        return Ok(spec);
    };
    let Some(approved) = &locked.oci else {
        return Err(Box::new(ConnectError::BadLock {
            server: spec.name.clone(),
            lock: lock_name.to_owned(),
            detail: format!(
                "the config names {reference}, and the lock records no OCI artifact for it: run `moat lock`"
            ),
        }));
    };
    let manifest: Digest = approved.manifest.parse().map_err(|e| {
        Box::new(ConnectError::BadLock {
            server: spec.name.clone(),
            lock: lock_name.to_owned(),
            detail: format!("oci.manifest: {e}"),
        })
    })?;
    if reference.to_string() != approved.reference
        || reference.digest.is_some_and(|digest| digest != manifest)
    {
        return Err(Box::new(ConnectError::OciLockConflict {
            server: spec.name.clone(),
            config: reference.to_string(),
            locked: format!("{} (manifest sha256:{manifest})", approved.reference),
        }));
    }
    *reference = reference.with_digest(manifest);
    Ok(spec)
}

//! The compiled-component cache: each file is native code that Moat runs
//! outside every sandbox, so it carries an HMAC-SHA256 under a per-user key
//! over the component's digest, the engine's hash and the payload; a file
//! Moat did not write for this component and engine is recompiled, never
//! loaded. Files are written whole (a temporary file, then a rename).

use super::*;

/// First bytes of every cache file Moat writes.
pub(super) const CACHE_MAGIC: &[u8; 12] = b"MOAT-CWASM3\n";

/// The cache key's file name, inside the cache directory.
pub(super) const CACHE_KEY_FILE: &str = "cache.key";

/// Where a compiled component came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from a cache file whose payload was read and its MAC
    /// verified (and the file then sealed).
    Hit,
    /// Mapped straight from a cache file whose seal says it is the file
    /// verified before: nothing read or hashed.
    Mapped,
    /// Compiled: no cache file, or no cache configured.
    Compiled,
    /// A cache file existed but was corrupt or foreign: compiled afresh and
    /// the file rewritten.
    Recompiled,
    /// Already prepared by this engine: reused from memory.
    Memory,
}

/// What a cache file's MAC binds: the key, the component and the engine.
pub(super) struct MacContext<'a> {
    pub(super) key: &'a crate::keys::Key,
    pub(super) digest: Digest,
    pub(super) engine: String,
}

impl MacContext<'_> {
    pub(super) fn mac(&self, payload: &[u8]) -> hmac::Hmac<Sha256> {
        use hmac::Mac;
        let mut mac = self.key.mac();
        mac.update(CACHE_MAGIC);
        mac.update(self.digest.as_bytes());
        mac.update(self.engine.as_bytes());
        mac.update(payload);
        mac
    }

    /// What the seal of a verified cache file is for: this component on
    /// this engine.
    pub(super) fn purpose(&self) -> Vec<u8> {
        let mut purpose = b"compiled component\n".to_vec();
        purpose.extend_from_slice(self.digest.as_bytes());
        purpose.extend_from_slice(self.engine.as_bytes());
        purpose
    }

    /// The component in `cache_path`: mapped straight from the file when
    /// its seal says it is the file verified before; else read, its MAC
    /// (in `cache_path.mac`) checked in constant time, and sealed. The
    /// outcome to report when it cannot be used.
    pub(super) fn load(
        &self,
        engine: &Engine,
        cache_path: &Path,
    ) -> Result<(Component, CacheOutcome), CacheOutcome> {
        use hmac::Mac;
        use std::io::Read as _;
        let mac_path = with_suffix(cache_path, ".mac");
        let seal_path = with_suffix(cache_path, ".seal");
        let mut file = match crate::keys::open_private(cache_path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(CacheOutcome::Compiled);
            }
            Err(error) => {
                tracing::warn!(path = %cache_path.display(), %error, "unreadable cache file; recompiling");
                return Err(CacheOutcome::Recompiled);
            }
        };
        let stat = file
            .metadata()
            .ok()
            .as_ref()
            .and_then(crate::seal::Stat::of);
        let recorded = crate::keys::read_private(&mac_path).unwrap_or_default();
        let sealed = stat.as_ref().is_some_and(|stat| {
            crate::seal::read(&seal_path, self.key, &self.purpose(), stat)
                .is_some_and(|claim| !recorded.is_empty() && claim == recorded)
        });
        if sealed {
            // SAFETY: `Component::deserialize_file` maps the file and runs it
            // as native code. The file is the one whose payload MAC, under the
            // per-user key that only Moat reads, was verified for exactly this
            // component and engine, and it has not changed since (same inode,
            // size, mtime and ctime, sealed under the same key). Wasmtime
            // also checks the header for engine compatibility.
            match unsafe { Component::deserialize_file(engine, cache_path) } {
                Ok(component) => return Ok((component, CacheOutcome::Mapped)),
                Err(error) => {
                    tracing::warn!(path = %cache_path.display(), %error, "sealed cache file did not load; recompiling");
                    return Err(CacheOutcome::Recompiled);
                }
            }
        }
        let mut payload = Vec::new();
        if let Err(error) = file.read_to_end(&mut payload) {
            tracing::warn!(path = %cache_path.display(), %error, "unreadable cache file; recompiling");
            return Err(CacheOutcome::Recompiled);
        }
        if self.mac(&payload).verify_slice(&recorded).is_err() {
            tracing::warn!(path = %cache_path.display(), "cache file not written by Moat for this component and engine; recompiling");
            return Err(CacheOutcome::Recompiled);
        }
        // SAFETY: `Component::deserialize` runs the payload as native code.
        // The payload is only used when its MAC, under the per-user key that
        // only Moat reads, matches this component's digest, this engine's
        // compatibility hash and the payload: Moat wrote it for exactly this
        // component and engine. Wasmtime additionally checks the header for
        // engine compatibility.
        match unsafe { Component::deserialize(engine, &payload) } {
            Ok(component) => {
                if let Some(stat) = &stat
                    && let Err(error) =
                        crate::seal::write(&seal_path, self.key, &self.purpose(), stat, &recorded)
                {
                    tracing::debug!(path = %seal_path.display(), %error, "could not seal a cache file");
                }
                Ok((component, CacheOutcome::Hit))
            }
            Err(error) => {
                tracing::warn!(path = %cache_path.display(), %error, "foreign cache file; recompiling");
                Err(CacheOutcome::Recompiled)
            }
        }
    }
}

/// `path` with `suffix` appended to its file name.
pub(super) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Writes the compiled component as wasmtime serialized it (so it can be
/// mapped), with its MAC in `cache_path.mac`; the MAC goes first, so a
/// reader between the two sees a mismatch, never a match for other bytes.
pub(super) fn write_cache(
    cache_path: &Path,
    context: &MacContext<'_>,
    component: &Component,
) -> std::io::Result<()> {
    use hmac::Mac;
    let payload = component
        .serialize()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mac = context.mac(&payload).finalize().into_bytes();
    crate::keys::write_private(&with_suffix(cache_path, ".mac"), &mac)?;
    crate::keys::write_private(cache_path, &payload)
}

/// The snapshot digest a snapshot record holds (see
/// `WasmEngine::snapshot_cache_path`), if it reads as one. It is bound into
/// the MAC of the compiled file it names, so a changed record only names a
/// file that fails its check, or none.
pub(super) fn read_snapshot_digest(record: &Path) -> Option<Digest> {
    let text = crate::keys::read_private(record).ok()?;
    std::str::from_utf8(&text).ok()?.trim().parse().ok()
}

/// Writes a snapshot's compiled component to its own file (as
/// [`write_cache`] does), then the record naming it, then removes the
/// `stale` file the record named before: a reader sees the old record and
/// file or the new ones (a start that mapped the old file keeps its
/// mapping).
pub(super) fn write_snapshot_cache(
    record: &Path,
    compiled: &Path,
    context: &MacContext<'_>,
    component: &Component,
    snapshot: Digest,
    stale: Option<PathBuf>,
) -> std::io::Result<()> {
    write_cache(compiled, context, component)?;
    crate::keys::write_private(record, snapshot.to_string().as_bytes())?;
    if let Some(stale) = stale {
        for suffix in ["", ".mac", ".seal"] {
            let _ = std::fs::remove_file(with_suffix(&stale, suffix));
        }
    }
    Ok(())
}

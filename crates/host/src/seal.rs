//! Stat seals: what Moat verified about a file's bytes (a component's
//! digest, a compiled file's MAC), bound under the cache key to the file's
//! identity as the kernel keeps it (device, inode, size, mtime, ctime), so
//! a file unchanged since is neither read nor hashed again on the hot path.
//!
//! Why this holds: any write to a file, a copy over it or a rename onto its
//! name changes its inode or its ctime, and ctime cannot be set from user
//! space. Timestamps can be coarse (a clock tick) on older kernels, so a
//! seal is only written for a file whose ctime is at least [`SETTLED`] in
//! the past (git's "racy clean" rule): a change within the same tick as
//! the verification would otherwise look unchanged. A seal that does not
//! match, or whose MAC fails, only means the slow path: read and verify.

use std::path::Path;

use hmac::Mac as _;

use crate::keys::Key;

/// How old a file's ctime must be before its verification is sealed.
pub const SETTLED: std::time::Duration = std::time::Duration::from_secs(2);

/// A file's identity as the kernel keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stat {
    /// From a file's metadata (`None` off unix, where nothing is sealed).
    pub fn of(meta: &std::fs::Metadata) -> Option<Self> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            Some(Self {
                dev: meta.dev(),
                ino: meta.ino(),
                size: meta.size(),
                mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
                ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
            })
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            None
        }
    }

    fn bytes(&self) -> [u8; 64] {
        let mut out = [0u8; 64];
        out[..8].copy_from_slice(&self.dev.to_le_bytes());
        out[8..16].copy_from_slice(&self.ino.to_le_bytes());
        out[16..24].copy_from_slice(&self.size.to_le_bytes());
        out[24..40].copy_from_slice(&self.mtime_ns.to_le_bytes());
        out[40..56].copy_from_slice(&self.ctime_ns.to_le_bytes());
        out
    }

    /// Whether the file last changed at least [`SETTLED`] before `now_ns`.
    pub fn settled(&self, now_ns: i128) -> bool {
        self.ctime_ns + SETTLED.as_nanos() as i128 <= now_ns
    }
}

/// Now, in nanoseconds since the epoch (as ctime counts).
pub fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// The MAC of a seal: `purpose`, the file's stat bytes and the claim.
fn mac(key: &Key, purpose: &[u8], stat: &[u8], claim: &[u8]) -> hmac::Hmac<sha2::Sha256> {
    let mut mac = key.mac();
    mac.update(b"moat-seal\n");
    mac.update(&(purpose.len() as u64).to_le_bytes());
    mac.update(purpose);
    mac.update(stat);
    mac.update(claim);
    mac
}

/// The claim sealed at `seal_path` for a file that now has `stat`, if the
/// seal is for exactly that file state and its MAC holds.
pub fn read(seal_path: &Path, key: &Key, purpose: &[u8], stat: &Stat) -> Option<Vec<u8>> {
    let file = crate::keys::read_private(seal_path).ok()?;
    let (body, recorded) = file.split_at(file.len().checked_sub(32)?);
    let (sealed_stat, claim) = body.split_at_checked(64)?;
    if sealed_stat != stat.bytes() {
        return None;
    }
    let check = mac(key, purpose, sealed_stat, claim);
    check.verify_slice(recorded).ok()?;
    Some(claim.to_vec())
}

/// Seals `claim` for a file that has `stat`, at `seal_path` (see
/// [`crate::keys::write_private`]). Nothing is written for a file
/// that changed less than [`SETTLED`] ago.
pub fn write(
    seal_path: &Path,
    key: &Key,
    purpose: &[u8],
    stat: &Stat,
    claim: &[u8],
) -> std::io::Result<()> {
    if !stat.settled(now_ns()) {
        return Ok(());
    }
    let mut body = stat.bytes().to_vec();
    body.extend_from_slice(claim);
    body.extend_from_slice(
        &mac(key, purpose, &stat.bytes(), claim)
            .finalize()
            .into_bytes(),
    );
    if let Some(parent) = seal_path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    crate::keys::write_private(seal_path, &body)
}

/// Seals file digests in one directory under one key: what the launchers
/// use to skip hashing an executable, an interpreter or a component that
/// has not changed since it was hashed.
#[derive(Clone)]
pub struct Sealer {
    key: Key,
    dir: std::path::PathBuf,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").field("dir", &self.dir).finish()
    }
}

/// How a digest was known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DigestSource {
    /// The bytes were read and hashed.
    Hashed,
    /// From the file's seal: unchanged since it was last hashed.
    Sealed,
}

impl Sealer {
    /// Seals kept in `dir` under `key`.
    pub fn new(key: Key, dir: std::path::PathBuf) -> Self {
        Self { key, dir }
    }

    fn path_for(&self, path: &Path) -> std::path::PathBuf {
        let name = crate::identity::Digest::of(path.as_os_str().as_encoded_bytes());
        self.dir.join(format!("{name}.digest"))
    }

    /// The digest of the file at `path` whose metadata is `meta`: from its
    /// seal when the file is unchanged since it was sealed, else `hash()`,
    /// which is then sealed.
    pub fn digest<E>(
        &self,
        path: &Path,
        meta: &std::fs::Metadata,
        hash: impl FnOnce() -> Result<crate::identity::Digest, E>,
    ) -> Result<(crate::identity::Digest, DigestSource), E> {
        let seal_path = self.path_for(path);
        let stat = Stat::of(meta);
        if let Some(stat) = &stat
            && let Some(claim) = read(&seal_path, &self.key, b"file digest", stat)
            && let Ok(bytes) = <[u8; 32]>::try_from(claim.as_slice())
        {
            return Ok((
                crate::identity::Digest::from_bytes(bytes),
                DigestSource::Sealed,
            ));
        }
        let digest = hash()?;
        if let Some(stat) = &stat
            && let Err(error) = write(
                &seal_path,
                &self.key,
                b"file digest",
                stat,
                digest.as_bytes(),
            )
        {
            tracing::debug!(path = %seal_path.display(), %error, "could not seal a digest");
        }
        Ok((digest, DigestSource::Hashed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(byte: u8) -> Key {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("k"), [byte; crate::keys::KEY_BYTES]).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path().join("k"), std::fs::Permissions::from_mode(0o600))
                .unwrap();
        }
        crate::keys::user_key(dir.path(), "k").unwrap()
    }

    #[test]
    fn a_seal_holds_for_that_file_state_and_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let seal = dir.path().join("x.seal");
        let old = Stat {
            dev: 1,
            ino: 2,
            size: 3,
            mtime_ns: 4,
            ctime_ns: 5,
        };
        let key = key_of(7);
        write(&seal, &key, b"digest", &old, b"claim").unwrap();
        assert_eq!(
            read(&seal, &key, b"digest", &old).as_deref(),
            Some(&b"claim"[..])
        );
        assert_eq!(read(&seal, &key, b"other purpose", &old), None);
        assert_eq!(
            read(&seal, &key_of(8), b"digest", &old),
            None,
            "another key"
        );
        for changed in [
            Stat { ino: 9, ..old },
            Stat { size: 9, ..old },
            Stat { mtime_ns: 9, ..old },
            Stat { ctime_ns: 9, ..old },
            Stat { dev: 9, ..old },
        ] {
            assert_eq!(read(&seal, &key, b"digest", &changed), None, "{changed:?}");
        }
        // A claim edited in the file fails the MAC.
        let mut bytes = std::fs::read(&seal).unwrap();
        bytes[64] ^= 1;
        std::fs::write(&seal, &bytes).unwrap();
        assert_eq!(read(&seal, &key, b"digest", &old), None);
    }

    #[test]
    fn a_file_that_changed_just_now_is_not_sealed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "fresh").unwrap();
        let stat = Stat::of(&std::fs::metadata(&file).unwrap()).unwrap();
        assert!(!stat.settled(now_ns()));
        assert!(stat.settled(now_ns() + SETTLED.as_nanos() as i128 + 1));
        let seal = dir.path().join("f.seal");
        write(&seal, &key_of(1), b"digest", &stat, b"claim").unwrap();
        assert!(
            !seal.exists(),
            "racy: a change within the tick would look unchanged"
        );
    }
}

//! The claim signing key: an Ed25519 key whose 32-byte seed is a private
//! key file of its own (`claim.key`, made and read as the audit key is, in
//! the same directory, which no grant may reach), its public half printed by
//! `moat key show` and pinned by whoever verifies. Rotating retires the
//! key: its public half is kept in `claim.retired` (claims signed with it
//! still verify with it), its seed is removed.

use std::io::Write;
use std::path::{Path, PathBuf};

use ring::signature::{Ed25519KeyPair, KeyPair};

pub use crate::signature::{ALGORITHM, PublicKey, Signature};

use super::ClaimError;

/// The signing key's file name, beside the audit key.
pub const KEY_FILE: &str = "claim.key";
/// The retired public keys' file name: one `HEX unix_ms` line each.
pub const RETIRED_FILE: &str = "claim.retired";

/// Moat's claim signing key.
pub struct SigningKey {
    pair: Ed25519KeyPair,
    path: PathBuf,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({}, {})", self.path.display(), self.public())
    }
}

impl SigningKey {
    /// The signing key in `dir`, made there when `create` and there is
    /// none (see [`crate::keys::user_key`]).
    pub fn in_dir(dir: &Path, create: bool) -> Result<Self, ClaimError> {
        let path = dir.join(KEY_FILE);
        let seed = if create {
            crate::keys::user_key(dir, KEY_FILE)
        } else {
            crate::keys::existing_key(dir, KEY_FILE)
        }
        .map_err(|source| ClaimError::Key {
            path: path.clone(),
            operation: "reading the claim signing key",
            source,
        })?;
        let pair = Ed25519KeyPair::from_seed_unchecked(seed.secret_bytes()).map_err(|e| {
            ClaimError::Key {
                path: path.clone(),
                operation: "making the Ed25519 key from its seed",
                source: std::io::Error::other(e.to_string()),
            }
        })?;
        Ok(Self { pair, path })
    }

    /// Its public half.
    pub fn public(&self) -> PublicKey {
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(self.pair.public_key().as_ref());
        PublicKey::from_bytes(bytes)
    }

    /// Its file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The Ed25519 signature of `message`.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.pair.sign(message).as_ref().to_vec()
    }

    /// This key's signature of `value` in `domain` (see
    /// [`crate::signature::signed_bytes`]).
    pub fn signature(&self, domain: &str, value: &impl serde::Serialize) -> Signature {
        let value = serde_json::to_value(value).unwrap_or_default();
        Signature {
            algorithm: ALGORITHM.to_owned(),
            public_key: self.public().to_string(),
            value: hex::encode(self.sign(&crate::signature::signed_bytes(domain, &value))),
        }
    }
}

/// A retired public key and when it was retired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retired {
    pub key: PublicKey,
    pub unix_ms: u64,
}

/// Retires the signing key in `dir` (its public half kept in
/// [`RETIRED_FILE`], its seed removed) and makes a new one. A running
/// `moat serve` keeps signing with the key it read until it restarts.
pub fn rotate(dir: &Path) -> Result<(Option<PublicKey>, SigningKey), ClaimError> {
    let old = match SigningKey::in_dir(dir, false) {
        Ok(old) => Some(old),
        Err(ClaimError::Key { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            None
        }
        Err(error) => return Err(error),
    };
    if let Some(old) = &old {
        let retired = dir.join(RETIRED_FILE);
        let io = |operation| {
            let path = retired.clone();
            move |source| ClaimError::Key {
                path,
                operation,
                source,
            }
        };
        let mut options = std::fs::OpenOptions::new();
        options.append(true).create(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options
                .mode(0o600)
                .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32);
        }
        let mut file = options.open(&retired).map_err(io("opening"))?;
        writeln!(file, "{} {}", old.public(), crate::audit::now_unix_ms())
            .and_then(|()| file.sync_all())
            .map_err(io("recording the retired key in"))?;
        std::fs::remove_file(old.path()).map_err(|source| ClaimError::Key {
            path: old.path().to_owned(),
            operation: "removing the retired key",
            source,
        })?;
    }
    let new = SigningKey::in_dir(dir, true)?;
    Ok((old.map(|k| k.public()), new))
}

/// The retired public keys in `dir`, oldest first (none when nothing was
/// ever retired).
pub fn retired(dir: &Path) -> Result<Vec<Retired>, ClaimError> {
    let path = dir.join(RETIRED_FILE);
    let bytes = match crate::keys::read_private(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ClaimError::Key {
                path,
                operation: "reading the retired keys",
                source,
            });
        }
    };
    String::from_utf8_lossy(&bytes)
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            let mut parts = line.split_whitespace();
            let key = parts.next().and_then(|k| k.parse().ok());
            let unix_ms = parts.next().and_then(|t| t.parse().ok());
            match (key, unix_ms) {
                (Some(key), Some(unix_ms)) => Ok(Retired { key, unix_ms }),
                _ => Err(ClaimError::Key {
                    path: path.clone(),
                    operation: "reading the retired keys",
                    source: std::io::Error::other(format!("line {} is not `HEX unix_ms`", n + 1)),
                }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::{Ledger, verify};

    /// A rotated key is retired, not lost: claims it signed still verify
    /// with its public half, and not with the new key's.
    #[test]
    fn claims_signed_before_a_rotation_verify_with_the_retired_key() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        let old = SigningKey::in_dir(&keys, true).unwrap();
        let signed = Ledger::new("s1").finish().sign(&old);
        let path = signed.write_to(&dir.path().join("claims")).unwrap();
        assert_eq!(verify(&path, &old.public()).unwrap().session, "s1");

        let (retired, new) = rotate(&keys).unwrap();
        assert_eq!(retired, Some(old.public()));
        assert_ne!(new.public(), old.public());
        assert_eq!(
            super::retired(&keys)
                .unwrap()
                .iter()
                .map(|r| r.key)
                .collect::<Vec<_>>(),
            [old.public()]
        );
        // The new key is the one read from now on.
        assert_eq!(
            SigningKey::in_dir(&keys, false).unwrap().public(),
            new.public()
        );
        assert_eq!(verify(&path, &old.public()).unwrap().session, "s1");
        assert!(matches!(
            verify(&path, &new.public()),
            Err(crate::claim::ClaimError::OtherKey { .. })
        ));
    }

    #[test]
    fn a_public_key_reads_as_moat_key_show_prints_it() {
        let dir = tempfile::tempdir().unwrap();
        let key = SigningKey::in_dir(dir.path(), true).unwrap().public();
        assert_eq!(key.to_string().parse::<PublicKey>(), Ok(key));
        assert_eq!(format!("ed25519:{key}\n").parse::<PublicKey>(), Ok(key));
        assert_eq!(
            "abc".parse::<PublicKey>(),
            Err(
                "\"abc\" is not an Ed25519 public key (64 hex digits, as `moat key show` prints)"
                    .to_owned()
            )
        );
    }
}

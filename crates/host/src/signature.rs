//! Signed documents: Moat's Ed25519 public keys as text, and signatures over
//! a document's canonical encoding (object keys sorted at every level, no
//! insignificant space: [`crate::lock::canonical_json`]) behind its format
//! as a domain, so a signature of one kind of document (a claim) never
//! passes for another (a node's launch statement). Making a signature
//! needs the private key, which [`crate::claim::key`] owns; checking one
//! needs only this module, so a launcher can check what a node signed.

use ring::signature::{ED25519, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

/// The algorithm, as a signature names it.
pub const ALGORITHM: &str = "ed25519";

/// An Ed25519 public key: 64 hex digits, optionally after `ed25519:`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublicKey([u8; 32]);

impl std::fmt::Display for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl std::str::FromStr for PublicKey {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let hex_part = text.strip_prefix("ed25519:").unwrap_or(text);
        let bytes = hex::decode(hex_part)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| {
                format!("{text:?} is not an Ed25519 public key (64 hex digits, as `moat key show` prints)")
            })?;
        Ok(Self(bytes))
    }
}

impl PublicKey {
    /// The key of these 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Whether `signature` is this key's Ed25519 signature of `message`.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, self.0)
            .verify(message, signature)
            .is_ok()
    }
}

/// An Ed25519 signature of a document's canonical encoding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    /// [`ALGORITHM`].
    pub algorithm: String,
    /// The signer's public key (hex).
    pub public_key: String,
    /// The signature (hex).
    pub value: String,
}

/// A document's canonical encoding: what its signature covers.
pub fn canonical(value: &serde_json::Value) -> String {
    crate::lock::canonical_json(value)
}

/// The bytes a signature covers: the document's `format` (its domain: a
/// claim's signature can never pass for a launch statement's, nor the
/// reverse), a newline, then `value`'s canonical encoding.
pub fn signed_bytes(domain: &str, value: &serde_json::Value) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(domain.len() + 1);
    bytes.extend_from_slice(domain.as_bytes());
    bytes.push(b'\n');
    bytes.extend_from_slice(canonical(value).as_bytes());
    bytes
}

impl Signature {
    /// Checks that `key` made this signature of `value` as it stands, in
    /// `domain` (see [`signed_bytes`]).
    pub fn check(
        &self,
        domain: &str,
        value: &serde_json::Value,
        key: &PublicKey,
    ) -> Result<(), SignatureError> {
        if self.algorithm != ALGORITHM {
            return Err(SignatureError::Algorithm(self.algorithm.clone()));
        }
        if self.public_key.parse::<PublicKey>().ok() != Some(*key) {
            return Err(SignatureError::OtherKey(self.public_key.clone()));
        }
        let signature = hex::decode(&self.value).map_err(|_| SignatureError::Bad)?;
        if key.verifies(&signed_bytes(domain, value), &signature) {
            Ok(())
        } else {
            Err(SignatureError::Bad)
        }
    }
}

/// Why a signature does not hold.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("signature algorithm {0:?}: only \"ed25519\" is known")]
    Algorithm(String),
    #[error("signed by the key {0}, not by the key given")]
    OtherKey(String),
    #[error("the signature does not verify")]
    Bad,
}

//! Identity: sha256 digests of the bytes that actually run, and the evidence
//! class every server reports.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// A sha256 digest, shown and parsed as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The sha256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// A digest from its raw 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{self}")
    }
}

/// Why a string is not a sha256 digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestParseError {
    #[error("a sha256 digest is 64 hex digits, found {0} characters")]
    Length(usize),
    #[error("a sha256 digest is hex digits only, found {0:?}")]
    NotHex(char),
}

impl FromStr for Digest {
    type Err = DigestParseError;

    /// Accepts 64 hex digits, optionally prefixed with `sha256:`; either case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex_part = s.strip_prefix("sha256:").unwrap_or(s);
        if let Some(bad) = hex_part.chars().find(|c| !c.is_ascii_hexdigit()) {
            return Err(DigestParseError::NotHex(bad));
        }
        if hex_part.len() != 64 {
            return Err(DigestParseError::Length(hex_part.len()));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part.to_ascii_lowercase(), &mut out)
            .map_err(|_| DigestParseError::Length(hex_part.len()))?;
        Ok(Self(out))
    }
}

/// How much a server's identity is backed by a measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Evidence {
    /// A wasm component whose bytes were hashed and compiled from those bytes.
    WasmMeasured,
    /// A native executable hashed through the descriptor it was run from.
    NativeMeasured,
    /// A native executable run without a measurement (explicit consent).
    NativeUnmeasured,
    /// A remote server: nothing here runs it, and nothing measured what
    /// answers at its endpoint.
    Remote,
    /// A server a node launched for this front: the node's signed statement
    /// (verified with its pinned public key) says what runs and how it is
    /// contained; nothing here measured it.
    RemoteMeasured,
}

impl Evidence {
    /// The class as written in reports and audit records.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WasmMeasured => "wasm-measured",
            Self::NativeMeasured => "native-measured",
            Self::NativeUnmeasured => "native-unmeasured",
            Self::Remote => "remote-unmeasured",
            Self::RemoteMeasured => "remote-measured",
        }
    }
}

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a launch requires of the bytes it is about to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expectation {
    /// The bytes must hash to this digest, or the launch is refused.
    Pinned(Digest),
    /// No digest is pinned; the user consented with `allow_unmeasured`.
    Unpinned,
    /// No digest is pinned yet: measure and report it (`moat lock`).
    Record,
}

impl Expectation {
    /// Checks `actual` against the expectation.
    pub fn check(self, actual: Digest) -> Result<(), DigestMismatch> {
        match self {
            Self::Pinned(expected) if expected != actual => {
                Err(DigestMismatch { expected, actual })
            }
            _ => Ok(()),
        }
    }
}

/// The bytes found are not the bytes pinned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("digest mismatch: pinned sha256 {expected}, found {actual}")]
pub struct DigestMismatch {
    pub expected: Digest,
    pub actual: Digest,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_round_trips_and_matches_known_vector() {
        let d = Digest::of(b"abc");
        let text = d.to_string();
        assert_eq!(
            text,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(text.parse::<Digest>().unwrap(), d);
        assert_eq!(
            format!("sha256:{}", text.to_uppercase())
                .parse::<Digest>()
                .unwrap(),
            d
        );
    }

    #[test]
    fn digest_parse_names_the_problem() {
        assert_eq!("abc".parse::<Digest>(), Err(DigestParseError::Length(3)));
        assert_eq!(
            "g".repeat(64).parse::<Digest>(),
            Err(DigestParseError::NotHex('g'))
        );
    }

    #[test]
    fn pinned_expectation_refuses_other_bytes() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        assert!(Expectation::Pinned(a).check(a).is_ok());
        assert_eq!(
            Expectation::Pinned(a).check(b),
            Err(DigestMismatch {
                expected: a,
                actual: b
            })
        );
        assert!(Expectation::Unpinned.check(b).is_ok());
    }
}

//! Claims: at the end of each agent session, a statement of what ran in it,
//! signed with Moat's own Ed25519 key, that a third party checks with the
//! public key alone (and, given the audit log, against the log).
//!
//! A claim names the session, when it began and ended, every server that
//! ran in it with its execution identity, digest, evidence class (kept
//! apart: `wasm-measured`, `native-measured`, `native-unmeasured`,
//! `remote-unmeasured`) and sandbox report, the calls by outcome class, Moat's
//! refusals, and the audit chain's head at the end (the digest of the
//! session's `session_close` line) with the digest of its `session_open`
//! line, so the log can be checked to hold exactly what the claim counts.
//!
//! The format: a JSON document `{"claim": {...}, "signature": {"algorithm":
//! "ed25519", "public_key": HEX, "value": HEX}}`. The signature is over
//! `moat-claim/1`, a newline, and the claim's canonical encoding: object
//! keys sorted at every level, no insignificant space, strings as JSON
//! escapes them, integers only (what Python's `json.dumps(claim,
//! sort_keys=True, separators=(",", ":"), ensure_ascii=False)` writes). The
//! format in front keeps a claim's signature from passing for any other
//! document Moat's key signs (a node's launch statement).
//!
//! Never signed over an incomplete record: when an audit write of the
//! session failed, or a child could not be closed, the claim lists why in
//! `incomplete` and is written with `"signature": null`; verifying one
//! refuses it with those reasons.
//!
//! The key: [`key`]. What a session's events add up to: [`ledger`]. The
//! check: [`verify`].

pub mod key;
mod ledger;
mod verify;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use crate::signature::{Signature, SignatureError, canonical, signed_bytes};
pub use key::{PublicKey, SigningKey};
pub use ledger::Ledger;
pub use verify::{Checked, check_against_log, verify};

/// The `format` of claims this version writes and reads.
pub const FORMAT: &str = "moat-claim/1";
/// Refusals listed in a claim before the rest are only counted
/// (`refusals_omitted`): a flood of refused calls cannot make a claim grow
/// without bound.
pub const MAX_REFUSALS: usize = 256;
/// Bytes of a refusal's text kept in a claim; the rest is cut, with its
/// length said.
pub const MAX_TEXT_BYTES: usize = 512;

/// Errors signing, writing, reading or checking a claim.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("{operation} {}: {source}", path.display())]
    Key {
        path: PathBuf,
        operation: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{operation} {}: {source}", path.display())]
    Io {
        path: PathBuf,
        operation: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("recording the claim in the audit log: {0}")]
    Audit(#[from] crate::audit::AuditError),
    #[error("claim {}: not a claim: {detail}", path.display())]
    Shape { path: PathBuf, detail: String },
    #[error(
        "claim {}: not signed: the session's record is incomplete: {}",
        path.display(),
        reasons.join("; ")
    )]
    Unsigned { path: PathBuf, reasons: Vec<String> },
    #[error(
        "claim {}: signed by the key {signed_by}, not by the key given ({given})",
        path.display()
    )]
    OtherKey {
        path: PathBuf,
        signed_by: String,
        given: PublicKey,
    },
    #[error(
        "claim {}: the signature does not verify with {key}: the claim was altered after it was signed, or signed by another key",
        path.display()
    )]
    BadSignature { path: PathBuf, key: PublicKey },
    #[error("claim {} against the audit log {}: {detail}", claim.display(), log.display())]
    Log {
        claim: PathBuf,
        log: PathBuf,
        detail: String,
    },
}

/// What a claim says of one agent session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// [`FORMAT`].
    pub format: String,
    /// The session's id, as audited.
    pub session: String,
    /// The session that took over from it, when it was reset (Moat closes
    /// sessions rather than resetting them, so `null` today).
    pub successor: Option<String>,
    pub started_unix_ms: u64,
    pub ended_unix_ms: u64,
    /// Moat's version.
    pub moat: String,
    /// Every server that ran in the session, by name and execution identity.
    pub servers: Vec<ServerRan>,
    /// Tool calls by outcome class (`ok`, `tool-error`, `refused`, ...).
    pub calls: BTreeMap<String, u64>,
    /// Moat's refusals: calls it refused, starts that failed, what the
    /// sandbox was seen to refuse (up to [`MAX_REFUSALS`]).
    pub refusals: Vec<Refusal>,
    /// Refusals past [`MAX_REFUSALS`], counted only.
    pub refusals_omitted: u64,
    /// Where the audit log stood: `null` when Moat kept none.
    pub audit: Option<AuditPoint>,
    /// Why the record is incomplete (then the claim is not signed); empty
    /// when it is complete.
    pub incomplete: Vec<String>,
}

/// One server that ran in the session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerRan {
    pub name: String,
    /// The execution identity (what ran, with what, under which grants).
    pub identity: String,
    /// The digest of the bytes that ran, when measured.
    pub sha256: Option<String>,
    /// The evidence class, never folded into another.
    pub evidence: String,
    /// For a remote server: the endpoint it was reached at.
    pub endpoint: Option<String>,
    /// What its sandbox enforced and did not (`enforced: ...`,
    /// `not enforced: ...`).
    pub sandbox: Vec<String>,
    /// How many times it was launched in the session.
    pub launches: u64,
}

/// One refusal, in Moat's words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    pub server: String,
    /// `tools/call TOOL`, `start`, or what the sandbox refusal was seen in.
    pub during: String,
    pub reason: String,
}

/// The audit log at the end of the session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditPoint {
    /// The digest of the session's `session_open` line.
    pub opened: Option<String>,
    /// The digest of its `session_close` line: the chain's head then.
    pub head: String,
    /// The log's lines up to and including it.
    pub lines: usize,
}

/// A claim and its signature, as written.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedClaim {
    pub claim: Claim,
    pub signature: Option<Signature>,
}

impl Claim {
    /// The claim signed with `key`; left unsigned when it is incomplete.
    pub fn sign(self, key: &SigningKey) -> SignedClaim {
        if !self.incomplete.is_empty() {
            return SignedClaim {
                claim: self,
                signature: None,
            };
        }
        let signature = key.signature(FORMAT, &self);
        SignedClaim {
            claim: self,
            signature: Some(signature),
        }
    }
}

/// Where claims go.
#[derive(Clone, Debug)]
pub enum Place {
    /// A file per session in this directory.
    Dir(PathBuf),
    /// A `claim` line in the audit log itself, after the session's close.
    AuditLog,
}

impl std::str::FromStr for Place {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(if text == "audit" {
            Self::AuditLog
        } else {
            Self::Dir(PathBuf::from(text))
        })
    }
}

/// What the gateway signs claims with, and where it puts them.
#[derive(Clone, Debug)]
pub struct Claims {
    pub key: Arc<SigningKey>,
    pub place: Place,
}

impl SignedClaim {
    /// The document as written: pretty JSON and a newline.
    pub fn to_text(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// Writes the claim into `dir` as `claim-ENDED-SESSION-RANDOM.json` (a
    /// file made whole beside it, then renamed; never over another claim:
    /// two gateways sharing the directory, whose sessions are both `s1` and
    /// end in the same millisecond, still write two, and nobody can make the
    /// name first).
    pub fn write_to(&self, dir: &Path) -> Result<PathBuf, ClaimError> {
        let io = |operation: &'static str, path: &Path| {
            let path = path.to_owned();
            move |source| ClaimError::Io {
                path,
                operation,
                source,
            }
        };
        std::fs::create_dir_all(dir).map_err(io("making the claims directory", dir))?;
        let mut random = [0u8; 8];
        getrandom::fill(&mut random)
            .map_err(|e| std::io::Error::other(e.to_string()))
            .map_err(io("naming a claim in", dir))?;
        let path = dir.join(format!(
            "claim-{}-{}-{}.json",
            self.claim.ended_unix_ms,
            self.claim.session,
            hex::encode(random)
        ));
        let mut file =
            tempfile::NamedTempFile::new_in(dir).map_err(io("writing a claim in", dir))?;
        use std::io::Write;
        file.write_all(self.to_text().as_bytes())
            .and_then(|()| file.as_file().sync_all())
            .map_err(io("writing the claim", &path))?;
        file.persist_noclobber(&path)
            .map_err(|e| e.error)
            .map_err(io("writing the claim", &path))?;
        Ok(path)
    }
}

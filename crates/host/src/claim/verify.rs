//! Checking a claim: its signature and shape with the public key alone,
//! and, given the audit log, that the log holds the chain head it names
//! and the calls and launches it counts (no audit key needed: the chain's
//! `prev` links and the line digests are enough to place the claim; the
//! line MACs are `moat audit verify`'s).

use std::collections::BTreeMap;
use std::path::Path;

use super::{Claim, ClaimError, FORMAT, PublicKey, SignatureError, SignedClaim, key};
use crate::identity::Digest;

/// The largest claim read (a claim holds at most [`super::MAX_REFUSALS`]
/// refusals, and a sandbox report per server).
const MAX_CLAIM_BYTES: u64 = 16 << 20;

/// A launch as both sides name it: server, execution identity, digest and
/// evidence class.
type Launch = (String, String, Option<String>, String);

/// What the audit log was found to hold for a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    /// The line numbers (1-based) of the session's open and close.
    pub opened_line: usize,
    pub head_line: usize,
    /// Tool calls of the session found between them, by outcome class.
    pub calls: BTreeMap<String, u64>,
}

/// Reads the claim at `path` and checks that `key` signed exactly it, and
/// that it has a claim's shape. An unsigned claim (an incomplete record)
/// is refused with its reasons.
pub fn verify(path: &Path, key: &PublicKey) -> Result<Claim, ClaimError> {
    let shape = |detail: String| ClaimError::Shape {
        path: path.to_owned(),
        detail,
    };
    let file = std::fs::File::open(path).map_err(|source| ClaimError::Io {
        path: path.to_owned(),
        operation: "reading the claim",
        source,
    })?;
    let mut text = String::new();
    use std::io::Read;
    file.take(MAX_CLAIM_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|source| ClaimError::Io {
            path: path.to_owned(),
            operation: "reading the claim",
            source,
        })?;
    if text.len() as u64 > MAX_CLAIM_BYTES {
        return Err(shape(format!("larger than {MAX_CLAIM_BYTES} bytes")));
    }
    let document: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| shape(format!("not JSON: {e}")))?;
    let signed: SignedClaim =
        serde_json::from_value(document.clone()).map_err(|e| shape(e.to_string()))?;
    let Some(signature) = &signed.signature else {
        let mut reasons: Vec<String> = signed
            .claim
            .incomplete
            .iter()
            .map(|r| crate::text::printable(r))
            .collect();
        if reasons.is_empty() {
            reasons.push("it carries no signature".to_owned());
        }
        return Err(ClaimError::Unsigned {
            path: path.to_owned(),
            reasons,
        });
    };
    // The bytes signed are the claim as it stands in the file, encoded
    // canonically: nothing in it can change without breaking this.
    match signature.check(FORMAT, &document["claim"], key) {
        Ok(()) => {}
        Err(SignatureError::Algorithm(algorithm)) => {
            return Err(shape(format!(
                "signature algorithm {algorithm:?}: only {:?} is known",
                key::ALGORITHM
            )));
        }
        Err(SignatureError::OtherKey(signed_by)) => {
            return Err(ClaimError::OtherKey {
                path: path.to_owned(),
                signed_by: crate::text::printable(&signed_by),
                given: *key,
            });
        }
        Err(SignatureError::Bad) => {
            return Err(ClaimError::BadSignature {
                path: path.to_owned(),
                key: *key,
            });
        }
    }
    let claim = signed.claim;
    if claim.format != FORMAT {
        return Err(shape(format!(
            "format {:?}: this Moat reads {FORMAT:?}",
            claim.format
        )));
    }
    if !claim.incomplete.is_empty() {
        return Err(shape(
            "a signed claim names its record incomplete, which Moat never signs".to_owned(),
        ));
    }
    Ok(claim)
}

/// Checks `claim` (read from `claim_path`) against the audit log at `log`:
/// the chain is unbroken up to the claim's head, the head is the session's
/// `session_close` at the line count the claim names, and between the
/// session's open and close the log holds exactly the calls (by outcome
/// class) and the launches (by server, identity, digest and evidence, and
/// how many of each) the claim counts.
pub fn check_against_log(
    claim_path: &Path,
    claim: &Claim,
    log: &Path,
) -> Result<Checked, ClaimError> {
    let fail = |detail: String| ClaimError::Log {
        claim: claim_path.to_owned(),
        log: log.to_owned(),
        detail,
    };
    let Some(point) = &claim.audit else {
        return Err(fail(
            "the claim names no point in an audit log (Moat kept none for the session)".into(),
        ));
    };
    let io = |source| ClaimError::Io {
        path: log.to_owned(),
        operation: "reading the audit log",
        source,
    };
    // Line by line, up to the claim's head: a long log is never held whole.
    use std::io::BufRead;
    let lines = std::io::BufReader::new(std::fs::File::open(log).map_err(io)?).lines();
    let mut prev = crate::audit::GENESIS.to_owned();
    let mut opened_line = None;
    let mut head_line = None;
    let mut calls: BTreeMap<String, u64> = BTreeMap::new();
    // Each launch as the log has it: (server, identity, sha256, evidence)
    // and how many times.
    let mut launched: BTreeMap<Launch, u64> = BTreeMap::new();
    for (index, line) in lines.enumerate() {
        let line = line.map_err(io)?;
        let number = index + 1;
        let event: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| fail(format!("line {number} is not JSON: {e}")))?;
        if event["prev"].as_str() != Some(prev.as_str()) {
            return Err(fail(format!(
                "the chain breaks at line {number} (its prev is not the digest of line {index})"
            )));
        }
        prev = Digest::of(line.as_bytes()).to_string();
        let ours = event["session"].as_str() == Some(claim.session.as_str());
        let kind = event["event"].as_str().unwrap_or_default();
        if point.opened.as_deref() == Some(prev.as_str()) {
            if !(ours && kind == "session_open") {
                return Err(fail(format!(
                    "line {number}, the claim's opening line, is not session {}'s session_open",
                    claim.session
                )));
            }
            opened_line = Some(number);
        }
        let within = opened_line.is_some() && head_line.is_none();
        if within && ours {
            match kind {
                "tool_call" => {
                    let class = crate::metrics::outcome_class(
                        event["outcome"].as_str().unwrap_or_default(),
                    );
                    *calls.entry(class.to_owned()).or_default() += 1;
                }
                "server_launch" => {
                    let text = |key: &str| event[key].as_str().map(str::to_owned);
                    *launched
                        .entry((
                            text("server").unwrap_or_default(),
                            text("identity").unwrap_or_default(),
                            text("sha256"),
                            text("evidence").unwrap_or_default(),
                        ))
                        .or_default() += 1;
                }
                _ => {}
            }
        }
        if prev == point.head {
            if !(ours && kind == "session_close") {
                return Err(fail(format!(
                    "line {number}, the claim's chain head, is not session {}'s session_close",
                    claim.session
                )));
            }
            if number != point.lines {
                return Err(fail(format!(
                    "the claim's chain head is line {number} of the log, the claim says line {}",
                    point.lines
                )));
            }
            head_line = Some(number);
            break;
        }
    }
    let Some(head_line) = head_line else {
        return Err(fail(format!(
            "the log holds no line with the claim's chain head {} (lines were removed or changed, or this is another log)",
            point.head
        )));
    };
    let Some(opened_line) = opened_line else {
        return Err(fail(format!(
            "the log holds no session_open of session {} before the claim's chain head",
            claim.session
        )));
    };
    if calls != claim.calls {
        return Err(fail(format!(
            "the log holds these calls of session {} by outcome: {calls:?}; the claim counts {:?}",
            claim.session, claim.calls
        )));
    }
    let claimed: BTreeMap<Launch, u64> = claim
        .servers
        .iter()
        .map(|s| {
            (
                (
                    s.name.clone(),
                    s.identity.clone(),
                    s.sha256.clone(),
                    s.evidence.clone(),
                ),
                s.launches,
            )
        })
        .collect();
    if launched != claimed {
        return Err(fail(format!(
            "the log's launches in session {} ({launched:?}) are not the claim's servers ({claimed:?})",
            claim.session
        )));
    }
    Ok(Checked {
        opened_line,
        head_line,
        calls,
    })
}

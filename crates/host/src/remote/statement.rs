//! The node's statement of what it launched for a front: the profile and
//! revision asked for, and what ran (execution identity, digest, evidence
//! class on the node, sandbox report), signed with the node's claim key in
//! the claims' format (an Ed25519 signature of the canonical encoding). The
//! front checks it with the node's public key pinned in its config, and
//! that it answers the request it made; its own evidence for the server is
//! then `remote-measured`.

use serde::{Deserialize, Serialize};

use super::request::LaunchRequest;
use crate::signature::{PublicKey, Signature};

/// The `format` of statements this version writes and reads.
pub const FORMAT: &str = "moat-launch/1";

/// What a node launched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    /// [`FORMAT`].
    pub format: String,
    /// The node's id of the launched session (the one the front talks to).
    pub session: String,
    /// The front's nonce for this launch (its `Moat-Nonce` header): a
    /// statement answers one request only and cannot be replayed.
    pub nonce: String,
    pub profile: String,
    pub revision: String,
    /// The execution identity of what runs.
    pub identity: String,
    /// The digest of the bytes that run, when measured.
    pub sha256: Option<String>,
    /// The evidence class on the node (`native-measured`, ...).
    pub evidence: String,
    /// The node's sandbox report, line by line.
    pub sandbox: Vec<String>,
    pub launched_unix_ms: u64,
}

/// A statement and the node's signature of it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedStatement {
    pub statement: Statement,
    pub signature: Signature,
}

/// Why a front refuses a node's answer.
#[derive(Debug, thiserror::Error)]
#[error("node `{node}`: its launch statement: {detail}")]
pub struct StatementError {
    pub node: String,
    pub detail: String,
}

/// The front's check of node `node`'s answer `answer` to `asked`: signed by
/// `key` (the node's public key pinned in the front's config), over exactly
/// this statement, of this format, and naming the profile and revision that
/// were asked for.
pub fn check(
    node: &str,
    answer: &serde_json::Value,
    key: &PublicKey,
    asked: &LaunchRequest,
    nonce: &str,
) -> Result<Statement, StatementError> {
    let refused = |detail: String| StatementError {
        node: node.to_owned(),
        detail,
    };
    let signed: SignedStatement = serde_json::from_value(answer.clone())
        .map_err(|e| refused(format!("not a launch statement: {e}")))?;
    signed
        .signature
        .check(FORMAT, &answer["statement"], key)
        .map_err(|e| refused(format!("{e} (the key pinned for the node is {key})")))?;
    let statement = signed.statement;
    if statement.format != FORMAT {
        return Err(refused(format!(
            "format {:?}: this Moat reads {FORMAT:?}",
            statement.format
        )));
    }
    if statement.profile != asked.profile || statement.revision != asked.revision.to_string() {
        return Err(refused(format!(
            "it launched profile `{}` at {}, and profile `{}` at {} was asked for",
            statement.profile, statement.revision, asked.profile, asked.revision
        )));
    }
    if statement.nonce != nonce {
        return Err(refused(format!(
            "it answers the launch request with nonce {:?}, not this one ({nonce:?}): a statement is good for the one launch it was made for",
            crate::text::printable(&statement.nonce)
        )));
    }
    Ok(statement)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::SigningKey;
    use crate::identity::Digest;

    fn signed(statement: Statement, key: &SigningKey) -> SignedStatement {
        SignedStatement {
            signature: key.signature(FORMAT, &statement),
            statement,
        }
    }

    fn statement(revision: Digest) -> Statement {
        Statement {
            format: FORMAT.into(),
            session: "n1".into(),
            nonce: "nonce-1".into(),
            profile: "time".into(),
            revision: revision.to_string(),
            identity: Digest::of(b"identity").to_string(),
            sha256: Some(Digest::of(b"python3").to_string()),
            evidence: "native-measured".into(),
            sandbox: vec!["enforced: seccomp: ...".into()],
            launched_unix_ms: 1,
        }
    }

    #[test]
    fn a_statement_holds_only_for_its_signer_and_the_launch_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let node = SigningKey::in_dir(&dir.path().join("node"), true).unwrap();
        let other = SigningKey::in_dir(&dir.path().join("other"), true).unwrap();
        let revision = Digest::of(b"revision");
        let asked = LaunchRequest {
            profile: "time".into(),
            revision,
        };
        let answer = serde_json::to_value(signed(statement(revision), &node)).unwrap();
        assert_eq!(
            check("gpu", &answer, &node.public(), &asked, "nonce-1").unwrap(),
            statement(revision)
        );

        // The same statement, offered again for another launch.
        let error = check("gpu", &answer, &node.public(), &asked, "nonce-2").unwrap_err();
        assert_eq!(
            error.to_string(),
            "node `gpu`: its launch statement: it answers the launch request with nonce \"nonce-1\", not this one (\"nonce-2\"): a statement is good for the one launch it was made for"
        );

        let error = check("gpu", &answer, &other.public(), &asked, "nonce-1").unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "node `gpu`: its launch statement: signed by the key {}, not by the key given (the key pinned for the node is {})",
                node.public(),
                other.public()
            )
        );

        let mut altered = answer.clone();
        altered["statement"]["sandbox"][0] = "enforced: everything".into();
        let error = check("gpu", &altered, &node.public(), &asked, "nonce-1").unwrap_err();
        assert!(
            error.to_string().contains("the signature does not verify"),
            "{error}"
        );

        let elsewhere =
            serde_json::to_value(signed(statement(Digest::of(b"older")), &node)).unwrap();
        let error = check("gpu", &elsewhere, &node.public(), &asked, "nonce-1").unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "node `gpu`: its launch statement: it launched profile `time` at {}, and profile `time` at {revision} was asked for",
                Digest::of(b"older")
            )
        );
    }
}

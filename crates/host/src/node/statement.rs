//! The node's statement of what it launched for a front: the profile and
//! revision asked for, and what ran (execution identity, digest, evidence
//! class on the node, sandbox report), signed with the node's claim key in
//! the claims' format (an Ed25519 signature of the canonical encoding). The
//! front checks it with the node's public key pinned in its config, and
//! that it answers the request it made; its own evidence for the server is
//! then `remote-measured`.

use serde::{Deserialize, Serialize};

use super::NodeError;
use super::request::LaunchRequest;
use crate::claim::{PublicKey, Signature, SigningKey};

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

impl Statement {
    /// Signed with the node's `key`.
    pub fn sign(self, key: &SigningKey) -> SignedStatement {
        SignedStatement {
            signature: Signature::of(FORMAT, &self, key),
            statement: self,
        }
    }
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
) -> Result<Statement, NodeError> {
    let refused = |detail: String| NodeError::Statement {
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
    Ok(statement)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Digest;

    fn statement(revision: Digest) -> Statement {
        Statement {
            format: FORMAT.into(),
            session: "n1".into(),
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
        let answer = serde_json::to_value(statement(revision).sign(&node)).unwrap();
        assert_eq!(
            check("gpu", &answer, &node.public(), &asked).unwrap(),
            statement(revision)
        );

        let error = check("gpu", &answer, &other.public(), &asked).unwrap_err();
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
        let error = check("gpu", &altered, &node.public(), &asked).unwrap_err();
        assert!(
            error.to_string().contains("the signature does not verify"),
            "{error}"
        );

        let elsewhere = serde_json::to_value(statement(Digest::of(b"older")).sign(&node)).unwrap();
        let error = check("gpu", &elsewhere, &node.public(), &asked).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "node `gpu`: its launch statement: it launched profile `time` at {}, and profile `time` at {revision} was asked for",
                Digest::of(b"older")
            )
        );
    }
}

//! Remote launch by profile (`moat node`): a launch host that serves the
//! servers of its own `moat.toml` and `moat.lock` to authenticated fronts.
//! A front names a **profile** (a server of the node's config) and the
//! **revision** it expects (the digest of that profile as the node's lock
//! and config hold it: execution identity, pins, grants, limits, sandbox);
//! nothing else crosses the wire. The node refuses a profile it does not
//! have and a revision it does not hold (naming both digests), launches
//! the profile under its own sandbox (policy is compiled only where the
//! process runs) and answers with a statement of what it launched, signed
//! with its claim key, which the front checks against the node's public key
//! pinned in its config.
//!
//! What a launch request may say: [`request`]. What a profile's revision
//! covers, and how a request is resolved against the node's files:
//! [`profile`]. The signed statement: [`statement`]. A launch decided and
//! made: [`launch`].

pub mod launch;
pub mod profile;
pub mod request;
pub mod statement;

use crate::identity::Digest;

/// Why a node refuses a launch, or a front refuses a node's answer.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("launch request: {detail}")]
    BadRequest { detail: String },
    #[error(
        "launch request: field `{field}` is not accepted: a front names a profile and its revision only; grants, limits, commands and policy are the node's own"
    )]
    FieldRefused { field: String },
    #[error("profile `{profile}`: this node has no such profile (its config names: {known})")]
    UnknownProfile { profile: String, known: String },
    #[error(
        "profile `{profile}`: this node holds no lock entry for it: run `moat lock` on the node"
    )]
    NotLocked { profile: String },
    #[error(
        "profile `{profile}`: stale revision: the front expects {expected}, this node holds {held} (update the front's `revision`, or the node's moat.lock, so that they agree)"
    )]
    Stale {
        profile: String,
        expected: Digest,
        held: Digest,
    },
    #[error("profile `{profile}`: the launch failed: {source}")]
    Launch {
        profile: String,
        #[source]
        source: Box<crate::host::ConnectError>,
    },
    #[error("node `{node}`: its launch statement: {detail}")]
    Statement { node: String, detail: String },
}

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
//! What a launch request may say, and the signed statement, are the wire
//! the front shares ([`crate::remote::request`],
//! [`crate::remote::statement`]). What a profile's revision covers, and how
//! a request is resolved against the node's files: [`profile`]. A launch
//! decided and made: [`launch`]. One launch served to its front:
//! `served`. The HTTPS listener, its token and its routes: [`serve`].

pub mod launch;
pub mod profile;
pub mod serve;
mod served;

pub use crate::remote::request::{LaunchRequest, RequestError};
pub use crate::remote::statement::{FORMAT, SignedStatement, Statement, StatementError, check};

use crate::identity::Digest;

/// Why a node refuses a launch, or a front refuses a node's answer.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(
        "launch request: the `moat-nonce` header must be 16 to 128 characters of A-Z, a-z, 0-9, `-` or `_`"
    )]
    Nonce,
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
    #[error(
        "this node holds as many launches as it may ([serve] max_sessions = {max}): try again when one ends"
    )]
    Busy { max: usize },
    #[error("profile `{profile}`: revoked on this node: {revocation}")]
    Revoked { profile: String, revocation: String },
    #[error("profile `{profile}`: the launch failed: {source}")]
    Launch {
        profile: String,
        #[source]
        source: Box<crate::host::ConnectError>,
    },
    #[error("profile `{profile}` reported no identity once launched")]
    NoIdentity { profile: String },
    #[error("moat node: {operation} {path}: {detail}", path = path.display())]
    Tls {
        operation: &'static str,
        path: std::path::PathBuf,
        detail: String,
    },
    #[error("moat node: drawing a launch id from the system's random source: {0}")]
    Random(String),
    #[error("moat node: reading the listener's local address: {0}")]
    LocalAddr(#[source] std::io::Error),
}

impl NodeError {
    /// The HTTP status a front gets for this refusal.
    pub fn status(&self) -> u16 {
        match self {
            Self::Request(_) | Self::Nonce => 400,
            Self::UnknownProfile { .. } => 404,
            Self::Revoked { .. } => 403,
            Self::Busy { .. } => 503,
            Self::NotLocked { .. } | Self::Stale { .. } => 409,
            Self::Launch { .. } | Self::NoIdentity { .. } => 502,
            Self::Tls { .. } | Self::LocalAddr(_) | Self::Random(_) => 500,
        }
    }
}

//! The gateway's own errors of a call: what a session of `moat serve`
//! decides (a server it gave up on, one held back after a failed start,
//! one a reloaded lock no longer matches, a call cancelled by a
//! revocation), apart from what the server session reports
//! ([`ClientError`], carried as it is).

use crate::session::ClientError;
use crate::transport::Fault;

/// Why a call (or a listing) through the gateway failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// What the server session, its launch or the lock said.
    #[error(transparent)]
    Session(Box<ClientError>),
    #[error(
        "server `{server}` crashed again after {restarts} restarts in this session; giving up: {fault}"
    )]
    GaveUp {
        server: String,
        restarts: u32,
        fault: Fault,
    },
    /// A server a session still ran when moat.lock was read again and no
    /// longer matched it: that session stops it and refuses it from then on.
    #[error(
        "server `{server}` is refused in this session: moat.lock was reloaded and no longer matches what this session runs ({detail}); a new session runs what the lock pins now"
    )]
    Stale { server: String, detail: String },
    /// A call in flight when a revocation of what it calls came into force,
    /// cancelled when the drain timeout passed.
    #[error("tool `{tool}` on server `{server}`: the call was cancelled in flight: {refusal}")]
    CancelledByRevocation {
        server: String,
        tool: String,
        refusal: String,
    },
    /// A server that failed to start, asked for again before its next try
    /// is due: the reason of the last failure.
    #[error("server `{server}` could not start: {reason} (Moat tries it again in {retry_in_s} s)")]
    NotStarted {
        server: String,
        reason: String,
        retry_in_s: u64,
    },
}

impl From<ClientError> for CallError {
    fn from(error: ClientError) -> Self {
        CallError::Session(Box::new(error))
    }
}

impl CallError {
    /// The server session's error, when that is what this is.
    pub fn session(&self) -> Option<&ClientError> {
        match self {
            CallError::Session(error) => Some(error),
            _ => None,
        }
    }
}

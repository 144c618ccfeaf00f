//! The gateway's own errors of a call: what a session of `moat serve`
//! decides (a server it gave up on, one held back after a failed start,
//! one a reloaded lock no longer matches, a call cancelled by a
//! revocation, a tool revoked), apart from what the server session
//! reports ([`SessionError`]) and what its start under the lock reported
//! ([`ConnectError`]), each carried as it is.

use crate::host::ConnectError;
use crate::session::SessionError;
use crate::transport::Fault;

/// Why a call (or a listing) through the gateway failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// What the server session said.
    #[error(transparent)]
    Session(Box<SessionError>),
    /// What starting the server under the lock said.
    #[error(transparent)]
    Connect(Box<ConnectError>),
    /// The kill switch: moat.lock's `[[revoked]]` names the tool, the
    /// server or a digest the server runs.
    #[error("{subject} is refused: {revocation}")]
    Revoked {
        server: String,
        /// `server `x`` or `tool `t` on server `x``.
        subject: String,
        /// What was revoked, by whom, when and why.
        revocation: String,
    },
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

impl From<SessionError> for CallError {
    fn from(error: SessionError) -> Self {
        CallError::Session(Box::new(error))
    }
}

impl From<ConnectError> for CallError {
    /// A start that got as far as a session is the session's error.
    fn from(error: ConnectError) -> Self {
        match error {
            ConnectError::Session(error) => CallError::Session(error),
            other => CallError::Connect(Box::new(other)),
        }
    }
}

impl CallError {
    /// The server session's error, when that is what this is.
    pub fn session(&self) -> Option<&SessionError> {
        match self {
            CallError::Session(error) => Some(error),
            _ => None,
        }
    }
}

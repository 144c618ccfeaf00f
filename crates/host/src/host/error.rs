//! The error of connecting a server under the host's rules: what the lock
//! and the kill switch refuse before anything runs, the launch itself, and
//! what the new session reported while it was checked against the lock.

use crate::launch::LaunchError;
use crate::session::SessionError;
use crate::transport::Fault;

/// Why a server could not be connected, naming the server.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The launcher refused or failed to start the server (however far the
    /// launch got: planning, or the transport's start).
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// What the server session said during its handshake or its check
    /// against the lock.
    #[error(transparent)]
    Session(Box<SessionError>),
    /// The kill switch: moat.lock's `[[revoked]]` names the server, the
    /// tool or a digest the server runs.
    #[error("{subject} is refused: {revocation}")]
    Revoked {
        server: String,
        /// `server `x`` or `tool `t` on server `x``.
        subject: String,
        /// What was revoked, by whom, when and why.
        revocation: String,
    },
    #[error(transparent)]
    Lock(#[from] crate::lock::LockError),
    #[cfg(unix)]
    #[error(transparent)]
    Learn(#[from] crate::native::learn::LearnError),
    #[error("server `{server}` is not in {lock}: run `moat lock` to approve it")]
    NotLocked { server: String, lock: String },
    #[error(
        "server `{server}`: grant {path} is not in {lock} (added since `moat lock`, or the lock predates grant pins): run `moat lock` to approve it"
    )]
    GrantNotLocked {
        server: String,
        path: String,
        lock: String,
    },
    #[error(
        "server `{server}`: the config pins sha256 {config} but the lock approved {locked}: run `moat lock` after checking which is right"
    )]
    LockConflict {
        server: String,
        config: String,
        locked: String,
    },
    #[error(
        "server `{server}`: the config names {config} but the lock approved {locked}: run `moat lock` to approve the config's"
    )]
    OciLockConflict {
        server: String,
        config: String,
        locked: String,
    },
    #[error(
        "server `{server}`: its execution identity changed since the lock (locked {locked}, now {live}): argv, cwd, environment names or measured files differ; run `moat lock` to approve"
    )]
    IdentityChanged {
        server: String,
        locked: String,
        live: String,
    },
    #[error("server `{server}`: {lock} is damaged: {detail}")]
    BadLock {
        server: String,
        lock: String,
        detail: String,
    },
}

impl From<SessionError> for ConnectError {
    /// A launch failure is a launch failure however it reached the host:
    /// the session's transport start lands in [`ConnectError::Launch`].
    fn from(error: SessionError) -> Self {
        match error {
            SessionError::Launch(error) => Self::Launch(error),
            other => Self::Session(Box::new(other)),
        }
    }
}

impl ConnectError {
    /// The session's error, when the server got as far as a session.
    pub fn session(&self) -> Option<&SessionError> {
        match self {
            Self::Session(error) => Some(error),
            _ => None,
        }
    }

    /// The transport fault behind this error, if one caused it.
    pub fn fault(&self) -> Option<&Fault> {
        self.session().and_then(SessionError::fault)
    }
}

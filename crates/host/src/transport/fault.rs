//! How a session with a server ends badly: the server's [`Fault`] (the
//! first one wins), and the transport's own [`TransportError`].

use crate::limits::LimitHit;

/// A fault that ended a session with a server. The first fault wins.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    #[error("server `{server}` hit its {limit}")]
    Limit { server: String, limit: LimitHit },
    #[error(
        "server `{server}` exited with code {code} before closing; stderr tail: {stderr_tail:?}"
    )]
    Exited {
        server: String,
        code: i32,
        stderr_tail: String,
    },
    #[error("server `{server}` crashed: {reason}; stderr tail: {stderr_tail:?}")]
    Crashed {
        server: String,
        reason: String,
        stderr_tail: String,
    },
    #[error(
        "server `{server}` wrote a stdout line that is not a JSON-RPC message ({detail}): {excerpt:?}"
    )]
    NotJsonRpc {
        server: String,
        detail: String,
        excerpt: String,
    },
    #[error("server `{server}`: reading stdout failed: {detail}")]
    Io { server: String, detail: String },
    #[error(
        "server `{server}` answered request {id}, which was never sent or was already answered (fail closed)"
    )]
    UnknownResponse { server: String, id: String },
    #[error(
        "server `{server}` has more than {limit} requests to the client unanswered: it is not reading the answers (fail closed)"
    )]
    RequestFlood { server: String, limit: usize },
}

impl Fault {
    /// The fault in Moat's words only: without the stderr tail or the
    /// excerpt of a bad line, which the server chose (for the audit log).
    pub fn summary(&self) -> String {
        match self {
            Self::Exited { server, code, .. } => {
                format!("server `{server}` exited with code {code} before closing")
            }
            Self::Crashed { server, reason, .. } => format!("server `{server}` crashed: {reason}"),
            Self::NotJsonRpc { server, detail, .. } => {
                format!(
                    "server `{server}` wrote a stdout line that is not a JSON-RPC message ({detail})"
                )
            }
            other => other.to_string(),
        }
    }

    /// The text of the server's that explains the fault, if any.
    pub fn server_text(&self) -> Option<&str> {
        match self {
            Self::Exited { stderr_tail, .. } | Self::Crashed { stderr_tail, .. } => {
                Some(stderr_tail)
            }
            Self::NotJsonRpc { excerpt, .. } => Some(excerpt),
            _ => None,
        }
    }
}

/// Errors of the transport itself (not of the server).
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(
        "transport for server `{server}` is already connected: a transport connects at most once"
    )]
    AlreadyConnected { server: String },
    #[error("server `{server}` is no longer running: {fault}")]
    Faulted { server: String, fault: Fault },
    #[error("server `{server}`: the transport is closed")]
    Closed { server: String },
    #[error("server `{server}`: encoding a message failed: {detail}")]
    Encode { server: String, detail: String },
}

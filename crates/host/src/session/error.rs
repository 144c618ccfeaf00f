//! The errors of one connected server session: its transport's start, its
//! faults, what the server answered, its pins, and calls refused or
//! withheld. What may be launched under the lock has its own error
//! (`host::ConnectError`), and the gateway's own decisions theirs
//! (`gateway::CallError`).

use crate::launch::LaunchError;
use crate::transport::Fault;

/// Errors of a server session, naming the server and the operation.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The transport could not start the server.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("{operation} on server `{server}` failed: {fault}")]
    Fault {
        server: String,
        operation: String,
        fault: Fault,
    },
    #[error("{operation} on server `{server}`: the server answered with error {code}: {message}")]
    Server {
        server: String,
        operation: String,
        code: i32,
        message: String,
    },
    #[error("{operation} on server `{server}` failed: {detail}")]
    Protocol {
        server: String,
        operation: String,
        detail: String,
    },
    #[error(
        "{operation} on server `{server}` failed: {fault}. The native sandbox may be the cause: the server may read only what `moat inspect {server}` lists{denied}. Run `moat learn {server}` to see the files and addresses it uses, and grant them with `dirs` and `net`"
    )]
    Sandboxed {
        server: String,
        /// `handshake`, or the request that was in flight.
        operation: String,
        fault: Fault,
        /// Paths the server's stderr names beside a denial, as ": it was
        /// denied A, B".
        denied: String,
    },
    #[error(
        "{operation} on server `{server}` failed: {fault}. It tried to reach the network ({hosts}), which the native sandbox refuses to what `net` does not list: a server that downloads code or data when it starts (an `npm install`, `pip install` or model download at first use) needs it installed ahead of time (`moat add`), or the host granted (`net = [\"HOST:443\"]`; `moat learn {server}` shows where it connects)"
    )]
    NetworkRefused {
        server: String,
        /// `handshake`, or the request that was in flight.
        operation: String,
        fault: Fault,
        /// The hosts its stderr names beside a failed lookup or
        /// connection, or "a host its stderr does not name".
        hosts: String,
    },
    #[error(
        "handshake on server `{server}` failed: its answer to server/discover is not a discover result Moat can read ({detail})"
    )]
    DiscoverUnreadable { server: String, detail: String },
    #[error("server `{server}`: {lock} is damaged: {detail}")]
    BadLock {
        server: String,
        lock: String,
        detail: String,
    },
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    #[error(
        "{kind} `{name}` on server `{server}` is unavailable: {status} since `moat lock` (run `moat lock` to approve it)"
    )]
    NotPinned {
        server: String,
        kind: &'static str,
        name: String,
        status: &'static str,
    },
    #[error("tool `{tool}` on server `{server}`: the call was cancelled")]
    Cancelled { server: String, tool: String },
    /// The server answered with a request for input (a multi round-trip
    /// request, or a task waiting for input) that this caller cannot answer.
    #[error(
        "tool `{tool}` on server `{server}` asks the caller for input, which this caller cannot give (an agent on 2026-07-28 can)"
    )]
    InputRequired { server: String, tool: String },
    #[error("tool `{tool}` on server `{server}` is unavailable: {reason}")]
    ToolUnavailable {
        server: String,
        tool: String,
        reason: String,
    },
    #[error(
        "tool `{tool}` on server `{server}`: invalid params {violation} (not sent to the server)"
    )]
    InvalidArguments {
        server: String,
        tool: String,
        violation: crate::policy::SchemaViolation,
    },
    #[error(
        "tool `{tool}` on server `{server}`: structuredContent violates the pinned outputSchema {violation}; the result was withheld"
    )]
    InvalidOutput {
        server: String,
        tool: String,
        violation: crate::policy::SchemaViolation,
    },
}

impl SessionError {
    /// The transport fault behind this error, if one caused it.
    pub fn fault(&self) -> Option<&Fault> {
        match self {
            Self::Fault { fault, .. } => Some(fault),
            _ => None,
        }
    }
}

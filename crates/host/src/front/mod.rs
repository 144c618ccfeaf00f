//! The agent-facing fronts of `moat serve`: what carries an agent's
//! messages between its connection and the gateway's agent sessions.
//! [`http`] is streamable HTTP with its limits and probes; [`stdio`] is one
//! agent on the process's stdin and stdout, read by `moat_lines` (rmcp's
//! line transport, with a `tools/call` decoded at once). Both rewrite
//! 2025-11-25's task messages at the wire ([`crate::tasks_2025`]). The CLI
//! binds, says when to stop, and prints.

pub mod http;
#[cfg(unix)]
pub mod stdio;

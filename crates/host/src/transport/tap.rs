//! The tap: how the layer above sees each message from the server in
//! order, before rmcp does and before any later message, without the
//! transport knowing what an MCP notification means (the session taps
//! progress to the call it belongs to, `tools/list_changed` to its pins,
//! and an acknowledged subscription to the book). As wasmtime-wasi's views
//! do, the transport defines the hook and the layer above implements it.

use rmcp::model::ServerJsonRpcMessage;

use super::book::Book;

/// Whether a message the tap saw goes on to rmcp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// rmcp gets it too.
    On,
    /// The tap took it; rmcp never sees it.
    Taken,
}

/// Sees every message from the server, in order, before rmcp.
pub trait Tap: Send + Sync + std::fmt::Debug {
    /// Called by the stdout reader for each message; `book` is the
    /// transport's book of requests in flight.
    fn on_message(&self, message: &ServerJsonRpcMessage, book: &Book) -> Pass;
}

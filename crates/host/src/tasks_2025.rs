//! 2025-11-25's experimental tasks, on the agent's side of the wire.
//!
//! An agent on 2025-11-25 asks for a task with `params.task` on
//! `tools/call`, and follows it with `tasks/get`, `tasks/result`,
//! `tasks/list` and `tasks/cancel`; a server says it takes such requests in
//! `capabilities.tasks` and per tool in `execution.taskSupport`. rmcp speaks
//! only the tasks extension that replaced them (2026-07-28): it drops
//! `params.task` when it reads a call, and its types carry neither
//! declaration. This module owns what rmcp cannot carry, at the level of
//! one JSON-RPC message, for a connection whose agent is on 2025-11-25:
//!
//! - on the way in, each of those requests is renamed to a method of
//!   Moat's own ([`METHOD_PREFIX`]), which rmcp hands the gateway as it is
//!   (`tools/call` only when it asks for a task);
//! - on the way out, Moat's answers to `initialize` and `tools/list`
//!   declare them.
//!
//! The gateway answers the renamed requests with tasks of its own (see
//! `gateway::own_task`), whatever revision the server speaks. Everything
//! else passes untouched: a message is parsed only when a cheap byte test
//! says it may be one of these.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The revision whose tasks this module carries.
pub const REVISION: &str = "2025-11-25";

/// What the requests are renamed to: `moat/2025-11-25/tools/call`,
/// `moat/2025-11-25/tasks/get`, ...
pub const METHOD_PREFIX: &str = "moat/2025-11-25/";

/// The task methods of 2025-11-25 (besides a `tools/call` with a task).
const TASK_METHODS: [&str; 4] = ["tasks/get", "tasks/result", "tasks/list", "tasks/cancel"];

/// What Moat declares to an agent on 2025-11-25 in `capabilities.tasks`.
fn capability() -> Value {
    serde_json::json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
}

/// A task as 2025-11-25 words it (`ttl` and `pollInterval`, where the
/// tasks extension has `ttlMs` and `pollIntervalMs`).
pub fn task(task: &rmcp::model::Task) -> Value {
    let mut worded = serde_json::json!({
        "taskId": task.task_id,
        "status": task.status,
        "createdAt": task.created_at,
        "lastUpdatedAt": task.last_updated_at,
        "ttl": task.ttl_ms,
    });
    if let Some(interval) = task.poll_interval_ms {
        worded["pollInterval"] = interval.into();
    }
    if let Some(message) = &task.status_message {
        worded["statusMessage"] = message.clone().into();
    }
    worded
}

/// What one connection's agent speaks, and the answers of Moat's that still
/// need declaring.
#[derive(Debug, Default)]
pub struct Wire {
    /// The agent is on 2025-11-25 (its `initialize` proposed it, or, over
    /// HTTP, its `MCP-Protocol-Version` header names it).
    legacy: AtomicBool,
    /// Ids of the agent's `initialize` and `tools/list` requests whose
    /// answers are to declare tasks.
    declare: Mutex<HashSet<String>>,
}

/// Whether `bytes` contains `needle` (a short marker).
fn contains(bytes: &[u8], needle: &[u8]) -> bool {
    bytes.windows(needle.len()).any(|window| window == needle)
}

impl Wire {
    /// A connection whose agent is known to be on 2025-11-25 (HTTP, from
    /// its headers), or not yet known (stdio: its `initialize` says).
    pub fn new(legacy: bool) -> Self {
        Self {
            legacy: AtomicBool::new(legacy),
            declare: Mutex::default(),
        }
    }

    fn declare(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.declare.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One message from the agent (a line, or an HTTP body), rewritten when
    /// it is one of 2025-11-25's task requests; `None` to pass it as it is.
    pub fn inbound(&self, message: &[u8]) -> Option<Vec<u8>> {
        let initialize = contains(message, b"\"initialize\"");
        let legacy = self.legacy.load(Ordering::Relaxed);
        let maybe = initialize
            || (legacy
                && (contains(message, b"\"tasks/")
                    || contains(message, b"\"task\"")
                    || contains(message, b"\"tools/list\"")));
        if !maybe {
            return None;
        }
        let mut value: Value = serde_json::from_slice(message).ok()?;
        let object = value.as_object_mut()?;
        let method = object.get("method")?.as_str()?.to_owned();
        let id = object.get("id").map(Value::to_string);
        if method == "initialize" {
            let proposed = object
                .get("params")
                .and_then(|params| params.get("protocolVersion"))
                .and_then(Value::as_str);
            let legacy = proposed == Some(REVISION);
            self.legacy.store(legacy, Ordering::Relaxed);
            if legacy && let Some(id) = id {
                self.declare().insert(id);
            }
            return None;
        }
        if !legacy {
            return None;
        }
        let renamed = match method.as_str() {
            "tools/list" => {
                if let Some(id) = id {
                    self.declare().insert(id);
                }
                return None;
            }
            "tools/call" => {
                // Only a call that asks for a task; `null` asks for none.
                let task = object.get("params").and_then(|params| params.get("task"));
                if !matches!(task, Some(Value::Object(_))) {
                    return None;
                }
                format!("{METHOD_PREFIX}tools/call")
            }
            method if TASK_METHODS.contains(&method) => format!("{METHOD_PREFIX}{method}"),
            _ => return None,
        };
        object.insert("method".to_owned(), Value::String(renamed));
        serde_json::to_vec(&value).ok()
    }

    /// Whether an answer of Moat's may need declaring (cheap: no parse).
    pub fn outbound_pending(&self) -> bool {
        !self.declare().is_empty()
    }

    /// One message from Moat to the agent, rewritten when it answers an
    /// `initialize` or `tools/list` that is to declare tasks; `None` to pass
    /// it as it is.
    pub fn outbound(&self, message: &[u8]) -> Option<Vec<u8>> {
        if !self.outbound_pending() || !contains(message, b"\"result\"") {
            return None;
        }
        let mut value: Value = serde_json::from_slice(message).ok()?;
        let id = value.get("id")?.to_string();
        if !self.declare().remove(&id) {
            return None;
        }
        let result = value.get_mut("result")?.as_object_mut()?;
        if let Some(capabilities) = result
            .get_mut("capabilities")
            .and_then(Value::as_object_mut)
        {
            capabilities.insert("tasks".to_owned(), capability());
        }
        if let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) {
            for tool in tools.iter_mut().filter_map(Value::as_object_mut) {
                tool.entry("execution")
                    .or_insert_with(|| serde_json::json!({}))
                    .as_object_mut()?
                    .insert("taskSupport".to_owned(), Value::from("optional"));
            }
        }
        serde_json::to_vec(&value).ok()
    }
}

/// Lines up to this long are looked at; a longer one passes as it comes
/// (no request this module rewrites is anywhere near it).
const INSPECTED: usize = 64 * 1024;

/// Splits a byte stream into lines for a rewrite, bounded by
/// [`INSPECTED`]: what it returns is what goes on.
#[derive(Default)]
struct Lines {
    /// The start of the current line, while it may still be inspected.
    line: Vec<u8>,
    /// The current line was too long: the rest of it passes as it comes.
    passing: bool,
}

impl Lines {
    /// Takes `bytes`, and returns what can go on now, each whole line
    /// through `rewrite` (when `inspect` says so at its start).
    fn feed(
        &mut self,
        mut bytes: &[u8],
        inspect: impl Fn() -> bool,
        rewrite: impl Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let end = bytes.iter().position(|b| *b == b'\n');
            let (part, rest, whole) = match end {
                Some(end) => (&bytes[..=end], &bytes[end + 1..], true),
                None => (bytes, &[][..], false),
            };
            bytes = rest;
            if self.passing || (self.line.is_empty() && !inspect()) {
                // Not looked at: goes on as it comes, to the line's end.
                out.extend_from_slice(part);
                self.passing = !whole;
                continue;
            }
            self.line.extend_from_slice(part);
            if whole {
                let line = std::mem::take(&mut self.line);
                let body = line.strip_suffix(b"\n").unwrap_or(&line);
                match rewrite(body) {
                    Some(mut rewritten) => {
                        rewritten.push(b'\n');
                        out.extend_from_slice(&rewritten);
                    }
                    None => out.extend_from_slice(&line),
                }
            } else if self.line.len() > INSPECTED {
                out.append(&mut self.line);
                self.passing = true;
            }
        }
        out
    }
}

/// The agent's input with 2025-11-25's task requests renamed.
pub struct Reader<R> {
    inner: R,
    wire: std::sync::Arc<Wire>,
    lines: Lines,
    ready: Vec<u8>,
    offset: usize,
    /// What one read from `inner` fills: zeroed once, not at every poll
    /// (a fresh zeroed buffer at every poll was a tenth of the host's
    /// instructions per call, there and in the reader under it).
    chunk: Box<[u8]>,
}

impl<R> Reader<R> {
    pub fn new(inner: R, wire: std::sync::Arc<Wire>) -> Self {
        Self {
            inner,
            wire,
            lines: Lines::default(),
            ready: Vec::new(),
            offset: 0,
            chunk: vec![0; 8192].into_boxed_slice(),
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Reader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.offset < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.offset);
                buf.put_slice(&this.ready[this.offset..this.offset + n]);
                this.offset += n;
                return Poll::Ready(Ok(()));
            }
            this.ready.clear();
            this.offset = 0;
            let mut read = ReadBuf::new(&mut this.chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let filled = read.filled();
            if filled.is_empty() {
                // End of input: a partial last line goes on as it is.
                let rest = std::mem::take(&mut this.lines.line);
                if rest.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                this.ready = rest;
                continue;
            }
            let wire = &this.wire;
            this.ready = this.lines.feed(filled, || true, |line| wire.inbound(line));
        }
    }
}

/// Moat's output to the agent, its answers to `initialize` and
/// `tools/list` declaring 2025-11-25's tasks where the agent speaks it.
pub struct Writer<W> {
    inner: W,
    wire: std::sync::Arc<Wire>,
    lines: Lines,
    pending: Vec<u8>,
    offset: usize,
}

impl<W> Writer<W> {
    pub fn new(inner: W, wire: std::sync::Arc<Wire>) -> Self {
        Self {
            inner,
            wire,
            lines: Lines::default(),
            pending: Vec::new(),
            offset: 0,
        }
    }
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    /// Writes out what is pending.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.offset < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.offset..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.offset += n;
        }
        self.pending.clear();
        self.offset = 0;
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Writer<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        let wire = &this.wire;
        if this.lines.line.is_empty() && !wire.outbound_pending() {
            // Nothing to look at (the common case): straight through,
            // keeping count of where lines end.
            let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
            if n > 0 {
                this.lines.passing = buf[n - 1] != b'\n';
            }
            return Poll::Ready(Ok(n));
        }
        this.pending = this
            .lines
            .feed(buf, || wire.outbound_pending(), |line| wire.outbound(line));
        // Taken: what is pending goes out with the next write or flush.
        let _ = this.poll_drain(cx)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(value: Value) -> Vec<u8> {
        serde_json::to_vec(&value).unwrap()
    }

    #[test]
    fn an_agent_on_2025_11_25_has_its_task_requests_renamed_and_tasks_declared() {
        let wire = Wire::new(false);
        let call = line(
            serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "a__job", "task": {"ttl": 1000}}}),
        );
        assert_eq!(wire.inbound(&call), None, "not before initialize says");
        let init = line(
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}}}),
        );
        assert_eq!(wire.inbound(&init), None, "passed as it is");
        let renamed: Value = serde_json::from_slice(&wire.inbound(&call).unwrap()).unwrap();
        assert_eq!(renamed["method"], "moat/2025-11-25/tools/call");
        assert_eq!(renamed["params"]["task"]["ttl"], 1000);
        let plain = line(
            serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "a__task", "task": null}}),
        );
        assert_eq!(wire.inbound(&plain), None, "a call without a task");
        for method in TASK_METHODS {
            let request = line(
                serde_json::json!({"jsonrpc": "2.0", "id": 4, "method": method,
                "params": {"taskId": "a__1"}}),
            );
            let renamed: Value = serde_json::from_slice(&wire.inbound(&request).unwrap()).unwrap();
            assert_eq!(renamed["method"], format!("moat/2025-11-25/{method}"));
        }
        let answer = line(serde_json::json!({"jsonrpc": "2.0", "id": 1,
            "result": {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}}));
        let declared: Value = serde_json::from_slice(&wire.outbound(&answer).unwrap()).unwrap();
        assert_eq!(declared["result"]["capabilities"]["tasks"], capability());
        assert_eq!(wire.outbound(&answer), None, "once");
        let list = line(serde_json::json!({"jsonrpc": "2.0", "id": "l", "method": "tools/list"}));
        assert_eq!(wire.inbound(&list), None);
        let tools = line(serde_json::json!({"jsonrpc": "2.0", "id": "l",
            "result": {"tools": [{"name": "a__job", "inputSchema": {}}]}}));
        let declared: Value = serde_json::from_slice(&wire.outbound(&tools).unwrap()).unwrap();
        assert_eq!(
            declared["result"]["tools"][0]["execution"]["taskSupport"],
            "optional"
        );
    }

    #[test]
    fn other_revisions_pass_untouched() {
        for revision in ["2025-06-18", "2026-07-28"] {
            let wire = Wire::new(false);
            let init = line(
                serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": revision}}),
            );
            wire.inbound(&init);
            assert!(!wire.outbound_pending(), "{revision}");
            let get = line(
                serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/get",
                "params": {"taskId": "a__1"}}),
            );
            assert_eq!(
                wire.inbound(&get),
                None,
                "{revision}: tasks/get is 2026's own"
            );
        }
    }

    #[tokio::test]
    async fn the_writer_declares_tasks_in_an_answer_written_in_pieces() {
        use tokio::io::AsyncWriteExt;
        let wire = std::sync::Arc::new(Wire::new(false));
        let init = line(
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25"}}),
        );
        let sent = [init.as_slice(), b"\n"].concat();
        let mut reader = Reader::new(&sent[..], wire.clone());
        let mut read = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut read)
            .await
            .unwrap();
        assert_eq!(read, sent, "passed as it came");
        let mut written = Vec::new();
        let mut writer = Writer::new(&mut written, wire.clone());
        writer
            .write_all(
                b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\"}\n{\"jsonrpc\":\"2.0\",",
            )
            .await
            .unwrap();
        writer
            .write_all(b"\"id\":1,\"result\":{\"capabilities\":{}}}\n")
            .await
            .unwrap();
        writer.flush().await.unwrap();
        let lines: Vec<Value> = written
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(lines[0]["method"], "notifications/x");
        assert_eq!(lines[1]["result"]["capabilities"]["tasks"], capability());
        assert!(!wire.outbound_pending());
    }

    #[test]
    fn lines_split_anywhere_come_out_whole_and_a_long_one_passes_as_it_comes() {
        let mut lines = Lines::default();
        let upper = |line: &[u8]| Some(line.to_ascii_uppercase());
        let mut out = lines.feed(b"ab", || true, upper);
        assert!(out.is_empty(), "held until its end");
        out.extend(lines.feed(b"c\nd", || true, upper));
        out.extend(lines.feed(b"e\n", || true, upper));
        assert_eq!(out, b"ABC\nDE\n");
        let long = vec![b'x'; INSPECTED + 10];
        let out = lines.feed(&long, || true, upper);
        assert_eq!(out, long, "too long to look at: as it came");
        let out = lines.feed(b"yy\nz\n", || true, upper);
        assert_eq!(out, b"yy\nZ\n", "its rest too; the next line is looked at");
        let out = lines.feed(b"q\n", || false, upper);
        assert_eq!(out, b"q\n", "not to be looked at");
    }
}

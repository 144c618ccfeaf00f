//! The codec: what crosses a server's stdio, byte by byte. Stdout is
//! newline-delimited JSON-RPC read with a maximum line length (a longer
//! line, or one that is not JSON-RPC, ends the session: fail closed, never
//! skip, never resynchronise); stderr is drained into a bounded rolling
//! buffer and the debug log, never into the protocol stream.

use std::collections::VecDeque;
use std::sync::Mutex;

use rmcp::model::{RequestId, ServerJsonRpcMessage};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::sync::watch;

use super::book::Book;

/// Bytes read from a server's stdout or stderr at a time. Each session holds
/// one such buffer per stream for its whole life, idle or not (the buffers
/// are zeroed, so resident), so they are kept small: a longer line is
/// gathered across reads, up to `max_line_bytes`.
pub(super) const STDIO_CHUNK_BYTES: usize = 4096;

/// A bounded rolling buffer of a server's stderr, with a byte count.
#[derive(Debug)]
pub struct StderrBuffer {
    capacity: usize,
    inner: Mutex<(VecDeque<u8>, u64)>,
}

impl StderrBuffer {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            // Grown as stderr arrives: most servers write little or
            // nothing, and an idle session should not hold the capacity.
            inner: Mutex::new((VecDeque::new(), 0)),
        }
    }

    fn push(&self, bytes: &[u8]) {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (buffer, total) = &mut *guard;
        *total += bytes.len() as u64;
        let keep = bytes.len().min(self.capacity);
        let bytes = &bytes[bytes.len() - keep..];
        let overflow = (buffer.len() + bytes.len()).saturating_sub(self.capacity);
        buffer.drain(..overflow);
        buffer.extend(bytes);
    }

    /// Bytes currently held (never more than the capacity).
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).0.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The configured capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Every byte the server has written to stderr.
    pub fn total_bytes(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    /// The last lines of stderr, sanitised for display: escape sequences and
    /// control characters removed, at most `max` bytes.
    pub fn tail(&self, max: usize) -> String {
        let bytes: Vec<u8> = {
            let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            guard.0.iter().copied().collect()
        };
        sanitize_tail(&bytes, max)
    }
}

/// Longest stderr line echoed to the log; the buffer keeps the rest.
const LOG_LINE_BYTES: usize = 1024;

/// Strips ANSI escape sequences and control characters (keeping newlines and
/// tabs), trims, and keeps at most the last `max` bytes on a char boundary.
pub fn sanitize_tail(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte; other escapes: ESC + one char.
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else if c == '\n' || c == '\t' || !c.is_control() {
            out.push(c);
        }
    }
    let trimmed = out.trim();
    if trimmed.len() <= max {
        return trimmed.to_owned();
    }
    let mut start = trimmed.len() - max;
    while !trimmed.is_char_boundary(start) {
        start += 1;
    }
    trimmed[start..].to_owned()
}

/// Reads the server's stderr into `buffer` and the debug log, a line at a
/// time (at most [`LOG_LINE_BYTES`] of each to the log), until it closes;
/// then says so on `drained`.
pub(super) async fn drain_stderr(
    server: &str,
    buffer: &StderrBuffer,
    stderr: Box<dyn AsyncRead + Send + Unpin>,
    drained: &watch::Sender<bool>,
) {
    let mut stderr = stderr;
    let mut chunk = vec![0u8; STDIO_CHUNK_BYTES];
    let mut partial: Vec<u8> = Vec::new();
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buffer.push(&chunk[..n]);
        for &byte in &chunk[..n] {
            if byte == b'\n' {
                tracing::debug!(%server, line = %sanitize_tail(&partial, LOG_LINE_BYTES), "stderr");
                partial.clear();
            } else if partial.len() < LOG_LINE_BYTES {
                partial.push(byte);
            }
        }
    }
    if !partial.is_empty() {
        tracing::debug!(%server, line = %sanitize_tail(&partial, LOG_LINE_BYTES), "stderr");
    }
    drained.send_replace(true);
}

/// Why no line could be read.
pub(super) enum FrameError {
    /// Reading failed.
    Io(String),
    /// The line grew past the maximum.
    TooLong,
}

/// Stdout, a line at a time, each at most `max` bytes (`\n` or `\r\n`
/// ended). The line is gathered across reads of [`STDIO_CHUNK_BYTES`].
pub(super) struct Lines {
    reader: BufReader<Box<dyn AsyncRead + Send + Unpin>>,
    line: Vec<u8>,
    max: usize,
}

impl Lines {
    pub(super) fn new(stdout: Box<dyn AsyncRead + Send + Unpin>, max: usize) -> Self {
        Self {
            reader: BufReader::with_capacity(STDIO_CHUNK_BYTES, stdout),
            line: Vec::new(),
            max,
        }
    }

    /// The next whole line, without its end; `None` at EOF (a partial
    /// last line is dropped with it: the server closed stdout).
    pub(super) async fn next(&mut self) -> Result<Option<&[u8]>, FrameError> {
        self.line.clear();
        loop {
            let buf = self
                .reader
                .fill_buf()
                .await
                .map_err(|error| FrameError::Io(error.to_string()))?;
            if buf.is_empty() {
                return Ok(None);
            }
            let (taken, complete) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            let content = if complete { taken - 1 } else { taken };
            if self.line.len() + content > self.max {
                return Err(FrameError::TooLong);
            }
            self.line.extend_from_slice(&buf[..content]);
            self.reader.consume(taken);
            if complete {
                if self.line.last() == Some(&b'\r') {
                    self.line.pop();
                }
                return Ok(Some(&self.line));
            }
        }
    }
}

pub(super) fn decode(book: &Book, line: &[u8]) -> Result<ServerJsonRpcMessage, String> {
    if line.is_empty() {
        return Err("empty line".to_owned());
    }
    if let Some(answer) = known_answer(book, line) {
        return Ok(answer);
    }
    let message =
        serde_json::from_slice::<ServerJsonRpcMessage>(line).map_err(|error| error.to_string())?;
    Ok(draft_discover(&message, line).unwrap_or(message))
}

/// A `server/discover` answer in the shape of a draft of the 2026-07-28
/// revision (no `ttlMs`, no `cacheScope`: Google's MCP Toolbox 1.12 answers
/// so, and speaks nothing else), read as a discover result that may not be
/// cached (`ttlMs` 0, `cacheScope` private). `None` for anything else; only
/// a line that did not decode as a known result gets here.
fn draft_discover(decoded: &ServerJsonRpcMessage, line: &[u8]) -> Option<ServerJsonRpcMessage> {
    use rmcp::model::{JsonRpcMessage, ServerResult};
    // Only what rmcp could not read as any known result is looked at again.
    let JsonRpcMessage::Response(response) = decoded else {
        return None;
    };
    let ServerResult::CustomResult(_) = &response.result else {
        return None;
    };
    let mut value: serde_json::Value = serde_json::from_slice(line).ok()?;
    let result = value.get_mut("result")?.as_object_mut()?;
    if !(result.contains_key("supportedVersions") && result.contains_key("capabilities")) {
        return None;
    }
    result.entry("ttlMs").or_insert(serde_json::json!(0));
    result
        .entry("cacheScope")
        .or_insert(serde_json::json!("private"));
    let patched = serde_json::from_value::<ServerJsonRpcMessage>(value).ok()?;
    match &patched {
        JsonRpcMessage::Response(response)
            if matches!(response.result, ServerResult::DiscoverResult(_)) =>
        {
            Some(patched)
        }
        _ => None,
    }
}

/// The answer to a pending `tools/call` or listing, decoded as what it
/// answers.
///
/// rmcp decodes a server's message as an untagged union: the line is
/// buffered whole, then tried as a request, then as each of twenty result
/// types in turn, and every miss builds an error message. A call's result
/// is the sixteenth: that was a sixth of the host's instructions per
/// forwarded call. `tools/list` is the tenth, and its answer carries every
/// tool's schemas: buffering and trying it was 7% of a start. The transport
/// knows what each pending id asked, so the answer to a call or a listing
/// is decoded as that result at once, under the same shape rule (a
/// `result`, and neither `method` nor `error`, whatever their values).
/// Anything else takes rmcp's path: every other message, an answer to
/// another request, and a result that is not of the kind asked for (a
/// task, a request for input), so nothing of the kinds rmcp reads is
/// refused here that rmcp accepts, and a result that decodes as what was
/// asked is what rmcp's client would have taken from it.
fn known_answer(book: &Book, line: &[u8]) -> Option<ServerJsonRpcMessage> {
    use rmcp::model::ConstString;
    use rmcp::model::ServerResult;
    /// A method whose answers are decoded at once, with its decoder.
    type Known = (
        &'static str,
        fn(&Book, &[u8], &str) -> Option<ServerJsonRpcMessage>,
    );
    const KNOWN: [Known; 5] = [
        (rmcp::model::CallToolRequestMethod::VALUE, |b, l, m| {
            typed(b, l, m, ServerResult::CallToolResult)
        }),
        (rmcp::model::ListToolsRequestMethod::VALUE, |b, l, m| {
            typed(b, l, m, ServerResult::ListToolsResult)
        }),
        (rmcp::model::ListPromptsRequestMethod::VALUE, |b, l, m| {
            typed(b, l, m, ServerResult::ListPromptsResult)
        }),
        (rmcp::model::ListResourcesRequestMethod::VALUE, |b, l, m| {
            typed(b, l, m, ServerResult::ListResourcesResult)
        }),
        (
            rmcp::model::ListResourceTemplatesRequestMethod::VALUE,
            |b, l, m| typed(b, l, m, ServerResult::ListResourceTemplatesResult),
        ),
    ];
    const METHODS: [&str; 5] = {
        let mut methods = [""; 5];
        let mut at = 0;
        while at < KNOWN.len() {
            methods[at] = KNOWN[at].0;
            at += 1;
        }
        methods
    };
    let asked = book.asking(&METHODS);
    let which = match asked.count_ones() {
        0 => return None,
        // One kind in flight (calls, in the steady state): only it is tried.
        1 => asked.trailing_zeros() as usize,
        // Several: the id says which, so a line is parsed at most twice.
        _ => {
            #[derive(serde::Deserialize)]
            struct Head {
                id: RequestId,
            }
            let head: Head = serde_json::from_slice(line).ok()?;
            book.asked_by(&head.id, &METHODS)?
        }
    };
    let (method, decode) = KNOWN[which];
    decode(book, line, method)
}

/// `line` decoded as the answer to a pending `method` whose result is `T`.
fn typed<T: serde::de::DeserializeOwned>(
    book: &Book,
    line: &[u8],
    method: &str,
    wrap: fn(T) -> rmcp::model::ServerResult,
) -> Option<ServerJsonRpcMessage> {
    /// Whether a key is present at all (`"error": null` counts).
    fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
        serde::de::IgnoredAny::deserialize(deserializer).map(|_| true)
    }
    #[derive(serde::Deserialize)]
    #[serde(bound = "T: serde::de::DeserializeOwned")]
    struct Answer<T> {
        jsonrpc: rmcp::model::JsonRpcVersion2_0,
        id: RequestId,
        result: T,
        #[serde(default, deserialize_with = "present")]
        method: bool,
        #[serde(default, deserialize_with = "present")]
        error: bool,
    }
    use serde::Deserialize;
    let answer: Answer<T> = serde_json::from_slice(line).ok()?;
    if answer.method || answer.error || !book.asks(&answer.id, method) {
        return None;
    }
    Some(ServerJsonRpcMessage::Response(
        rmcp::model::JsonRpcResponse {
            jsonrpc: answer.jsonrpc,
            id: answer.id,
            result: wrap(answer.result),
        },
    ))
}

/// The id a response or error answers.
pub(super) fn response_id(message: &ServerJsonRpcMessage) -> Option<RequestId> {
    match message {
        ServerJsonRpcMessage::Response(response) => Some(response.id.clone()),
        ServerJsonRpcMessage::Error(error) => error.id.clone(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A book with request 7 in flight as `method`.
    fn pending(method: &str) -> Book {
        let book = Book::default();
        book.sent(
            RequestId::Number(7),
            method.to_owned(),
            tokio::time::Instant::now() + Duration::from_secs(60),
        );
        book
    }

    #[test]
    fn a_draft_discover_answer_is_read_as_one_that_may_not_be_cached() {
        use rmcp::model::{CacheScope, JsonRpcMessage, ServerResult};
        let line = br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","supportedVersions":["2025-11-25","2026-07-28"],"capabilities":{"tools":{}},"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"Toolbox","version":"1.12.0"}}}}"#;
        let decoded = serde_json::from_slice::<ServerJsonRpcMessage>(line).unwrap();
        let patched = draft_discover(&decoded, line).expect("read as a discover result");
        let JsonRpcMessage::Response(response) = patched else {
            panic!("a response");
        };
        let ServerResult::DiscoverResult(result) = response.result else {
            panic!("a discover result: {:?}", response.result);
        };
        assert_eq!(
            (result.ttl_ms, result.cache_scope),
            (0, CacheScope::Private)
        );
        assert_eq!(result.supported_versions.len(), 2);
        // Any other result rmcp could not read is left as it is.
        let other =
            br#"{"jsonrpc":"2.0","id":2,"result":{"supportedVersions":"not a list","x":1}}"#;
        let decoded = serde_json::from_slice::<ServerJsonRpcMessage>(other).unwrap();
        assert!(draft_discover(&decoded, other).is_none());
    }

    #[test]
    fn tail_strips_escapes_and_controls_and_bounds_length() {
        let raw = b"ok line\n\x1b[31mred\x1b[0m\x07 bell\x00\n";
        assert_eq!(sanitize_tail(raw, 100), "ok line\nred bell");
        assert_eq!(sanitize_tail(b"abcdef", 3), "def");
        assert_eq!(sanitize_tail("ééé".as_bytes(), 3), "é");
    }

    #[test]
    fn stderr_buffer_keeps_the_last_bytes_and_counts_all() {
        let buffer = StderrBuffer::new(8);
        buffer.push(b"0123456789");
        buffer.push(b"ab");
        assert_eq!(buffer.len(), 8);
        assert_eq!(buffer.total_bytes(), 12);
        assert_eq!(buffer.tail(100), "456789ab");
    }

    fn result_of(message: &ServerJsonRpcMessage) -> &rmcp::model::ServerResult {
        match message {
            ServerJsonRpcMessage::Response(response) => &response.result,
            other => panic!("not a response: {other:?}"),
        }
    }

    /// A listing's answer is decoded as what was asked, into what rmcp's
    /// own decoding makes of it; an answer to another method, a result of
    /// another kind and a stray `error` take rmcp's path.
    #[test]
    fn a_listings_answer_is_decoded_as_its_result_and_nothing_else_is() {
        use rmcp::model::ServerResult;
        let json = |m: &ServerJsonRpcMessage| serde_json::to_value(m).unwrap();
        let answers: [(&str, &[u8]); 4] = [
            (
                "tools/list",
                br#"{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"echo","inputSchema":{"type":"object","properties":{"message":{"type":"string"}}},"annotations":{"readOnlyHint":true}}],"nextCursor":"2"}}"#,
            ),
            (
                "prompts/list",
                br#"{"jsonrpc":"2.0","id":7,"result":{"prompts":[{"name":"greet","arguments":[{"name":"who","required":true}]}]}}"#,
            ),
            (
                "resources/list",
                br#"{"jsonrpc":"2.0","id":7,"result":{"resources":[{"uri":"file:///a","name":"a"}],"ttlMs":5,"cacheScope":"private","resultType":"complete"}}"#,
            ),
            (
                "resources/templates/list",
                br#"{"jsonrpc":"2.0","id":7,"result":{"resourceTemplates":[{"uriTemplate":"file:///{p}","name":"p"}]}}"#,
            ),
        ];
        for (method, line) in answers {
            let book = pending(method);
            let fast = known_answer(&book, line).unwrap_or_else(|| panic!("{method}"));
            let general = serde_json::from_slice::<ServerJsonRpcMessage>(line).unwrap();
            assert_eq!(json(&fast), json(&general), "{method}");
            let same_kind = matches!(
                (result_of(&fast), result_of(&general)),
                (
                    ServerResult::ListToolsResult(_),
                    ServerResult::ListToolsResult(_)
                ) | (
                    ServerResult::ListPromptsResult(_),
                    ServerResult::ListPromptsResult(_)
                ) | (
                    ServerResult::ListResourcesResult(_),
                    ServerResult::ListResourcesResult(_)
                ) | (
                    ServerResult::ListResourceTemplatesResult(_),
                    ServerResult::ListResourceTemplatesResult(_)
                )
            );
            assert!(same_kind, "{method}: {fast:?}");
            // Not for an id that asked something else.
            assert!(
                known_answer(&pending("tools/call"), line).is_none(),
                "{method}"
            );
        }
        // Several kinds in flight: each answer is read as what its own id
        // asked, and one whose id is not in flight is left to rmcp.
        let book = pending("tools/list");
        book.sent(
            RequestId::Number(8),
            "tools/call".to_owned(),
            tokio::time::Instant::now() + Duration::from_secs(60),
        );
        let listing = known_answer(&book, answers[0].1).expect("the listing");
        assert!(matches!(
            result_of(&listing),
            ServerResult::ListToolsResult(_)
        ));
        let call =
            br#"{"jsonrpc":"2.0","id":8,"result":{"content":[{"type":"text","text":"hi"}]}}"#;
        let answered = known_answer(&book, call).expect("the call");
        assert!(matches!(
            result_of(&answered),
            ServerResult::CallToolResult(_)
        ));
        let stray = br#"{"jsonrpc":"2.0","id":9,"result":{"tools":[]}}"#;
        assert!(known_answer(&book, stray).is_none());
        // A `tools/list` answer with no `tools` (an error's shape, a request
        // for input) is not a listing: rmcp's path reads it.
        let book = pending("tools/list");
        let input = br#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"input_required","inputRequests":{}}}"#;
        assert!(known_answer(&book, input).is_none());
        let stray = br#"{"jsonrpc":"2.0","id":7,"result":{"tools":[]},"error":null}"#;
        assert!(known_answer(&book, stray).is_none());
        assert!(
            decode(&book, stray)
                .unwrap_err()
                .contains("unrecognized JSON-RPC message")
        );
    }

    #[test]
    fn a_calls_answer_is_decoded_as_a_call_result_and_nothing_else_is() {
        use rmcp::model::ServerResult;
        let call = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hi"}],"isError":false}}"#;
        // Taken at once when the pending id asked `tools/call`...
        let book = pending("tools/call");
        let fast = known_answer(&book, call).expect("the fast path takes a call's answer");
        let ServerResult::CallToolResult(result) = result_of(&fast) else {
            panic!("{fast:?}");
        };
        assert_eq!(result.is_error, Some(false));
        // ... and the same as rmcp's own decoding of it.
        let json = |m: &ServerJsonRpcMessage| serde_json::to_value(m).unwrap();
        assert_eq!(json(&decode(&book, call).unwrap()), json(&fast));
        let general = serde_json::from_slice::<ServerJsonRpcMessage>(call).unwrap();
        assert!(matches!(
            result_of(&general),
            ServerResult::CallToolResult(_)
        ));
        assert_eq!(json(&general), json(&fast));
        // Not for an id that asked something else, nor one not pending.
        assert!(known_answer(&pending("tools/list"), call).is_none());
        let other = br#"{"jsonrpc":"2.0","id":8,"result":{"content":[]}}"#;
        assert!(known_answer(&book, other).is_none());
        // A stray `error` or `method` beside the result, even null, is refused
        // as rmcp refuses it.
        for stray in [
            &br#"{"jsonrpc":"2.0","id":7,"result":{"content":[]},"error":null}"#[..],
            br#"{"jsonrpc":"2.0","id":7,"result":{"content":[]},"method":"x"}"#,
        ] {
            assert!(known_answer(&book, stray).is_none());
            let refused = decode(&book, stray).unwrap_err();
            assert!(
                refused.contains("unrecognized JSON-RPC message"),
                "{refused}"
            );
        }
        // A task under 2026-07-28 (`resultType: "task"`) is rmcp's to read,
        // as the task; a call's fields beside a `task` key are a call's
        // result to rmcp too.
        let created = br#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"task","taskId":"t","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttl":null,"content":[]}}"#;
        assert!(known_answer(&book, created).is_none());
        assert!(matches!(
            result_of(&decode(&book, created).unwrap()),
            ServerResult::CreateTaskResult(_)
        ));
        let both = br#"{"jsonrpc":"2.0","id":7,"result":{"content":[],"task":{"taskId":"t","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttl":null}}}"#;
        let general = serde_json::from_slice::<ServerJsonRpcMessage>(both).unwrap();
        assert_eq!(
            json(&known_answer(&book, both).expect("a call's result")),
            json(&general)
        );
        // A result that is not a call's (a task) takes rmcp's path.
        let task = br#"{"jsonrpc":"2.0","id":7,"result":{"task":{"taskId":"t","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttl":null}}}"#;
        assert!(known_answer(&book, task).is_none());
        let decoded = decode(&book, task).unwrap();
        assert!(
            !matches!(result_of(&decoded), ServerResult::CallToolResult(_)),
            "{decoded:?}"
        );
    }
}

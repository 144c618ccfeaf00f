//! A client's messages as an rmcp server reads them from a stream:
//! newline-delimited JSON-RPC, with a `tools/call` decoded as a call at
//! once. `moat serve` reads its agent on stdio so, and a guest built with
//! moat-wit its host (`moat_wit::transport`).
//!
//! rmcp reads a client's request as an untagged union of its request
//! types, tried in turn, and every miss builds an error message: a
//! `tools/call` is the fourteenth, so each call cost thirteen misses (about
//! 24 K instructions natively, a twentieth of a call forwarded by `moat
//! serve`, and as much again inside the guest). This transport reads the
//! client's lines itself, and decodes a line that is a `tools/call`
//! request as one, under rmcp's shape rule (a `method` and an `id`, and
//! neither `result` nor `error`). Every other line, and a call that does
//! not decode so, goes through rmcp's own codec unchanged, so what rmcp
//! accepts, skips or refuses is what this accepts, skips or refuses.
//!
//! The rest follows rmcp's `AsyncRwTransport` (rmcp 3.11) step for step:
//! lines of at most [`DEFAULT_MAX_LINE_LENGTH`] (a longer one is dropped
//! and the connection stays open), a blank line skipped, input that is not
//! JSON ignored, JSON that is no message answered with "Invalid request"
//! before the next read, and the writes rmcp's codec makes. Reads are
//! cancel-safe as rmcp's are: the service loop polls `receive` in a
//! `select!`, and a partial line stays buffered for the next call.

use std::sync::Arc;

use futures::SinkExt;
use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequest, ClientJsonRpcMessage, ClientRequest, ErrorData, JsonRpcRequest,
    JsonRpcVersion2_0, RequestId, ServerJsonRpcMessage,
};
use rmcp::transport::async_rw::{
    DEFAULT_MAX_LINE_LENGTH, JsonRpcMessageCodec, JsonRpcMessageCodecError,
};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader};
use tokio_util::codec::{Decoder, FramedWrite};

type Framed<W> = FramedWrite<W, JsonRpcMessageCodec<ServerJsonRpcMessage>>;

/// rmcp's server transport over a stream, with `tools/call` decoded at
/// once (see the crate's docs).
pub struct ServerLines<R, W> {
    read: BufReader<R>,
    line: Vec<u8>,
    /// Dropping the rest of a line that grew too long.
    discarding: bool,
    write: Arc<tokio::sync::Mutex<Option<Framed<W>>>>,
    /// An "Invalid request" owed to the client, queued or written and not
    /// yet flushed: sent before the next read, as rmcp does.
    owed: Option<Owed>,
    codec: JsonRpcMessageCodec<ClientJsonRpcMessage>,
}

enum Owed {
    Queue,
    Flush,
}

enum LineRead {
    Line,
    Oversized,
    Eof,
    Io(std::io::Error),
}

enum Step {
    Line,
    More,
    EndDiscard,
    Oversized,
    OversizedNeedsDiscard,
}

impl<R, W> ServerLines<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    /// Reads the client's messages from `read` and writes the server's to
    /// `write`.
    pub fn new(read: R, write: W) -> Self {
        Self {
            read: BufReader::new(read),
            line: Vec::new(),
            discarding: false,
            write: Arc::new(tokio::sync::Mutex::new(Some(FramedWrite::new(
                write,
                JsonRpcMessageCodec::default(),
            )))),
            owed: None,
            codec: JsonRpcMessageCodec::default(),
        }
    }

    /// One `\n`-ended line into `self.line`, never longer than the maximum:
    /// nothing is consumed past what is copied, and nothing is awaited
    /// between the copy and the consume, so a dropped read loses nothing.
    async fn read_line(&mut self) -> LineRead {
        loop {
            let (consumed, step) = {
                let available = match self.read.fill_buf().await {
                    Ok(available) => available,
                    Err(error) => return LineRead::Io(error),
                };
                if available.is_empty() {
                    return LineRead::Eof;
                }
                let newline = available.iter().position(|b| *b == b'\n');
                let take = newline.map_or(available.len(), |at| at + 1);
                if self.discarding {
                    (take, newline.map_or(Step::More, |_| Step::EndDiscard))
                } else if self.line.len().saturating_add(take) > DEFAULT_MAX_LINE_LENGTH {
                    self.line.clear();
                    let step = if newline.is_some() {
                        Step::Oversized
                    } else {
                        Step::OversizedNeedsDiscard
                    };
                    (take, step)
                } else {
                    self.line.extend_from_slice(&available[..take]);
                    (take, newline.map_or(Step::More, |_| Step::Line))
                }
            };
            self.read.consume(consumed);
            match step {
                Step::Line => return LineRead::Line,
                Step::More => {}
                Step::EndDiscard => self.discarding = false,
                Step::Oversized => return LineRead::Oversized,
                Step::OversizedNeedsDiscard => {
                    self.discarding = true;
                    return LineRead::Oversized;
                }
            }
        }
    }

    /// The owed "Invalid request", written and flushed; `false` when the
    /// client's side is closed.
    async fn pay(&mut self) -> bool {
        let Some(owed) = self.owed.as_mut() else {
            return true;
        };
        let mut write = self.write.lock().await;
        let Some(framed) = write.as_mut() else {
            return false;
        };
        if matches!(owed, Owed::Queue) {
            let answer = ServerJsonRpcMessage::error(
                ErrorData::invalid_request("Invalid request", None),
                None,
            );
            if framed.feed(answer).await.is_err() {
                return false;
            }
            *owed = Owed::Flush;
        }
        if framed.flush().await.is_err() {
            return false;
        }
        drop(write);
        self.owed = None;
        true
    }
}

/// `line` as a `tools/call` request, when it is one under rmcp's shape rule
/// and decodes as one; `None` for anything else, which rmcp's codec reads.
fn call(line: &[u8]) -> Option<ClientJsonRpcMessage> {
    /// Whether a key is present at all (`"error": null` counts).
    fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
        serde::de::IgnoredAny::deserialize(deserializer).map(|_| true)
    }
    #[derive(serde::Deserialize)]
    struct CallLine {
        jsonrpc: JsonRpcVersion2_0,
        id: RequestId,
        #[serde(flatten)]
        request: CallToolRequest,
        #[serde(default, deserialize_with = "present")]
        result: bool,
        #[serde(default, deserialize_with = "present")]
        error: bool,
    }
    use serde::Deserialize;
    // A cheap test first: most lines are not calls.
    const METHOD: &[u8] = b"\"tools/call\"";
    if !line.windows(METHOD.len()).any(|window| window == METHOD) {
        return None;
    }
    let call: CallLine = serde_json::from_slice(line).ok()?;
    if call.result || call.error {
        return None;
    }
    Some(ClientJsonRpcMessage::Request(JsonRpcRequest {
        jsonrpc: call.jsonrpc,
        id: call.id,
        request: ClientRequest::CallToolRequest(call.request),
    }))
}

/// A line without the `\r` of a `\r\n` end.
fn without_carriage_return(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

impl<R, W> rmcp::transport::Transport<RoleServer> for ServerLines<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = self.write.clone();
        async move {
            match write.lock().await.as_mut() {
                Some(framed) => framed.send(item).await.map_err(Into::into),
                None => Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "Transport is closed",
                )),
            }
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            if !self.pay().await {
                return None;
            }
            // A line read part-way before a cancelled receive stays in
            // `self.line`; it is cleared only once a whole line is handled.
            match self.read_line().await {
                LineRead::Line => {}
                LineRead::Oversized => {
                    tracing::error!(
                        max_line_length = DEFAULT_MAX_LINE_LENGTH,
                        "a message exceeded the maximum line length; dropped"
                    );
                    continue;
                }
                LineRead::Eof => return None,
                LineRead::Io(error) => {
                    tracing::error!(%error, "reading the client's messages failed");
                    return None;
                }
            }
            let parsed = {
                let line =
                    without_carriage_return(self.line.strip_suffix(b"\n").unwrap_or(&self.line));
                if line.is_empty() {
                    self.line.clear();
                    continue;
                }
                match call(line) {
                    Some(call) => Ok(Some(call)),
                    None => {
                        let mut buffer = tokio_util::bytes::BytesMut::with_capacity(line.len() + 1);
                        buffer.extend_from_slice(line);
                        buffer.extend_from_slice(b"\n");
                        self.codec.decode(&mut buffer)
                    }
                }
            };
            self.line.clear();
            match parsed {
                Ok(Some(message)) => return Some(message),
                // A notification rmcp skips for compatibility.
                Ok(None) => continue,
                Err(JsonRpcMessageCodecError::Serde(error)) => match error.classify() {
                    // Not JSON: no id to answer, and answering could start
                    // a storm with a peer that echoes it. Ignored, as rmcp
                    // and the other SDKs do.
                    serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                        tracing::debug!(%error, "ignoring unparsable input");
                    }
                    serde_json::error::Category::Data | serde_json::error::Category::Io => {
                        tracing::debug!(%error, "a message is no JSON-RPC message");
                        self.owed = Some(Owed::Queue);
                    }
                },
                Err(error) => {
                    tracing::error!(%error, "reading the client's messages failed");
                    return None;
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        drop(self.write.lock().await.take());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::transport::Transport;
    use tokio::io::AsyncWriteExt;

    /// What rmcp's own codec makes of `line`.
    fn rmcp_reads(line: &[u8]) -> Option<ClientJsonRpcMessage> {
        let mut buffer = tokio_util::bytes::BytesMut::from(line);
        buffer.extend_from_slice(b"\n");
        JsonRpcMessageCodec::<ClientJsonRpcMessage>::default()
            .decode(&mut buffer)
            .ok()
            .flatten()
    }

    /// A call is decoded at once into what rmcp's codec makes of it, and
    /// nothing that rmcp would read otherwise is taken for a call.
    #[test]
    fn a_call_is_read_as_rmcp_reads_it_and_nothing_else_is_a_call() {
        let calls: [&[u8]; 4] = [
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"s__echo","arguments":{"message":"hi","n":1.5,"big":18446744073709551615}}}"#,
            br#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"s__echo","_meta":{"progressToken":3,"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}}"#,
            br#"{"params":{"name":"a","inputResponses":{"k":{"action":"decline"}},"requestState":"s"},"method":"tools/call","id":1,"jsonrpc":"2.0"}"#,
            br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"a","extra":[1,2]},"other":true}"#,
        ];
        for line in calls {
            let fast = call(line)
                .unwrap_or_else(|| panic!("not a call: {}", String::from_utf8_lossy(line)));
            let reference = rmcp_reads(line).unwrap();
            assert!(matches!(
                &reference,
                ClientJsonRpcMessage::Request(request)
                    if matches!(request.request, ClientRequest::CallToolRequest(_))
            ));
            assert_eq!(
                serde_json::to_value(&fast).unwrap(),
                serde_json::to_value(&reference).unwrap()
            );
        }
        let not_calls: [&[u8]; 7] = [
            // Not the call's shape: rmcp refuses these.
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"error":null}"#,
            // A notification of that name, a call without a name, another
            // method naming "tools/call" in its arguments, a bad version.
            br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"a"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"tools/call"}}"#,
            br#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"a"}}"#,
            b"\xEF\xBB\xBF{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"a\"}}",
        ];
        for line in not_calls {
            assert!(call(line).is_none(), "{}", String::from_utf8_lossy(line));
        }
        // The last is a call all the same, read by rmcp's codec (a BOM).
        assert!(rmcp_reads(not_calls[6]).is_some());
    }

    /// Over a pipe: calls and other messages in order, blank lines skipped,
    /// input that is not JSON ignored,
    /// JSON that is no message answered "Invalid request", and a line past
    /// the maximum dropped with the connection kept.
    #[tokio::test]
    async fn a_clients_lines_are_read_as_rmcp_reads_them() {
        let (mut client, read) = tokio::io::duplex(1 << 20);
        let (write, answers) = tokio::io::duplex(1 << 20);
        let mut lines = ServerLines::new(read, write);
        let mut input = Vec::new();
        input.extend_from_slice(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
        input.extend_from_slice(b"\n\r\n\n");
        input.extend_from_slice(b"not json\n");
        input.extend_from_slice(
            br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"s__echo"}}"#,
        );
        input.extend_from_slice(b"\r\n");
        input.extend_from_slice(br#"{"no":"message"}"#);
        input.push(b'\n');
        client.write_all(&input).await.unwrap();
        let first = lines.receive().await.unwrap();
        assert!(matches!(
            &first,
            ClientJsonRpcMessage::Request(request)
                if matches!(request.request, ClientRequest::PingRequest(_))
        ));
        let second = lines.receive().await.unwrap();
        assert!(matches!(
            &second,
            ClientJsonRpcMessage::Request(request)
                if request.id == RequestId::Number(2)
                    && matches!(request.request, ClientRequest::CallToolRequest(_))
        ));
        // Past the maximum: dropped; the next line is read.
        let long = vec![b' '; DEFAULT_MAX_LINE_LENGTH + 1];
        let writing = tokio::spawn(async move {
            client.write_all(&long).await.unwrap();
            client
                .write_all(b"\n{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}\n")
                .await
                .unwrap();
            client
        });
        let third = lines.receive().await.unwrap();
        assert!(matches!(
            &third,
            ClientJsonRpcMessage::Request(request) if request.id == RequestId::Number(3)
        ));
        let client = writing.await.unwrap();
        drop(client);
        assert!(lines.receive().await.is_none(), "end of input");
        // The one answer of its own: "Invalid request" for `{"no":"message"}`.
        lines.close().await.unwrap();
        let mut answered = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut { answers }, &mut answered)
            .await
            .unwrap();
        let answered: Vec<serde_json::Value> = answered
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(answered.len(), 1, "{answered:?}");
        assert_eq!(answered[0]["error"]["message"], "Invalid request");
        assert_eq!(answered[0]["id"], serde_json::Value::Null);
    }
}

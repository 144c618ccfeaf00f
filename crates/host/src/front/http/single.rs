//! An answer that is all a request's stream carries, sent as one JSON body.
//!
//! rmcp answers every request of a session with a stream of server-sent
//! events: a priming event (an event id and a retry time, so that a client
//! cut off can resume), then whatever the server sends on the request's
//! behalf (progress, its own requests to the agent), then the answer, and
//! the stream's end. Most calls send nothing but the answer.
//!
//! A client that keeps its connections but stops reading once it has the
//! answer (rmcp's client over a pooled reqwest client) leaves the end of
//! the chunked body unread unless it came with the answer, and its HTTP
//! library cannot use the connection again: the next call pays a new TCP
//! connection on both sides. A stream also leaves the server in at least
//! two writes, and every client parses it event by event.
//!
//! So the stream is held for up to [`HOLD`]. When the answer and the
//! stream's end both come in that time with nothing but the priming event
//! before them, the answer goes out as `application/json`, whole, with its
//! length: the spec lets a server answer a POST that way, and every client
//! accepts it (a client must accept both to send the request at all, and
//! rmcp checks its `Accept` before the stream is made). Anything else in
//! the stream (a notification, a request to the agent, an event after the
//! answer), or the time running out, sends the stream as it came, the held
//! events first, with nothing lost or reordered.
//!
//! Only a POST's stream is held: a GET's stream (the standalone stream, or
//! a resumed one) must stay a stream.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, BodyStream, Full, StreamBody};
use hyper::Response;
use hyper::body::Frame;

/// How long a request's stream is held for an answer that comes alone: long
/// enough for a call that needs no more than a round trip through the
/// server, short enough that a long call's stream (its priming event, and
/// the headers that tell the client its request was taken) is not kept
/// from the client for long.
pub(super) const HOLD: Duration = Duration::from_millis(100);

/// `response`, rmcp's answer to a POST, as one JSON body when its stream
/// carries one answer and nothing else within `hold` (see the module docs);
/// otherwise the stream as it came.
pub(super) async fn single(
    response: Response<BoxBody<Bytes, Infallible>>,
    hold: Duration,
) -> Response<BoxBody<Bytes, Infallible>> {
    let is_stream = response
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_stream {
        return response;
    }
    let (mut parts, mut body) = response.into_parts();
    let deadline = tokio::time::Instant::now() + hold;
    let mut held: Vec<Frame<Bytes>> = Vec::new();
    let mut answer: Option<Bytes> = None;
    loop {
        let next = tokio::time::timeout_at(deadline, body.frame()).await;
        let frame = match next {
            // The stream ended: with the answer alone, it goes as JSON.
            Ok(None) => match answer {
                Some(answer) => {
                    parts.headers.insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("application/json"),
                    );
                    parts.headers.remove(hyper::header::CACHE_CONTROL);
                    parts.headers.remove(hyper::header::CONTENT_LENGTH);
                    return Response::from_parts(parts, Full::new(answer).boxed());
                }
                None => break,
            },
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(never))) => match never {},
            // Time is up: the stream goes as a stream.
            Err(_) => break,
        };
        let event = frame.data_ref().map(Event::of);
        held.push(frame);
        match (event, &answer) {
            // Only the end may follow the answer.
            (_, Some(_)) => break,
            (Some(Event::Quiet), None) => {}
            (Some(Event::Message(data)), None) if is_answer(&data) => answer = Some(data),
            // A notification or request before the answer, or a frame
            // that is not one event: the stream goes as a stream.
            _ => break,
        }
    }
    let rest = futures::StreamExt::chain(
        futures::stream::iter(held.into_iter().map(Ok::<_, Infallible>)),
        BodyStream::new(body),
    );
    Response::from_parts(parts, StreamBody::new(rest).boxed())
}

/// What one frame of a stream of server-sent events holds.
#[derive(Debug, PartialEq)]
enum Event {
    /// Events with no data: a priming event, or a comment (a keep-alive).
    Quiet,
    /// One event with data: its lines' data, joined.
    Message(Bytes),
    /// Anything else (two events in one frame, an event cut in two).
    Other,
}

impl Event {
    fn of(frame: &Bytes) -> Self {
        let text = frame.as_ref();
        // One event: its fields, then the blank line that ends it.
        let Some(fields) = text.strip_suffix(b"\n\n") else {
            return Self::Other;
        };
        if fields.windows(2).any(|w| w == b"\n\n") {
            return Self::Other;
        }
        let mut data: Option<Vec<u8>> = None;
        for line in fields.split(|b| *b == b'\n') {
            let Some(value) = line.strip_prefix(b"data:") else {
                continue;
            };
            let value = value.strip_prefix(b" ").unwrap_or(value);
            match &mut data {
                None => data = Some(value.to_vec()),
                Some(data) => {
                    data.push(b'\n');
                    data.extend_from_slice(value);
                }
            }
        }
        match data {
            Some(data) if !data.is_empty() => Self::Message(Bytes::from(data)),
            _ => Self::Quiet,
        }
    }
}

/// Whether `data` is a JSON-RPC answer (a result or an error), not a
/// notification or a request of the server's: a request's stream carries
/// the answer to that request only, and ends after it.
fn is_answer(data: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(default, deserialize_with = "present")]
        method: bool,
        #[serde(default, deserialize_with = "present")]
        result: bool,
        #[serde(default, deserialize_with = "present")]
        error: bool,
    }
    /// Whether a key is present at all (`"error": null` counts).
    fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
        serde::de::IgnoredAny::deserialize(deserializer).map(|_| true)
    }
    use serde::Deserialize;
    serde_json::from_slice::<Probe>(data)
        .is_ok_and(|probe| !probe.method && (probe.result || probe.error))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(frames: &[&'static str]) -> Response<BoxBody<Bytes, Infallible>> {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = frames
            .iter()
            .map(|f| Ok(Frame::data(Bytes::from_static(f.as_bytes()))))
            .collect();
        Response::builder()
            .header(hyper::header::CONTENT_TYPE, "text/event-stream")
            .header(hyper::header::CACHE_CONTROL, "no-cache")
            .header("mcp-session-id", "s")
            .body(StreamBody::new(futures::stream::iter(frames)).boxed())
            .unwrap()
    }

    async fn read(response: Response<BoxBody<Bytes, Infallible>>) -> (String, String) {
        let kind = response.headers()[hyper::header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_owned();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (kind, String::from_utf8(body.to_vec()).unwrap())
    }

    const PRIMING: &str = "id: 0\nretry: 3000\ndata:\n\n";
    const ANSWER: &str = "id: 1\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n\n";
    const PROGRESS: &str = "id: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n";

    #[tokio::test]
    async fn an_answer_alone_goes_as_one_json_body_with_the_headers_kept() {
        let response = single(stream(&[PRIMING, ANSWER]), HOLD).await;
        assert_eq!(response.headers()["mcp-session-id"], "s");
        assert!(
            !response
                .headers()
                .contains_key(hyper::header::CACHE_CONTROL)
        );
        assert_eq!(
            read(response).await,
            (
                "application/json".to_owned(),
                "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}".to_owned()
            )
        );
    }

    #[tokio::test]
    async fn an_error_alone_goes_as_json_too() {
        const ERROR: &str = "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-32601,\"message\":\"no\"}}\n\n";
        let (kind, body) = read(single(stream(&[ERROR]), HOLD).await).await;
        assert_eq!(kind, "application/json");
        assert!(body.contains("-32601"), "{body}");
    }

    #[tokio::test]
    async fn a_notification_before_the_answer_keeps_the_stream_whole_and_in_order() {
        let frames = [PRIMING, PROGRESS, ANSWER];
        let (kind, body) = read(single(stream(&frames), HOLD).await).await;
        assert_eq!(kind, "text/event-stream");
        assert_eq!(body, frames.concat());
    }

    #[tokio::test]
    async fn anything_after_the_answer_keeps_the_stream() {
        let frames = [ANSWER, PROGRESS];
        let (kind, body) = read(single(stream(&frames), HOLD).await).await;
        assert_eq!(kind, "text/event-stream");
        assert_eq!(body, frames.concat());
    }

    #[tokio::test]
    async fn a_stream_that_ends_without_an_answer_stays_a_stream() {
        let (kind, body) = read(single(stream(&[PRIMING]), HOLD).await).await;
        assert_eq!(
            (kind.as_str(), body.as_str()),
            ("text/event-stream", PRIMING)
        );
    }

    #[tokio::test]
    async fn a_json_answer_or_a_status_is_left_as_it_is() {
        let response = Response::builder()
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from_static(b"{}")).boxed())
            .unwrap();
        assert_eq!(
            read(single(response, HOLD).await).await,
            ("application/json".to_owned(), "{}".to_owned())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_answer_goes_as_the_stream_once_the_hold_is_over_with_the_priming_event_first() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
        tx.send(Ok(Frame::data(Bytes::from_static(PRIMING.as_bytes()))))
            .await
            .unwrap();
        let response = Response::builder()
            .header(hyper::header::CONTENT_TYPE, "text/event-stream")
            .body(
                StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|frame| (frame, rx))
                }))
                .boxed(),
            )
            .unwrap();
        // The clock is paused: the hold runs out only because nothing
        // comes, and the stream's headers leave then, before the answer.
        let response = single(response, HOLD).await;
        assert_eq!(
            response.headers()[hyper::header::CONTENT_TYPE],
            "text/event-stream"
        );
        let mut body = response.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, PRIMING.as_bytes());
        tx.send(Ok(Frame::data(Bytes::from_static(ANSWER.as_bytes()))))
            .await
            .unwrap();
        drop(tx);
        let rest = body.collect().await.unwrap().to_bytes();
        assert_eq!(rest, ANSWER.as_bytes());
    }

    #[test]
    fn events_are_read_as_the_sse_format_says() {
        assert_eq!(
            Event::of(&Bytes::from_static(PRIMING.as_bytes())),
            Event::Quiet
        );
        assert_eq!(Event::of(&Bytes::from_static(b": ping\n\n")), Event::Quiet);
        assert_eq!(
            Event::of(&Bytes::from_static(b"data: a\ndata: b\n\n")),
            Event::Message(Bytes::from_static(b"a\nb"))
        );
        assert_eq!(Event::of(&Bytes::from_static(b"data: a\n")), Event::Other);
        assert_eq!(
            Event::of(&Bytes::from_static(b"data: a\n\ndata: b\n\n")),
            Event::Other
        );
        assert!(is_answer(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
        assert!(!is_answer(
            br#"{"jsonrpc":"2.0","id":1,"method":"roots/list"}"#
        ));
        assert!(!is_answer(b"not json"));
    }
}

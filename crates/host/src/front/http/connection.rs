//! One accepted connection: its slot (or a raw 503), then per request the
//! probes, the token, the path, the body's size and deadline, the session
//! limit and the audit log's health, before rmcp's service sees it; a
//! 2025-11-25 agent's task messages are rewritten at the wire
//! ([`crate::tasks_2025`]), and an answer that comes alone is sent as one
//! JSON body (`single`). A connection timed out or evicted is answered 408
//! on a second handle on its socket.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use super::Connection;
use super::admission::phase;
use super::answer::{json_error, raw_refusal, refused, status};
use super::clock::{Marked, RequestClock};
use super::guard::token_matches;
use super::probes::observe;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

/// The header a replica names itself in.
const REPLICA_HEADER: &str = "moat-replica";

/// How long a refusal may take to write before the socket is dropped.
const REFUSAL_WRITE: Duration = Duration::from_secs(1);

impl Connection {
    pub(super) async fn run(self, mut stream: tokio::net::TcpStream) {
        let Some(_slot) = self.admission.admit().await else {
            refused(
                &self.gateway,
                "max-connections",
                StatusCode::SERVICE_UNAVAILABLE,
            );
            let refusal = raw_refusal(StatusCode::SERVICE_UNAVAILABLE);
            let _ = tokio::time::timeout(REFUSAL_WRITE, stream.write_all(&refusal)).await;
            return;
        };
        // A second handle on the socket, to answer 408 once hyper has given
        // the connection up.
        let Ok(raw) = stream.into_std().and_then(|s| Ok((s.try_clone()?, s))) else {
            return;
        };
        let (answer, stream) = raw;
        let Ok(stream) = tokio::net::TcpStream::from_std(stream) else {
            return;
        };
        let phase = Arc::new(AtomicU8::new(phase::NEW));
        let evict = CancellationToken::new();
        self.admission.enlist(&phase, &evict);
        let gateway = self.gateway.clone();
        let clock = Arc::new(RequestClock::default());
        let this = Arc::new(self);
        let handler = {
            let phase = phase.clone();
            let clock = clock.clone();
            let this = this.clone();
            hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                phase.store(phase::BODY, Ordering::SeqCst);
                let deadline = clock.began() + this.request_timeout;
                let this = this.clone();
                let phase = phase.clone();
                let clock = clock.clone();
                async move {
                    let response = this.handle(request, deadline, &phase).await;
                    phase.store(phase::ANSWERING, Ordering::SeqCst);
                    clock.reset();
                    Ok::<_, Infallible>(response)
                }
            })
        };
        let io = Marked {
            inner: stream,
            clock,
        };
        let served = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(this.header_timeout)
            .serve_connection(hyper_util::rt::TokioIo::new(io), handler);
        let timed_out = tokio::select! {
            result = served => match result {
                Err(error) if error.is_timeout() => Some("header-timeout"),
                _ => None,
            },
            () = evict.cancelled() => Some(if phase.load(Ordering::SeqCst) == phase::BODY {
                "evicted-slow-body"
            } else {
                "evicted-idle"
            }),
        };
        if let Some(reason) = timed_out {
            refused(&gateway, reason, StatusCode::REQUEST_TIMEOUT);
            // Non-blocking, best effort: the client may already be gone.
            let _ = answer.set_nonblocking(true);
            let _ = std::io::Write::write(&mut &answer, &raw_refusal(StatusCode::REQUEST_TIMEOUT));
        }
    }

    /// Answers `request`, whose body must have arrived by `deadline`;
    /// `phase` becomes [`phase::ANSWERING`] once it has. A replica names
    /// itself in every answer.
    async fn handle(
        &self,
        request: Request<hyper::body::Incoming>,
        deadline: Instant,
        phase: &AtomicU8,
    ) -> Response<BoxBody<Bytes, Infallible>> {
        let mut response = self.answer(request, deadline, phase).await;
        if let Some(replica) = self.gateway.replica()
            && let Ok(name) = hyper::header::HeaderValue::from_str(replica.name())
        {
            response.headers_mut().insert(REPLICA_HEADER, name);
        }
        response
    }

    async fn answer(
        &self,
        request: Request<hyper::body::Incoming>,
        deadline: Instant,
        phase: &AtomicU8,
    ) -> Response<BoxBody<Bytes, Infallible>> {
        if let Some(response) = observe(
            &request,
            &self.gateway,
            &self.hosts,
            self.max_sessions,
            self.expected.as_deref(),
        ) {
            return response;
        }
        if let Some(expected) = &self.expected {
            let presented = request
                .headers()
                .get(hyper::header::AUTHORIZATION)
                .map(|v| v.as_bytes());
            if !token_matches(expected, presented) {
                refused(&self.gateway, "unauthorized", StatusCode::UNAUTHORIZED);
                return status(StatusCode::UNAUTHORIZED);
            }
        }
        if request.uri().path() != "/mcp" {
            return status(StatusCode::NOT_FOUND);
        }
        let misrouted = request
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .and_then(|id| self.gateway.misrouted("session", id));
        if let Some(told) = misrouted {
            // 404 is what tells an agent on a 2025 revision that its
            // session is gone and to initialize a new one.
            refused(&self.gateway, "other-replica", StatusCode::NOT_FOUND);
            return json_error(StatusCode::NOT_FOUND, &told);
        }
        let declared = request
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_body as u64) {
            refused(
                &self.gateway,
                "body-too-large",
                StatusCode::PAYLOAD_TOO_LARGE,
            );
            return status(StatusCode::PAYLOAD_TOO_LARGE);
        }
        let new_session = request.method() == hyper::Method::POST
            && !request.headers().contains_key("mcp-session-id");
        if new_session && self.gateway.live_sessions() >= self.max_sessions {
            refused(
                &self.gateway,
                "max-sessions",
                StatusCode::SERVICE_UNAVAILABLE,
            );
            return status(StatusCode::SERVICE_UNAVAILABLE);
        }
        if new_session && self.gateway.draining() {
            refused(&self.gateway, "draining", StatusCode::SERVICE_UNAVAILABLE);
            return status(StatusCode::SERVICE_UNAVAILABLE);
        }
        if new_session && self.gateway.audit_failure().is_some() {
            refused(
                &self.gateway,
                "audit-unwritable",
                StatusCode::SERVICE_UNAVAILABLE,
            );
            return status(StatusCode::SERVICE_UNAVAILABLE);
        }
        let (mut parts, body) = request.into_parts();
        let collected =
            tokio::time::timeout_at(deadline.into(), Limited::new(body, self.max_body).collect())
                .await;
        phase.store(phase::ANSWERING, Ordering::SeqCst);
        let Ok(collected) = collected else {
            refused(
                &self.gateway,
                "request-timeout",
                StatusCode::REQUEST_TIMEOUT,
            );
            let mut response = status(StatusCode::REQUEST_TIMEOUT);
            response.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
            return response;
        };
        let body = match collected {
            Ok(collected) => collected.to_bytes(),
            Err(error) if error.is::<http_body_util::LengthLimitError>() => {
                refused(
                    &self.gateway,
                    "body-too-large",
                    StatusCode::PAYLOAD_TOO_LARGE,
                );
                return status(StatusCode::PAYLOAD_TOO_LARGE);
            }
            Err(_) => return status(StatusCode::BAD_REQUEST),
        };
        // 2025-11-25's task requests and declarations, which rmcp does not
        // carry, rewritten for an agent on that revision.
        let revision = parts
            .headers
            .get("mcp-protocol-version")
            .and_then(|v| v.to_str().ok());
        let wire = crate::tasks_2025::Wire::new(revision == Some(crate::tasks_2025::REVISION));
        let body = match wire.inbound(&body) {
            Some(renamed) => {
                parts.headers.remove(hyper::header::CONTENT_LENGTH);
                Bytes::from(renamed)
            }
            None => body,
        };
        let post = parts.method == hyper::Method::POST;
        let request = Request::from_parts(parts, Full::new(body));
        let response = match tower_service::Service::call(&mut self.service.clone(), request).await
        {
            Ok(response) => response,
            Err(never) => match never {},
        };
        // An answer that comes alone, as one JSON body (`single`).
        let response = if post {
            super::single::single(response, super::single::HOLD).await
        } else {
            response
        };
        if !wire.outbound_pending() {
            return response;
        }
        let wire = Arc::new(wire);
        let (mut parts, body) = response.into_parts();
        parts.headers.remove(hyper::header::CONTENT_LENGTH);
        let body = body
            .map_frame(move |frame| frame.map_data(|data| with_tasks_declared(&wire, data)))
            .boxed();
        Response::from_parts(parts, body)
    }
}

/// A piece of an answer's body (JSON, or server-sent events each on a
/// `data:` line) with Moat's answers to a 2025-11-25 agent's `initialize`
/// and `tools/list` declaring tasks ([`crate::tasks_2025`]).
fn with_tasks_declared(wire: &crate::tasks_2025::Wire, data: Bytes) -> Bytes {
    if let Some(rewritten) = wire.outbound(&data) {
        return Bytes::from(rewritten);
    }
    if !data.starts_with(b"data:") && !data.windows(6).any(|w| w == b"\ndata:") {
        return data;
    }
    let mut out = Vec::with_capacity(data.len() + 128);
    for line in data.split_inclusive(|b| *b == b'\n') {
        let rewritten = line.strip_prefix(b"data:").and_then(|payload| {
            let end = payload.len() - payload.ends_with(b"\n") as usize;
            wire.outbound(payload[..end].trim_ascii())
        });
        match rewritten {
            Some(json) => {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(&json);
                if line.ends_with(b"\n") {
                    out.push(b'\n');
                }
            }
            None => out.extend_from_slice(line),
        }
    }
    Bytes::from(out)
}

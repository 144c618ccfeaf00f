//! The streamable HTTP front of `moat serve --http`, and what bounds it.
//! The CLI binds the listener and says when to stop; everything between the
//! socket and the gateway's agent sessions is here.
//!
//! Every limit comes from `[serve]` in the config and answers with a status
//! the client can act on, plus an audit event (`http_refused`):
//! - connections (`max_connections`): at the limit the oldest connection
//!   that has not sent a request yet, or whose request body is still
//!   arriving, is closed with 408 to make room, so a flood of idle or
//!   dripping connections cannot keep an agent out; with none to close,
//!   the new one gets 503;
//! - request headers (`header_timeout_ms`): a connection that sends none in
//!   time (or idles that long between requests) gets 408 and is closed;
//! - whole requests (`request_timeout_ms`): a request whose body has not
//!   arrived in full that long after its first byte gets 408 and its
//!   connection is closed, however steadily it drips;
//! - request bodies (`max_body_bytes`): a larger one gets 413 before it is
//!   read further;
//! - sessions (`max_sessions`): an `initialize` beyond it gets 503; a session
//!   with no request for `session_idle_ms` is closed with its children.
//!
//! An audit log that cannot be written (see [`crate::audit`]) turns every
//! new session away with 503 (`audit-unwritable`); the sessions open get
//! the log's error for every call.
//!
//! Beside `/mcp`, the listener answers `/healthz` (200 while it serves),
//! `/readyz` (200 while a new agent session would be admitted, else 503)
//! and `/metrics` (the gateway's counters, see [`crate::metrics`]): the
//! probes need no token and say nothing but their status; `/metrics` needs
//! the token when one is set, a `Host` the listener accepts, and no
//! browser `Origin`.
//!
//! Accept errors (EMFILE above all) are retried with a growing pause and
//! never end the process. The bearer token is compared in constant time.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::audit::Event;
use crate::gateway::Gateway;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::{Request, Response, StatusCode};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// The shortest and longest pause after a failed accept.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));
/// How long a refusal may take to write before the socket is dropped.
const REFUSAL_WRITE: Duration = Duration::from_secs(1);
/// How long a new connection waits for the room an eviction makes.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// What `moat serve --http` accepts beyond loopback Host names.
#[derive(Clone, Debug, Default)]
pub struct Allowed {
    /// Host header values (`name` or `name:port`).
    pub hosts: Vec<String>,
    /// Browser origins.
    pub origins: Vec<String>,
}

/// Why the HTTP front could not serve.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("--http: reading the listener's local address failed: {0}")]
    LocalAddr(#[source] std::io::Error),
    #[error(
        "--http {addr} is not a loopback address: set a bearer token with --token or MOAT_HTTP_TOKEN"
    )]
    TokenRequired { addr: std::net::SocketAddr },
    #[error(
        "--metrics {addr} is not a loopback address: beside stdio serving, metrics are served on loopback only (there is no token to ask for)"
    )]
    MetricsNotLoopback { addr: std::net::SocketAddr },
}

/// Where a connection is in its life, for eviction: a connection waiting
/// for its first request, or whose request body is still arriving, can be
/// closed to make room; one being answered (or that has been, and idles
/// between requests under `header_timeout_ms`) is not.
mod phase {
    /// Admitted; no request head yet.
    pub const NEW: u8 = 0;
    /// A request's head has arrived; its body is being read.
    pub const BODY: u8 = 1;
    /// Its request is being answered, or has been.
    pub const ANSWERING: u8 = 2;
}

/// An admitted connection that may be asked to make room (see [`phase`]).
struct Waiting {
    phase: std::sync::Weak<AtomicU8>,
    evict: CancellationToken,
}

/// Who holds a connection slot, and who may be asked to give one up.
struct Admission {
    slots: Arc<Semaphore>,
    max: usize,
    waiting: Mutex<VecDeque<Waiting>>,
}

impl Admission {
    fn new(max: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
            waiting: Mutex::default(),
        }
    }

    fn enlist(&self, phase: &Arc<AtomicU8>, evict: &CancellationToken) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if waiting.len() > 2 * self.max {
            waiting.retain(Waiting::alive);
        }
        waiting.push_back(Waiting {
            phase: Arc::downgrade(phase),
            evict: evict.clone(),
        });
    }

    /// Asks the oldest admitted connection that has not sent a request, or
    /// whose request body is still arriving, to close. Whether there was
    /// one. Connections being answered stay listed: their next request's
    /// body may be slow too.
    fn evict_oldest_waiting(&self) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.retain(Waiting::alive);
        match waiting.iter().position(Waiting::evictable) {
            Some(at) => {
                if let Some(oldest) = waiting.remove(at) {
                    oldest.evict.cancel();
                }
                true
            }
            None => false,
        }
    }

    /// A slot for a new connection: a free one, or one an eviction frees.
    async fn admit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Some(permit);
        }
        if !self.evict_oldest_waiting() {
            return None;
        }
        tokio::time::timeout(EVICTION_WAIT, self.slots.clone().acquire_owned())
            .await
            .ok()?
            .ok()
    }
}

impl Waiting {
    /// Whether its connection is still open.
    fn alive(&self) -> bool {
        !self.evict.is_cancelled() && self.phase.strong_count() > 0
    }

    fn evictable(&self) -> bool {
        !self.evict.is_cancelled()
            && self
                .phase
                .upgrade()
                .is_some_and(|p| p.load(Ordering::SeqCst) != phase::ANSWERING)
    }
}

/// The socket as hyper reads it, noting when the current request's first
/// byte arrived (for `request_timeout_ms`).
struct Marked<T> {
    inner: T,
    clock: Arc<RequestClock>,
}

/// When the request now arriving on a connection began.
#[derive(Default)]
struct RequestClock(Mutex<Option<Instant>>);

impl RequestClock {
    fn mark(&self) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Instant::now);
    }

    /// When the current request began (now, if no byte of it was seen).
    fn began(&self) -> Instant {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Instant::now)
    }

    /// The current request is over: the next byte read begins another.
    fn reset(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Marked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.clock.mark();
        }
        polled
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Marked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

fn empty() -> BoxBody<Bytes, Infallible> {
    Empty::<Bytes>::new().boxed()
}

fn status(code: StatusCode) -> Response<BoxBody<Bytes, Infallible>> {
    let mut response = Response::new(empty());
    *response.status_mut() = code;
    if code == StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from_static("1"),
        );
    }
    response
}

/// A whole response for a connection Moat will not serve, written raw.
fn raw_refusal(code: StatusCode) -> Vec<u8> {
    format!(
        "HTTP/1.1 {} {}\r\nContent-Length: 0\r\nConnection: close\r\n{}\r\n",
        code.as_u16(),
        code.canonical_reason().unwrap_or_default(),
        if code == StatusCode::SERVICE_UNAVAILABLE {
            "Retry-After: 1\r\n"
        } else {
            ""
        }
    )
    .into_bytes()
}

fn refused(gateway: &Gateway, reason: &str, code: StatusCode) {
    tracing::debug!(reason, status = code.as_u16(), "http request refused");
    // Counted in the metrics even when the log can no longer take it.
    let _ = gateway.record(&Event::HttpRefused {
        reason: reason.to_owned(),
        status: code.as_u16(),
    });
}

/// Whether `presented` is the expected `Authorization` value, compared in
/// constant time (for values of the same length).
fn token_matches(expected: &str, presented: Option<&[u8]>) -> bool {
    use subtle::ConstantTimeEq;
    presented.is_some_and(|p| bool::from(expected.as_bytes().ct_eq(p)))
}

/// Serves `gateway` on `listener` until `shutdown` resolves, then drains
/// every session. A listener beyond loopback needs a `token`.
pub async fn serve(
    gateway: Gateway,
    listener: tokio::net::TcpListener,
    token: Option<String>,
    allowed: Allowed,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<Vec<(String, crate::session::ClientError)>, HttpError> {
    let settings = gateway.serve_settings().clone();
    let addr = listener.local_addr().map_err(HttpError::LocalAddr)?;
    if !addr.ip().is_loopback() && token.is_none() {
        return Err(HttpError::TokenRequired { addr });
    }
    let cancel = CancellationToken::new();
    let mut http_config = StreamableHttpServerConfig::default();
    http_config.cancellation_token = cancel.clone();
    http_config.allowed_hosts.extend(allowed.hosts);
    // DNS rebinding and cross-site requests: a browser's Origin must be one
    // the operator listed (rmcp leaves Origin unchecked unless told).
    let mut http_config = http_config
        .with_allowed_origins(allowed.origins)
        .enforce_origin_validation();
    if !addr.ip().is_loopback() {
        http_config.allowed_hosts.push(addr.ip().to_string());
        http_config.allowed_hosts.push(addr.to_string());
    }
    let hosts: Arc<[String]> = http_config.allowed_hosts.clone().into();
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive =
        Some(Duration::from_millis(settings.session_idle_ms.get()));
    let factory_gateway = gateway.clone();
    let max_sessions = settings.max_sessions.get();
    let service = StreamableHttpService::new(
        move || {
            // The handler refuses first, with 503; this holds under a race.
            if factory_gateway.live_sessions() >= max_sessions {
                return Err(std::io::Error::other(format!(
                    "{max_sessions} agent sessions are open (max_sessions)"
                )));
            }
            if let Some(error) = factory_gateway.audit_failure() {
                return Err(std::io::Error::other(error.to_string()));
            }
            Ok(factory_gateway.session())
        },
        Arc::new(sessions),
        http_config,
    );
    let expected = token.map(|t| format!("Bearer {t}"));
    let admission = Arc::new(Admission::new(settings.max_connections.get()));
    tokio::pin!(shutdown);
    let mut backoff = ACCEPT_BACKOFF.0;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = ACCEPT_BACKOFF.0;
                stream
            }
            Err(error) => {
                // EMFILE, ENFILE, ENOBUFS, ECONNABORTED...: the listener is
                // fine; wait for descriptors or memory to come back.
                tracing::warn!(%error, ?backoff, "accept failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = &mut shutdown => break,
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
                continue;
            }
        };
        let connection = Connection {
            gateway: gateway.clone(),
            service: service.clone(),
            expected: expected.clone(),
            admission: admission.clone(),
            header_timeout: Duration::from_millis(settings.header_timeout_ms.get()),
            request_timeout: Duration::from_millis(settings.request_timeout_ms.get()),
            max_body: settings.max_body_bytes.get(),
            max_sessions,
            hosts: hosts.clone(),
        };
        tokio::spawn(connection.run(stream));
    }
    // Drain every open session while agents can still receive answers,
    // then stop serving.
    let failures = gateway.close_all().await;
    cancel.cancel();
    Ok(failures)
}

type Service = StreamableHttpService<crate::gateway::AgentSession, LocalSessionManager>;

/// One accepted connection and what it needs.
struct Connection {
    gateway: Gateway,
    service: Service,
    expected: Option<String>,
    admission: Arc<Admission>,
    header_timeout: Duration,
    request_timeout: Duration,
    max_body: usize,
    max_sessions: usize,
    /// The `Host` values accepted (as rmcp checks them for `/mcp`).
    hosts: Arc<[String]>,
}

/// The answer to a probe (`/healthz`, `/readyz`) or a scrape (`/metrics`),
/// or `None` for any other path. A scrape needs `expected` (the bearer
/// token's `Authorization` value) when there is one, a `Host` in `hosts`,
/// no browser `Origin`, and GET.
fn observe(
    request: &Request<hyper::body::Incoming>,
    gateway: &Gateway,
    hosts: &[String],
    max_sessions: usize,
    expected: Option<&str>,
) -> Option<Response<BoxBody<Bytes, Infallible>>> {
    Some(match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        // Which log and why are for the operator (stderr), not the prober.
        "/readyz" if gateway.audit_failure().is_some() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: the audit log cannot be written\n".into(),
        ),
        // Ready with servers that could not start: the others serve, and the
        // prober learns which (the reasons are in the log and the audit log).
        "/readyz" if gateway.live_sessions() < max_sessions => {
            let mut body = String::from("ready\n");
            for (server, failure) in gateway.not_started() {
                body.push_str(&format!(
                    "server `{server}` is not started ({} failed starts; its tools are left out)\n",
                    failure.attempts
                ));
            }
            text(StatusCode::OK, "text/plain", body)
        }
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("not ready: {max_sessions} agent sessions are open (max_sessions)\n"),
        ),
        "/metrics" => {
            if let Some(expected) = expected {
                let presented = request
                    .headers()
                    .get(hyper::header::AUTHORIZATION)
                    .map(|v| v.as_bytes());
                if !token_matches(expected, presented) {
                    refused(gateway, "unauthorized", StatusCode::UNAUTHORIZED);
                    return Some(status(StatusCode::UNAUTHORIZED));
                }
            }
            if !host_allowed(request, hosts)
                || request.headers().contains_key(hyper::header::ORIGIN)
            {
                status(StatusCode::FORBIDDEN)
            } else if request.method() != hyper::Method::GET {
                status(StatusCode::METHOD_NOT_ALLOWED)
            } else {
                text(
                    StatusCode::OK,
                    crate::metrics::CONTENT_TYPE,
                    gateway.metrics().encode(),
                )
            }
        }
        _ => return None,
    })
}

/// `moat serve --metrics ADDR` beside stdio serving: `/metrics`,
/// `/healthz` and `/readyz` only, on a loopback address (there is no token
/// to ask for), until `shutdown`.
pub async fn serve_probes(
    gateway: Gateway,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), HttpError> {
    let addr = listener.local_addr().map_err(HttpError::LocalAddr)?;
    if !addr.ip().is_loopback() {
        return Err(HttpError::MetricsNotLoopback { addr });
    }
    let hosts: Arc<[String]> = ["localhost", "127.0.0.1", "::1"].map(String::from).into();
    let settings = gateway.serve_settings().clone();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "metrics listener: accept failed");
                    tokio::select! {
                        () = tokio::time::sleep(ACCEPT_BACKOFF.0) => continue,
                        () = &mut shutdown => break,
                    }
                }
            },
            () = &mut shutdown => break,
        };
        let gateway = gateway.clone();
        let hosts = hosts.clone();
        let max_sessions = settings.max_sessions.get();
        let handler = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
            let response = observe(&request, &gateway, &hosts, max_sessions, None)
                .unwrap_or_else(|| status(StatusCode::NOT_FOUND));
            async move { Ok::<_, Infallible>(response) }
        });
        let header_timeout = Duration::from_millis(settings.header_timeout_ms.get());
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), handler)
                .await;
        });
    }
    Ok(())
}

/// A plain-text answer.
fn text(
    code: StatusCode,
    content_type: &str,
    body: String,
) -> Response<BoxBody<Bytes, Infallible>> {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    *response.status_mut() = code;
    if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// Whether the request's `Host` is one the listener accepts: the host
/// (brackets removed, any case) equal to an allowed one, and the port too
/// when the allowed entry names one.
fn host_allowed(request: &Request<hyper::body::Incoming>, allowed: &[String]) -> bool {
    let authority = |text: &str| {
        let authority = hyper::http::uri::Authority::try_from(text.trim()).ok()?;
        let host = authority
            .host()
            .trim_matches(['[', ']'])
            .to_ascii_lowercase();
        Some((host, authority.port_u16()))
    };
    let Some((host, port)) = request
        .headers()
        .get(hyper::header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(authority)
    else {
        return false;
    };
    allowed
        .iter()
        .filter_map(|a| authority(a))
        .any(|(h, p)| h == host && p.is_none_or(|p| Some(p) == port))
}

impl Connection {
    async fn run(self, mut stream: tokio::net::TcpStream) {
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
    /// `phase` becomes [`phase::ANSWERING`] once it has.
    async fn handle(
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
        let request = Request::from_parts(parts, Full::new(body));
        let response = match tower_service::Service::call(&mut self.service.clone(), request).await
        {
            Ok(response) => response,
            Err(never) => match never {},
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn the_token_must_match_exactly() {
        assert!(token_matches("Bearer abc", Some(b"Bearer abc")));
        assert!(!token_matches("Bearer abc", Some(b"Bearer abd")));
        assert!(!token_matches("Bearer abc", Some(b"Bearer ab")));
        assert!(!token_matches("Bearer abc", None));
    }

    #[test]
    fn refusals_say_when_to_retry_only_for_503() {
        let busy = String::from_utf8(raw_refusal(StatusCode::SERVICE_UNAVAILABLE)).unwrap();
        assert_eq!(
            busy,
            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
        );
        let slow = String::from_utf8(raw_refusal(StatusCode::REQUEST_TIMEOUT)).unwrap();
        assert!(!slow.contains("Retry-After"), "{slow}");
        assert_eq!(
            status(StatusCode::SERVICE_UNAVAILABLE).headers()[hyper::header::RETRY_AFTER],
            "1"
        );
        assert!(status(StatusCode::NOT_FOUND).headers().is_empty());
    }

    #[tokio::test]
    async fn a_full_house_evicts_the_oldest_connection_that_has_not_asked_anything() {
        let admission = Arc::new(Admission::new(2));
        let silent = (
            Arc::new(AtomicU8::new(phase::NEW)),
            CancellationToken::new(),
        );
        let asking = (
            Arc::new(AtomicU8::new(phase::ANSWERING)),
            CancellationToken::new(),
        );
        let held_by_silent = admission.admit().await.unwrap();
        let _held_by_asking = admission.admit().await.unwrap();
        admission.enlist(&silent.0, &silent.1);
        admission.enlist(&asking.0, &asking.1);
        // The silent connection closes when told to, freeing its slot.
        let evicted = silent.1.clone();
        tokio::spawn(async move {
            evicted.cancelled().await;
            drop(held_by_silent);
        });
        assert!(admission.admit().await.is_some(), "room was made");
        assert!(silent.1.is_cancelled(), "the silent one was evicted");
        assert!(!asking.1.is_cancelled(), "one that asked is never evicted");
    }

    #[tokio::test]
    async fn a_connection_whose_body_is_still_arriving_is_evicted_too() {
        let admission = Arc::new(Admission::new(2));
        let answered = (
            Arc::new(AtomicU8::new(phase::ANSWERING)),
            CancellationToken::new(),
        );
        let dripping = (
            Arc::new(AtomicU8::new(phase::BODY)),
            CancellationToken::new(),
        );
        let _held_by_answered = admission.admit().await.unwrap();
        let held_by_dripping = admission.admit().await.unwrap();
        admission.enlist(&answered.0, &answered.1);
        admission.enlist(&dripping.0, &dripping.1);
        let evicted = dripping.1.clone();
        tokio::spawn(async move {
            evicted.cancelled().await;
            drop(held_by_dripping);
        });
        assert!(admission.admit().await.is_some(), "room was made");
        assert!(dripping.1.is_cancelled(), "the dripping one was evicted");
        assert!(!answered.1.is_cancelled());
        // The answered one stays listed: once its next body drips, it goes.
        answered.0.store(phase::BODY, Ordering::SeqCst);
        assert!(admission.evict_oldest_waiting());
        assert!(answered.1.is_cancelled());
    }

    #[tokio::test]
    async fn with_no_silent_connection_to_evict_a_new_one_is_refused() {
        let admission = Admission::new(1);
        let asking = (
            Arc::new(AtomicU8::new(phase::ANSWERING)),
            CancellationToken::new(),
        );
        let _held = admission.admit().await.unwrap();
        admission.enlist(&asking.0, &asking.1);
        assert!(admission.admit().await.is_none());
        assert!(!asking.1.is_cancelled());
    }

    fn gateway() -> Gateway {
        let config = crate::config::Config {
            path: "moat.toml".into(),
            servers: Default::default(),
            serve: Default::default(),
            wasm: Default::default(),
        };
        Gateway::new(crate::host::Host::new(None).unwrap(), config, None)
    }

    /// The status line's code of the answer to `request`, sent raw.
    async fn status_of(addr: std::net::SocketAddr, request: &str) -> u16 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before an answer: {answer:?}");
            answer.extend_from_slice(&buf[..n]);
        }
        let line = String::from_utf8_lossy(&answer);
        line[9..12].parse().unwrap()
    }

    #[tokio::test]
    async fn requests_are_refused_by_token_path_and_size_before_the_gateway() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let served = tokio::spawn(serve(
            gateway(),
            listener,
            Some("sesame".into()),
            Allowed::default(),
            stop.clone().cancelled_owned(),
        ));
        let host = format!("Host: {addr}\r\nConnection: close\r\n");
        let no_token = format!("POST /mcp HTTP/1.1\r\n{host}Content-Length: 0\r\n\r\n");
        assert_eq!(status_of(addr, &no_token).await, 401);
        let wrong = format!(
            "POST /mcp HTTP/1.1\r\n{host}Authorization: Bearer sesamf\r\nContent-Length: 0\r\n\r\n"
        );
        assert_eq!(status_of(addr, &wrong).await, 401);
        let elsewhere =
            format!("GET /other HTTP/1.1\r\n{host}Authorization: Bearer sesame\r\n\r\n");
        assert_eq!(status_of(addr, &elsewhere).await, 404);
        let huge = format!(
            "POST /mcp HTTP/1.1\r\n{host}Authorization: Bearer sesame\r\nContent-Length: {}\r\n\r\n",
            crate::config::ServeSettings::default().max_body_bytes.get() + 1
        );
        assert_eq!(status_of(addr, &huge).await, 413);
        stop.cancel();
        let failures = served.await.unwrap().unwrap();
        assert!(failures.is_empty());
    }

    #[tokio::test]
    async fn probes_need_nothing_and_metrics_need_the_token_a_host_and_no_origin() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let served = tokio::spawn(serve(
            gateway(),
            listener,
            Some("sesame".into()),
            Allowed::default(),
            stop.clone().cancelled_owned(),
        ));
        let get = |path: &str, headers: &str| {
            format!("GET {path} HTTP/1.1\r\nConnection: close\r\n{headers}\r\n")
        };
        let host = format!("Host: {addr}\r\n");
        let token = "Authorization: Bearer sesame\r\n";
        assert_eq!(status_of(addr, &get("/healthz", &host)).await, 200);
        assert_eq!(status_of(addr, &get("/readyz", &host)).await, 200);
        assert_eq!(status_of(addr, &get("/metrics", &host)).await, 401);
        let scrape = format!("{host}{token}");
        assert_eq!(status_of(addr, &get("/metrics", &scrape)).await, 200);
        let rebound = format!("Host: evil.example:{}\r\n{token}", addr.port());
        assert_eq!(status_of(addr, &get("/metrics", &rebound)).await, 403);
        let browser = format!("{scrape}Origin: http://evil.example\r\n");
        assert_eq!(status_of(addr, &get("/metrics", &browser)).await, 403);
        let post = format!(
            "POST /metrics HTTP/1.1\r\nConnection: close\r\n{scrape}Content-Length: 0\r\n\r\n"
        );
        assert_eq!(status_of(addr, &post).await, 405);
        stop.cancel();
        assert!(served.await.unwrap().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_listener_beyond_loopback_needs_a_token() {
        let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let error = serve(
            gateway(),
            listener,
            None,
            Allowed::default(),
            std::future::pending(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "--http {addr} is not a loopback address: set a bearer token with --token or MOAT_HTTP_TOKEN"
            )
        );
    }
}

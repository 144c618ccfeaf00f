//! `moat node`'s listener: TLS only (rustls, with the node's certificate
//! and key from PEM files), the fronts' token on every request (compared
//! in constant time), and three routes:
//!
//! - `POST /launch`: a launch request (see [`crate::remote::request`]) with
//!   the front's nonce in `moat-nonce`; answered with the signed statement
//!   (200), or `{"error": "..."}` with 400 (a malformed request, a field
//!   beyond profile and revision, a bad nonce), 404 (no such profile), 409
//!   (not locked, or a stale revision) or 502 (the launch failed).
//! - `/launch/ID/mcp`: the launched server, over MCP's streamable HTTP.
//! - `DELETE /launch/ID`: the front releases the launch; its process tree
//!   ends.
//!
//! At most `[serve] max_sessions` launches are held at once (another is
//! refused with 503 before anything starts), and at most `max_connections`
//! connections are served (the next waits for a slot). `/healthz` answers
//! 200 with no token, for probes. A launch nothing asks
//! anything of for `[serve] session_idle_ms` ends; at shutdown every launch
//! ends before the listener returns. Bodies are bounded by `[serve]
//! max_body_bytes`, a TLS handshake by [`HANDSHAKE_TIMEOUT`], request
//! headers by `header_timeout_ms`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use super::NodeError;
use super::launch::Node;
use super::served::{Held, Served};
use crate::identity::Digest;
use crate::remote::node::{LAUNCH_PATH, NONCE_HEADER};

/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest launch request read (it holds two short strings).
const MAX_LAUNCH_BODY: usize = 4096;

type Body = BoxBody<Bytes, Infallible>;
type Mcp = StreamableHttpService<Served, LocalSessionManager>;

/// The node's TLS configuration from its certificate chain and key (PEM),
/// and the sha256 of its certificate, which fronts pin as `cert_sha256`.
pub fn tls(cert: &Path, key: &Path) -> Result<(Arc<rustls::ServerConfig>, Digest), NodeError> {
    let read = |path: &Path, what: &'static str| {
        std::fs::read(path).map_err(|e| NodeError::Tls {
            operation: what,
            path: path.to_owned(),
            detail: e.to_string(),
        })
    };
    let bad = |path: &Path, operation: &'static str, detail: String| NodeError::Tls {
        operation,
        path: path.to_owned(),
        detail,
    };
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&read(cert, "reading the certificate")?)
            .collect::<Result<_, _>>()
            .map_err(|e| bad(cert, "reading the certificate", e.to_string()))?;
    let Some(leaf) = chain.first() else {
        return Err(bad(
            cert,
            "reading the certificate",
            "no PEM certificate in it".into(),
        ));
    };
    let pin = Digest::of(leaf.as_ref());
    let key_der = PrivateKeyDer::from_pem_slice(&read(key, "reading the private key")?)
        .map_err(|e| bad(key, "reading the private key", e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(cert, "configuring TLS with", e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| bad(key, "pairing the certificate with", e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((Arc::new(config), pin))
}

/// What the listener shares between connections.
struct State {
    node: Arc<Node>,
    expected: String,
    launches: Mutex<HashMap<String, (Arc<Held>, Mcp)>>,
    cancel: CancellationToken,
    idle: Duration,
    max_body: usize,
    /// How long a request body may take to arrive in full.
    body_timeout: Duration,
    max_launches: usize,
    /// One permit a launch held, from before it starts until it ends.
    launch_slots: Arc<tokio::sync::Semaphore>,
}

/// Serves `node` on `listener` with `tls` to fronts presenting `token`,
/// until `shutdown` resolves; then ends every launch.
pub async fn serve(
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    token: String,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), NodeError> {
    let settings = node.config().serve.clone();
    let state = Arc::new(State {
        node,
        expected: format!("Bearer {token}"),
        launches: Mutex::new(HashMap::new()),
        cancel: CancellationToken::new(),
        idle: Duration::from_millis(settings.session_idle_ms.get()),
        max_body: settings.max_body_bytes.get(),
        body_timeout: Duration::from_millis(settings.request_timeout_ms.get()),
        max_launches: settings.max_sessions.get(),
        launch_slots: Arc::new(tokio::sync::Semaphore::new(settings.max_sessions.get())),
    });
    let connections = Arc::new(tokio::sync::Semaphore::new(settings.max_connections.get()));
    let header_timeout = Duration::from_millis(settings.header_timeout_ms.get());
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::pin!(shutdown);
    let mut backoff = Duration::from_millis(10);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = Duration::from_millis(10);
                crate::front::http::no_delay(&stream);
                stream
            }
            Err(error) => {
                tracing::warn!(%error, ?backoff, "moat node: accept failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = &mut shutdown => break,
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let state = state.clone();
        // Waiting for a slot must not keep SIGTERM out.
        let slot = tokio::select! {
            slot = connections.clone().acquire_owned() => slot,
            () = &mut shutdown => break,
        };
        let Ok(slot) = slot else {
            break;
        };
        tokio::spawn(async move {
            let _slot = slot;
            let Ok(Ok(stream)) =
                tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
            else {
                return;
            };
            let handler = hyper::service::service_fn(move |request| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(state.handle(request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), handler)
                .await;
        });
    }
    let held: Vec<Arc<Held>> = state
        .launches
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .values()
        .map(|(held, _)| held.clone())
        .collect();
    for held in held {
        held.end("the node is stopping");
    }
    state.cancel.cancel();
    Ok(())
}

fn answer(status: StatusCode, body: serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn error(status: StatusCode, text: String) -> Response<Body> {
    answer(status, serde_json::json!({ "error": text }))
}

/// A nonce as the launch request's header carries it.
fn nonce_ok(nonce: &str) -> bool {
    (16..=128).contains(&nonce.len())
        && nonce
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl State {
    async fn handle(self: &Arc<Self>, request: Request<hyper::body::Incoming>) -> Response<Body> {
        let path = request.uri().path().to_owned();
        if path == "/healthz" {
            return answer(StatusCode::OK, serde_json::json!({"status": "serving"}));
        }
        let presented = request
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if !bool::from(presented.ct_eq(self.expected.as_bytes())) {
            tracing::warn!(%path, "moat node: a request without the fronts' token: refused");
            return error(
                StatusCode::UNAUTHORIZED,
                "this node serves fronts that present its token only".into(),
            );
        }
        if path == LAUNCH_PATH {
            if request.method() != Method::POST {
                return error(StatusCode::METHOD_NOT_ALLOWED, "launch with POST".into());
            }
            return self.launch(request).await;
        }
        let Some(rest) = path
            .strip_prefix(LAUNCH_PATH)
            .and_then(|r| r.strip_prefix('/'))
        else {
            return error(StatusCode::NOT_FOUND, format!("no route {path}"));
        };
        let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
        let found = self
            .launches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(id)
            .cloned();
        let Some((held, mcp)) = found else {
            return error(
                StatusCode::NOT_FOUND,
                format!(
                    "no launch `{}` on this node (it ended, or never was)",
                    crate::text::printable(id)
                ),
            );
        };
        match (request.method(), tail) {
            (&Method::DELETE, "") => {
                held.end("the front released it");
                answer(StatusCode::OK, serde_json::json!({"ended": id}))
            }
            (_, "mcp") => self.forward(&held, mcp, request).await,
            _ => error(StatusCode::NOT_FOUND, format!("no route {path}")),
        }
    }

    /// Hands a request to the launch's MCP service, its body bounded.
    /// The launch counts as busy only once the body has arrived: a body
    /// that never ends keeps nothing alive past `request_timeout_ms`.
    async fn forward(
        &self,
        held: &Held,
        mcp: Mcp,
        request: Request<hyper::body::Incoming>,
    ) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let collected = tokio::time::timeout(
            self.body_timeout,
            Limited::new(body, self.max_body).collect(),
        )
        .await;
        let Ok(collected) = collected else {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive within request_timeout_ms".into(),
            );
        };
        let _busy = held.busy();
        let body = match collected {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("a body over {} bytes (max_body_bytes)", self.max_body),
                );
            }
            Err(_) => return error(StatusCode::BAD_REQUEST, "the body did not arrive".into()),
        };
        let request = Request::from_parts(parts, Full::new(body));
        match tower_service::Service::call(&mut mcp.clone(), request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }

    async fn launch(self: &Arc<Self>, request: Request<hyper::body::Incoming>) -> Response<Body> {
        let nonce = request
            .headers()
            .get(NONCE_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let Some(nonce) = nonce.filter(|n| nonce_ok(n)) else {
            return refusal(NodeError::Nonce);
        };
        let collected = tokio::time::timeout(
            self.body_timeout,
            Limited::new(request.into_body(), MAX_LAUNCH_BODY).collect(),
        )
        .await;
        let Ok(collected) = collected else {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                "the launch request did not arrive within request_timeout_ms".into(),
            );
        };
        // The slot is taken once the request is whole: a request that
        // never ends holds none.
        let Ok(slot) = self.launch_slots.clone().try_acquire_owned() else {
            return refusal(NodeError::Busy {
                max: self.max_launches,
            });
        };
        let body = match collected {
            Ok(collected) => collected.to_bytes(),
            Err(_) => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("a launch request is at most {MAX_LAUNCH_BODY} bytes"),
                );
            }
        };
        let launched = match self.node.launch(&body, &nonce).await {
            Ok(launched) => launched,
            Err(e) => return refusal(e),
        };
        let id = launched.id.clone();
        let profile = launched.statement.statement.profile.clone();
        let weak = Arc::downgrade(self);
        let forget = id.clone();
        let held = Held::new(
            id.clone(),
            profile.clone(),
            launched.session,
            Box::new(move || {
                drop(slot);
                if let Some(state) = weak.upgrade() {
                    state
                        .launches
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .remove(&forget);
                }
            }),
        );
        let mut config = StreamableHttpServerConfig::default();
        config.cancellation_token = self.cancel.child_token();
        // Fronts reach a node by whatever name routes to it; the token,
        // not the Host header, says who may ask.
        config.allowed_hosts.clear();
        config.max_request_body_bytes = self.max_body;
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.keep_alive = Some(self.idle);
        let for_service = held.clone();
        let node = self.node.clone();
        let mcp = StreamableHttpService::new(
            move || {
                Ok(Served {
                    held: for_service.clone(),
                    node: node.clone(),
                })
            },
            Arc::new(sessions),
            config,
        );
        self.launches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id.clone(), (held.clone(), mcp));
        tokio::spawn(reap(held, self.idle));
        tracing::info!(launch = %id, %profile, "launched for a front");
        answer(
            StatusCode::OK,
            serde_json::to_value(&launched.statement).unwrap_or_default(),
        )
    }
}

/// Ends `held` once nothing has asked anything of it for `idle` with
/// nothing in flight.
async fn reap(held: Arc<Held>, idle: Duration) {
    loop {
        let wait = match held.idle_for() {
            _ if held.ended() => return,
            Some(quiet) if quiet >= idle => {
                held.end("no request came for session_idle_ms");
                return;
            }
            Some(quiet) => idle - quiet,
            None => idle,
        };
        tokio::time::sleep(wait).await;
    }
}

fn refusal(e: NodeError) -> Response<Body> {
    tracing::warn!(error = %e, "moat node: launch refused");
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error(status, e.to_string())
}

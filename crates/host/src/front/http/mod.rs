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
//!   with no request for `session_idle_ms` is closed with its children;
//! - draining (SIGTERM): the listener closes, and a new session on a
//!   connection still open gets 503 while the open ones finish.
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
//! With `--replica NAME` ([`crate::replica`]), every answer carries
//! `Moat-Replica: NAME`, session ids end in `.NAME`, and a request whose
//! `Mcp-Session-Id` names another replica gets 404 (start a new session)
//! naming both, never another session's answer.
//!
//! Accept errors (EMFILE above all) are retried with a growing pause and
//! never end the process. The bearer token is compared in constant time.
//!
//! The pieces: `admission` (who holds a connection slot, and eviction),
//! `clock` (when a request began), `connection` (one connection: the
//! limits, then rmcp), `sessions` (rmcp's session manager, naming
//! sessions for the replica), `probes` (`/healthz`, `/readyz`, `/metrics`, and
//! [`serve_probes`]), `guard` (the token and `Host` checks), `answer`
//! (the answers Moat writes itself, and the audit of a refusal) and `single`
//! (an answer that is all its request's stream carries, sent as one JSON
//! body). This file
//! holds the listener: [`serve`] and its accept loop.

mod admission;
mod answer;
mod clock;
mod connection;
mod guard;
mod probes;
mod sessions;
mod single;
#[cfg(test)]
mod tests;

pub use probes::{PROBE_CONNECTIONS, ProbeScope, serve_probes};

use std::sync::Arc;
use std::time::Duration;

use crate::gateway::Gateway;
use admission::Admission;
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use tokio_util::sync::CancellationToken;

/// The shortest and longest pause after a failed accept.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

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

/// Serves `gateway` on `listener` until `shutdown` resolves, then drains
/// every session. A listener beyond loopback needs a `token`.
pub async fn serve(
    gateway: Gateway,
    listener: tokio::net::TcpListener,
    token: Option<String>,
    allowed: Allowed,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<Vec<(String, crate::session::SessionError)>, HttpError> {
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
    let sessions = sessions::Sessions {
        local: sessions,
        replica: gateway.replica().cloned(),
    };
    let service = StreamableHttpService::new(
        move || {
            // The handler refuses first, with 503; this holds under a race.
            if factory_gateway.draining() {
                return Err(std::io::Error::other("draining: no new session"));
            }
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
                no_delay(&stream);
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
    // A load balancer's next connection is refused at once (it tries
    // another replica) rather than left in the backlog for the drain.
    drop(listener);
    // Drain every open session while agents can still receive answers,
    // then stop serving.
    let failures = gateway.close_all().await;
    cancel.cancel();
    Ok(failures)
}

/// Sends each write at once (`TCP_NODELAY`). An answer over streamable
/// HTTP is written in pieces (the headers and the SSE event, then the
/// chunked body's end): with Nagle's algorithm the last piece waits for
/// the agent to acknowledge the first, and an agent's kernel delays that
/// acknowledgement by up to 40 ms, so every call took 40 ms or more.
pub(crate) fn no_delay(stream: &tokio::net::TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "setting TCP_NODELAY on an accepted connection");
    }
}

type Service = StreamableHttpService<crate::gateway::AgentSession, sessions::Sessions>;

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

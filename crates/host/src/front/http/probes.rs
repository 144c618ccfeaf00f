//! The probes and the scrape: `/healthz`, `/readyz` and `/metrics`, answered
//! beside `/mcp` by the HTTP front, or alone on a listener of their own
//! ([`serve_probes`]): on loopback beside stdio serving, or anywhere beside
//! `--http` (a pod's address, for a scraper that holds no token).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use super::answer::{refused, status, text};
use super::guard::{host_allowed, token_matches};
use super::{ACCEPT_BACKOFF, HttpError};
use crate::gateway::Gateway;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper::{Request, Response, StatusCode};

/// The answer to a probe (`/healthz`, `/readyz`) or a scrape (`/metrics`),
/// or `None` for any other path. A scrape needs `expected` (the bearer
/// token's `Authorization` value) when there is one, a `Host` in `hosts`,
/// no browser `Origin`, and GET.
pub(super) fn observe(
    request: &Request<hyper::body::Incoming>,
    gateway: &Gateway,
    hosts: &[String],
    max_sessions: usize,
    expected: Option<&str>,
) -> Option<Response<BoxBody<Bytes, Infallible>>> {
    Some(match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        // Which log and why are for the operator (stderr), not the prober.
        "/readyz" if gateway.draining() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: draining (SIGTERM): open sessions finish, new ones go elsewhere\n".into(),
        ),
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

/// The connections a listener of probes alone serves at once.
pub const PROBE_CONNECTIONS: usize = 64;

/// Where a listener of probes alone may be, and which `Host` values its
/// `/metrics` answers.
#[derive(Clone, Debug)]
pub enum ProbeScope {
    /// Beside stdio serving: loopback only (there is no token to ask for).
    Loopback,
    /// Beside `--http`: any address the operator binds, so that a scraper
    /// on the pod network reaches `/metrics` without the agents' token
    /// (who reaches the port is the network policy's to say). `/metrics`
    /// answers loopback names, the bound address and `hosts` (the
    /// operator's `--allow-host` values, the pod's address).
    BesideHttp { hosts: Vec<String> },
}

/// `moat serve --metrics ADDR`: `/metrics`, `/healthz` and `/readyz`
/// only, as `scope` allows, until `shutdown`.
pub async fn serve_probes(
    gateway: Gateway,
    listener: tokio::net::TcpListener,
    scope: ProbeScope,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), HttpError> {
    let addr = listener.local_addr().map_err(HttpError::LocalAddr)?;
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "[::1]"].map(String::from).into();
    match scope {
        ProbeScope::Loopback if !addr.ip().is_loopback() => {
            return Err(HttpError::MetricsNotLoopback { addr });
        }
        ProbeScope::Loopback => {}
        ProbeScope::BesideHttp { hosts: more } => {
            hosts.extend(more);
            if !addr.ip().is_unspecified() {
                hosts.push(addr.ip().to_string());
                hosts.push(addr.to_string());
            }
        }
    }
    let hosts: Arc<[String]> = hosts.into();
    let settings = gateway.serve_settings().clone();
    // Probes and scrapes are quick: a few connections at once, one request
    // each. Beyond that a connection is closed as it comes, so no flood
    // of them takes the descriptors the agents' listener and the servers
    // need.
    let slots = Arc::new(tokio::sync::Semaphore::new(PROBE_CONNECTIONS));
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
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
            let _slot = slot;
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .keep_alive(false)
                .header_read_timeout(header_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), handler)
                .await;
        });
    }
    Ok(())
}

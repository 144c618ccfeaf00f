//! Outgoing HTTP for wasm guests: `wasi:http/outgoing-handler`, linked for
//! every component and sent by Moat's own client under the server's HTTP
//! grants (`net = ["https://api.example.com"]`).
//!
//! - A request goes out only when its scheme, host and port are exactly
//!   those of a grant. Anything else fails inside the guest with wasi:http's
//!   `HTTP-request-denied` (Wassette's `HttpRequestDenied`), and no
//!   connection is made. A redirect is a new request from the guest, so it
//!   is checked again.
//! - No name is resolved at request time: a granted name connects only to
//!   the addresses it had when the server was launched, so a name cannot be
//!   rebound to another address, and no other name is ever looked up.
//! - `https` is verified against the platform's roots (rustls, ring).
//! - A response body is cut at `max_http_response_bytes`, and its stream
//!   then ends in `HTTP-response-body-size`.
//!
//! Raw sockets are a separate grant (`net = ["host:port"]`, checked at the
//! socket by wasmtime-wasi); an HTTP grant opens no socket to the guest.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt as _;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use crate::grants::HttpGrant;

/// How long a connection may take when the guest sets no timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the first byte of a response may take when the guest sets no
/// timeout.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(60);

/// What one server's guests may reach over HTTP: each grant with the
/// addresses its host had at launch, and the response bound.
#[derive(Debug, Default)]
pub struct HttpPolicy {
    grants: Vec<(HttpGrant, Vec<SocketAddr>)>,
    max_response_bytes: u64,
}

impl HttpPolicy {
    /// A policy of `grants`, each with its launch-time addresses.
    pub fn new(grants: Vec<(HttpGrant, Vec<SocketAddr>)>, max_response_bytes: u64) -> Self {
        Self {
            grants,
            max_response_bytes,
        }
    }

    /// The grant and addresses that `uri` falls under, if any: the same
    /// scheme, host (case-insensitive) and port (the scheme's default when
    /// the URI has none).
    fn grant_for(&self, uri: &http::Uri) -> Option<(&HttpGrant, &[SocketAddr])> {
        let scheme = uri.scheme_str()?;
        let host = uri.host()?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
            .to_ascii_lowercase();
        let port = uri.port_u16().or(match scheme {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        })?;
        self.grants
            .iter()
            .find(|(g, _)| g.scheme == scheme && g.host == host && g.port == port)
            .map(|(g, addrs)| (g, addrs.as_slice()))
    }

    async fn send(
        self: Arc<Self>,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
        let Some((grant, addrs)) = self.grant_for(request.uri()) else {
            tracing::info!(uri = %request.uri(), "wasi:http request denied: no grant");
            return Err(Error::HttpRequestDenied);
        };
        let grant = grant.clone();
        let connect_timeout = options
            .and_then(|o| o.connect_timeout)
            .unwrap_or(CONNECT_TIMEOUT);
        let first_byte_timeout = options
            .and_then(|o| o.first_byte_timeout)
            .unwrap_or(FIRST_BYTE_TIMEOUT);
        let mut stream = None;
        let mut last = None;
        for addr in addrs {
            match tokio::time::timeout(connect_timeout, tokio::net::TcpStream::connect(addr)).await
            {
                Ok(Ok(s)) => {
                    stream = Some(s);
                    break;
                }
                Ok(Err(e)) => last = Some(Error::Connect(e)),
                Err(_) => last = Some(Error::ConnectionTimeout),
            }
        }
        let Some(stream) = stream else {
            return Err(last.unwrap_or(Error::DestinationUnavailable));
        };
        // Origin-form on the wire: the authority goes in the Host header.
        let path = request
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".to_owned());
        *request.uri_mut() = path.parse().map_err(|_| Error::HttpRequestUriInvalid)?;
        let (response, io) = if grant.scheme == "https" {
            let stream = tls(&grant.host, stream).await?;
            exchange(stream, request, connect_timeout, first_byte_timeout).await?
        } else {
            exchange(stream, request, connect_timeout, first_byte_timeout).await?
        };
        let limit = self.max_response_bytes;
        let response = response.map(|body| {
            Capped {
                body: body.map_err(Error::from),
                left: limit,
                limit,
            }
            .boxed_unsync()
        });
        Ok((response, io))
    }
}

type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

/// A TLS client stream to `host`, verified against the platform's roots.
async fn tls(
    host: &str,
    stream: tokio::net::TcpStream,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, Error> {
    use rustls_platform_verifier::BuilderVerifierExt;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_platform_verifier())
        .map_err(|e| Error::Tls(std::io::Error::other(e)))?
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|_| Error::HttpRequestUriInvalid)?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
        .map_err(Error::Tls)
}

/// One HTTP/1.1 exchange on `stream`: the response, and the future that
/// drives the connection.
async fn exchange<S>(
    stream: S,
    request: http::Request<WasiBody>,
    connect_timeout: Duration,
    first_byte_timeout: Duration,
) -> Result<(http::Response<hyper::body::Incoming>, IoFuture), Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, connection) = tokio::time::timeout(
        connect_timeout,
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)),
    )
    .await
    .map_err(|_| Error::ConnectionTimeout)??;
    // The connection is driven on a task of its own while the request is
    // sent and the body read; it is aborted when the future handed to
    // wasi:http (kept with the response) is dropped.
    let driver = AbortOnDrop(tokio::spawn(connection));
    let response = tokio::time::timeout(first_byte_timeout, sender.send_request(request))
        .await
        .map_err(|_| Error::ConnectionReadTimeout)?
        .map_err(Error::from)?;
    let io: IoFuture = Box::new(async move {
        let mut driver = driver;
        match (&mut driver.0).await {
            Ok(result) => result.map_err(Error::from),
            Err(_) => Err(Error::ConnectionTerminated),
        }
    });
    Ok((response, io))
}

/// A task aborted when this handle drops.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A response body cut at `limit` bytes.
struct Capped<B> {
    body: B,
    left: u64,
    limit: u64,
}

impl<B> Body for Capped<B>
where
    B: Body<Data = Bytes, Error = Error> + Unpin,
{
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.data_ref() {
                Some(data) if data.len() as u64 > self.left => {
                    self.left = 0;
                    Poll::Ready(Some(Err(Error::HttpResponseBodySize(Some(self.limit)))))
                }
                Some(data) => {
                    self.left -= data.len() as u64;
                    Poll::Ready(Some(Ok(frame)))
                }
                None => Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
}

/// The wasi:http hooks of one instance: requests go through its policy.
#[derive(Clone, Debug, Default)]
pub struct Hooks {
    pub(crate) policy: Arc<HttpPolicy>,
}

impl WasiHttpHooks for Hooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), Error>> + Send> {
        drop(fut);
        Box::new(self.policy.clone().send(request, options))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(grants: &[&str]) -> HttpPolicy {
        HttpPolicy::new(
            grants
                .iter()
                .map(|g| (HttpGrant::parse(g).unwrap().unwrap(), Vec::new()))
                .collect(),
            1,
        )
    }

    #[test]
    fn only_the_granted_scheme_host_and_port_match() {
        let p = policy(&["https://api.example.com", "http://127.0.0.1:8080"]);
        let granted = |uri: &str| p.grant_for(&uri.parse().unwrap()).is_some();
        assert!(granted("https://api.example.com/v1?q=1"));
        assert!(granted("https://API.Example.com:443/"));
        assert!(granted("http://127.0.0.1:8080/x"));
        assert!(!granted("http://api.example.com/"), "another scheme");
        assert!(!granted("https://api.example.com:8443/"), "another port");
        assert!(!granted("https://example.com/"), "another host");
        assert!(
            !granted("https://api.example.com.evil.test/"),
            "a longer host"
        );
        assert!(!granted("http://127.0.0.1:8081/"), "another port");
        assert!(!granted("/relative"), "no authority");
    }

    #[test]
    fn grants_parse_with_default_ports_and_refuse_paths() {
        let g = HttpGrant::parse("https://Api.Example.com")
            .unwrap()
            .unwrap();
        assert_eq!(
            (g.scheme.as_str(), g.host.as_str(), g.port),
            ("https", "api.example.com", 443)
        );
        let g = HttpGrant::parse("http://[::1]:9000/").unwrap().unwrap();
        assert_eq!((g.host.as_str(), g.port), ("::1", 9000));
        assert!(HttpGrant::parse("example.com:443").is_none());
        let error = HttpGrant::parse("https://example.com/api")
            .unwrap()
            .unwrap_err();
        assert!(error.contains("no path, query or user"), "{error}");
        assert!(
            HttpGrant::parse("https://user@example.com")
                .unwrap()
                .is_err()
        );
    }
}

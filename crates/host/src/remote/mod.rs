//! Remote upstreams: a server Moat does not run, reached over MCP's
//! streamable HTTP at one exact endpoint. This module owns the endpoint rules
//! (https, or plain http to loopback only; no credentials in the URL), the
//! HTTP client (TLS by rustls with the platform's roots; redirects followed
//! only within the endpoint's origin; no proxies from the environment), the
//! bearer token (read from Moat's environment at launch, sent to that
//! endpoint only, never logged), and a bridge that presents the remote
//! session as a [`Launched`] with in-memory stdin/stdout, so the one
//! transport above it (framing bounds, deadlines, pins, progress routing)
//! is the same code as for wasm and native servers.
//!
//! A server on a node (`node = "NAME"`) is reached the same way once the
//! node has launched it: [`node`] asks for the launch (profile, revision
//! and a nonce, nothing else), checks the node's certificate against the
//! pin and its signed statement against the pinned public key, then hands
//! the launched session's endpoint to the same bridge. The launch request
//! and the statement, which the node's side (`crate::node`) shares, are
//! [`request`] and [`statement`].

pub mod node;
pub mod request;
pub mod statement;

use std::fmt;
use std::sync::Arc;

use rmcp::model::{ClientJsonRpcMessage, ErrorData, JsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
};
use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::identity::Evidence;
use crate::instance::{Exit, Identity, InProcess, Launched, Metrics, SandboxReport, Tracker};
use crate::limits::Limits;

/// Bytes buffered in each in-memory pipe between the bridge and the transport.
const PIPE_BYTES: usize = 64 << 10;

/// Redirects followed within the endpoint's origin before giving up.
const MAX_REDIRECTS: usize = 5;

/// How long a TCP (and TLS) connection to the endpoint may take. The
/// per-request deadline bounds everything else.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why a remote server could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error(
        "server `{server}`: bearer_token_env names `{var}`, which is not set (or not valid text) in Moat's environment"
    )]
    TokenMissing { server: String, var: String },
    #[error("server `{server}`: the bearer token in `{var}` cannot be sent as an HTTP header")]
    TokenInvalid { server: String, var: String },
    #[error("server `{server}`: building the HTTP client for {url}: {detail}")]
    Client {
        server: String,
        url: String,
        detail: String,
    },
    #[error("server `{server}`: node `{node}` at {url}: {detail}")]
    NodeUnreachable {
        server: String,
        node: String,
        url: String,
        detail: String,
    },
    #[error("server `{server}`: node `{node}` refused the launch ({status}): {detail}")]
    NodeRefused {
        server: String,
        node: String,
        status: u16,
        detail: String,
    },
    #[error("server `{server}`: {source}")]
    NodeStatement {
        server: String,
        #[source]
        source: statement::StatementError,
    },
}

/// A bearer token: printed as `***` by `Debug` and `Display`, so it cannot
/// reach a log by accident.
#[derive(Clone)]
pub(crate) struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// What a remote launch needs: the endpoint, the environment variable holding
/// its bearer token, and the limits on its messages.
#[derive(Clone, Debug)]
pub struct RemoteLaunch {
    pub name: String,
    pub url: String,
    pub bearer_token_env: Option<String>,
    pub limits: Limits,
}

/// The bearer token for `server` from Moat's environment variable `var`:
/// set, not empty, and sendable as a header.
pub(crate) fn token_from_env(server: &str, var: &str) -> Result<Secret, RemoteError> {
    let token = std::env::var(var)
        .ok()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| RemoteError::TokenMissing {
            server: server.to_owned(),
            var: var.to_owned(),
        })?;
    if reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).is_err() {
        return Err(RemoteError::TokenInvalid {
            server: server.to_owned(),
            var: var.to_owned(),
        });
    }
    Ok(Secret(token))
}

impl RemoteLaunch {
    fn token(&self) -> Result<Option<Secret>, RemoteError> {
        self.bearer_token_env
            .as_deref()
            .map(|var| token_from_env(&self.name, var))
            .transpose()
    }

    fn client(&self) -> Result<reqwest::Client, RemoteError> {
        let error = |detail: String| RemoteError::Client {
            server: self.name.clone(),
            url: self.url.clone(),
            detail,
        };
        let endpoint = reqwest::Url::parse(&self.url).map_err(|e| error(e.to_string()))?;
        let origin = endpoint.origin();
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.url().origin() != origin {
                let refused = format!(
                    "refused a redirect to {}: Moat talks to the configured endpoint's origin only",
                    attempt.url()
                );
                attempt.error(refused)
            } else if attempt.previous().len() > MAX_REDIRECTS {
                attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
            } else {
                attempt.follow()
            }
        });
        let mut builder = reqwest::Client::builder()
            .redirect(redirects)
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            .referer(false);
        // reqwest needs a TLS configuration even for plain http; this one
        // names its provider (ring) rather than relying on a process default.
        use rustls_platform_verifier::BuilderVerifierExt;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_platform_verifier())
            .map_err(|e| error(format!("TLS: {e}")))?
            .with_no_client_auth();
        builder = builder.tls_backend_preconfigured(tls);
        if endpoint.scheme() == "https" {
            builder = builder.https_only(true);
        }
        builder
            .build()
            .map_err(|e| error(crate::text::error_chain(&e)))
    }
}

/// Connects the bridge for `launch`: the returned [`Launched`] reads and
/// writes JSON lines exactly like a child's stdio.
pub(crate) async fn launch(
    launch: RemoteLaunch,
    tracker: Arc<Tracker>,
) -> Result<Launched, RemoteError> {
    let token = launch.token()?;
    let client = launch.client()?;
    let mut sandbox = SandboxReport::default();
    sandbox.not_enforced(
        "remote server: no child process exists to sandbox; Moat bounds its messages and deadlines only",
    );
    let identity = Identity {
        digest: None,
        measured: Vec::new(),
        sandbox,
        evidence: Evidence::Remote,
        component: None,
        oci: None,
    };
    Ok(connect(
        Endpoint {
            name: launch.name.clone(),
            label: format!("remote `{}`", launch.name),
            url: launch.url.clone(),
            client,
            token,
            limits: launch.limits,
            on_end: None,
        },
        identity,
        &tracker,
    ))
}

/// Where a bridge connects: the server's name, how its faults name it, the
/// endpoint, the HTTP client and token for it, and the message bounds.
pub(crate) struct Endpoint {
    pub name: String,
    pub label: String,
    pub url: String,
    pub client: reqwest::Client,
    pub token: Option<Secret>,
    pub limits: Limits,
    /// Run once the bridge has ended, whatever ended it (a node's launch
    /// is released here).
    pub on_end: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
}

/// The bridge to `endpoint`, presented as an in-process instance of
/// `identity`.
pub(crate) fn connect(endpoint: Endpoint, identity: Identity, tracker: &Arc<Tracker>) -> Launched {
    let max = usize::try_from(endpoint.limits.max_line_bytes).unwrap_or(usize::MAX);
    let mut config = StreamableHttpClientTransportConfig::with_uri(endpoint.url.clone())
        .max_sse_event_size(max)
        .max_json_response_size(max);
    if let Some(Secret(token)) = endpoint.token {
        config = config.auth_header(token);
    }
    let remote = StreamableHttpClientTransport::with_client(endpoint.client, config);

    let (stdin_host, stdin_bridge) = tokio::io::duplex(PIPE_BYTES);
    let (stdout_bridge, stdout_host) = tokio::io::duplex(PIPE_BYTES);
    let (stderr_bridge, stderr_host) = tokio::io::duplex(PIPE_BYTES);
    let closing = CancellationToken::new();
    let label = endpoint.label;
    let on_end = endpoint.on_end;
    let label_faults = on_end.is_some();
    let bridge_closing = closing.clone();
    let started = InProcess {
        stdin: Box::new(stdin_host),
        stdout: Box::new(stdout_host),
        stderr: Box::new(stderr_host),
        identity,
        metrics: Arc::new(Metrics::default()),
        // No CPU budget to refresh.
        on_request: None,
        terminate: Some(Box::new(move || closing.cancel())),
        answers_deadlines: false,
    };
    started.spawn(&endpoint.name, "remote session", tracker, async move {
        let exit = bridge(
            &label,
            label_faults,
            remote,
            stdin_bridge,
            stdout_bridge,
            stderr_bridge,
            bridge_closing,
        )
        .await;
        if let Some(on_end) = on_end {
            on_end.await;
        }
        exit
    })
}

/// Moves JSON lines from the host to the remote session and the remote's
/// messages back as lines, until the host closes stdin (a clean close that
/// ends the HTTP session), `closing` fires, or the remote session ends.
/// Refusals name the server as `label`; so does the end of the session
/// when `label_faults` (the server's name alone does not say where it ran).
async fn bridge(
    label: &str,
    label_faults: bool,
    mut remote: StreamableHttpClientTransport<reqwest::Client>,
    stdin: tokio::io::DuplexStream,
    mut stdout: tokio::io::DuplexStream,
    mut stderr: tokio::io::DuplexStream,
    closing: CancellationToken,
) -> Exit {
    let mut lines = BufReader::new(stdin).lines();
    let mut sends = JoinSet::new();
    let mut last_refusal = None;
    loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(line)) => {
                    let message: ClientJsonRpcMessage = match serde_json::from_str(&line) {
                        Ok(message) => message,
                        Err(error) => {
                            note(&mut stderr, &format!("dropped a message the host could not encode: {error}")).await;
                            continue;
                        }
                    };
                    let id = match &message {
                        JsonRpcMessage::Request(request) => Some(request.id.clone()),
                        _ => None,
                    };
                    let send = remote.send(message);
                    sends.spawn(async move { (id, send.await) });
                }
                Ok(None) | Err(_) => {
                    // The host closed stdin: end the HTTP session cleanly.
                    let _ = remote.close().await;
                    return Exit::Code(0);
                }
            },
            Some(sent) = sends.join_next() => {
                if let Some(detail) = refused(label, sent, &mut stdout, &mut stderr).await {
                    last_refusal = Some(detail);
                }
            }
            message = remote.receive() => match message {
                Some(message) => {
                    if write_line(&mut stdout, &message).await.is_err() {
                        return Exit::Stopped;
                    }
                }
                None => {
                    // Answer what is still in flight first: the reason the
                    // remote ended is usually one of those refusals.
                    while let Some(sent) = sends.join_next().await {
                        if let Some(detail) = refused(label, sent, &mut stdout, &mut stderr).await {
                            last_refusal = Some(detail);
                        }
                    }
                    let ended = if label_faults {
                        format!("{label}: the remote endpoint ended the session")
                    } else {
                        "the remote endpoint ended the session".to_owned()
                    };
                    let reason = match last_refusal {
                        Some(detail) => format!("{ended}: {detail}"),
                        None => ended,
                    };
                    return Exit::Crashed(reason);
                }
            },
            () = closing.cancelled() => {
                let _ = remote.close().await;
                return Exit::Stopped;
            }
        }
    }
}

type Sent = (
    Option<rmcp::model::RequestId>,
    Result<(), rmcp::transport::streamable_http_client::StreamableHttpError<reqwest::Error>>,
);

/// Handles one finished send: a refused request is answered with an error
/// naming the reason (the remote will never answer it). Returns the reason.
async fn refused(
    label: &str,
    sent: Result<Sent, tokio::task::JoinError>,
    stdout: &mut (impl AsyncWrite + Unpin),
    stderr: &mut (impl AsyncWrite + Unpin),
) -> Option<String> {
    let (id, Err(error)) = sent.ok()? else {
        return None;
    };
    let detail = crate::text::error_chain(&error);
    tracing::warn!(server = %label, error = %detail, "remote endpoint refused a message");
    note(stderr, &detail).await;
    if let Some(id) = id {
        let answer = ServerJsonRpcMessage::error(
            ErrorData::internal_error(format!("{label}: {detail}"), None),
            Some(id),
        );
        let _ = write_line(stdout, &answer).await;
    }
    Some(detail)
}

async fn write_line(
    out: &mut (impl AsyncWrite + Unpin),
    message: &ServerJsonRpcMessage,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line).await?;
    out.flush().await
}

/// Writes a diagnostic line where a child's stderr would be: it reaches the
/// log and the stderr tail of a fault.
async fn note(stderr: &mut (impl AsyncWrite + Unpin), text: &str) {
    let _ = stderr.write_all(format!("{text}\n").as_bytes()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_do_not_print() {
        let secret = Secret("hunter2".into());
        assert_eq!(format!("{secret:?}"), "***");
    }
}

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

impl RemoteLaunch {
    fn token(&self) -> Result<Option<Secret>, RemoteError> {
        let Some(var) = &self.bearer_token_env else {
            return Ok(None);
        };
        let token = std::env::var(var)
            .ok()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| RemoteError::TokenMissing {
                server: self.name.clone(),
                var: var.clone(),
            })?;
        if reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).is_err() {
            return Err(RemoteError::TokenInvalid {
                server: self.name.clone(),
                var: var.clone(),
            });
        }
        Ok(Some(Secret(token)))
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
    let max = usize::try_from(launch.limits.max_line_bytes).unwrap_or(usize::MAX);
    let mut config = StreamableHttpClientTransportConfig::with_uri(launch.url.clone())
        .max_sse_event_size(max)
        .max_json_response_size(max);
    if let Some(Secret(token)) = token {
        config = config.auth_header(token);
    }
    let remote = StreamableHttpClientTransport::with_client(client, config);

    let (stdin_host, stdin_bridge) = tokio::io::duplex(PIPE_BYTES);
    let (stdout_bridge, stdout_host) = tokio::io::duplex(PIPE_BYTES);
    let (stderr_bridge, stderr_host) = tokio::io::duplex(PIPE_BYTES);
    let closing = CancellationToken::new();
    let name = launch.name.clone();
    let bridge_closing = closing.clone();
    let started = InProcess {
        stdin: Box::new(stdin_host),
        stdout: Box::new(stdout_host),
        stderr: Box::new(stderr_host),
        identity: Identity {
            digest: None,
            measured: Vec::new(),
            sandbox: {
                let mut report = SandboxReport::default();
                report.not_enforced("remote server: no child process exists to sandbox; Moat bounds its messages and deadlines only");
                report
            },
            evidence: Evidence::Remote,
            component: None,
            oci: None,
        },
        metrics: Arc::new(Metrics::default()),
        // No CPU budget to refresh.
        on_request: None,
        terminate: Some(Box::new(move || closing.cancel())),
        answers_deadlines: false,
    };
    Ok(
        started.spawn(&launch.name, "remote session", &tracker, async move {
            bridge(
                &name,
                remote,
                stdin_bridge,
                stdout_bridge,
                stderr_bridge,
                bridge_closing,
            )
            .await
        }),
    )
}

/// Moves JSON lines from the host to the remote session and the remote's
/// messages back as lines, until the host closes stdin (a clean close that
/// ends the HTTP session), `closing` fires, or the remote session ends.
async fn bridge(
    name: &str,
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
                if let Some(detail) = refused(name, sent, &mut stdout, &mut stderr).await {
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
                        if let Some(detail) = refused(name, sent, &mut stdout, &mut stderr).await {
                            last_refusal = Some(detail);
                        }
                    }
                    let reason = match last_refusal {
                        Some(detail) => format!("the remote endpoint ended the session: {detail}"),
                        None => "the remote endpoint ended the session".to_owned(),
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
    name: &str,
    sent: Result<Sent, tokio::task::JoinError>,
    stdout: &mut (impl AsyncWrite + Unpin),
    stderr: &mut (impl AsyncWrite + Unpin),
) -> Option<String> {
    let (id, Err(error)) = sent.ok()? else {
        return None;
    };
    let detail = crate::text::error_chain(&error);
    tracing::warn!(server = %name, error = %detail, "remote endpoint refused a message");
    note(stderr, &detail).await;
    if let Some(id) = id {
        let answer = ServerJsonRpcMessage::error(
            ErrorData::internal_error(format!("remote `{name}`: {detail}"), None),
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

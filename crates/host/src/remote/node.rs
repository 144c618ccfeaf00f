//! The front's side of a launch on a node: the HTTPS client that trusts
//! exactly the certificate pinned for the node (its sha256, whatever name
//! or issuer it carries), the launch request (profile and revision in the
//! body, a fresh nonce in `Moat-Nonce`, the front's token in
//! `Authorization`), the check of the node's signed statement against the
//! public key pinned for it, and the bridge to the launched session, whose
//! faults name the node.

use std::sync::Arc;
use std::time::Duration;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use super::request::LaunchRequest;
use super::statement::{Statement, check};
use super::{Endpoint, RemoteError, Secret};
use crate::config::NodeTarget;
use crate::identity::{Digest, Evidence};
use crate::instance::{Identity, Launched, SandboxReport, Tracker};
use crate::limits::Limits;
use crate::signature::PublicKey;

/// The header carrying the front's nonce for one launch.
pub const NONCE_HEADER: &str = "moat-nonce";
/// The path a node takes launch requests at.
pub const LAUNCH_PATH: &str = "/launch";
/// The largest launch answer read (a statement is a few kilobytes).
const MAX_ANSWER_BYTES: usize = 256 << 10;
/// Bytes of a node's refusal kept in the front's error.
const MAX_REFUSAL_BYTES: usize = 1024;
/// How long releasing a launch may take (the node ends it on its own when
/// no word comes).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting to the node (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The path of launched session `id`'s MCP endpoint on the node.
pub fn session_path(id: &str) -> String {
    format!("{LAUNCH_PATH}/{id}/mcp")
}

/// A server to launch on a node.
#[derive(Clone, Debug)]
pub struct NodeLaunch {
    /// The server's name at the front.
    pub name: String,
    pub node: NodeTarget,
    pub profile: String,
    pub revision: Digest,
    pub limits: Limits,
}

impl NodeLaunch {
    fn unreachable(&self, detail: String) -> RemoteError {
        RemoteError::NodeUnreachable {
            server: self.name.clone(),
            node: self.node.name.clone(),
            url: self.node.url.clone(),
            detail,
        }
    }

    fn token(&self) -> Result<Secret, RemoteError> {
        super::token_from_env(&self.name, &self.node.token_env)
    }

    /// An HTTPS client that accepts the pinned certificate only, follows
    /// no redirect and uses no proxy.
    fn client(&self) -> Result<reqwest::Client, RemoteError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Arc::new(PinnedCertificate {
            node: self.node.name.clone(),
            pin: self.node.cert_sha256,
            algorithms: provider.signature_verification_algorithms,
        });
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| self.unreachable(format!("TLS: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .https_only(true)
            .connect_timeout(CONNECT_TIMEOUT)
            .referer(false)
            .tls_backend_preconfigured(tls)
            .build()
            .map_err(|e| self.unreachable(crate::text::error_chain(&e)))
    }

    /// Asks the node to launch the profile, checks its statement, and
    /// connects to what it launched.
    pub(crate) async fn start(self, tracker: Arc<Tracker>) -> Result<Launched, RemoteError> {
        let token = self.token()?;
        let client = self.client()?;
        let key: PublicKey = self
            .node
            .public_key
            .parse()
            .map_err(|e: String| self.unreachable(format!("public_key: {e}")))?;
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(|e| self.unreachable(format!("nonce: {e}")))?;
        let nonce = hex::encode(nonce);
        let asked = LaunchRequest {
            profile: self.profile.clone(),
            revision: self.revision,
        };
        let statement = self.ask(&client, &token, &asked, &nonce, &key).await?;
        let identity = self.identity(&statement)?;
        let release = {
            let url = format!("{}{LAUNCH_PATH}/{}", self.node.url, statement.session);
            let request = client
                .delete(url)
                .bearer_auth(&token.0)
                .timeout(RELEASE_TIMEOUT);
            let name = self.name.clone();
            Box::pin(async move {
                // Best effort: a node that is gone has ended the launch.
                if let Err(error) = request.send().await {
                    tracing::debug!(server = %name, error = %crate::text::error_chain(&error), "releasing the launch on its node");
                }
            })
        };
        Ok(super::connect(
            Endpoint {
                name: self.name.clone(),
                label: format!(
                    "server `{}` on node `{}` ({})",
                    self.name, self.node.name, self.node.url
                ),
                url: format!("{}{}", self.node.url, session_path(&statement.session)),
                client,
                token: Some(token),
                limits: self.limits,
                on_end: Some(release),
            },
            identity,
            &tracker,
        ))
    }

    /// The launch request and the node's checked answer.
    async fn ask(
        &self,
        client: &reqwest::Client,
        token: &Secret,
        asked: &LaunchRequest,
        nonce: &str,
        key: &PublicKey,
    ) -> Result<Statement, RemoteError> {
        let url = format!("{}{LAUNCH_PATH}", self.node.url);
        let mut answer = client
            .post(&url)
            .bearer_auth(&token.0)
            .header(NONCE_HEADER, nonce)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(asked.to_json().to_string())
            .timeout(Duration::from_millis(self.limits.request_timeout_ms))
            .send()
            .await
            .map_err(|e| self.unreachable(crate::text::error_chain(&e)))?;
        let status = answer.status();
        let mut body = Vec::new();
        while let Some(chunk) = answer
            .chunk()
            .await
            .map_err(|e| self.unreachable(crate::text::error_chain(&e)))?
        {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(self.unreachable(format!(
                    "its answer to the launch request is over {MAX_ANSWER_BYTES} bytes: refused"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            let detail = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
            return Err(RemoteError::NodeRefused {
                server: self.name.clone(),
                node: self.node.name.clone(),
                status: status.as_u16(),
                detail: bounded(&detail),
            });
        }
        let value: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| RemoteError::NodeStatement {
                server: self.name.clone(),
                source: super::statement::StatementError {
                    node: self.node.name.clone(),
                    detail: format!("not JSON: {e}"),
                },
            })?;
        check(&self.node.name, &value, key, asked, nonce).map_err(|source| {
            RemoteError::NodeStatement {
                server: self.name.clone(),
                source,
            }
        })
    }

    /// The front's identity of what the node launched: the node's digest,
    /// evidence `remote-measured`, and the node's sandbox report, each rule
    /// said to hold on the node.
    fn identity(&self, statement: &Statement) -> Result<Identity, RemoteError> {
        let refused = |detail: String| RemoteError::NodeStatement {
            server: self.name.clone(),
            source: super::statement::StatementError {
                node: self.node.name.clone(),
                detail,
            },
        };
        let digest = match &statement.sha256 {
            Some(text) => Some(
                text.parse::<Digest>()
                    .map_err(|e| refused(format!("sha256: {e}")))?,
            ),
            None => None,
        };
        let mut sandbox = SandboxReport::default();
        let on = format!("on node `{}` ({})", self.node.name, statement.evidence);
        for line in &statement.sandbox {
            if let Some(rule) = line.strip_prefix("enforced: ") {
                sandbox.enforced(format!("{on}: {rule}"));
            } else if let Some(rule) = line.strip_prefix("not enforced: ") {
                sandbox.not_enforced(format!("{on}: {rule}"));
            } else {
                return Err(refused(format!(
                    "sandbox line {:?} is neither `enforced: ...` nor `not enforced: ...`",
                    crate::text::printable(line)
                )));
            }
        }
        Ok(Identity {
            digest,
            measured: Vec::new(),
            sandbox,
            evidence: Evidence::RemoteMeasured,
            component: None,
            oci: None,
        })
    }
}

/// A node's words, printable and bounded: a hostile node cannot fill the
/// front's error (and its log) with its answer.
fn bounded(detail: &str) -> String {
    let mut detail = crate::text::printable(detail);
    if detail.len() > MAX_REFUSAL_BYTES {
        let mut end = MAX_REFUSAL_BYTES;
        while !detail.is_char_boundary(end) {
            end -= 1;
        }
        let total = detail.len();
        detail.truncate(end);
        detail.push_str(&format!("... ({total} bytes in all)"));
    }
    detail
}

/// Trusts one certificate: the one whose DER bytes hash to the pin. Its
/// names, issuer and dates are not consulted: the pin is the trust, as an
/// SSH host key is. The handshake's signatures are still checked against
/// that certificate's key.
#[derive(Debug)]
struct PinnedCertificate {
    node: String,
    pin: Digest,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = Digest::of(end_entity.as_ref());
        if presented == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "node `{}` presented the certificate {presented}, not the one pinned for it ({}): refused (if the node's certificate was replaced, pin the new one with `cert_sha256`)",
                self.node, self.pin
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_refusal_is_kept_to_a_bound_on_a_character_boundary() {
        assert_eq!(bounded("stale revision"), "stale revision");
        let flood = format!("a{}", "é".repeat(200_000));
        let kept = bounded(&flood);
        assert!(kept.len() <= MAX_REFUSAL_BYTES + 40, "{}", kept.len());
        assert!(kept.ends_with("... (400001 bytes in all)"), "{kept}");
    }
}

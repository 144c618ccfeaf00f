//! The registry side of a pull: Moat's own client for the distribution
//! spec's anonymous GETs (a manifest, a blob, and the token a Bearer
//! challenge asks for), over reqwest and rustls.
//!
//! It owns three rules that a general registry client does not hold:
//!
//! * Every answer is read with a cap while it streams: a manifest at
//!   [`super::MAX_MANIFEST_BYTES`], a token answer at [`MAX_TOKEN_BYTES`], a
//!   blob at the size its manifest declares (straight to disk), an error's
//!   text at [`MAX_ERROR_TEXT`]. An answer that runs past its cap is refused
//!   at cap + 1 bytes, naming the URL and the cap; a `Content-Length` above
//!   it is refused before the body is read.
//! * Redirects are followed here, one hop at a time (reqwest follows none):
//!   a hop to https is followed; a hop to plain http only from plain http,
//!   that is when the registry is on loopback, and only to a loopback host.
//!   A hop from https to http is refused whatever its target, before any
//!   request is sent to it. The token goes only to the registry's own
//!   origin: a hop to another origin is sent without it.
//! * A token realm (`WWW-Authenticate: Bearer realm=...`) must be https, or
//!   plain http on the host of a registry on loopback.

use std::sync::Arc;

use reqwest::header::{ACCEPT, CONTENT_LENGTH, LOCATION, WWW_AUTHENTICATE};
use reqwest::{StatusCode, Url};

use super::OciError;

mod rules;
use rules::{Challenge, bearer_challenge, realm_refusal, redirect_refusal};

/// The largest token answer read. The token is sent back in a header,
/// which registries cap at a few KiB; this leaves room for a JSON answer
/// with a refresh token and expiry beside it.
pub const MAX_TOKEN_BYTES: u64 = 64 << 10;

/// How much of an error answer is read for its message; the rest is
/// dropped unread.
pub const MAX_ERROR_TEXT: u64 = 4 << 10;

/// Redirects followed for one request (registries send blobs to a CDN: one).
pub const MAX_REDIRECTS: usize = 5;

const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// One pull's connection to one registry.
pub(super) struct Registry {
    client: reqwest::Client,
    /// `scheme://host[:port]/`: https, or http for a loopback registry.
    base: Url,
    loopback: bool,
    repository: String,
    /// The reference, as messages show it.
    shown: String,
    /// The Bearer token, once a challenge asked for one.
    token: Option<String>,
}

impl Registry {
    pub(super) fn new(reference: &super::OciRef) -> Result<Self, OciError> {
        let shown = reference.to_string();
        let loopback = reference.is_loopback();
        let scheme = if loopback { "http" } else { "https" };
        // The registry Docker's short name stands for, as every client maps it.
        let host = match reference.registry.as_str() {
            "docker.io" => "index.docker.io",
            other => other,
        };
        let base = Url::parse(&format!("{scheme}://{host}/")).map_err(|e| OciError::Registry {
            reference: shown.clone(),
            operation: "client",
            detail: format!("{host}: {e}"),
        })?;
        let client = http_client(loopback).map_err(|detail| OciError::Registry {
            reference: shown.clone(),
            operation: "client",
            detail,
        })?;
        Ok(Self {
            client,
            base,
            loopback,
            repository: reference.repository.clone(),
            shown,
            token: None,
        })
    }

    /// `/v2/<repository>/<kind>/<reference>` on the registry.
    fn url(&self, kind: &str, reference: &str) -> Url {
        let mut url = self.base.clone();
        url.set_path(&format!("/v2/{}/{kind}/{reference}", self.repository));
        url
    }

    /// The manifest `reference` (a tag or `sha256:...`), read whole up to
    /// `limit` bytes.
    pub(super) async fn manifest(
        &mut self,
        reference: &str,
        accept: &str,
        limit: u64,
    ) -> Result<Vec<u8>, OciError> {
        let url = self.url("manifests", reference);
        let (url, response) = self.get("manifest", url, Some(accept)).await?;
        let response = self.ok("manifest", &url, response).await?;
        let mut body = Vec::new();
        let mut reader = Capped::new(
            self,
            "manifest",
            &url,
            response,
            limit,
            "the manifest limit",
        )?;
        while let Some(chunk) = reader.next().await? {
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// The blob `digest`, handed chunk by chunk to `sink`; the answer is
    /// refused past `size` bytes (the size the manifest declares).
    pub(super) async fn blob(
        &mut self,
        digest: &str,
        size: u64,
        mut sink: impl FnMut(&[u8]) -> Result<(), OciError>,
    ) -> Result<u64, OciError> {
        let url = self.url("blobs", digest);
        let (url, response) = self.get("component", url, None).await?;
        let response = self.ok("component", &url, response).await?;
        let mut reader = Capped::new(
            self,
            "component",
            &url,
            response,
            size,
            "the size the manifest declares",
        )?;
        let mut received = 0u64;
        while let Some(chunk) = reader.next().await? {
            received += chunk.len() as u64;
            sink(&chunk)?;
        }
        Ok(received)
    }

    /// GETs `url` (redirects followed under the rules), asking for a token
    /// once when the registry challenges for one.
    async fn get(
        &mut self,
        operation: &'static str,
        url: Url,
        accept: Option<&str>,
    ) -> Result<(Url, reqwest::Response), OciError> {
        let (at, response) = self.follow(operation, url.clone(), accept, true).await?;
        if response.status() != StatusCode::UNAUTHORIZED || self.token.is_some() {
            return Ok((at, response));
        }
        let Some(challenge) = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|value| value.to_str().ok())
            .and_then(bearer_challenge)
        else {
            return Ok((at, response));
        };
        drop(response);
        self.token = Some(self.fetch_token(operation, challenge).await?);
        self.follow(operation, url, accept, true).await
    }

    /// Sends GET `url`, following redirects by hand: each hop is checked
    /// against the transport rules before anything is sent to it.
    async fn follow(
        &self,
        operation: &'static str,
        mut url: Url,
        accept: Option<&str>,
        with_token: bool,
    ) -> Result<(Url, reqwest::Response), OciError> {
        let mut hops = 0;
        loop {
            let mut request = self.client.get(url.clone());
            if let Some(accept) = accept {
                request = request.header(ACCEPT, accept);
            }
            if with_token
                && url.origin() == self.base.origin()
                && let Some(token) = &self.token
            {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.map_err(|e| OciError::Http {
                reference: self.shown.clone(),
                operation,
                url: url.to_string(),
                detail: crate::text::error_chain(&e),
            })?;
            if !response.status().is_redirection() {
                return Ok((url, response));
            }
            let Some(location) = response.headers().get(LOCATION) else {
                return Ok((url, response));
            };
            let next = location
                .to_str()
                .ok()
                .and_then(|location| url.join(location).ok())
                .ok_or_else(|| OciError::Http {
                    reference: self.shown.clone(),
                    operation,
                    url: url.to_string(),
                    detail: format!(
                        "a redirect to an unreadable location {}",
                        crate::text::printable(&String::from_utf8_lossy(location.as_bytes()))
                    ),
                })?;
            if let Some(why) = redirect_refusal(self.loopback, &url, &next) {
                return Err(OciError::Redirect {
                    reference: self.shown.clone(),
                    operation,
                    from: url.to_string(),
                    to: next.to_string(),
                    why,
                });
            }
            hops += 1;
            if hops > MAX_REDIRECTS {
                return Err(OciError::Http {
                    reference: self.shown.clone(),
                    operation,
                    url: url.to_string(),
                    detail: format!("more than {MAX_REDIRECTS} redirects"),
                });
            }
            url = next;
        }
    }

    /// The anonymous pull token the challenge's realm issues.
    async fn fetch_token(
        &self,
        operation: &'static str,
        challenge: Challenge,
    ) -> Result<String, OciError> {
        let mut realm = Url::parse(&challenge.realm).map_err(|e| OciError::Realm {
            reference: self.shown.clone(),
            operation,
            realm: crate::text::printable(&challenge.realm),
            why: format!("not a URL: {e}"),
        })?;
        if let Some(why) = realm_refusal(&self.base, self.loopback, &realm) {
            return Err(OciError::Realm {
                reference: self.shown.clone(),
                operation,
                realm: realm.to_string(),
                why: why.to_owned(),
            });
        }
        {
            let mut query = realm.query_pairs_mut();
            query.append_pair("scope", &format!("repository:{}:pull", self.repository));
            if let Some(service) = &challenge.service {
                query.append_pair("service", service);
            }
        }
        let operation = "token";
        let (url, response) = self.follow(operation, realm, None, false).await?;
        let response = self.ok(operation, &url, response).await?;
        let mut body = Vec::new();
        let mut reader = Capped::new(
            self,
            operation,
            &url,
            response,
            MAX_TOKEN_BYTES,
            "the token answer limit",
        )?;
        while let Some(chunk) = reader.next().await? {
            body.extend_from_slice(&chunk);
        }
        #[derive(serde::Deserialize)]
        struct Answer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let bad = |detail: String| OciError::Http {
            reference: self.shown.clone(),
            operation,
            url: url.to_string(),
            detail,
        };
        let answer: Answer = serde_json::from_slice(&body)
            .map_err(|e| bad(format!("the token answer is not JSON: {e}")))?;
        let token = answer
            .token
            .or(answer.access_token)
            .ok_or_else(|| bad("the token answer has no token".into()))?;
        if reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).is_err() {
            return Err(bad("the token is not a header value".into()));
        }
        Ok(token)
    }

    /// `response` when it is 200; otherwise an error naming the URL, the
    /// status and the start of the registry's message.
    async fn ok(
        &self,
        operation: &'static str,
        url: &Url,
        response: reqwest::Response,
    ) -> Result<reqwest::Response, OciError> {
        let status = response.status();
        if status == StatusCode::OK {
            return Ok(response);
        }
        let mut response = response;
        let mut text = Vec::new();
        while (text.len() as u64) < MAX_ERROR_TEXT {
            match response.chunk().await {
                Ok(Some(chunk)) => text.extend_from_slice(&chunk),
                _ => break,
            }
        }
        text.truncate(MAX_ERROR_TEXT as usize);
        let text = String::from_utf8_lossy(&text);
        Err(OciError::Registry {
            reference: self.shown.clone(),
            operation,
            detail: format!(
                "{url} answered {status}: {}",
                crate::text::printable(text.trim())
            ),
        })
    }
}

/// An answer's body, read chunk by chunk and refused past a cap.
struct Capped<'a> {
    registry: &'a Registry,
    operation: &'static str,
    url: &'a Url,
    response: reqwest::Response,
    limit: u64,
    bound: &'static str,
    read: u64,
}

impl<'a> Capped<'a> {
    fn new(
        registry: &'a Registry,
        operation: &'static str,
        url: &'a Url,
        response: reqwest::Response,
        limit: u64,
        bound: &'static str,
    ) -> Result<Self, OciError> {
        let capped = Self {
            registry,
            operation,
            url,
            response,
            limit,
            bound,
            read: 0,
        };
        let declared = capped
            .response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        if declared.is_some_and(|length| length > limit) {
            return Err(capped.too_large());
        }
        Ok(capped)
    }

    fn too_large(&self) -> OciError {
        OciError::AnswerTooLarge {
            reference: self.registry.shown.clone(),
            operation: self.operation,
            url: self.url.to_string(),
            limit: self.limit,
            bound: self.bound,
        }
    }

    /// The next chunk, or an error once the answer runs past the cap.
    async fn next(&mut self) -> Result<Option<bytes::Bytes>, OciError> {
        let chunk = self.response.chunk().await.map_err(|e| OciError::Http {
            reference: self.registry.shown.clone(),
            operation: self.operation,
            url: self.url.to_string(),
            detail: crate::text::error_chain(&e),
        })?;
        if let Some(chunk) = &chunk {
            self.read += chunk.len() as u64;
            if self.read > self.limit {
                return Err(self.too_large());
            }
        }
        Ok(chunk)
    }
}

/// reqwest without redirects (they are followed above), TLS by rustls with
/// ring and the platform's roots; https only unless the registry is on
/// loopback, which is reached directly (no proxy).
fn http_client(loopback: bool) -> Result<reqwest::Client, String> {
    use rustls_platform_verifier::BuilderVerifierExt as _;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_platform_verifier())
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth();
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .user_agent(concat!("moat/", env!("CARGO_PKG_VERSION")))
        .referer(false)
        .tls_backend_preconfigured(tls)
        .https_only(!loopback);
    if loopback {
        builder = builder.no_proxy();
    }
    builder.build().map_err(|e| crate::text::error_chain(&e))
}

//! The answers the front writes itself rather than rmcp: empty statuses
//! (503 says when to retry), plain text, the raw bytes for a connection
//! hyper never serves, and the audit event (`http_refused`) of a refusal.

use std::convert::Infallible;

use crate::audit::Event;
use crate::gateway::Gateway;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::{Response, StatusCode};

fn empty() -> BoxBody<Bytes, Infallible> {
    Empty::<Bytes>::new().boxed()
}

pub(super) fn status(code: StatusCode) -> Response<BoxBody<Bytes, Infallible>> {
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
pub(super) fn raw_refusal(code: StatusCode) -> Vec<u8> {
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

pub(super) fn refused(gateway: &Gateway, reason: &str, code: StatusCode) {
    tracing::debug!(reason, status = code.as_u16(), "http request refused");
    // Counted in the metrics even when the log can no longer take it.
    let _ = gateway.record(&Event::HttpRefused {
        reason: reason.to_owned(),
        status: code.as_u16(),
    });
}

/// A plain-text answer.
pub(super) fn text(
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

/// A JSON-RPC error with no id, as the answer to a request that never
/// reached a session: -32001, as the SDKs answer a session they do not
/// know, with `message` saying why.
pub(super) fn json_error(code: StatusCode, message: &str) -> Response<BoxBody<Bytes, Infallible>> {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32001, "message": message},
    });
    text(code, "application/json", body.to_string())
}

//! A typed tool component that makes outgoing HTTP requests through
//! `wasi:http/outgoing-handler`, and reads and writes files and its
//! environment (what a Wassette policy grants). It follows redirects itself, as an HTTP
//! library in a guest does: each hop is a new request the host checks.
//! Errors come back as the `err` text, with wasi:http's error code, so a
//! test can tell a refusal from a failure.

wit_bindgen::generate!({ path: "wit", world: "fetch" });

use wasip2::http::outgoing_handler;
use wasip2::http::types::{ErrorCode, Fields, Method, OutgoingRequest, Scheme};

struct Fetch;

impl Guest for Fetch {
    fn get(url: String, redirects: u8) -> Result<String, String> {
        let mut url = url;
        for _ in 0..=redirects {
            let (status, location, body) = request(&url)?;
            match (status, location) {
                (300..=399, Some(next)) => url = next,
                _ => return Ok(format!("{status} {body}")),
            }
        }
        Err("too many redirects".into())
    }

    fn read_file(path: String) -> Result<String, String> {
        std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))
    }

    fn write_file(path: String, text: String) -> Result<(), String> {
        std::fs::write(&path, text).map_err(|e| format!("{path}: {e}"))
    }

    fn env_var(key: String) -> Option<String> {
        std::env::var(key).ok()
    }
}

/// One GET: (status, Location header, body as text).
fn request(url: &str) -> Result<(u16, Option<String>, String), String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("not an absolute URL: {url}"))?;
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let request = OutgoingRequest::new(Fields::new());
    request.set_method(&Method::Get).map_err(|()| "method")?;
    let scheme = match scheme {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => Scheme::Other(other.to_owned()),
    };
    request.set_scheme(Some(&scheme)).map_err(|()| "scheme")?;
    request
        .set_authority(Some(authority))
        .map_err(|()| "authority")?;
    request
        .set_path_with_query(Some(path))
        .map_err(|()| "path")?;
    let pending = outgoing_handler::handle(request, None).map_err(describe)?;
    pending.subscribe().block();
    let response = pending
        .get()
        .ok_or("no response")?
        .map_err(|()| "response taken twice")?
        .map_err(describe)?;
    let status = response.status();
    let location = response
        .headers()
        .get("location")
        .first()
        .map(|v| String::from_utf8_lossy(v).into_owned());
    let body = response.consume().map_err(|()| "body")?;
    let stream = body.stream().map_err(|()| "body stream")?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => bytes.extend(chunk),
            Err(wasip2::io::streams::StreamError::Closed) => break,
            Err(wasip2::io::streams::StreamError::LastOperationFailed(error)) => {
                let code = wasip2::http::types::http_error_code(&error);
                return Err(match code {
                    Some(code) => format!("body: {}", describe(code)),
                    None => format!("body: {}", error.to_debug_string()),
                });
            }
        }
    }
    drop(stream);
    Ok((
        status,
        location,
        String::from_utf8_lossy(&bytes).into_owned(),
    ))
}

fn describe(code: ErrorCode) -> String {
    format!("{code:?}")
}

export!(Fetch);

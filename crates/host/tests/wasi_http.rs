//! Outgoing HTTP from wasm guests (wasi:http), in pairs: what an HTTP grant
//! allows is answered, and everything else is refused inside the guest
//! (`HttpRequestDenied`) without a connection: another port, host or
//! scheme, a redirect to an ungranted origin, no grant at all. A body past
//! `max_http_response_bytes` is cut.

#[macro_use]
mod common;

use common::{args, host};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use moat_host::ServerSpec;
use moat_host::config::HttpGrant;
use moat_test_guests as guests;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A loopback HTTP/1.1 server that counts its connections: `/hello` is
/// 200 "hello", `/big` is 64 KiB of `x`, `/redirect/PORT` is a 302 to
/// `http://127.0.0.1:PORT/hello`.
struct Origin {
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl Origin {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    let (status, extra, body) = if path == "/hello" {
                        ("200 OK", String::new(), "hello".to_owned())
                    } else if path == "/big" {
                        ("200 OK", String::new(), "x".repeat(64 << 10))
                    } else if let Some(to) = path.strip_prefix("/redirect/") {
                        (
                            "302 Found",
                            format!("location: http://127.0.0.1:{to}/hello\r\n"),
                            String::new(),
                        )
                    } else {
                        ("404 Not Found", String::new(), String::new())
                    };
                    let response = format!(
                        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                });
            }
        });
        Self { port, connections }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

fn fetch(grants: &[String]) -> ServerSpec {
    let mut spec = ServerSpec::wasm("fetch", guests::FETCH_WASM);
    spec.allow_unmeasured = true;
    if let moat_host::ServerKind::Wasm { http, .. } = &mut spec.kind {
        *http = grants
            .iter()
            .map(|g| HttpGrant::parse(g).unwrap().unwrap())
            .collect();
    }
    spec
}

/// `get URL` with `redirects` hops: the `ok` text, or the `err` text.
async fn get(spec: &ServerSpec, url: &str, redirects: u8) -> Result<String, String> {
    let session = host().connect(spec).await.expect("connect to fetch");
    let answer = session
        .call_tool("get", args(json!({"url": url, "redirects": redirects})))
        .await
        .expect("get");
    session.close().await.unwrap();
    let result = answer.structured_content.expect("structured")["result"].clone();
    match (result.get("ok"), result.get("err")) {
        (Some(Value::String(ok)), None) => Ok(ok.clone()),
        (None, Some(Value::String(err))) => Err(err.clone()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_granted_origin_is_answered_and_nothing_else_is_reached() {
    let granted = Origin::start().await;
    let other = Origin::start().await;
    let spec = fetch(&[format!("http://127.0.0.1:{}", granted.port)]);
    assert_eq!(
        get(
            &spec,
            &format!("http://127.0.0.1:{}/hello", granted.port),
            0
        )
        .await,
        Ok("200 hello".to_owned())
    );
    assert_eq!(granted.connections(), 1);
    let denied = [
        // Another port on the same host.
        format!("http://127.0.0.1:{}/hello", other.port),
        // Another name for the same address: no lookup, no connection.
        format!("http://localhost:{}/hello", granted.port),
        // Another scheme to the same host and port.
        format!("https://127.0.0.1:{}/hello", granted.port),
    ];
    for url in &denied {
        assert_eq!(
            get(&spec, url, 0).await,
            Err("ErrorCode::HttpRequestDenied".to_owned()),
            "{url}"
        );
    }
    assert_eq!(granted.connections(), 1, "no refused request connected");
    assert_eq!(other.connections(), 0);
}

#[tokio::test]
async fn a_redirect_to_an_ungranted_origin_is_refused() {
    let granted = Origin::start().await;
    let other = Origin::start().await;
    let spec = fetch(&[format!("http://127.0.0.1:{}", granted.port)]);
    let hop = format!("http://127.0.0.1:{}/redirect/{}", granted.port, other.port);
    assert_eq!(
        get(&spec, &hop, 1).await,
        Err("ErrorCode::HttpRequestDenied".to_owned())
    );
    assert_eq!(
        other.connections(),
        0,
        "the redirect target was never reached"
    );
    // A redirect within the grant is followed.
    let within = format!(
        "http://127.0.0.1:{}/redirect/{}",
        granted.port, granted.port
    );
    assert_eq!(get(&spec, &within, 1).await, Ok("200 hello".to_owned()));
}

#[tokio::test]
async fn without_a_grant_every_request_is_refused() {
    let origin = Origin::start().await;
    let spec = fetch(&[]);
    assert_eq!(
        get(&spec, &format!("http://127.0.0.1:{}/hello", origin.port), 0).await,
        Err("ErrorCode::HttpRequestDenied".to_owned())
    );
    assert_eq!(origin.connections(), 0);
    let session = host().connect(&spec).await.unwrap();
    let rules = session.identity().unwrap().sandbox.lines();
    assert!(
        rules.contains(&"enforced: HTTP (wasi:http): every request refused".to_owned()),
        "{rules:?}"
    );
    session.close().await.unwrap();
}

#[tokio::test]
async fn a_body_past_the_limit_is_cut() {
    let origin = Origin::start().await;
    let mut spec = fetch(&[format!("http://127.0.0.1:{}", origin.port)]);
    let url = format!("http://127.0.0.1:{}/big", origin.port);
    assert_eq!(
        get(&spec, &url, 0).await.map(|t| t.len()),
        Ok("200 ".len() + (64 << 10))
    );
    spec.limits.max_http_response_bytes = 1000;
    assert_eq!(
        get(&spec, &url, 0).await,
        Err("body: HTTP response body size exceeds limit: 1000 bytes".to_owned())
    );
}

//! Unit tests of the HTTP front: the token check, refusals, eviction, and
//! a served listener's refusals and probes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use super::admission::{Admission, phase};
use super::answer::{raw_refusal, status};
use super::guard::token_matches;
use super::{Allowed, serve};
use crate::gateway::Gateway;
use hyper::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

#[test]
fn the_token_must_match_exactly() {
    assert!(token_matches("Bearer abc", Some(b"Bearer abc")));
    assert!(!token_matches("Bearer abc", Some(b"Bearer abd")));
    assert!(!token_matches("Bearer abc", Some(b"Bearer ab")));
    assert!(!token_matches("Bearer abc", None));
}

#[test]
fn refusals_say_when_to_retry_only_for_503() {
    let busy = String::from_utf8(raw_refusal(StatusCode::SERVICE_UNAVAILABLE)).unwrap();
    assert_eq!(
        busy,
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
    );
    let slow = String::from_utf8(raw_refusal(StatusCode::REQUEST_TIMEOUT)).unwrap();
    assert!(!slow.contains("Retry-After"), "{slow}");
    assert_eq!(
        status(StatusCode::SERVICE_UNAVAILABLE).headers()[hyper::header::RETRY_AFTER],
        "1"
    );
    assert!(status(StatusCode::NOT_FOUND).headers().is_empty());
}

#[tokio::test]
async fn a_full_house_evicts_the_oldest_connection_that_has_not_asked_anything() {
    let admission = Arc::new(Admission::new(2));
    let silent = (
        Arc::new(AtomicU8::new(phase::NEW)),
        CancellationToken::new(),
    );
    let asking = (
        Arc::new(AtomicU8::new(phase::ANSWERING)),
        CancellationToken::new(),
    );
    let held_by_silent = admission.admit().await.unwrap();
    let _held_by_asking = admission.admit().await.unwrap();
    admission.enlist(&silent.0, &silent.1);
    admission.enlist(&asking.0, &asking.1);
    // The silent connection closes when told to, freeing its slot.
    let evicted = silent.1.clone();
    tokio::spawn(async move {
        evicted.cancelled().await;
        drop(held_by_silent);
    });
    assert!(admission.admit().await.is_some(), "room was made");
    assert!(silent.1.is_cancelled(), "the silent one was evicted");
    assert!(!asking.1.is_cancelled(), "one that asked is never evicted");
}

#[tokio::test]
async fn a_connection_whose_body_is_still_arriving_is_evicted_too() {
    let admission = Arc::new(Admission::new(2));
    let answered = (
        Arc::new(AtomicU8::new(phase::ANSWERING)),
        CancellationToken::new(),
    );
    let dripping = (
        Arc::new(AtomicU8::new(phase::BODY)),
        CancellationToken::new(),
    );
    let _held_by_answered = admission.admit().await.unwrap();
    let held_by_dripping = admission.admit().await.unwrap();
    admission.enlist(&answered.0, &answered.1);
    admission.enlist(&dripping.0, &dripping.1);
    let evicted = dripping.1.clone();
    tokio::spawn(async move {
        evicted.cancelled().await;
        drop(held_by_dripping);
    });
    assert!(admission.admit().await.is_some(), "room was made");
    assert!(dripping.1.is_cancelled(), "the dripping one was evicted");
    assert!(!answered.1.is_cancelled());
    // The answered one stays listed: once its next body drips, it goes.
    answered.0.store(phase::BODY, Ordering::SeqCst);
    assert!(admission.evict_oldest_waiting());
    assert!(answered.1.is_cancelled());
}

#[tokio::test]
async fn with_no_silent_connection_to_evict_a_new_one_is_refused() {
    let admission = Admission::new(1);
    let asking = (
        Arc::new(AtomicU8::new(phase::ANSWERING)),
        CancellationToken::new(),
    );
    let _held = admission.admit().await.unwrap();
    admission.enlist(&asking.0, &asking.1);
    assert!(admission.admit().await.is_none());
    assert!(!asking.1.is_cancelled());
}

fn gateway() -> Gateway {
    let config = crate::config::Config {
        path: "moat.toml".into(),
        servers: Default::default(),
        serve: Default::default(),
        wasm: Default::default(),
        nodes: Default::default(),
    };
    Gateway::new(crate::host::Host::new(None).unwrap(), config, None)
}

/// The status line's code of the answer to `request`, sent raw.
async fn status_of(addr: std::net::SocketAddr, request: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before an answer: {answer:?}");
        answer.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&answer);
    line[9..12].parse().unwrap()
}

#[tokio::test]
async fn requests_are_refused_by_token_path_and_size_before_the_gateway() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let served = tokio::spawn(serve(
        gateway(),
        listener,
        Some("sesame".into()),
        Allowed::default(),
        stop.clone().cancelled_owned(),
    ));
    let host = format!("Host: {addr}\r\nConnection: close\r\n");
    let no_token = format!("POST /mcp HTTP/1.1\r\n{host}Content-Length: 0\r\n\r\n");
    assert_eq!(status_of(addr, &no_token).await, 401);
    let wrong = format!(
        "POST /mcp HTTP/1.1\r\n{host}Authorization: Bearer sesamf\r\nContent-Length: 0\r\n\r\n"
    );
    assert_eq!(status_of(addr, &wrong).await, 401);
    let elsewhere = format!("GET /other HTTP/1.1\r\n{host}Authorization: Bearer sesame\r\n\r\n");
    assert_eq!(status_of(addr, &elsewhere).await, 404);
    let huge = format!(
        "POST /mcp HTTP/1.1\r\n{host}Authorization: Bearer sesame\r\nContent-Length: {}\r\n\r\n",
        crate::config::ServeSettings::default().max_body_bytes.get() + 1
    );
    assert_eq!(status_of(addr, &huge).await, 413);
    stop.cancel();
    let failures = served.await.unwrap().unwrap();
    assert!(failures.is_empty());
}

#[tokio::test]
async fn probes_need_nothing_and_metrics_need_the_token_a_host_and_no_origin() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let served = tokio::spawn(serve(
        gateway(),
        listener,
        Some("sesame".into()),
        Allowed::default(),
        stop.clone().cancelled_owned(),
    ));
    let get = |path: &str, headers: &str| {
        format!("GET {path} HTTP/1.1\r\nConnection: close\r\n{headers}\r\n")
    };
    let host = format!("Host: {addr}\r\n");
    let token = "Authorization: Bearer sesame\r\n";
    assert_eq!(status_of(addr, &get("/healthz", &host)).await, 200);
    assert_eq!(status_of(addr, &get("/readyz", &host)).await, 200);
    assert_eq!(status_of(addr, &get("/metrics", &host)).await, 401);
    let scrape = format!("{host}{token}");
    assert_eq!(status_of(addr, &get("/metrics", &scrape)).await, 200);
    let rebound = format!("Host: evil.example:{}\r\n{token}", addr.port());
    assert_eq!(status_of(addr, &get("/metrics", &rebound)).await, 403);
    let browser = format!("{scrape}Origin: http://evil.example\r\n");
    assert_eq!(status_of(addr, &get("/metrics", &browser)).await, 403);
    let post =
        format!("POST /metrics HTTP/1.1\r\nConnection: close\r\n{scrape}Content-Length: 0\r\n\r\n");
    assert_eq!(status_of(addr, &post).await, 405);
    stop.cancel();
    assert!(served.await.unwrap().unwrap().is_empty());
}

#[tokio::test]
async fn a_listener_beyond_loopback_needs_a_token() {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let error = serve(
        gateway(),
        listener,
        None,
        Allowed::default(),
        std::future::pending(),
    )
    .await
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "--http {addr} is not a loopback address: set a bearer token with --token or MOAT_HTTP_TOKEN"
        )
    );
}

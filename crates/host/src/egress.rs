//! Egress for native servers with `net` grants: the server runs in a
//! network namespace of its own whose only way out is this proxy, which
//! Moat runs outside it. The server's side of the proxy is a listener on
//! 127.0.0.1 inside the server's namespace (made by the child before exec
//! and handed to Moat); `HTTP_PROXY` and `HTTPS_PROXY` point at it.
//!
//! The proxy serves `CONNECT host:port` (HTTPS and any TCP) and plain HTTP
//! requests in absolute form. A destination is allowed when the name the
//! client asked for and the port are a `net` entry (names compare without
//! case and final dot); the connection is then made to what Moat resolves
//! for that name. Anything else gets `403 Forbidden` with a one-line reason
//! the server can read. Nothing else leaves the namespace: no DNS, no UDP,
//! no other TCP.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::config::NetGrant;

/// The proxy's port inside every server's namespace (nothing else listens
/// there).
pub const PROXY_PORT: u16 = 3128;
/// Connections one server may have open through the proxy at once: each
/// costs Moat two descriptors, and a server must not be able to spend all
/// of Moat's.
pub const MAX_CONNECTIONS: usize = 256;
/// The longest request head the proxy reads.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client may take to send its request head, and Moat to
/// resolve and connect.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment that points a server at the proxy.
pub fn proxy_environment() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ]
    .into_iter()
    .map(|name| (name.to_owned(), url.clone()))
    .chain(
        ["NO_PROXY", "no_proxy"]
            .into_iter()
            .map(|name| (name.to_owned(), String::new())),
    )
    .collect()
}

/// Serves the proxy on `listener` (the server's side) until the task is
/// aborted, allowing `allowed`.
pub fn serve(
    server: String,
    listener: std::net::TcpListener,
    allowed: Vec<NetGrant>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    let allowed = std::sync::Arc::new(allowed);
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    Ok(tokio::spawn(async move {
        loop {
            let mut client = match listener.accept().await {
                Ok((client, _)) => client,
                Err(error) => {
                    // Out of descriptors, most likely: wait, never spin.
                    tracing::warn!(%server, %error, "egress accept failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                let reason = format!("more than {MAX_CONNECTIONS} connections at once");
                tokio::spawn(async move {
                    let _ = refuse(&mut client, "503 Service Unavailable", &reason).await;
                });
                continue;
            };
            let allowed = allowed.clone();
            let server = server.clone();
            tokio::spawn(async move {
                let _slot = slot;
                if let Err(error) = relay(client, &allowed).await {
                    tracing::debug!(%server, %error, "egress connection ended");
                }
            });
        }
    }))
}

/// A request the proxy understood.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    host: String,
    port: u16,
    /// `CONNECT`: a tunnel; else the head to send on, in origin form.
    tunnel: bool,
}

fn normalize(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether `host:port` is a `net` entry.
fn allowed_by(allowed: &[NetGrant], host: &str, port: u16) -> bool {
    let host = normalize(host.trim_start_matches('[').trim_end_matches(']'));
    allowed
        .iter()
        .any(|g| g.port == port && normalize(&g.host) == host)
}

/// Splits `host:port` (with `[v6]:port`), `default` when no port is given.
fn host_port(authority: &str, default: u16) -> Option<(String, u16)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(port) => port.parse().ok()?,
            None if after.is_empty() => default,
            None => return None,
        };
        return Some((host.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok()?)),
        None => Some((authority.to_owned(), default)),
    }
}

/// The target of a request head, and the head rewritten for the upstream
/// (origin-form request line, no proxy headers, `Connection: close`).
fn parse_head(head: &str) -> Result<(Target, String), String> {
    let mut lines = head.split("\r\n");
    let request = lines.next().unwrap_or_default();
    let mut parts = request.split(' ');
    let (method, uri, version) = match (parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(u), Some(v)) if parts.next().is_none() => (m, u, v),
        _ => return Err("a malformed request line".into()),
    };
    if method == "CONNECT" {
        let (host, port) = host_port(uri, 443).ok_or("a malformed CONNECT target")?;
        return Ok((
            Target {
                host,
                port,
                tunnel: true,
            },
            String::new(),
        ));
    }
    let rest = uri
        .strip_prefix("http://")
        .ok_or("not a proxy request (use an absolute http:// URL, or CONNECT)")?;
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let (host, port) = host_port(authority, 80).ok_or("a malformed URL authority")?;
    let mut out = format!("{method} {path} {version}\r\n");
    for line in lines {
        if line.is_empty() {
            continue;
        }
        let name = line
            .split(':')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    Ok((
        Target {
            host,
            port,
            tunnel: false,
        },
        out,
    ))
}

async fn refuse(client: &mut TcpStream, status: &str, reason: &str) -> std::io::Result<()> {
    let body = format!("moat: {reason}\n");
    client
        .write_all(
            format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
}

async fn relay(mut client: TcpStream, allowed: &[NetGrant]) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let end = tokio::time::timeout(STEP_TIMEOUT, async {
        let mut buf = [0u8; 2048];
        loop {
            if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                return Ok::<_, std::io::Error>(Some(at + 4));
            }
            if head.len() > MAX_HEAD {
                return Ok(None);
            }
            let n = client.read(&mut buf).await?;
            if n == 0 {
                return Ok(None);
            }
            head.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or(Ok(None))?;
    let Some(end) = end else {
        return refuse(&mut client, "400 Bad Request", "no complete request head").await;
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let (target, upstream_head) = match parse_head(&text) {
        Ok(parsed) => parsed,
        Err(reason) => return refuse(&mut client, "400 Bad Request", &reason).await,
    };
    if !allowed_by(allowed, &target.host, target.port) {
        let reason = format!(
            "{}:{} is not in this server's net grants",
            crate::lock::printable(&target.host),
            target.port
        );
        return refuse(&mut client, "403 Forbidden", &reason).await;
    }
    let connected = tokio::time::timeout(STEP_TIMEOUT, async {
        let addresses: Vec<_> = tokio::net::lookup_host((target.host.as_str(), target.port))
            .await?
            .collect();
        let mut last = std::io::Error::other("the name has no address");
        for address in addresses {
            match TcpStream::connect(address).await {
                Ok(stream) => return Ok(stream),
                Err(error) => last = error,
            }
        }
        Err(last)
    })
    .await
    .unwrap_or_else(|_| Err(std::io::Error::other("timed out")));
    let mut upstream = match connected {
        Ok(upstream) => upstream,
        Err(error) => {
            let reason = format!(
                "connecting to {}:{}: {error}",
                crate::lock::printable(&target.host),
                target.port
            );
            return refuse(&mut client, "502 Bad Gateway", &reason).await;
        }
    };
    if target.tunnel {
        client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await?;
    } else {
        upstream.write_all(upstream_head.as_bytes()).await?;
    }
    // Bytes the client sent after its head belong to the upstream.
    upstream.write_all(&head[end..]).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_parsed_and_destinations_matched_by_name() {
        let (target, _) =
            parse_head("CONNECT api.example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(
            target,
            Target {
                host: "api.example.com".into(),
                port: 443,
                tunnel: true
            }
        );
        let (target, head) = parse_head(
            "GET http://127.0.0.1:8080/page?q=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nProxy-Authorization: x\r\nConnection: keep-alive\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            (target.host.as_str(), target.port, target.tunnel),
            ("127.0.0.1", 8080, false)
        );
        assert_eq!(
            head,
            "GET /page?q=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nConnection: close\r\n\r\n"
        );
        assert!(parse_head("GET /relative HTTP/1.1\r\n\r\n").is_err());
        let allowed = [NetGrant {
            host: "API.example.com".into(),
            port: 443,
        }];
        assert!(allowed_by(&allowed, "api.example.com.", 443));
        assert!(!allowed_by(&allowed, "api.example.com", 80));
        assert!(!allowed_by(&allowed, "evil.example.com", 443));
        assert_eq!(host_port("[::1]:8080", 80), Some(("::1".into(), 8080)));
    }
}

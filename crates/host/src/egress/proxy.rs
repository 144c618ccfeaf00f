//! The HTTP proxy inside a server's namespace: `CONNECT host:port` and
//! plain HTTP in absolute form, to the listed destinations only.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::serve::Connections;
use super::{PROXY_PORT, STEP_TIMEOUT, normalize, unbracket};
use crate::grants::NetGrant;

/// The longest request head the proxy reads.
const MAX_HEAD: usize = 16 * 1024;

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

/// A request the proxy understood.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) host: String,
    pub(super) port: u16,
    /// `CONNECT`: a tunnel; else the head to send on, in origin form.
    pub(super) tunnel: bool,
}

/// Whether `host:port` is a `net` entry.
pub(super) fn allowed_by(allowed: &[NetGrant], host: &str, port: u16) -> bool {
    let host = normalize(unbracket(host));
    allowed
        .iter()
        .any(|g| g.port == port && normalize(unbracket(&g.host)) == host)
}

/// Splits `host:port` (with `[v6]:port`), `default` when no port is given.
pub(super) fn host_port(authority: &str, default: u16) -> Option<(String, u16)> {
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
pub(super) fn parse_head(head: &str) -> Result<(Target, String), String> {
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

/// Reads what the client sent up to the end of its request head (at most
/// [`REFUSED_HEAD_BYTES`]), without keeping it.
pub(super) async fn skip_head(client: &mut TcpStream) -> std::io::Result<()> {
    let mut buf = [0u8; 1024];
    let mut tail = [0u8; 3];
    let mut read = 0usize;
    while read < REFUSED_HEAD_BYTES {
        let n = client.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        read += n;
        let mut seen = tail.to_vec();
        seen.extend_from_slice(&buf[..n]);
        if seen.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
        let keep = seen.len().saturating_sub(3);
        tail.copy_from_slice(&seen[keep..]);
    }
    Ok(())
}

/// How much of a refused connection's request is read before the refusal.
const REFUSED_HEAD_BYTES: usize = 16 << 10;

pub(super) async fn refuse(
    client: &mut TcpStream,
    status: &str,
    reason: &str,
) -> std::io::Result<()> {
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

/// Serves one proxy request: a tunnel or a plain HTTP request to an
/// allowed destination, at its launch-time address.
pub(super) async fn proxy_one(
    mut client: TcpStream,
    allowed: &[NetGrant],
    connections: &Connections,
) -> std::io::Result<()> {
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
        let destination = format!("{}:{}", crate::text::printable(&target.host), target.port);
        connections.recorder.refused(
            &destination,
            "not in this server's net grants (proxy answered 403)",
        );
        let reason = format!("{destination} is not in this server's net grants");
        return refuse(&mut client, "403 Forbidden", &reason).await;
    }
    let mut upstream = match connections.connect(&target.host, target.port).await {
        Ok(upstream) => upstream,
        Err(reason) => return refuse(&mut client, "502 Bad Gateway", &reason).await,
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

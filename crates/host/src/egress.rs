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
//! the server can read. Nothing else leaves the namespace: no UDP, no
//! other TCP.
//!
//! DNS is answered by Moat, from memory: the child also hands over a UDP
//! socket on 127.0.0.1:53 of its namespace, where its `/etc/resolv.conf`
//! points. A name a `net` entry lists gets the addresses Moat resolved for
//! it when the server started (so a client that resolves before it asks
//! the proxy, as some check for private addresses, works); any other name
//! is REFUSED, and no query the server sends reaches a resolver, so DNS is
//! no channel out.
//!
//! Every proxied connection costs Moat two descriptors, so connections are
//! bounded per server, per agent session and per gateway ([`Shares`], from
//! `[serve] egress_connections_per_server`, `egress_connections_per_session`
//! and `egress_connections`): one beyond a bound gets `503 Service
//! Unavailable` naming it, and servers elsewhere keep their share.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::NetGrant;

/// The proxy's port inside every server's namespace (nothing else listens
/// there).
pub const PROXY_PORT: u16 = 3128;
/// The DNS port inside every server's namespace, on 127.0.0.1.
pub const DNS_PORT: u16 = 53;
/// How long an answer says it may be cached.
const DNS_TTL: u32 = 60;
/// Connections one server may have open through the proxy at once when
/// nothing else says (outside a gateway): each costs Moat two descriptors,
/// and a server must not be able to spend all of Moat's.
pub const MAX_CONNECTIONS: usize = 256;

/// A bound on proxied connections at once, shared by every proxy that
/// draws from it.
#[derive(Clone, Debug)]
pub struct Pool {
    slots: Arc<Semaphore>,
    max: usize,
    /// What it bounds: `server`, `session` or `gateway`.
    per: &'static str,
}

impl Pool {
    /// A pool of `max` connections, bounding what one `per` may have open.
    pub fn new(max: usize, per: &'static str) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
            per,
        }
    }

    /// Its bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections open against it now.
    pub fn in_use(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

/// The bounds on a server's proxied connections: its own (a pool of
/// `per_server` made at its start), and the pools it shares with others,
/// its gateway's and its agent session's. A server started before any
/// session needed it (the gateway's name check) has no session yet; the
/// session that takes it over gives it its pool with [`Shares::adopt`].
#[derive(Clone, Debug)]
pub struct Shares {
    per_server: usize,
    gateway: Option<Pool>,
    session: Arc<OnceLock<Pool>>,
}

impl Default for Shares {
    /// [`MAX_CONNECTIONS`] per server, and nothing shared.
    fn default() -> Self {
        Self {
            per_server: MAX_CONNECTIONS,
            gateway: None,
            session: Arc::default(),
        }
    }
}

impl Shares {
    /// `per_server` for each server, all drawing from `gateway`, with no
    /// session yet.
    pub fn gateway(per_server: usize, gateway: Pool) -> Self {
        Self {
            per_server,
            gateway: Some(gateway),
            session: Arc::default(),
        }
    }

    /// The same bounds, and no session yet (of its own: see
    /// [`Shares::adopt`]).
    pub fn detached(&self) -> Self {
        Self {
            per_server: self.per_server,
            gateway: self.gateway.clone(),
            session: Arc::default(),
        }
    }

    /// The same bounds, and `session`'s pool.
    pub fn in_session(&self, session: &Pool) -> Self {
        Self {
            per_server: self.per_server,
            gateway: self.gateway.clone(),
            session: Arc::new(OnceLock::from(session.clone())),
        }
    }

    /// Draws from `session` from now on, if no session's pool was given
    /// yet.
    pub fn adopt(&self, session: &Pool) {
        let _ = self.session.set(session.clone());
    }

    /// A slot in `server` and in each shared pool, or the refusal naming
    /// the bound that is reached.
    fn take(&self, server: &Pool) -> Result<Vec<OwnedSemaphorePermit>, String> {
        [Some(server), self.session.get(), self.gateway.as_ref()]
            .into_iter()
            .flatten()
            .map(|pool| {
                pool.slots.clone().try_acquire_owned().map_err(|_| {
                    format!(
                        "egress connection limit ({} per {}) reached",
                        pool.max, pool.per
                    )
                })
            })
            .collect()
    }
}
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

/// The names (not IP literals) the `net` entries list, normalized and
/// deduplicated.
pub fn listed_names(allowed: &[NetGrant]) -> Vec<String> {
    let mut names: Vec<String> = allowed
        .iter()
        .map(|g| normalize(&g.host))
        .filter(|h| {
            h.trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_err()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Serves the proxy on `listener` and DNS on `dns` (the server's side)
/// until the task is aborted, allowing `allowed`, with `shares` bounding
/// its connections open at once.
pub fn serve(
    server: String,
    listener: std::net::TcpListener,
    dns: std::net::UdpSocket,
    allowed: Vec<NetGrant>,
    shares: Shares,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    dns.set_nonblocking(true)?;
    let dns = tokio::net::UdpSocket::from_std(dns)?;
    let names = listed_names(&allowed);
    let allowed = Arc::new(allowed);
    let own = Pool::new(shares.per_server, "server");
    let answers = serve_dns(server.clone(), dns, names);
    Ok(tokio::spawn(async move {
        let proxy = async move {
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
                let slot = match shares.take(&own) {
                    Ok(slot) => slot,
                    Err(reason) => {
                        tracing::debug!(%server, %reason, "egress connection refused");
                        tokio::spawn(async move {
                            let _ = tokio::time::timeout(STEP_TIMEOUT, async {
                                // The request head is read first: closing a
                                // socket with unread data sends a reset,
                                // which can destroy the 503 before the
                                // client reads it (it saw EPIPE instead).
                                skip_head(&mut client).await?;
                                refuse(&mut client, "503 Service Unavailable", &reason).await
                            })
                            .await;
                        });
                        continue;
                    }
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
        };
        tokio::join!(proxy, answers);
    }))
}

/// Answers DNS on `socket` for `names`, resolved once, up front (each
/// within [`STEP_TIMEOUT`]; one that fails has no addresses), and refuses
/// every other name.
async fn serve_dns(server: String, socket: tokio::net::UdpSocket, names: Vec<String>) {
    let mut resolved = HashMap::new();
    for name in names {
        let found = tokio::time::timeout(STEP_TIMEOUT, tokio::net::lookup_host((name.as_str(), 0)))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|addresses| addresses.map(|a| a.ip().to_canonical()).collect::<Vec<_>>())
            .unwrap_or_default();
        if found.is_empty() {
            tracing::warn!(%server, %name, "a listed name did not resolve; DNS answers it with no address");
        }
        resolved.insert(name, found);
    }
    let mut buffer = vec![0u8; 4096];
    loop {
        let (length, from) = match socket.recv_from(&mut buffer).await {
            Ok(received) => received,
            Err(error) => {
                tracing::debug!(%server, %error, "DNS receive failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Some(reply) = answer_dns(&buffer[..length], &resolved) {
            let _ = socket.send_to(&reply, from).await;
        }
    }
}

/// The reply to one DNS query: A and AAAA records for a listed name (no
/// records for other types), REFUSED for any other name, FORMERR for a
/// query that is not exactly one question. `None` for what is not a query.
fn answer_dns(query: &[u8], names: &HashMap<String, Vec<IpAddr>>) -> Option<Vec<u8>> {
    use simple_dns::rdata::{A, AAAA, RData};
    use simple_dns::{CLASS, Packet, PacketFlag, QTYPE, RCODE, ResourceRecord, TYPE};
    let packet = Packet::parse(query).ok()?;
    if packet.has_flags(PacketFlag::RESPONSE) {
        return None;
    }
    let mut reply = Packet::new_reply(packet.id());
    if packet.has_flags(PacketFlag::RECURSION_DESIRED) {
        reply.set_flags(PacketFlag::RECURSION_DESIRED | PacketFlag::RECURSION_AVAILABLE);
    }
    let [question] = packet.questions.as_slice() else {
        *reply.rcode_mut() = RCODE::FormatError;
        return reply.build_bytes_vec().ok();
    };
    reply.questions.push(question.clone());
    match names.get(&normalize(&question.qname.to_string())) {
        None => *reply.rcode_mut() = RCODE::Refused,
        Some(addresses) => {
            for address in addresses {
                let data = match (question.qtype, address) {
                    (QTYPE::TYPE(TYPE::A) | QTYPE::ANY, IpAddr::V4(v4)) => RData::A(A::from(*v4)),
                    (QTYPE::TYPE(TYPE::AAAA) | QTYPE::ANY, IpAddr::V6(v6)) => {
                        RData::AAAA(AAAA::from(*v6))
                    }
                    _ => continue,
                };
                reply.answers.push(ResourceRecord::new(
                    question.qname.clone(),
                    CLASS::IN,
                    DNS_TTL,
                    data,
                ));
            }
        }
    }
    reply.build_bytes_vec().ok()
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

/// Reads what the client sent up to the end of its request head (at most
/// [`REFUSED_HEAD_BYTES`]), without keeping it.
async fn skip_head(client: &mut TcpStream) -> std::io::Result<()> {
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
            crate::text::printable(&target.host),
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
                crate::text::printable(&target.host),
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
    fn dns_answers_listed_names_and_refuses_the_rest() {
        use simple_dns::{CLASS, Name, Packet, PacketFlag, QCLASS, QTYPE, Question, RCODE, TYPE};
        let names = HashMap::from([(
            "api.example".to_owned(),
            vec!["192.0.2.7".parse().unwrap(), "2001:db8::7".parse().unwrap()],
        )]);
        let query = |name: &str, kind: TYPE| {
            let mut packet = Packet::new_query(42);
            packet.set_flags(PacketFlag::RECURSION_DESIRED);
            packet.questions.push(Question::new(
                Name::new_unchecked(name),
                QTYPE::TYPE(kind),
                QCLASS::CLASS(CLASS::IN),
                false,
            ));
            packet.build_bytes_vec().unwrap()
        };
        let reply = |bytes: Vec<u8>| {
            let answer = answer_dns(&bytes, &names).unwrap();
            let packet = Packet::parse(&answer).unwrap();
            let records: Vec<String> = packet
                .answers
                .iter()
                .map(|r| format!("{:?}", r.rdata))
                .collect();
            (packet.id(), packet.rcode(), records)
        };
        let (id, rcode, records) = reply(query("API.example.", TYPE::A));
        assert_eq!((id, rcode), (42, RCODE::NoError));
        assert_eq!(records.len(), 1, "{records:?}");
        let address = u32::from("192.0.2.7".parse::<std::net::Ipv4Addr>().unwrap());
        assert!(records[0].contains(&address.to_string()), "{records:?}");
        let (_, rcode, records) = reply(query("api.example", TYPE::AAAA));
        assert_eq!((rcode, records.len()), (RCODE::NoError, 1));
        let (_, rcode, records) = reply(query("api.example", TYPE::TXT));
        assert_eq!((rcode, records.len()), (RCODE::NoError, 0));
        let (_, rcode, records) = reply(query("exfil.attacker.example", TYPE::A));
        assert_eq!((rcode, records.len()), (RCODE::Refused, 0));
        let mut empty = Packet::new_query(7);
        empty.set_flags(PacketFlag::RECURSION_DESIRED);
        let (_, rcode, _) = reply(empty.build_bytes_vec().unwrap());
        assert_eq!(rcode, RCODE::FormatError);
        assert!(answer_dns(b"not dns", &names).is_none());
        let response = Packet::parse(&answer_dns(&query("api.example", TYPE::A), &names).unwrap())
            .unwrap()
            .build_bytes_vec()
            .unwrap();
        assert!(
            answer_dns(&response, &names).is_none(),
            "a reply is not answered"
        );
    }

    #[test]
    fn connections_take_a_slot_in_every_pool_and_the_refusal_names_the_full_one() {
        let gateway = Pool::new(3, "gateway");
        let session = Pool::new(2, "session");
        let shares = Shares::gateway(8, gateway.clone());
        let spare = shares.detached();
        let (one, two) = (Pool::new(8, "server"), Pool::new(8, "server"));
        // Before a session takes it over, only the gateway bounds it.
        let first = spare.take(&one).unwrap();
        assert_eq!((gateway.in_use(), session.in_use()), (1, 0));
        spare.adopt(&session);
        let second = spare.take(&one).unwrap();
        let in_session = shares.in_session(&session);
        let third = in_session.take(&two).unwrap();
        assert_eq!((gateway.in_use(), session.in_use()), (3, 2));
        assert_eq!(
            in_session.take(&two).unwrap_err(),
            "egress connection limit (2 per session) reached"
        );
        assert_eq!(two.in_use(), 1, "a refusal holds no slot anywhere");
        drop(first);
        let fourth = Shares::gateway(8, gateway.clone())
            .take(&Pool::new(8, "server"))
            .unwrap();
        let over = Shares::gateway(8, gateway.clone()).take(&Pool::new(8, "server"));
        assert_eq!(
            over.unwrap_err(),
            "egress connection limit (3 per gateway) reached"
        );
        let own = Pool::new(1, "server");
        let _only = Shares::default().take(&own).unwrap();
        assert_eq!(
            Shares::default().take(&own).unwrap_err(),
            "egress connection limit (1 per server) reached"
        );
        drop((second, third, fourth));
        assert_eq!((gateway.in_use(), session.in_use()), (0, 0));
    }

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

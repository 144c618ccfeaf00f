//! Egress for native servers with `net` grants: the server runs in a
//! network namespace of its own whose only ways out are Moat's, which Moat
//! serves from outside it on sockets the child made inside before exec and
//! handed over (see [`Layout`] for where each is).
//!
//! **Transparent relays.** Every `net` entry has a TCP listener of Moat's
//! inside the namespace: a listed name gets a loopback address of its own
//! (`127.100.0.1`, `127.100.0.2`, ... in the order of the entries), which
//! Moat's DNS answers for it; an address literal is listened on at that very
//! address (`127.0.0.1` as it is, any other IPv4 address made an alias of
//! the namespace's `lo`). A connection to one is relayed to the address the
//! name resolved to **at launch**: names are looked up once, when the server
//! starts, and a rebinding answer later changes nothing. A name's
//! loopback, private, link-local or otherwise non-public addresses are used
//! only when the grant also names that address literally (with the port);
//! a name that resolved to nothing usable is refused, saying so. No TLS is
//! intercepted: bytes are relayed as they are. So a client that ignores
//! proxy variables (Node's `fetch`, Go, `psql`, a Redis client) reaches its
//! granted hosts as it would anywhere, and nothing else: any other address
//! has no route, any other port on a relay address refuses the connection.
//!
//! **The proxy** (`HTTP_PROXY`, `HTTPS_PROXY` at `127.0.0.1:3128`), for
//! clients that want one, serves `CONNECT host:port` and plain HTTP in
//! absolute form, for the same destinations, to the same launch-time
//! addresses. Anything else gets `403 Forbidden` with a one-line reason.
//!
//! **DNS** is answered by Moat, from memory, on UDP 127.0.0.1:53 of the
//! namespace, where its `/etc/resolv.conf` points: a listed name gets its
//! relay address (an A record; no AAAA, so clients use it); any other name
//! is NXDOMAIN at once. No query the server sends reaches a resolver, so DNS
//! is no channel out.
//!
//! Every refusal Moat sees (an unlisted name asked of its DNS, a proxy
//! request outside the grants, a relay whose name has no usable address) is
//! reported to the observer the gateway gives ([`Shares::observe`]), which
//! writes it to the audit log: the first [`MAX_RECORDED`] distinct ones per
//! server start, then one saying that more were not recorded.
//!
//! Every relayed connection costs Moat two descriptors, so connections are
//! bounded per server, per agent session and per gateway ([`Shares`], from
//! `[serve] egress_connections_per_server`, `egress_connections_per_session`
//! and `egress_connections`): one beyond a bound gets `503 Service
//! Unavailable` naming it (the proxy) or is closed (a relay), and servers
//! elsewhere keep their share.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::grants::NetGrant;

/// The proxy's port inside every server's namespace (nothing else listens
/// there).
pub const PROXY_PORT: u16 = 3128;
/// The DNS port inside every server's namespace, on 127.0.0.1.
pub const DNS_PORT: u16 = 53;
/// How long an answer says it may be cached.
const DNS_TTL: u32 = 60;
/// The relay address of the first listed name; the next get the addresses
/// after it (all of 127.0.0.0/8 is the namespace's loopback).
pub const NAME_BASE: Ipv4Addr = Ipv4Addr::new(127, 100, 0, 1);
/// Distinct refusals recorded per server start: a server asking for
/// random names must not fill the audit log.
pub const MAX_RECORDED: usize = 64;
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

/// How names in `net` entries are looked up at launch: the system's
/// resolver unless an embedder gives another ([`Shares::with_lookup`]).
#[derive(Clone)]
pub struct Lookup(Arc<LookupFn>);

type LookupFn = dyn Fn(String) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>
    + Send
    + Sync;

impl Lookup {
    /// Looks names up with `lookup`.
    pub fn new<F, R>(lookup: F) -> Self
    where
        F: Fn(String) -> R + Send + Sync + 'static,
        R: Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'static,
    {
        Self(Arc::new(move |name| Box::pin(lookup(name))))
    }

    /// The system's resolver (`getaddrinfo`, on tokio's blocking pool).
    pub fn system() -> Self {
        Self::new(|name: String| async move {
            Ok(tokio::net::lookup_host((name.as_str(), 0))
                .await?
                .map(|address| address.ip().to_canonical())
                .collect())
        })
    }
}

impl std::fmt::Debug for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lookup")
    }
}

/// One destination Moat refused a server, as told to the observer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub server: String,
    /// `host:port`, or a name asked of Moat's DNS.
    pub destination: String,
    pub reason: String,
}

/// Told of each refusal ([`Shares::observe`]).
#[derive(Clone)]
pub struct Observer(Arc<dyn Fn(Refusal) + Send + Sync>);

impl Observer {
    pub fn new(observe: impl Fn(Refusal) + Send + Sync + 'static) -> Self {
        Self(Arc::new(observe))
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

/// The bounds on a server's relayed connections: its own (a pool of
/// `per_server` made at its start), and the pools it shares with others,
/// its gateway's and its agent session's. A server started before any
/// session needed it (the gateway's name check) has no session yet; the
/// session that takes it over gives it its pool with [`Shares::adopt`].
/// With them: how names are looked up, and who is told of refusals.
#[derive(Clone, Debug)]
pub struct Shares {
    per_server: usize,
    gateway: Option<Pool>,
    session: Arc<OnceLock<Pool>>,
    lookup: Option<Lookup>,
    observer: Option<Observer>,
}

impl Default for Shares {
    /// [`MAX_CONNECTIONS`] per server, nothing shared, the system's
    /// resolver, and refusals only logged.
    fn default() -> Self {
        Self {
            per_server: MAX_CONNECTIONS,
            gateway: None,
            session: Arc::default(),
            lookup: None,
            observer: None,
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
            ..Self::default()
        }
    }

    /// The same, with names looked up by `lookup`.
    pub fn with_lookup(mut self, lookup: Lookup) -> Self {
        self.lookup = Some(lookup);
        self
    }

    /// The same, with `observer` told of every refusal recorded.
    pub fn observe(mut self, observer: Observer) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The same bounds, and no session yet (of its own: see
    /// [`Shares::adopt`]).
    pub fn detached(&self) -> Self {
        Self {
            session: Arc::default(),
            ..self.clone()
        }
    }

    /// The same bounds, and `session`'s pool.
    pub fn in_session(&self, session: &Pool) -> Self {
        Self {
            session: Arc::new(OnceLock::from(session.clone())),
            ..self.clone()
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

/// Where each `net` entry is reached inside a server's namespace: what
/// the child makes before exec (the `lo` aliases, one listener per relay),
/// and what Moat's DNS answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Each listed name (normalized) and the relay address its DNS answer
    /// gives.
    pub names: Vec<(String, Ipv4Addr)>,
    /// One listener per distinct entry, in the order the child hands them
    /// over.
    pub relays: Vec<Relay>,
    /// IPv4 literals outside 127.0.0.0/8: made addresses of the
    /// namespace's `lo` so a connection to one stays inside, where Moat
    /// listens.
    pub aliases: Vec<Ipv4Addr>,
    /// Entries with no relay (an IPv6 literal other than `::1`, or
    /// `127.0.0.1:3128`, where the proxy is): reached through the proxy only.
    pub proxy_only: Vec<NetGrant>,
}

/// One relay: where Moat listens inside, and the entry it relays for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relay {
    pub inside: SocketAddr,
    /// The entry's host, normalized, and port.
    pub host: String,
    pub port: u16,
}

impl Layout {
    /// The layout for `grants`; `ipv6`: whether the namespace's `lo` has
    /// `::1` (the kernel has IPv6).
    pub fn of(grants: &[NetGrant], ipv6: bool) -> Self {
        let mut layout = Layout::default();
        let mut seen = HashSet::new();
        let entries: Vec<(String, u16)> = grants
            .iter()
            .map(|g| (normalize(unbracket(&g.host)), g.port))
            .filter(|entry| seen.insert(entry.clone()))
            .collect();
        // Addresses literals take are not given to names.
        let literals: HashSet<IpAddr> = entries
            .iter()
            .filter_map(|(host, _)| host.parse::<IpAddr>().ok())
            .map(|ip| ip.to_canonical())
            .collect();
        let mut next = u32::from(NAME_BASE);
        for (host, port) in entries {
            let grant = NetGrant {
                host: host.clone(),
                port,
            };
            let inside = match host.parse::<IpAddr>().map(|ip| ip.to_canonical()) {
                Ok(IpAddr::V4(v4)) => {
                    if !v4.is_loopback() && !layout.aliases.contains(&v4) {
                        layout.aliases.push(v4);
                    }
                    IpAddr::V4(v4)
                }
                Ok(IpAddr::V6(v6)) if v6 == Ipv6Addr::LOCALHOST && ipv6 => IpAddr::V6(v6),
                Ok(IpAddr::V6(_)) => {
                    layout.proxy_only.push(grant);
                    continue;
                }
                Err(_) if host == "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
                Err(_) => {
                    let address = match layout.names.iter().find(|(name, _)| *name == host) {
                        Some((_, address)) => *address,
                        None => {
                            while literals.contains(&IpAddr::V4(Ipv4Addr::from(next))) {
                                next += 1;
                            }
                            let address = Ipv4Addr::from(next);
                            next += 1;
                            layout.names.push((host.clone(), address));
                            address
                        }
                    };
                    IpAddr::V4(address)
                }
            };
            if inside == IpAddr::V4(Ipv4Addr::LOCALHOST) && port == PROXY_PORT {
                layout.proxy_only.push(grant);
                continue;
            }
            layout.relays.push(Relay {
                inside: SocketAddr::new(inside, port),
                host,
                port,
            });
        }
        layout
    }
}

/// The names (not IP literals, not `localhost`) the `net` entries list,
/// normalized and deduplicated.
pub fn listed_names(allowed: &[NetGrant]) -> Vec<String> {
    Layout::of(allowed, false)
        .names
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// Whether `ip` is an address of the public internet: not loopback,
/// private, link-local, shared (100.64.0.0/10), unique-local, unspecified,
/// multicast, broadcast or documentation.
pub fn public(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || first == 0x2001 && v6.segments()[1] == 0xdb8)
        }
    }
}

/// Where each entry's connections go: fixed when the server starts.
#[derive(Clone, Debug, Default)]
pub struct Pinned {
    targets: HashMap<(String, u16), Result<Vec<SocketAddr>, String>>,
}

impl Pinned {
    /// The launch-time addresses of the entry `host:port`, or why it has
    /// none; `None` when it is not an entry.
    pub fn targets(&self, host: &str, port: u16) -> Option<&Result<Vec<SocketAddr>, String>> {
        self.targets.get(&(normalize(unbracket(host)), port))
    }
}

/// Looks up each name `grants` lists, once, with `lookup` (each within
/// [`STEP_TIMEOUT`]), and fixes where each entry's connections go.
pub async fn pin(grants: &[NetGrant], lookup: &Lookup) -> Pinned {
    let literal: HashSet<SocketAddr> = grants
        .iter()
        .filter_map(|g| {
            let ip = unbracket(&g.host).parse::<IpAddr>().ok()?;
            Some(SocketAddr::new(ip.to_canonical(), g.port))
        })
        .collect();
    let mut looked_up: HashMap<String, Result<Vec<IpAddr>, String>> = HashMap::new();
    let mut pinned = Pinned::default();
    for grant in grants {
        let host = normalize(unbracket(&grant.host));
        let port = grant.port;
        if pinned.targets.contains_key(&(host.clone(), port)) {
            continue;
        }
        let targets = if let Ok(ip) = host.parse::<IpAddr>() {
            Ok(vec![SocketAddr::new(ip.to_canonical(), port)])
        } else if host == "localhost" {
            Ok(vec![
                SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port),
                SocketAddr::new(Ipv6Addr::LOCALHOST.into(), port),
            ])
        } else {
            if !looked_up.contains_key(&host) {
                let found = match tokio::time::timeout(STEP_TIMEOUT, (lookup.0)(host.clone())).await
                {
                    Ok(Ok(found)) => Ok(found),
                    Ok(Err(error)) => Err(format!("did not resolve at launch: {error}")),
                    Err(_) => Err(format!(
                        "did not resolve at launch within {} s",
                        STEP_TIMEOUT.as_secs()
                    )),
                };
                looked_up.insert(host.clone(), found);
            }
            match &looked_up[&host] {
                Err(reason) => Err(reason.clone()),
                Ok(found) if found.is_empty() => Err("resolved at launch to no address".to_owned()),
                Ok(found) => {
                    let (kept, dropped): (Vec<SocketAddr>, Vec<SocketAddr>) = found
                        .iter()
                        .map(|ip| SocketAddr::new(ip.to_canonical(), port))
                        .partition(|target| public(target.ip()) || literal.contains(target));
                    if kept.is_empty() {
                        let shown: Vec<String> =
                            dropped.iter().map(|t| t.ip().to_string()).collect();
                        Err(format!(
                            "resolved at launch to {} only, not a public address; a name's loopback, private and link-local addresses are reached only when granted by address too (add \"{}\" to `net`)",
                            shown.join(", "),
                            dropped[0]
                        ))
                    } else {
                        Ok(kept)
                    }
                }
            }
        };
        pinned.targets.insert((host, port), targets);
    }
    pinned
}

/// The sockets a child made inside its namespace and handed to Moat.
pub struct Sockets {
    /// The proxy's listener, 127.0.0.1:[`PROXY_PORT`].
    pub proxy: std::net::TcpListener,
    /// UDP 127.0.0.1:[`DNS_PORT`].
    pub dns: std::net::UdpSocket,
    /// One per [`Layout::relays`], in its order.
    pub relays: Vec<std::net::TcpListener>,
}

/// Tells the observer of refusals, each distinct one once, the first
/// [`MAX_RECORDED`] of them.
struct Recorder {
    server: String,
    observer: Option<Observer>,
    seen: Mutex<HashSet<String>>,
}

impl Recorder {
    fn refused(&self, destination: &str, reason: &str) {
        let destination = crate::text::printable(destination);
        tracing::info!(server = %self.server, %destination, %reason, "egress refused");
        let Some(observer) = &self.observer else {
            return;
        };
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let refusal = if seen.len() < MAX_RECORDED {
            if !seen.insert(format!("{destination} {reason}")) {
                return;
            }
            Refusal {
                server: self.server.clone(),
                destination,
                reason: reason.to_owned(),
            }
        } else if seen.insert(String::new()) {
            Refusal {
                server: self.server.clone(),
                destination: "*".to_owned(),
                reason: format!(
                    "more than {MAX_RECORDED} distinct refusals since this server started: the rest are not recorded"
                ),
            }
        } else {
            return;
        };
        drop(seen);
        (observer.0)(refusal);
    }
}

/// Serves the proxy, DNS and the relays on `sockets` (the server's side)
/// until the task is aborted, for `allowed` laid out as `layout`, with
/// `shares` bounding the connections open at once. Names are looked up
/// first, once.
pub fn serve(
    server: String,
    sockets: Sockets,
    layout: Layout,
    allowed: Vec<NetGrant>,
    shares: Shares,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    sockets.proxy.set_nonblocking(true)?;
    let listener = TcpListener::from_std(sockets.proxy)?;
    sockets.dns.set_nonblocking(true)?;
    let dns = tokio::net::UdpSocket::from_std(sockets.dns)?;
    let mut relays = Vec::with_capacity(sockets.relays.len());
    for (socket, relay) in sockets.relays.into_iter().zip(layout.relays) {
        socket.set_nonblocking(true)?;
        relays.push((TcpListener::from_std(socket)?, relay));
    }
    let names: HashMap<String, Ipv4Addr> = layout.names.into_iter().collect();
    let own = Pool::new(shares.per_server, "server");
    let recorder = Arc::new(Recorder {
        server: server.clone(),
        observer: shares.observer.clone(),
        seen: Mutex::default(),
    });
    Ok(tokio::spawn(async move {
        let lookup = shares.lookup.clone().unwrap_or_else(Lookup::system);
        let pinned = Arc::new(pin(&allowed, &lookup).await);
        for grant in &allowed {
            if let Some(Err(reason)) = pinned.targets(&grant.host, grant.port) {
                tracing::warn!(%server, destination = %grant, %reason, "a net entry has no address to reach");
            }
        }
        let allowed = Arc::new(allowed);
        let connections = Connections {
            server: server.clone(),
            shares,
            own,
            pinned,
            recorder: recorder.clone(),
        };
        let proxy = {
            let connections = connections.clone();
            async move {
                loop {
                    let client = accept(&listener, &connections.server).await;
                    let slot = match connections.slot() {
                        Ok(slot) => slot,
                        Err(reason) => {
                            tokio::spawn(async move {
                                let mut client = client;
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
                    let connections = connections.clone();
                    tokio::spawn(async move {
                        let _slot = slot;
                        if let Err(error) = proxy_one(client, &allowed, &connections).await {
                            tracing::debug!(server = %connections.server, %error, "egress connection ended");
                        }
                    });
                }
            }
        };
        let relayed = futures::future::join_all(relays.into_iter().map(|(listener, relay)| {
            let connections = connections.clone();
            async move {
                loop {
                    let client = accept(&listener, &connections.server).await;
                    let Ok(slot) = connections.slot() else {
                        continue;
                    };
                    let connections = connections.clone();
                    let relay = relay.clone();
                    tokio::spawn(async move {
                        let _slot = slot;
                        if let Err(error) = relay_one(client, &relay, &connections).await {
                            tracing::debug!(server = %connections.server, %error, "relayed connection ended");
                        }
                    });
                }
            }
        }));
        let answers = serve_dns(dns, names, recorder);
        tokio::join!(proxy, relayed, answers);
    }))
}

/// What every connection of one server shares.
#[derive(Clone)]
struct Connections {
    server: String,
    shares: Shares,
    own: Pool,
    pinned: Arc<Pinned>,
    recorder: Arc<Recorder>,
}

impl Connections {
    fn slot(&self) -> Result<Vec<OwnedSemaphorePermit>, String> {
        self.shares.take(&self.own).inspect_err(|reason| {
            tracing::debug!(server = %self.server, %reason, "egress connection refused");
        })
    }

    /// A connection to the first of `host:port`'s launch-time addresses
    /// that answers, each tried within [`STEP_TIMEOUT`]; `Err` says why
    /// not (recorded when the entry has no address).
    async fn connect(&self, host: &str, port: u16) -> Result<TcpStream, String> {
        let shown = format!("{}:{port}", crate::text::printable(host));
        let targets = match self.pinned.targets(host, port) {
            Some(Ok(targets)) => targets,
            Some(Err(reason)) => {
                self.recorder.refused(&shown, reason);
                return Err(format!("{shown} {reason}"));
            }
            None => return Err(format!("{shown} is not in this server's net grants")),
        };
        let mut last = String::from("no address");
        for target in targets {
            match tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(target)).await {
                Ok(Ok(stream)) => return Ok(stream),
                Ok(Err(error)) => last = format!("{target}: {error}"),
                Err(_) => last = format!("{target}: timed out"),
            }
        }
        Err(format!("connecting to {shown}: {last}"))
    }
}

/// The next connection on `listener`; on an error (out of descriptors,
/// most likely) it waits, never spins.
async fn accept(listener: &TcpListener, server: &str) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((client, _)) => return client,
            Err(error) => {
                tracing::warn!(%server, %error, "egress accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Relays one connection a client made to `relay`'s address inside.
async fn relay_one(
    mut client: TcpStream,
    relay: &Relay,
    connections: &Connections,
) -> std::io::Result<()> {
    let mut upstream = connections
        .connect(&relay.host, relay.port)
        .await
        .map_err(std::io::Error::other)?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// Answers DNS on `socket` for `names`, each with its relay address, and
/// refuses every other name (NXDOMAIN), recording it.
async fn serve_dns(
    socket: tokio::net::UdpSocket,
    names: HashMap<String, Ipv4Addr>,
    recorder: Arc<Recorder>,
) {
    let mut buffer = vec![0u8; 4096];
    loop {
        let (length, from) = match socket.recv_from(&mut buffer).await {
            Ok(received) => received,
            Err(error) => {
                tracing::debug!(server = %recorder.server, %error, "DNS receive failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Some((reply, refused)) = answer_dns(&buffer[..length], &names) {
            if let Some(name) = refused {
                recorder.refused(
                    &name,
                    "not in this server's net grants (DNS answered NXDOMAIN)",
                );
            }
            let _ = socket.send_to(&reply, from).await;
        }
    }
}

/// The reply to one DNS query: an A record with its relay address for a
/// listed name (no records for other types), NXDOMAIN for any other name
/// (with that name, to record, unless it is a reverse lookup), FORMERR for
/// a query that is not exactly one question. `None` for what is not a
/// query.
fn answer_dns(
    query: &[u8],
    names: &HashMap<String, Ipv4Addr>,
) -> Option<(Vec<u8>, Option<String>)> {
    use simple_dns::rdata::{A, RData};
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
        return Some((reply.build_bytes_vec().ok()?, None));
    };
    reply.questions.push(question.clone());
    let name = normalize(&question.qname.to_string());
    let mut refused = None;
    match names.get(&name) {
        None => {
            *reply.rcode_mut() = RCODE::NameError;
            if !name.ends_with(".arpa") {
                refused = Some(name);
            }
        }
        Some(address) => {
            if matches!(question.qtype, QTYPE::TYPE(TYPE::A) | QTYPE::ANY) {
                reply.answers.push(ResourceRecord::new(
                    question.qname.clone(),
                    CLASS::IN,
                    DNS_TTL,
                    RData::A(A::from(*address)),
                ));
            }
        }
    }
    Some((reply.build_bytes_vec().ok()?, refused))
}

/// A request the proxy understood.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    host: String,
    port: u16,
    /// `CONNECT`: a tunnel; else the head to send on, in origin form.
    tunnel: bool,
}

fn unbracket(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

fn normalize(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether `host:port` is a `net` entry.
fn allowed_by(allowed: &[NetGrant], host: &str, port: u16) -> bool {
    let host = normalize(unbracket(host));
    allowed
        .iter()
        .any(|g| g.port == port && normalize(unbracket(&g.host)) == host)
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

/// Serves one proxy request: a tunnel or a plain HTTP request to an
/// allowed destination, at its launch-time address.
async fn proxy_one(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_answers_listed_names_with_their_relay_address_and_nothing_else() {
        use simple_dns::{CLASS, Name, Packet, PacketFlag, QCLASS, QTYPE, Question, RCODE, TYPE};
        let names = HashMap::from([("api.example".to_owned(), Ipv4Addr::new(127, 100, 0, 1))]);
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
            let (answer, refused) = answer_dns(&bytes, &names).unwrap();
            let packet = Packet::parse(&answer).unwrap();
            let records: Vec<String> = packet
                .answers
                .iter()
                .map(|r| format!("{:?}", r.rdata))
                .collect();
            (packet.id(), packet.rcode(), records, refused)
        };
        let (id, rcode, records, refused) = reply(query("API.example.", TYPE::A));
        assert_eq!((id, rcode, refused), (42, RCODE::NoError, None));
        assert_eq!(records.len(), 1, "{records:?}");
        let address = u32::from(Ipv4Addr::new(127, 100, 0, 1));
        assert!(records[0].contains(&address.to_string()), "{records:?}");
        // No AAAA: clients use the relay's IPv4 address.
        let (_, rcode, records, _) = reply(query("api.example", TYPE::AAAA));
        assert_eq!((rcode, records.len()), (RCODE::NoError, 0));
        let (_, rcode, records, _) = reply(query("api.example", TYPE::TXT));
        assert_eq!((rcode, records.len()), (RCODE::NoError, 0));
        let (_, rcode, records, refused) = reply(query("exfil.attacker.example", TYPE::A));
        assert_eq!((rcode, records.len()), (RCODE::NameError, 0));
        assert_eq!(refused.as_deref(), Some("exfil.attacker.example"));
        let (_, rcode, _, refused) = reply(query("1.0.100.127.in-addr.arpa", TYPE::PTR));
        assert_eq!(
            (rcode, refused),
            (RCODE::NameError, None),
            "reverse lookups are not recorded"
        );
        let mut empty = Packet::new_query(7);
        empty.set_flags(PacketFlag::RECURSION_DESIRED);
        let (_, rcode, _, _) = reply(empty.build_bytes_vec().unwrap());
        assert_eq!(rcode, RCODE::FormatError);
        assert!(answer_dns(b"not dns", &names).is_none());
        let response = answer_dns(&query("api.example", TYPE::A), &names)
            .unwrap()
            .0;
        assert!(
            answer_dns(&response, &names).is_none(),
            "a reply is not answered"
        );
    }

    fn grant(host: &str, port: u16) -> NetGrant {
        NetGrant {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn each_entry_gets_a_listener_inside_names_an_address_of_their_own() {
        let grants = [
            grant("API.example.", 443),
            grant("api.example", 80),
            grant("db.internal", 5432),
            grant("127.100.0.2", 9000),
            grant("127.0.0.1", 8080),
            grant("10.1.2.3", 6379),
            grant("localhost", 7000),
            grant("::1", 7001),
            grant("2001:db8::5", 443),
            grant("127.0.0.1", PROXY_PORT),
            grant("api.example", 443),
        ];
        let layout = Layout::of(&grants, true);
        assert_eq!(
            layout.names,
            [
                ("api.example".to_owned(), Ipv4Addr::new(127, 100, 0, 1)),
                // 127.100.0.2 is a literal entry's: the next name skips it.
                ("db.internal".to_owned(), Ipv4Addr::new(127, 100, 0, 3)),
            ]
        );
        let inside: Vec<String> = layout.relays.iter().map(|r| r.inside.to_string()).collect();
        assert_eq!(
            inside,
            [
                "127.100.0.1:443",
                "127.100.0.1:80",
                "127.100.0.3:5432",
                "127.100.0.2:9000",
                "127.0.0.1:8080",
                "10.1.2.3:6379",
                "127.0.0.1:7000",
                "[::1]:7001",
            ]
        );
        assert_eq!(layout.aliases, [Ipv4Addr::new(10, 1, 2, 3)]);
        assert_eq!(
            layout.proxy_only,
            [grant("2001:db8::5", 443), grant("127.0.0.1", PROXY_PORT)]
        );
        let without_v6 = Layout::of(&[grant("::1", 7001)], false);
        assert!(without_v6.relays.is_empty());
        assert_eq!(without_v6.proxy_only, [grant("::1", 7001)]);
        assert_eq!(listed_names(&grants), ["api.example", "db.internal"]);
    }

    #[test]
    fn public_addresses_are_told_from_the_rest() {
        for ip in [
            "93.184.215.14",
            "2606:4700::6810:84e5",
            "::ffff:93.184.215.14",
        ] {
            assert!(public(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "127.0.0.1",
            "10.0.0.5",
            "172.16.3.4",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.2.7",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "2001:db8::1",
        ] {
            assert!(!public(ip.parse().unwrap()), "{ip}");
        }
    }

    #[tokio::test]
    async fn names_are_pinned_at_launch_and_non_public_answers_need_the_address_granted() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let asked = Arc::new(AtomicUsize::new(0));
        let counted = asked.clone();
        let lookup = Lookup::new(move |name: String| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                match name.as_str() {
                    "api.example" => Ok(vec![
                        "93.184.215.14".parse().unwrap(),
                        "10.0.0.9".parse().unwrap(),
                    ]),
                    "metadata.example" => Ok(vec!["169.254.169.254".parse().unwrap()]),
                    "db.test" => Ok(vec!["127.0.0.1".parse().unwrap()]),
                    "empty.example" => Ok(vec![]),
                    _ => Err(std::io::Error::other("no such name")),
                }
            }
        });
        let grants = [
            grant("api.example", 443),
            grant("api.example", 80),
            grant("metadata.example", 80),
            grant("db.test", 5432),
            grant("127.0.0.1", 5432),
            grant("empty.example", 443),
            grant("gone.example", 443),
            grant("localhost", 7000),
        ];
        let pinned = pin(&grants, &lookup).await;
        assert_eq!(
            asked.load(Ordering::SeqCst),
            5,
            "each name is looked up once"
        );
        let ok = |host: &str, port| pinned.targets(host, port).unwrap().clone().unwrap();
        let err = |host: &str, port| pinned.targets(host, port).unwrap().clone().unwrap_err();
        assert_eq!(
            ok("API.example.", 443),
            ["93.184.215.14:443".parse().unwrap()]
        );
        assert_eq!(ok("api.example", 80), ["93.184.215.14:80".parse().unwrap()]);
        assert_eq!(
            err("metadata.example", 80),
            "resolved at launch to 169.254.169.254 only, not a public address; a name's loopback, private and link-local addresses are reached only when granted by address too (add \"169.254.169.254:80\" to `net`)"
        );
        assert_eq!(ok("db.test", 5432), ["127.0.0.1:5432".parse().unwrap()]);
        assert_eq!(
            err("empty.example", 443),
            "resolved at launch to no address"
        );
        assert_eq!(
            err("gone.example", 443),
            "did not resolve at launch: no such name"
        );
        assert_eq!(
            ok("localhost", 7000),
            [
                "127.0.0.1:7000".parse().unwrap(),
                "[::1]:7000".parse().unwrap()
            ]
        );
        assert!(pinned.targets("api.example", 8443).is_none());
    }

    #[test]
    fn refusals_are_told_once_each_and_a_flood_is_cut_short() {
        let told = Arc::new(Mutex::new(Vec::new()));
        let sink = told.clone();
        let recorder = Recorder {
            server: "probe".into(),
            observer: Some(Observer::new(move |refusal| {
                sink.lock().unwrap().push(refusal)
            })),
            seen: Mutex::default(),
        };
        recorder.refused("evil.example", "not listed");
        recorder.refused("evil.example", "not listed");
        assert_eq!(
            *told.lock().unwrap(),
            [Refusal {
                server: "probe".into(),
                destination: "evil.example".into(),
                reason: "not listed".into()
            }]
        );
        for i in 0..200 {
            recorder.refused(&format!("n{i}.example"), "not listed");
        }
        let told = told.lock().unwrap();
        assert_eq!(told.len(), MAX_RECORDED + 1);
        assert_eq!(told[MAX_RECORDED].destination, "*");
        assert!(
            told[MAX_RECORDED]
                .reason
                .contains("the rest are not recorded")
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

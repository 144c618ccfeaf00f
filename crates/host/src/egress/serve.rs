//! The task that serves one server's egress: the sockets its child handed
//! over, the proxy's and the relays' accept loops, and the connections
//! they share (bounded, to launch-time addresses).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;

use super::dns::serve_dns;
use super::proxy::{proxy_one, refuse, skip_head};
use super::shares::Recorder;
use super::{Layout, Lookup, Pinned, Pool, Relay, STEP_TIMEOUT, Shares, pin};
use crate::grants::NetGrant;

/// The sockets a child made inside its namespace and handed to Moat.
pub struct Sockets {
    /// The proxy's listener, 127.0.0.1:[`PROXY_PORT`].
    pub proxy: std::net::TcpListener,
    /// UDP 127.0.0.1:[`DNS_PORT`].
    pub dns: std::net::UdpSocket,
    /// One per [`Layout::relays`], in its order.
    pub relays: Vec<std::net::TcpListener>,
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
pub(super) struct Connections {
    pub(super) server: String,
    shares: Shares,
    own: Pool,
    pinned: Arc<Pinned>,
    pub(super) recorder: Arc<Recorder>,
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
    pub(super) async fn connect(&self, host: &str, port: u16) -> Result<TcpStream, String> {
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
                Ok(Ok(stream)) => return Ok(no_delay(stream, &self.server)),
                Ok(Err(error)) => last = format!("{target}: {error}"),
                Err(_) => last = format!("{target}: timed out"),
            }
        }
        Err(format!("connecting to {shown}: {last}"))
    }
}

/// `stream` sending each write at once (`TCP_NODELAY`). A relay copies
/// what arrives as it arrives: with Nagle's algorithm on its ends, the
/// second piece of an answer (an HTTP body after its headers) waited for
/// the first to be acknowledged, which the far side may delay by 40 ms.
/// With it off, each end's own choice of when to send is kept.
fn no_delay(stream: TcpStream, server: &str) -> TcpStream {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%server, %error, "setting TCP_NODELAY on an egress connection");
    }
    stream
}

/// The next connection on `listener`, sending each write at once; on an
/// error (out of descriptors, most likely) it waits, never spins.
async fn accept(listener: &TcpListener, server: &str) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((client, _)) => return no_delay(client, server),
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

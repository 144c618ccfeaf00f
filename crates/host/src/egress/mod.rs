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
//!
//! Here: the shared bounds, lookup and observer ([`shares`]), where each
//! entry is reached and where it leads ([`layout`]), the task that serves a
//! server's sockets and its relays ([`serve`]), the DNS answers ([`dns`])
//! and the proxy ([`proxy`]).

use std::net::Ipv4Addr;
use std::time::Duration;

mod dns;
mod layout;
mod proxy;
mod serve;
mod shares;
#[cfg(test)]
mod tests;

pub use layout::{Layout, Pinned, Relay, listed_names, pin, public};
pub use proxy::proxy_environment;
pub use serve::{Sockets, serve};
pub use shares::{Lookup, Observer, Pool, Refusal, Shares};

/// The proxy's port inside every server's namespace (nothing else listens
/// there).
pub const PROXY_PORT: u16 = 3128;
/// The DNS port inside every server's namespace, on 127.0.0.1.
pub const DNS_PORT: u16 = 53;
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

/// How long a client may take to send its request head, and Moat to
/// resolve and connect.
pub(super) const STEP_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) fn unbracket(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

pub(super) fn normalize(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

//! Where each `net` entry is reached inside a server's namespace
//! ([`Layout`]) and where its connections go, fixed at launch ([`pin`]).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{Lookup, NAME_BASE, PROXY_PORT, STEP_TIMEOUT, normalize, unbracket};
use crate::grants::NetGrant;

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

//! `net` grants: TCP `host:port` destinations, and for a wasm server's
//! wasi:http the `http(s)://host[:port]` origins. Names are resolved at
//! launch by the launchers; here is what an entry is and how it reads.

/// One `net` entry: `host:port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetGrant {
    /// An IP literal or a name (resolved at launch).
    pub host: String,
    pub port: u16,
}

/// One HTTP origin a wasm server may reach through wasi:http: exactly this
/// scheme, host and port (the default port of the scheme when none is
/// written). Paths are not part of a grant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HttpGrant {
    /// `http` or `https`.
    pub scheme: String,
    /// An IP literal or a name (resolved at launch), lower-cased.
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for HttpGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        write!(f, "{}://{host}:{}", self.scheme, self.port)
    }
}

impl HttpGrant {
    /// Parses `http://host[:port]` or `https://host[:port]` (nothing after
    /// the authority but an optional `/`); `None` when `s` names no scheme
    /// (a TCP `host:port` entry).
    pub fn parse(s: &str) -> Option<Result<Self, String>> {
        if !(s.starts_with("http://") || s.starts_with("https://")) {
            return None;
        }
        Some((|| {
            let url = url::Url::parse(s).map_err(|e| format!("{s:?}: {e}"))?;
            if !(url.path() == "/" || url.path().is_empty())
                || url.query().is_some()
                || url.fragment().is_some()
                || !url.username().is_empty()
                || url.password().is_some()
            {
                return Err(format!(
                    "{s:?}: an HTTP grant is a scheme, a host and a port only (no path, query or user)"
                ));
            }
            let host = match url.host() {
                Some(url::Host::Domain(d)) => d.to_owned(),
                Some(url::Host::Ipv4(ip)) => ip.to_string(),
                Some(url::Host::Ipv6(ip)) => ip.to_string(),
                None => return Err(format!("{s:?} has no host")),
            };
            Ok(Self {
                scheme: url.scheme().to_owned(),
                host,
                port: url.port_or_known_default().unwrap_or(80),
            })
        })())
    }
}

/// `net` entries as one comma-separated line, for evidence.
pub fn net_line(net: &[NetGrant]) -> String {
    net.iter()
        .map(|g| g.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl std::fmt::Display for NetGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl std::str::FromStr for NetGrant {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("{s:?} is not host:port"))?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() {
            return Err(format!("{s:?} has no host"));
        }
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{s:?}: the port must be 1-65535"))?;
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }
}

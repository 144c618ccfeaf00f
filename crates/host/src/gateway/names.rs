//! Exposed names: `server__tool`, what a name may be, and which names
//! of a lock cannot be served (left out, never the whole gateway).

use super::GatewayError;
use crate::config::SEPARATOR;

/// Whether `name` is a valid exposed tool name: `^[a-zA-Z0-9_-]{1,64}$`.
pub fn valid_exposed_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The exposed names of one server's tools or prompts that cannot be
/// served: each invalid one, and each one listed twice (the first is
/// served). (Different servers cannot collide: a server name has no `__`.)
pub(super) fn unexposable<'a>(
    server: &str,
    what: &'static str,
    names: impl IntoIterator<Item = &'a str>,
) -> Vec<GatewayError> {
    let mut seen = std::collections::BTreeSet::new();
    let mut problems = Vec::new();
    for name in names {
        let exposed = format!("{server}{SEPARATOR}{name}");
        if !valid_exposed_name(&exposed) {
            problems.push(GatewayError::InvalidName {
                server: server.to_owned(),
                what,
                tool: name.to_owned(),
                exposed,
            });
        } else if !seen.insert(name) {
            problems.push(GatewayError::DuplicateName {
                server: server.to_owned(),
                what,
                name: name.to_owned(),
                exposed,
            });
        }
    }
    problems
}

/// Every pinned tool and prompt of `lock` whose exposed name cannot be
/// served, for a warning before serving: the listings leave each out and
/// the rest is served. (Without a lock, names are only known once their
/// servers run; the same rule applies then.)
pub fn check_lock_names(lock: &crate::lock::Lock) -> Vec<GatewayError> {
    lock.servers
        .iter()
        .flat_map(|(server, locked)| {
            unexposable(server, "tool", locked.tools.iter().map(|t| t.name.as_str()))
                .into_iter()
                .chain(unexposable(
                    server,
                    "prompt",
                    locked.prompts.iter().map(|p| p.name.as_str()),
                ))
        })
        .collect()
}

/// 128 random bits, in hex: a name nobody else can guess.
pub(super) fn unguessable() -> String {
    let mut nonce = [0u8; 16];
    if let Err(error) = getrandom::fill(&mut nonce) {
        // Never seen on Linux (getrandom(2) blocks until seeded); the name
        // then stays unique, though no longer secret.
        tracing::warn!(%error, "no randomness for a capability: using the clock");
        nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            .to_le_bytes();
    }
    nonce.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{LOCK_VERSION, Lock, LockedServer, LockedTool};

    #[test]
    fn exposed_names_are_checked_at_start_from_the_lock() {
        let tool = |name: &str| LockedTool {
            name: name.into(),
            sha256: String::new(),
            definition: String::new(),
            flags: vec![],
        };
        let server = |tools: Vec<LockedTool>| LockedServer {
            kind: "wasm".into(),
            evidence: "wasm-measured".into(),
            sha256: String::new(),
            identity: String::new(),
            measured: Default::default(),
            grants: Default::default(),
            tools,
            prompts: Default::default(),
            resources: Default::default(),
            package: None,
            oci: None,
        };
        let mut lock = Lock {
            version: LOCK_VERSION,
            revoked: Vec::new(),
            servers: Default::default(),
        };
        lock.servers.insert(
            "files".into(),
            server(vec![tool("read"), tool("write-all")]),
        );
        assert!(check_lock_names(&lock).is_empty());
        lock.servers
            .insert("web".into(), server(vec![tool("fetch url")]));
        match &check_lock_names(&lock)[..] {
            [
                GatewayError::InvalidName {
                    server,
                    tool,
                    exposed,
                    ..
                },
            ] => {
                assert_eq!((server.as_str(), tool.as_str()), ("web", "fetch url"));
                assert_eq!(exposed, "web__fetch url");
            }
            other => panic!("{other:?}"),
        }
        assert!(valid_exposed_name(&"a".repeat(64)));
        assert!(!valid_exposed_name(&"a".repeat(65)));
        lock.servers.remove("web");
        lock.servers.insert(
            "twice".into(),
            server(vec![tool("get"), tool("get"), tool("put")]),
        );
        match &check_lock_names(&lock)[..] {
            [error @ GatewayError::DuplicateName { .. }] => assert_eq!(
                error.to_string(),
                "server `twice` lists two tools named `get`: the exposed name `twice__get` would be ambiguous, so only the first is served"
            ),
            other => panic!("{other:?}"),
        }
        lock.servers.remove("twice");
        let mut prompted = server(vec![tool("get")]);
        prompted.prompts = vec![tool("hello world")];
        lock.servers.insert("greeter".into(), prompted);
        match &check_lock_names(&lock)[..] {
            [GatewayError::InvalidName { what, exposed, .. }] => {
                assert_eq!(
                    (*what, exposed.as_str()),
                    ("prompt", "greeter__hello world")
                )
            }
            other => panic!("{other:?}"),
        }
    }
}

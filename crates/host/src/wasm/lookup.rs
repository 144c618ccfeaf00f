//! Name lookup for wasm guests (`wasi:sockets/ip-name-lookup`), answered
//! from memory: only the names a server's `net` entries list, resolved once
//! when the instance is launched. wasmtime-wasi's own implementation resolves
//! any name, on tokio's blocking pool, at the guest's request. That makes DNS
//! an exfiltration channel for any guest with a `net` grant, and lets a guest
//! fill the pool that the gateway's own stdio and file I/O wait on. Here a
//! lookup never leaves the process: a listed name gets its launch-time
//! addresses, an IP literal is itself, anything else is `access-denied`.
//!
//! The interface is shadowed in the linker after wasmtime-wasi's: its
//! `resolve-address-stream` becomes [`Lookup`], a finished list.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

use wasmtime::component::{Linker, Resource, ResourceType};
use wasmtime_wasi::p2::bindings::sockets::network::{ErrorCode, IpAddress};
use wasmtime_wasi::p2::{DynPollable, Network, Pollable};

use crate::wasm::HostState;

/// The interface this module answers, at the version wasmtime-wasi 48
/// defines (older 0.2 imports are matched to it by the linker).
const INTERFACE: &str = "wasi:sockets/ip-name-lookup@0.2.12";

/// The names one instance may look up, with their launch-time addresses.
#[derive(Clone, Debug, Default)]
pub struct Names(Arc<HashMap<String, Vec<IpAddr>>>);

impl Names {
    /// From `(name, addresses)` pairs, as resolved at launch.
    pub fn new(pairs: impl IntoIterator<Item = (String, Vec<IpAddr>)>) -> Self {
        let mut map: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (name, addresses) in pairs {
            let entry = map.entry(normalize(&name)).or_default();
            for address in addresses {
                if !entry.contains(&address) {
                    entry.push(address);
                }
            }
        }
        Self(Arc::new(map))
    }

    /// What the guest gets for `name`.
    pub fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, ErrorCode> {
        let literal = name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(name);
        if let Ok(address) = literal.parse::<IpAddr>() {
            return Ok(vec![address]);
        }
        match self.0.get(&normalize(name)) {
            Some(addresses) => Ok(addresses.clone()),
            None => {
                tracing::debug!(name = %crate::text::printable(name), "name lookup denied: not listed in net");
                Err(ErrorCode::AccessDenied)
            }
        }
    }
}

/// DNS names compare without case and without a final dot.
fn normalize(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// A finished lookup: the addresses not yet taken by the guest.
pub struct Lookup(std::vec::IntoIter<IpAddr>);

impl Pollable for Lookup {
    // The trait is declared with `async_trait`; this is its expanded form.
    // A finished lookup is always ready.
    fn ready<'life0, 'async_trait>(
        &'life0 mut self,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(std::future::ready(()))
    }
}

/// Shadows wasmtime-wasi's `ip-name-lookup` in `linker` with [`Names`].
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut instance = linker.instance(INTERFACE)?;
    instance.resource(
        "resolve-address-stream",
        ResourceType::host::<Lookup>(),
        |mut store, rep| {
            store
                .data_mut()
                .table()
                .delete(Resource::<Lookup>::new_own(rep))?;
            Ok(())
        },
    )?;
    instance.func_wrap(
        "resolve-addresses",
        |mut store, (network, name): (Resource<Network>, String)| {
            let state = store.data_mut();
            // The network resource is the capability to look up at all.
            state.table().get(&network)?;
            let result = match state.names().resolve(&name) {
                Ok(addresses) => Ok(state.table().push(Lookup(addresses.into_iter()))?),
                Err(code) => Err(code),
            };
            Ok((result,))
        },
    )?;
    instance.func_wrap(
        "[method]resolve-address-stream.resolve-next-address",
        |mut store, (lookup,): (Resource<Lookup>,)| {
            let next = store.data_mut().table().get_mut(&lookup)?.0.next();
            Ok((Ok::<Option<IpAddress>, ErrorCode>(next.map(Into::into)),))
        },
    )?;
    instance.func_wrap(
        "[method]resolve-address-stream.subscribe",
        |mut store, (lookup,): (Resource<Lookup>,)| {
            let pollable: Resource<DynPollable> =
                wasmtime_wasi::p2::subscribe(store.data_mut().table(), lookup)?;
            Ok((pollable,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_names_and_literals_resolve() {
        let names = Names::new([(
            "API.example.com".to_owned(),
            vec!["192.0.2.1".parse().unwrap()],
        )]);
        assert_eq!(
            names.resolve("api.example.com.").unwrap(),
            ["192.0.2.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            names.resolve("[::1]").unwrap(),
            ["::1".parse::<IpAddr>().unwrap()]
        );
        assert!(matches!(
            names.resolve("secret.attacker.example"),
            Err(ErrorCode::AccessDenied)
        ));
    }
}

//! The linkers components are instantiated with, and which one each gets:
//! of wasmtime-wasi's WASI 0.2 interfaces, only those the component
//! imports, then Moat's name lookup over wasmtime-wasi's when it imports
//! that, and wasi:http when it imports that.
//!
//! wasmtime-wasi's `add_to_linker_async` defines every WASI 0.2 function by
//! name, about 200 of them, and that was 7% of a `moat serve` start in
//! front of one component (608 K of 8.2 M instructions); a server built
//! with Rust's standard library imports cli, clocks, io and random, a
//! third of them. Each interface here is defined by the call
//! `add_to_linker_async` makes for it, so an import resolves to the same
//! host function either way. A component that imports anything else (not
//! WASI, another version, an interface not in [`INTERFACES`]) gets the
//! whole linker, which links or refuses it as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use wasmtime::component::{Component, HasData, Linker, ResourceTable};
use wasmtime_wasi::cli::{WasiCli, WasiCliView as _};
use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView as _};
use wasmtime_wasi::filesystem::{WasiFilesystem, WasiFilesystemView as _};
use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, random, sockets};
use wasmtime_wasi::random::{WasiRandom, WasiRandomView as _};
use wasmtime_wasi::sockets::{WasiSockets, WasiSocketsView as _};
use wasmtime_wasi::{WasiView, p2::bindings::io};

use super::HostState;

/// Defines one interface in a linker.
type Define = fn(&mut Linker<HostState>) -> wasmtime::Result<()>;

/// The resource table, for wasi:io (as wasmtime-wasi's own `HasIo`).
struct HasIo;

impl HasData for HasIo {
    type Data<'a> = &'a mut ResourceTable;
}

/// The name lookup Moat answers itself (see `lookup`).
const NAME_LOOKUP: &str = "wasi:sockets/ip-name-lookup";

/// Every interface `wasmtime_wasi::p2::add_to_linker_async` defines, in its
/// order, each with the call it makes for it: wasmtime-wasi 48.0.8's, which
/// the workspace pins. When that pin moves, compare this table with
/// `add_to_linker_with_options_async` again (an interface it gains only
/// sends its importers to the whole linker; a call it changes would not
/// show here).
const INTERFACES: [(&str, Define); 27] = [
    ("wasi:io/error", |l| {
        io::error::add_to_linker::<HostState, HasIo>(l, |t| t.ctx().table)
    }),
    ("wasi:io/poll", |l| {
        io::poll::add_to_linker::<HostState, HasIo>(l, |t| t.ctx().table)
    }),
    ("wasi:io/streams", |l| {
        io::streams::add_to_linker::<HostState, HasIo>(l, |t| t.ctx().table)
    }),
    ("wasi:clocks/wall-clock", |l| {
        clocks::wall_clock::add_to_linker::<HostState, WasiClocks>(l, HostState::clocks)
    }),
    ("wasi:clocks/monotonic-clock", |l| {
        clocks::monotonic_clock::add_to_linker::<HostState, WasiClocks>(l, HostState::clocks)
    }),
    ("wasi:filesystem/preopens", |l| {
        filesystem::preopens::add_to_linker::<HostState, WasiFilesystem>(l, HostState::filesystem)
    }),
    ("wasi:random/random", |l| {
        random::random::add_to_linker::<HostState, WasiRandom>(l, HostState::random)
    }),
    ("wasi:random/insecure", |l| {
        random::insecure::add_to_linker::<HostState, WasiRandom>(l, HostState::random)
    }),
    ("wasi:random/insecure-seed", |l| {
        random::insecure_seed::add_to_linker::<HostState, WasiRandom>(l, HostState::random)
    }),
    ("wasi:cli/exit", |l| {
        cli::exit::add_to_linker::<HostState, WasiCli>(l, HostState::cli)
    }),
    ("wasi:cli/environment", |l| {
        cli::environment::add_to_linker::<HostState, WasiCli>(l, HostState::cli)
    }),
    ("wasi:cli/stdin", |l| {
        cli::stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)
    }),
    ("wasi:cli/stdout", |l| {
        cli::stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)
    }),
    ("wasi:cli/stderr", |l| {
        cli::stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)
    }),
    ("wasi:cli/terminal-input", |l| {
        cli::terminal_input::add_to_linker::<HostState, WasiCli>(l, HostState::cli)
    }),
    ("wasi:cli/terminal-output", |l| {
        cli::terminal_output::add_to_linker::<HostState, WasiCli>(l, HostState::cli)
    }),
    ("wasi:cli/terminal-stdin", |l| {
        cli::terminal_stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)
    }),
    ("wasi:cli/terminal-stdout", |l| {
        cli::terminal_stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)
    }),
    ("wasi:cli/terminal-stderr", |l| {
        cli::terminal_stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)
    }),
    ("wasi:sockets/tcp-create-socket", |l| {
        sockets::tcp_create_socket::add_to_linker::<HostState, WasiSockets>(l, HostState::sockets)
    }),
    ("wasi:sockets/instance-network", |l| {
        sockets::instance_network::add_to_linker::<HostState, WasiSockets>(l, HostState::sockets)
    }),
    ("wasi:sockets/network", |l| {
        sockets::network::add_to_linker::<HostState, WasiSockets>(
            l,
            &sockets::network::LinkOptions::default(),
            HostState::sockets,
        )
    }),
    (NAME_LOOKUP, |l| {
        sockets::ip_name_lookup::add_to_linker::<HostState, WasiSockets>(l, HostState::sockets)
    }),
    ("wasi:filesystem/types", |l| {
        filesystem::types::add_to_linker::<HostState, WasiFilesystem>(l, HostState::filesystem)
    }),
    ("wasi:sockets/tcp", |l| {
        sockets::tcp::add_to_linker::<HostState, WasiSockets>(l, HostState::sockets)
    }),
    ("wasi:sockets/udp", |l| {
        sockets::udp::add_to_linker::<HostState, WasiSockets>(l, HostState::sockets)
    }),
    ("wasi:sockets/udp-create-socket", |l| {
        sockets::udp_create_socket::add_to_linker::<HostState, WasiSockets>(l, HostState::sockets)
    }),
];

// A bit per interface in `Imports::wasi`.
const _: () = assert!(INTERFACES.len() <= u32::BITS as usize);

/// What a component imports, as a linker is made for it: a bit per
/// interface of [`INTERFACES`], and whether it imports wasi:http.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Imports {
    wasi: u32,
    http: bool,
}

impl Imports {
    /// The imports named, or `None` when one is neither a WASI 0.2
    /// interface of [`INTERFACES`] nor wasi:http 0.2.
    pub(super) fn of<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<Self> {
        let mut imports = Self {
            wasi: 0,
            http: false,
        };
        for name in names {
            let (interface, version) = name.split_once('@')?;
            if !version.starts_with("0.2.") {
                return None;
            }
            if interface.starts_with("wasi:http/") {
                imports.http = true;
                continue;
            }
            let at = INTERFACES.iter().position(|(i, _)| *i == interface)?;
            imports.wasi |= 1 << at;
        }
        Some(imports)
    }

    /// A linker defining these WASI interfaces (Moat's name lookup over
    /// wasmtime-wasi's) and, when imported, wasi:http.
    fn linker(&self, engine: &wasmtime::Engine) -> wasmtime::Result<Linker<HostState>> {
        let mut linker = Linker::new(engine);
        for (at, (_, define)) in INTERFACES.iter().enumerate() {
            if self.wasi & (1 << at) != 0 {
                define(&mut linker)?;
            }
        }
        let lookup = INTERFACES
            .iter()
            .position(|(i, _)| *i == NAME_LOOKUP)
            .is_some_and(|at| self.wasi & (1 << at) != 0);
        if lookup {
            super::lookup::add_to_linker(&mut linker)?;
        }
        if self.http {
            wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        }
        Ok(linker)
    }
}

/// The linkers components are instantiated with, each made at its first
/// use: one per set of imports this module knows (a process serving
/// several components with the same imports makes one), and the whole one,
/// with and without wasi:http, for every other component and for
/// initialisers.
#[derive(Clone, Default)]
pub(super) struct Linkers(Arc<Made>);

#[derive(Default)]
struct Made {
    by_imports: Mutex<HashMap<Imports, Arc<Linker<HostState>>>>,
    whole: OnceLock<Result<Arc<Linker<HostState>>, String>>,
    whole_http: OnceLock<Result<Arc<Linker<HostState>>, String>>,
}

impl Linkers {
    /// The linker for `component`: what it imports, with wasi:http when it
    /// imports any of it (every request is then refused unless granted,
    /// see `http`); the whole one when it imports anything this module
    /// does not know.
    pub(super) fn for_component(
        &self,
        engine: &wasmtime::Engine,
        component: &Component,
    ) -> Result<Arc<Linker<HostState>>, String> {
        let ty = component.component_type();
        let names = || ty.imports(engine).map(|(name, _)| name);
        match Imports::of(names()) {
            Some(imports) => self.get(engine, imports),
            None if names().any(|name| name.starts_with("wasi:http/")) => self.whole_http(engine),
            None => self.whole(engine),
        }
    }

    /// The linker an initialiser's instance is made with, for the
    /// component `bytes`: the whole one, with wasi:http when it imports it.
    pub(super) fn for_initialiser(
        &self,
        engine: &wasmtime::Engine,
        bytes: &[u8],
    ) -> Result<Arc<Linker<HostState>>, String> {
        if super::preinit::bytes_import_http(bytes) {
            self.whole_http(engine)
        } else {
            self.whole(engine)
        }
    }

    /// The linker for `imports`.
    fn get(
        &self,
        engine: &wasmtime::Engine,
        imports: Imports,
    ) -> Result<Arc<Linker<HostState>>, String> {
        let mut made = self.0.by_imports.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(linker) = made.get(&imports) {
            return Ok(linker.clone());
        }
        let linker = Arc::new(
            imports
                .linker(engine)
                .map_err(|e| format!("defining the component's imports: {e:#}"))?,
        );
        made.insert(imports, linker.clone());
        Ok(linker)
    }

    /// Every WASI interface, then Moat's name lookup over wasmtime-wasi's.
    fn whole(&self, engine: &wasmtime::Engine) -> Result<Arc<Linker<HostState>>, String> {
        self.0
            .whole
            .get_or_init(|| {
                whole(engine)
                    .map(Arc::new)
                    .map_err(|e| format!("defining WASI in the linker: {e:#}"))
            })
            .clone()
    }

    /// The whole linker with wasi:http added.
    fn whole_http(&self, engine: &wasmtime::Engine) -> Result<Arc<Linker<HostState>>, String> {
        self.0
            .whole_http
            .get_or_init(|| {
                let mut linker = (*self.whole(engine)?).clone();
                wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
                    .map(|()| Arc::new(linker))
                    .map_err(|e| format!("adding wasi:http to the linker: {e:#}"))
            })
            .clone()
    }
}

/// The whole linker: every WASI 0.2 interface, then Moat's name lookup
/// over wasmtime-wasi's.
pub(super) fn whole(engine: &wasmtime::Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    super::lookup::add_to_linker(&mut linker)?;
    Ok(linker)
}

#[cfg(test)]
mod tests {
    use super::*;
    use moat_test_guests as guests;
    use wasmtime::component::Component;

    fn imports(engine: &wasmtime::Engine, component: &Component) -> Option<Imports> {
        let ty = component.component_type();
        Imports::of(ty.imports(engine).map(|(name, _)| name))
    }

    /// A component's linker defines what it imports and nothing more: the
    /// one made for a guest of stdio alone instantiates it and refuses a
    /// guest that opens files, which the whole linker instantiates. A
    /// guest importing sockets and the name lookup gets them (Moat's lookup
    /// over wasmtime-wasi's; `hostile` tests what it answers).
    #[test]
    fn a_components_linker_defines_what_it_imports_and_nothing_more() {
        let engine =
            wasmtime::Engine::new(wasmtime::Config::new().wasm_component_model(true)).unwrap();
        let load = |path: &str| Component::from_file(&engine, path).unwrap();
        let (mute, files, probe) = (
            load(guests::MUTE_WASM),
            load(guests::OPEN_FILES_WASM),
            load(guests::PROBE_WASM),
        );
        let mute_imports = imports(&engine, &mute).expect("WASI 0.2 only");
        let files_imports = imports(&engine, &files).expect("WASI 0.2 only");
        assert_ne!(mute_imports, files_imports);
        let linkers = Linkers::default();
        let stdio_only = linkers.get(&engine, mute_imports).unwrap();
        stdio_only.instantiate_pre(&mute).unwrap();
        let refused = stdio_only.instantiate_pre(&files).err().unwrap();
        assert!(
            format!("{refused:#}").contains("wasi:filesystem/"),
            "{refused:#}"
        );
        let whole = whole(&engine).unwrap();
        whole.instantiate_pre(&files).unwrap();
        linkers
            .get(&engine, files_imports)
            .unwrap()
            .instantiate_pre(&files)
            .unwrap();
        let probe_imports = imports(&engine, &probe).expect("WASI 0.2 only");
        linkers
            .get(&engine, probe_imports)
            .unwrap()
            .instantiate_pre(&probe)
            .unwrap();
        // Made once per set of imports.
        assert!(Arc::ptr_eq(
            &stdio_only,
            &linkers.get(&engine, mute_imports).unwrap()
        ));
    }

    /// Every interface of the table at once defines without a clash; an
    /// import of anything else (another version, not WASI, no version)
    /// is left to the whole linker.
    #[test]
    fn imports_the_table_does_not_know_take_the_whole_linker() {
        let names: Vec<String> = INTERFACES
            .iter()
            .map(|(name, _)| format!("{name}@0.2.0"))
            .collect();
        let all = Imports::of(names.iter().map(String::as_str)).unwrap();
        assert_eq!(all.wasi.count_ones() as usize, INTERFACES.len());
        all.linker(&wasmtime::Engine::default()).unwrap();
        for unknown in [
            "wasi:cli/stdout@0.3.0",
            "local:x/y@0.2.0",
            "wasi:cli/stdout",
        ] {
            assert_eq!(Imports::of([unknown]), None, "{unknown}");
        }
        let http = Imports::of(["wasi:http/types@0.2.4", "wasi:io/poll@0.2.4"]).unwrap();
        assert!(http.http && http.wasi.count_ones() == 1);
    }
}

//! Paths to the guests in `guests/`, built from source for wasm32-wasip2 and
//! natively by this crate's build script. `<NAME>` (a [`Guest`]), `<NAME>_WASM`
//! and `<NAME>_NATIVE` exist for every guest binary (dashes become
//! underscores), and `<NAME>_WASM` alone for every library component (a
//! typed tool component, wasm only). The build fails when a guest has no test that names it.

/// One guest: its name and the paths of its two builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guest {
    /// The binary's name.
    pub name: &'static str,
    /// The wasm32-wasip2 component.
    pub wasm: &'static str,
    /// The native executable.
    pub native: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/guests.rs"));

//! Paths to the guests in `guests/`, built from source for wasm32-wasip2 and
//! natively by this crate's build script. `<NAME>_WASM` and `<NAME>_NATIVE`
//! exist for every guest binary (dashes become underscores).

include!(concat!(env!("OUT_DIR"), "/guests.rs"));

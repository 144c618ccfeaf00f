//! How the `moat` binary is linked.
//!
//! On Linux with glibc, its relative relocations are packed (`DT_RELR`,
//! `-z pack-relative-relocs`: GNU ld 2.38 or lld 15, and glibc 2.36 to
//! load): a position-independent executable of Moat's size carries
//! hundreds of thousands of them, and in the usual `RELA` form their table
//! alone is megabytes that the loader reads at every start. Packed, the
//! table is a small bitmap: the executable keeps its address
//! randomisation, and each `moat` process starts sooner and maps less
//! (README "Performance"). Only the binary is linked so; the tests and
//! dependencies are untouched.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

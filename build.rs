//! How the `moat` binary is linked.
//!
//! On Linux with glibc, its relative relocations are packed (`DT_RELR`,
//! `-z pack-relative-relocs`: GNU ld 2.38 or lld 15, and glibc 2.36 to
//! load): a position-independent executable of Moat's size carries
//! hundreds of thousands of them, and in the usual `RELA` form their table
//! alone is megabytes that the loader reads at every start. Packed, the
//! table is a small bitmap: the executable keeps its address
//! randomisation, and each `moat` process starts sooner and maps less
//! (README "Performance").
//!
//! In an optimised build on x86_64 Linux (where Rust links with its own
//! lld), the functions that `moat serve` runs are laid out together, in the
//! order `link/moat.order` lists them (lld's `--symbol-ordering-file`). The
//! kernel maps a file's code 64 KiB around each page that faults in, so
//! hot code scattered over 35 MB of text made most of it resident; laid
//! out together it is a few megabytes. The order file is written by
//! `link/order.sh` from a profile of the release build; a name it lists
//! that the build does not define (the code changed since, or another
//! profile's build) is skipped, and costs only its locality.
//! `MOAT_LINK_ORDER=0` links without it.
//!
//! Only the binary is linked so; the tests and dependencies are untouched.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=link/moat.order");
    println!("cargo:rerun-if-env-changed=MOAT_LINK_ORDER");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    // lld, the linker Rust uses on this target unless told otherwise
    // (another linker does not know the option): not when a linker is
    // configured (`target.<triple>.linker`, which Cargo passes here as
    // RUSTC_LINKER) or picked by RUSTFLAGS.
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let flags = var("CARGO_ENCODED_RUSTFLAGS");
    let own_lld = var("TARGET") == "x86_64-unknown-linux-gnu"
        && var("RUSTC_LINKER").is_empty()
        && !["linker=", "linker-features=-lld", "fuse-ld"]
            .iter()
            .any(|flag| flags.contains(flag));
    let order = std::path::Path::new(&var("CARGO_MANIFEST_DIR")).join("link/moat.order");
    if own_lld && var("PROFILE") == "release" && var("MOAT_LINK_ORDER") != "0" && order.exists() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}

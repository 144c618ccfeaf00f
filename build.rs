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
//! In a build of the `release` profile or one that inherits it (`bench`,
//! `dist`) on x86_64 Linux, linked by the lld that ships with Rust (see
//! `links_with_own_lld`), the functions that `moat serve` runs are laid
//! out together, in the order `link/moat.order` lists them (lld's
//! `--symbol-ordering-file`). The
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
    println!("cargo:rerun-if-env-changed=MOAT_LINK_ORDER");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    let order = std::path::Path::new(&var("CARGO_MANIFEST_DIR")).join("link/moat.order");
    // A missing file would count as changed at every build.
    if order.exists() {
        println!("cargo:rerun-if-changed=link/moat.order");
    } else {
        println!("cargo:rerun-if-changed=link");
    }
    if var("PROFILE") == "release"
        && var("MOAT_LINK_ORDER") != "0"
        && order.exists()
        && links_with_own_lld(&var)
    {
        // Through -Xlinker, one argument each: `-Wl,` would split a path
        // with a comma in it.
        for arg in [
            "-Xlinker".to_owned(),
            format!("--symbol-ordering-file={}", order.display()),
            "-Xlinker".to_owned(),
            "--no-warn-symbol-ordering".to_owned(),
        ] {
            println!("cargo:rustc-link-arg-bins={arg}");
        }
    }
}

/// Whether the binary is linked by the lld that ships with the Rust
/// toolchain, the one linker here that knows `--symbol-ordering-file`:
/// rust-lang's x86_64 Linux toolchains (1.90 on) link with it unless told
/// otherwise, and carry it as `gcc-ld/ld.lld` in the sysroot. A toolchain
/// built without it (a distribution's rustc, say) links with the system's
/// linker, as does a build that configures a linker
/// (`target.<triple>.linker`, which Cargo hands the script as
/// RUSTC_LINKER) or picks one in RUSTFLAGS.
fn links_with_own_lld(var: &dyn Fn(&str) -> String) -> bool {
    if var("TARGET") != "x86_64-unknown-linux-gnu" || !var("RUSTC_LINKER").is_empty() {
        return false;
    }
    let flags = var("CARGO_ENCODED_RUSTFLAGS");
    let other = [
        "linker=",
        "linker-flavor",
        "linker-features=-lld",
        "link-self-contained=-linker",
        "link-self-contained=n",
        "fuse-ld",
    ];
    if other.iter().any(|flag| flags.contains(flag)) {
        return false;
    }
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let Ok(sysroot) = std::process::Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
    else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&sysroot.stdout);
    std::path::Path::new(sysroot.trim())
        .join("lib/rustlib/x86_64-unknown-linux-gnu/bin/gcc-ld/ld.lld")
        .exists()
}

//! Encodes the doc comments of `wit/` as a `package-docs` section (wit-parser's
//! `PackageMetadata`, the format Wassette and `wasm-tools` read), for
//! `src/lib.rs` to embed.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wit");
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve.push_path("wit").expect("parsing wit/");
    let docs = wit_parser::PackageMetadata::extract(&resolve, package)
        .encode()
        .expect("encoding package docs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    std::fs::write(out.join("package-docs.bin"), &docs).unwrap();
    std::fs::write(
        out.join("package_docs.rs"),
        format!(
            "/// The WIT's doc comments, as the `package-docs` custom section.\n\
             #[unsafe(link_section = \"package-docs\")]\n\
             #[used]\n\
             static PACKAGE_DOCS: [u8; {}] = *include_bytes!(concat!(env!(\"OUT_DIR\"), \"/package-docs.bin\"));\n",
            docs.len()
        ),
    )
    .unwrap();
}

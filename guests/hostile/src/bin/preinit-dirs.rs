//! Its initialiser (`wizer-initialize`) lists a directory, which asks
//! for the preopens: what belongs to each instance, which a snapshot
//! would freeze (`wasi:filesystem/preopens.get-directories`).
moat_wit::preinit!(read);

fn read() -> usize {
    std::fs::read_dir("/data").map(|d| d.count()).unwrap_or(0)
}

fn main() {
    // Without a snapshot (`preinit = false`) the initialiser never runs,
    // and the server answers `attack` as any other.
    hostile::serve("preinit-dirs", |id: &serde_json::Value| {
        Some(hostile::text_result(id, "started"))
    });
}

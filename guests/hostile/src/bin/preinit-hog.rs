//! Its initialiser (`wizer-initialize`) fills 64 MiB of memory: a
//! snapshot of it must be stopped by the server's `memory_bytes`.
moat_wit::preinit!(hog);

fn hog() -> Vec<u8> {
    vec![1u8; 64 << 20]
}

fn main() {
    // Without a snapshot (`preinit = false`) the initialiser never runs,
    // and the server answers `attack` as any other.
    hostile::serve("preinit-hog", |id: &serde_json::Value| {
        Some(hostile::text_result(id, "started"))
    });
}

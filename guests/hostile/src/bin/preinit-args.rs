//! Its initialiser (`wizer-initialize`) reads its arguments: what belongs to each
//! instance, which a snapshot would freeze (`wasi:cli/environment.get-arguments`).
moat_wit::preinit!(read);

fn read() -> usize {
    std::env::args().count()
}

fn main() {
    // Without a snapshot (`preinit = false`) the initialiser never runs,
    // and the server answers `attack` as any other.
    hostile::serve("preinit-args", |id: &serde_json::Value| {
        Some(hostile::text_result(id, "started"))
    });
}

//! Its initialiser (`wizer-initialize`) reads the monotonic clock: what belongs to each
//! instance, which a snapshot would freeze (`wasi:clocks/monotonic-clock.now`).
moat_wit::preinit!(read);

fn read() -> std::time::Instant {
    std::time::Instant::now()
}

fn main() {
    // Without a snapshot (`preinit = false`) the initialiser never runs,
    // and the server answers `attack` as any other.
    hostile::serve("preinit-clock", |id: &serde_json::Value| {
        Some(hostile::text_result(id, "started"))
    });
}

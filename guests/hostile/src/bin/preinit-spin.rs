//! Its initialiser (`wizer-initialize`) spins forever, never calling the
//! host: a snapshot of it must be stopped by the server's fuel.
moat_wit::preinit!(spin);

fn spin() -> u64 {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

fn main() {
    // Without a snapshot (`preinit = false`) the initialiser never runs,
    // and the server answers `attack` as any other.
    hostile::serve("preinit-spin", |id: &serde_json::Value| {
        Some(hostile::text_result(id, "started"))
    });
}

//! Its initialiser (`wizer-initialize`) writes to stderr, which leaves the
//! guest holding the stderr stream's handle (wasi-libc keeps it): a
//! snapshot would carry an index into a table that no later instance has.
moat_wit::preinit!(say);

fn say() {
    eprintln!("initialising");
}

fn main() {
    // Without a snapshot (`preinit = false`) the initialiser never runs,
    // and the server answers `attack` as any other.
    hostile::serve("preinit-stdio", |id: &serde_json::Value| {
        Some(hostile::text_result(id, "started"))
    });
}

//! Its initialiser (`wizer-initialize`) blocks in the host for good (a
//! `wasi:io/poll` on a clock a day away): a snapshot of it must be stopped
//! by the server's deadline.
moat_wit::preinit!(sleep);

fn sleep() {
    std::thread::sleep(std::time::Duration::from_secs(86_400));
}

fn main() {
    // Without a snapshot (`preinit = false`) the initialiser never runs,
    // and the server answers `attack` as any other.
    hostile::serve("preinit-sleep", |id: &serde_json::Value| {
        Some(hostile::text_result(id, "started"))
    });
}

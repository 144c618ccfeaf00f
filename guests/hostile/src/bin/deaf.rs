//! Answers `tools/call`, then stops reading stdin and sleeps forever: it
//! never notices EOF. The host must stop it anyway.
fn main() {
    hostile::serve("deaf", |id: &serde_json::Value| {
        hostile::send(&hostile::text_result(id, "going deaf"));
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    });
}

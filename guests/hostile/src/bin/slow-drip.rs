//! Answers `tools/call` one byte a second.
use std::io::Write;

fn main() {
    hostile::serve("slow-drip", |id: &serde_json::Value| {
        let answer = hostile::text_result(id, "eventually").to_string() + "\n";
        let mut stdout = std::io::stdout();
        for byte in answer.as_bytes() {
            if stdout
                .write_all(&[*byte])
                .and_then(|()| stdout.flush())
                .is_err()
            {
                hostile::exit(0);
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
        None
    });
}

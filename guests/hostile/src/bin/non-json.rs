//! Answers `tools/call` with a line that is not JSON.
use std::io::Write;

fn main() {
    hostile::serve("non-json", |_: &serde_json::Value| {
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(b"this line is not JSON-RPC\n");
        let _ = stdout.flush();
        None
    });
}

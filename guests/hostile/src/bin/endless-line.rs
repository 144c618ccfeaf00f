//! On `tools/call`, writes one stdout line that never ends.
use std::io::Write;

fn main() {
    hostile::serve("endless-line", |_: &serde_json::Value| {
        let chunk = [b'x'; 64 * 1024];
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"");
        loop {
            if stdout.write_all(&chunk).is_err() {
                hostile::exit(0);
            }
        }
    });
}

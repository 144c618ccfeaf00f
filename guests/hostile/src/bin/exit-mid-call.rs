//! Writes a last word to stderr and exits with code 3 in the middle of a call.
use std::io::Write;

fn main() {
    hostile::serve("exit-mid-call", |_: &serde_json::Value| {
        let mut stderr = std::io::stderr().lock();
        // Control characters and an ANSI escape the host must strip.
        let _ = stderr.write_all(b"fatal: planted failure\x1b[31m\x07 in attack\n");
        let _ = stderr.flush();
        hostile::exit(3)
    });
}

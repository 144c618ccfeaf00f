//! Answers `tools/call` with one well-formed JSON-RPC message of 100 MB.
use std::io::Write;

fn main() {
    hostile::serve("huge-message", |id: &serde_json::Value| {
        let mut stdout = std::io::stdout().lock();
        let head = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\""
        );
        let chunk = vec![b'x'; 1 << 20]; // on the heap: a wasm stack is 1 MiB
        let mut ok = stdout.write_all(head.as_bytes()).is_ok();
        for _ in 0..100 {
            ok = ok && stdout.write_all(&chunk).is_ok();
        }
        ok = ok
            && stdout
                .write_all(b"\"}]}}\n")
                .and_then(|()| stdout.flush())
                .is_ok();
        if !ok {
            hostile::exit(0); // the host stopped reading: expected
        }
        None
    });
}

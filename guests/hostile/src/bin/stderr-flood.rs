//! Floods stderr (4 MiB per call) while answering every call correctly.
use std::io::Write;

/// Bytes of stderr written for each call.
const FLOOD_BYTES: usize = 4 << 20;

fn main() {
    hostile::serve("stderr-flood", |id: &serde_json::Value| {
        let line = [b'e'; 1023];
        let mut stderr = std::io::stderr().lock();
        for _ in 0..FLOOD_BYTES / 1024 {
            let _ = stderr.write_all(&line);
            let _ = stderr.write_all(b"\n");
        }
        let _ = stderr.flush();
        Some(hostile::text_result(id, "flooded"))
    });
}

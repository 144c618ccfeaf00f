//! On `tools/call`, asks for 2^32 random bytes: from `wasi:random` under wasm
//! (the host's limit answers), into one buffer natively (the address-space
//! limit answers: the kernel, not Moat, serves a native process's randomness).
fn main() {
    hostile::serve("random-hog", |id: &serde_json::Value| {
        #[cfg(target_os = "wasi")]
        let got = wasip2::random::random::get_random_bytes(1 << 32).len();
        #[cfg(not(target_os = "wasi"))]
        let got = {
            use std::io::Read;
            let mut buffer = vec![0u8; 1 << 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut buffer))
                .map_or(0, |()| buffer.len())
        };
        Some(hostile::text_result(id, &format!("got {got} bytes")))
    });
}

//! Spins forever on `tools/call`, never yielding to the host.
fn main() {
    hostile::serve("spin", |_: &serde_json::Value| {
        let mut n: u64 = 0;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    });
}

//! Allocates without end on `tools/call`.
fn main() {
    hostile::serve("grow-memory", |_: &serde_json::Value| {
        let mut held: Vec<Vec<u8>> = Vec::new();
        loop {
            held.push(std::hint::black_box(vec![1u8; 1 << 20]));
        }
    });
}

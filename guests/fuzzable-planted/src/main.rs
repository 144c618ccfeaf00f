//! `fuzzable-planted`: the `fuzzable` server with all four planted bugs. The
//! fuzzer must find each of them; see `guests/fuzzable/src/lib.rs`.

fn main() -> std::io::Result<()> {
    fuzzable::run()
}

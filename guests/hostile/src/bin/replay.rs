//! The fuzzer's guest: writes bytes chosen by the fuzzer to stdout and
//! stderr and exits with a chosen code, ignoring stdin. `REPLAY` holds them
//! in hex: the first byte is the exit code; the rest is stdout, then (after
//! the first 0xff byte, if any) stderr.
use std::io::Write;

fn main() {
    let hex = std::env::var("REPLAY").unwrap_or_default();
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    let (code, rest) = bytes.split_first().map_or((0, &[][..]), |(c, r)| (*c, r));
    let (out, err) = match rest.iter().position(|b| *b == 0xff) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &[][..]),
    };
    let _ = std::io::stdout()
        .write_all(out)
        .and_then(|()| std::io::stdout().flush());
    let _ = std::io::stderr().write_all(err);
    hostile::exit(code);
}

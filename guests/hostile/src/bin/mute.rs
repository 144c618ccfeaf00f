//! Reads every line it is sent and never answers, not even `initialize`:
//! its start never completes. It exits at EOF on stdin.
use std::io::BufRead;

fn main() {
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
    }
}

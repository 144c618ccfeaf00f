#!/usr/bin/env bash
# Moat's main job on the bundled example: build Moat and the `everything`
# guest from source, then list its tools and call one through the wasm
# sandbox. Safe to run again; later runs reuse the builds.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

step "toolchain: the pinned Rust with the wasm32-wasip2 target (rust-toolchain.toml)"
rustup toolchain install

step "building moat and the guests (the first build compiles wasmtime: several minutes)"
cargo build --release --locked -p moat -p moat-test-guests

step "moat tools --config examples/moat.toml everything"
./target/release/moat tools --config examples/moat.toml everything

step "moat call --config examples/moat.toml everything add '{\"a\":2,\"b\":40}'"
./target/release/moat call --config examples/moat.toml everything add '{"a":2,"b":40}'

step "moat call --config examples/moat.toml everything-native add '{\"a\":2,\"b\":40}'  (the same guest, native)"
./target/release/moat call --config examples/moat.toml everything-native add '{"a":2,"b":40}'

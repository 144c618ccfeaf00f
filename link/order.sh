#!/usr/bin/env bash
# Writes link/moat.order, the order in which build.rs has lld lay out the
# `moat` binary's hot functions, from a profile of the release build:
# `moat serve` on stdio and on streamable HTTP in front of the bundled
# example's wasm server, run under valgrind's callgrind (link/profile.py).
# Then relinks and prints how much of the order the build defines.
#
# Run it again when the hot path changes or a dependency moves (a name in
# the order that the build no longer defines costs only its locality;
# README "Performance" says what it saves). Needs valgrind and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "order.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
# The names are those of the build users make: a build through a wrapper
# (clippy's, sccache) gives the workspace's crates other names.
unset RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER
cargo build --release --locked -p moat
cargo build --manifest-path guests/Cargo.toml --release --locked -p everything \
    --target wasm32-wasip2 --target-dir target/guests
out=target/link-profile
rm -rf "$out"
mkdir -p "$out"
python3 link/profile.py target/release/moat examples/moat.toml "$out"
python3 link/order.py target/release/moat "$out"/stdio.out.* "$out"/http.out.* >"$out/moat.order"
# The names must be the build's before the file replaces the one in use.
python3 link/order.py --check target/release/moat "$out/moat.order"
mv "$out/moat.order" link/moat.order
cargo build --release --locked -p moat
python3 link/order.py --check target/release/moat link/moat.order

#!/usr/bin/env bash
# Moat's main job on the bundled example, on a fresh clone: build Moat and the
# `everything` guest from source (nothing else: not the test guests, not the
# JavaScript or Python toolchains that `tests/setup.sh` installs), then run
# `moat serve --http` on loopback in front of the guest, once as a wasm
# component and once as a native child, and call it as an agent would, with
# Moat's own streamable-HTTP client. Safe to run again; later runs reuse the
# builds.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*" >&2; }
# The command, shown as it is run.
run() { printf '$ %s\n' "$*" >&2; "$@"; }

step "toolchain: the pinned Rust with the wasm32-wasip2 target (rust-toolchain.toml)"
rustup toolchain install

# The dev profile: the build the tests share (`cargo test` after this one
# compiles only what the tests add), and half the CPU of a release build.
# `--workspace --bin moat` builds only the moat binary, but with every
# dependency's features as the whole workspace asks for them (fuzz/Cargo.toml
# names the ones the tests add): with `-p moat`
# alone, tokio, wasmparser and cc got fewer, so the test command compiled
# them again and all of wasmtime, rustls and rmcp above them.
# For daily use build `cargo build --release -p moat` (README, "The two
# commands"); `--profile dist` is the fat-LTO build to ship.
step "building moat (dev profile; the first build compiles wasmtime, about 5 minutes on 2 cores)"
run cargo build --locked --workspace --bin moat

step "building the example guest: guests/everything, for wasm32-wasip2 and natively"
run cargo build --manifest-path guests/Cargo.toml --release --locked -p everything \
    --target wasm32-wasip2 --target-dir target/guests
run cargo build --manifest-path guests/Cargo.toml --release --locked -p everything \
    --target-dir target/guests

moat=target/debug/moat
demo=target/demo
mkdir -p "$demo"

step "what the guest exposes, and what its sandbox enforces"
run "$moat" tools --config examples/moat.toml everything

step "moat serve: one MCP server for the agent, in front of both servers, on loopback"
# A fresh log each run: the anchor beside it goes too (a log without the
# anchor it had, or an anchor without its log, is refused as truncated).
rm -f "$demo/audit.jsonl" "$demo/audit.jsonl.anchor" "$demo/serve.log"
"$moat" serve --config examples/moat.toml --http 127.0.0.1:0 --audit "$demo/audit.jsonl" \
    2>"$demo/serve.log" &
serve=$!
trap 'kill "$serve" 2>/dev/null || true' EXIT
url=
for _ in $(seq 1 300); do
    url=$(sed -n 's|^moat: serving MCP at \(http://[^ ]*\)$|\1|p' "$demo/serve.log")
    [ -n "$url" ] && break
    kill -0 "$serve" 2>/dev/null || { cat "$demo/serve.log" >&2; exit 1; }
    sleep 0.1
done
[ -n "$url" ] || { echo "demo: moat serve did not start; its log:" >&2; cat "$demo/serve.log" >&2; exit 1; }
echo "moat serve is at $url (its log: $demo/serve.log)" >&2

# The agent: here Moat's own client for remote MCP servers, pointed at the
# gateway. Any MCP client (an agent app, an SDK) does the same over HTTP.
cat >"$demo/agent.toml" <<EOF
# An agent's view of the gateway: one remote MCP server.
[servers.gateway]
url = "$url"
sandbox = "best-effort" # Moat does not run it: it is the gateway above
EOF

step "the agent lists the gateway's tools: every server's, as SERVER__TOOL"
run "$moat" tools --config "$demo/agent.toml" gateway

step "the agent calls the wasm server through the gateway"
run "$moat" call --config "$demo/agent.toml" gateway everything__add '{"a":2,"b":40}'

step "the agent calls the same guest run natively, through the same gateway"
run "$moat" call --config "$demo/agent.toml" gateway everything-native__add '{"a":2,"b":40}'

step "stopping moat serve (SIGTERM: sessions drain, children stop)"
kill -TERM "$serve"
wait "$serve"
trap - EXIT

step "the audit log it kept: one line per event, hash-chained"
run cut -c1-160 "$demo/audit.jsonl"
run "$moat" audit verify "$demo/audit.jsonl"

step "done: moat is at $moat; examples/moat.toml is the config it served"

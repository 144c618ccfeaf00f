#!/usr/bin/env bash
# Short fuzz runs for CI (stable toolchain, no sanitizer): every target for
# FUZZ_SECONDS (default 60) from its seed corpus with the MCP dictionary;
# the planted crash gets up to PLANTED_SECONDS (default FUZZ_SECONDS);
# a crash fails the run and is saved under fuzz/artifacts/TARGET/, where the
# replay tests (crates/fuzz-targets/tests/replay.rs) keep it as a regression
# test once committed. An input that makes the process exceed 2 GiB, one
# allocation over 1 GiB, or one input running over 30 s counts as a crash.
# Then a build with a planted crash must be caught,
# which shows the harness can fail.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${FUZZ_SECONDS:-60}"
planted_seconds="${PLANTED_SECONDS:-$seconds}"
targets=(framing config routing wasm_boundary arguments typed_values)
# The targets are built in the workspace's dev profile and target dir, on
# the dependencies the test build compiled: fuzz/instrument.sh compiles
# Moat's own crates again with libFuzzer's coverage instrumentation, and
# nothing else is compiled again. (cargo-fuzz instruments every crate, so
# it compiles all of them, wasmtime too: about 7 min on 2 cores.) Each
# binary is copied out of target/debug, where the next build replaces it.
target_dir="${CARGO_TARGET_DIR:-$PWD/../target}"
bin="$target_dir/fuzz-bin"
mkdir -p "$bin"
# FUZZ_SHARED_DEPS=1 (CI): fail when the build compiled any dependency
# but libFuzzer's own (fuzz/Cargo.toml says how to mend it).
build() {
    local log
    log="$(mktemp)"
    env -u RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER="$PWD/instrument.sh" \
        cargo build --locked -p moat-fuzz --features fuzzing "$@" 2>&1 | tee "$log" >&2
    local again
    again="$(grep -E '^ +Compiling ' "$log" | grep -v ' (/' | grep -vE ' (libfuzzer-sys|arbitrary) v' |
        sed -E 's/^ +Compiling //' | paste -sd, || true)"
    rm -f "$log"
    if [ -n "$again" ]; then
        local count
        count=$(tr ',' '\n' <<<"$again" | wc -l)
        if [ "$count" -gt 12 ]; then
            again="$(cut -d, -f1-12 <<<"$again"),... ($count in all: has the test build run?)"
        fi
        echo "fuzz build: dependencies compiled here, not shared with the test build: $again" >&2
        if [ "${FUZZ_SHARED_DEPS:-}" = 1 ]; then
            echo "fuzz build: give fuzz/Cargo.toml's dependencies the test build's features (see there)" >&2
            exit 1
        fi
    fi
}
build --bins
for target in "${targets[@]}"; do
    cp "$target_dir/debug/$target" "$bin/$target"
done
build --bin config --features planted-crash
cp "$target_dir/debug/config" "$bin/config-planted"
echo "fuzz budget: ${#targets[@]} targets × ${seconds} s, ${FUZZ_JOBS:-$(nproc)} at a time, then the planted crash within ${planted_seconds} s"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Each target is one process on one core for its budget: as many run at
# once as there are cores (FUZZ_JOBS), and their summaries follow in order.
jobs="${FUZZ_JOBS:-$(nproc)}"
fuzz_target() {
    local target=$1 status=0
    mkdir -p "$work/$target" "artifacts/$target"
    "$bin/$target" "$work/$target" "corpus/$target" \
        -max_total_time="$seconds" -dict=dict/mcp.dict -print_final_stats=1 \
        -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=30 \
        -artifact_prefix="artifacts/$target/" >"$work/$target.log" 2>&1 || status=$?
    echo "$status" >"$work/$target.status"
}
running=0
for target in "${targets[@]}"; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
    fuzz_target "$target" &
    running=$((running + 1))
done
wait
for target in "${targets[@]}"; do
    echo "--- fuzz $target for ${seconds}s"
    # libFuzzer's progress lines are left out; its summary and any crash stay.
    grep -E '^(stat::|Done|INFO: seed|SUMMARY|thread|Test unit|==)' "$work/$target.log" || true
    if [ "$(cat "$work/$target.status")" -ne 0 ]; then
        tail -n 40 "$work/$target.log"
        echo "fuzz: $target failed (a crash is saved under fuzz/artifacts/$target/)"
        exit 1
    fi
done
echo "--- the planted crash must be found"
mkdir -p "$work/planted"
if "$bin/config-planted" "$work/planted" corpus/config \
    -max_total_time="$planted_seconds" -dict=dict/mcp.dict -artifact_prefix="$work/planted-" >"$work/planted.log" 2>&1; then
    echo "fuzz: the planted crash was not found in ${planted_seconds}s"; exit 1
fi
grep -q 'the planted crash was found' "$work/planted.log" || { cat "$work/planted.log"; exit 1; }
ls "$work"/planted-crash-* >/dev/null
echo "fuzz: planted crash found and saved, as it must be"

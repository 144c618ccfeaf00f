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
# The guests the targets run are the test build's (target/guests), not a
# second build of them under target/fuzz.
export MOAT_GUESTS_TARGET_DIR="$PWD/../target/guests"
# FUZZ_BUILD_ONLY=1: build the targets and stop (CI builds them beside the
# tests, on the CPU the tests leave idle).
version=0.13.2
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $version" ]; then
    cargo install cargo-fuzz --version "$version" --locked
fi
fuzz() { local command="$1"; shift; cargo fuzz "$command" -s none --dev --target-dir ../target/fuzz "$@"; }
fuzz build
if [ "${FUZZ_BUILD_ONLY:-}" = 1 ]; then
    exit 0
fi
echo "fuzz budget: ${#targets[@]} targets × ${seconds} s, then the planted crash within ${planted_seconds} s (at most $((${#targets[@]} * seconds + planted_seconds)) s of fuzzing, after the build)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for target in "${targets[@]}"; do
    echo "--- fuzz $target for ${seconds}s"
    mkdir -p "$work/$target"
    status=0
    fuzz run "$target" "$work/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -dict=dict/mcp.dict -print_final_stats=1 \
        -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=30 \
        >"$work/$target.log" 2>&1 || status=$?
    # libFuzzer's progress lines are left out; its summary and any crash stay.
    grep -E '^(stat::|Done|INFO: seed|SUMMARY|thread|Test unit|==)' "$work/$target.log" || true
    if [ "$status" -ne 0 ]; then
        tail -n 40 "$work/$target.log"
        echo "fuzz: $target failed (a crash is saved under fuzz/artifacts/$target/)"
        exit 1
    fi
done
echo "--- the planted crash must be found"
mkdir -p "$work/planted"
if fuzz run config --features planted-crash "$work/planted" corpus/config -- \
    -max_total_time="$planted_seconds" -dict=dict/mcp.dict -artifact_prefix="$work/planted-" >"$work/planted.log" 2>&1; then
    echo "fuzz: the planted crash was not found in ${planted_seconds}s"; exit 1
fi
grep -q 'the planted crash was found' "$work/planted.log" || { cat "$work/planted.log"; exit 1; }
ls "$work"/planted-crash-* >/dev/null
echo "fuzz: planted crash found and saved, as it must be"

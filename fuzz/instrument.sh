#!/usr/bin/env bash
# The compiler of the workspace's own crates in fuzz/run.sh's build
# (RUSTC_WORKSPACE_WRAPPER: cargo runs `instrument.sh RUSTC ARGS...`).
# It adds libFuzzer's coverage instrumentation, the flags cargo-fuzz gives
# every crate (but `--cfg fuzzing`, which no crate here reads), to Moat's
# crates only: the dependencies are the test build's, already compiled, and
# are not compiled again. Build scripts and proc-macros run inside the
# build, where libFuzzer's runtime is not linked, and cargo's own queries
# (`-vV`, `--print`) compile nothing: those are passed on as they are.
set -euo pipefail
rustc="$1"
shift
compiles=no
for arg in "$@"; do
    case "$arg" in
    build_script_* | proc-macro | --print*) exec "$rustc" "$@" ;;
    --crate-name) compiles=yes ;;
    esac
done
[ "$compiles" = yes ] || exec "$rustc" "$@"
exec "$rustc" "$@" \
    -Cpasses=sancov-module \
    -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares \
    -Cllvm-args=-sanitizer-coverage-stack-depth \
    -Cllvm-args=-simplifycfg-branch-fold-threshold=0

#!/usr/bin/env bash
# Stages the build context of deploy/container/Containerfile: BINARY
# (stripped) at /usr/local/bin/moat, and the shared objects it loads, as
# ldd resolves them, at their own paths. Prints what it staged.
#
# usage: bash deploy/container/stage.sh BINARY CONTEXT_DIR
set -euo pipefail
binary=${1:?usage: stage.sh BINARY CONTEXT_DIR}
context=${2:?usage: stage.sh BINARY CONTEXT_DIR}
[ -x "$binary" ] || { echo "stage.sh: $binary is not an executable (build it first: cargo build --release --locked)" >&2; exit 1; }
rm -rf "$context/root"
mkdir -p "$context/root/usr/local/bin" "$context/root/var/cache/moat" "$context/root/var/lib/moat/state" "$context/root/tmp"
chmod 1777 "$context/root/tmp"
if [ "$(id -u)" = 0 ]; then
    chown -R 65532:65532 "$context/root/var/cache/moat" "$context/root/var/lib/moat"
fi
strip -o "$context/root/usr/local/bin/moat" "$binary"
# Each `name => /path (addr)` or `/path (addr)` line of ldd: the loader and
# the libraries, copied (links followed) to the path they are loaded from.
ldd "$binary" | awk '/=> \// { print $3 } /^\t\// { print $1 }' | while read -r library; do
    mkdir -p "$context/root$(dirname "$library")"
    cp -L "$library" "$context/root$library"
done
(cd "$context/root" && find . -mindepth 1 \( -type f -o -type l \) | sort)

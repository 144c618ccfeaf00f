#!/usr/bin/env bash
# Stages the build context of deploy/container/Containerfile: BINARY
# (stripped) at /usr/local/bin/moat, the shared objects it loads, as ldd
# resolves them, at their own paths, and the system's CA certificates
# (one file); Moat's own directories apart (volumes/, owned by Moat's
# user in the image). Prints the files it staged.
#
# usage: bash deploy/container/stage.sh BINARY CONTEXT_DIR
set -euo pipefail
binary=${1:?usage: stage.sh BINARY CONTEXT_DIR}
context=${2:?usage: stage.sh BINARY CONTEXT_DIR}
[ -x "$binary" ] || { echo "stage.sh: $binary is not an executable (build it first: cargo build --release --locked)" >&2; exit 1; }
rm -rf "$context/root" "$context/volumes"
mkdir -p "$context/root/usr/local/bin" "$context/root/etc/ssl/certs" "$context/root/tmp" \
    "$context/volumes/var/cache/moat" "$context/volumes/var/lib/moat"
chmod 1777 "$context/root/tmp"
certificates=/etc/ssl/certs/ca-certificates.crt
[ -f "$certificates" ] || { echo "stage.sh: $certificates is missing (Debian: apt-get install ca-certificates)" >&2; exit 1; }
cp -L "$certificates" "$context/root$certificates"
strip -o "$context/root/usr/local/bin/moat" "$binary"
# Each `name => /path (addr)` or `/path (addr)` line of ldd: the loader and
# the libraries, copied (links followed) to the path they are loaded from.
ldd "$binary" | awk '/=> \// { print $3 } /^\t\// { print $1 }' | while read -r library; do
    mkdir -p "$context/root$(dirname "$library")"
    cp -L "$library" "$context/root$library"
done
(cd "$context/root" && find . -mindepth 1 \( -type f -o -type l \) | sort)

#!/usr/bin/env bash
# Set-up for the test suite on a fresh machine: the pinned Rust toolchain with
# the wasm32-wasip2 target, Node.js, the Distribution registry, HAProxy, the third-party MCP servers and SDKs the
# tests run, and the JavaScript and Python component toolchains that build
# guests/js and guests/py (from the npm registry and PyPI, into target/npm
# and target/py). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# rust-toolchain.toml pins the toolchain, its components and targets.
rustup toolchain install

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
    else
        echo "tests/setup.sh: node and npm are needed (install Node.js 20 or newer)" >&2
        exit 1
    fi
fi

# The Distribution registry (tests/oci/ pulls components from it on
# loopback), as Debian packages it. Its service is not started: each test
# starts its own on a free port.
if ! command -v docker-registry >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null
    else
        echo "tests/setup.sh: docker-registry is needed (Debian: apt-get install docker-registry)" >&2
        exit 1
    fi
fi

# HAProxy balances tests/replicas.rs's replicas with deploy/haproxy/haproxy.cfg.
if ! command -v haproxy >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null
    else
        echo "tests/setup.sh: haproxy is needed (Debian: apt-get install haproxy)" >&2
        exit 1
    fi
fi

# openssl makes the test CA and certificate of tests/oci/'s https registry.
if ! command -v openssl >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
    else
        echo "tests/setup.sh: openssl is needed (Debian: apt-get install openssl)" >&2
        exit 1
    fi
fi

# The reference MCP server (run by the native tests) and the official
# TypeScript SDK (the agent that drives `moat serve`), pinned.
# componentize-js builds the JavaScript typed component in guests/js (the
# version Wassette's examples are built with).
SERVER_EVERYTHING=2026.8.31
SDK=1.32.2
COMPONENTIZE_JS=0.19.3
installed=target/npm/node_modules
if ! grep -q "\"version\": \"$SERVER_EVERYTHING\"" "$installed/@modelcontextprotocol/server-everything/package.json" 2>/dev/null ||
    ! grep -q "\"version\": \"$SDK\"" "$installed/@modelcontextprotocol/sdk/package.json" 2>/dev/null ||
    ! grep -q "\"version\": \"$COMPONENTIZE_JS\"" "$installed/@bytecodealliance/componentize-js/package.json" 2>/dev/null; then
    mkdir -p target/npm
    npm install --prefix target/npm --no-audit --no-fund --silent \
        "@modelcontextprotocol/server-everything@$SERVER_EVERYTHING" \
        "@modelcontextprotocol/sdk@$SDK" \
        "@bytecodealliance/componentize-js@$COMPONENTIZE_JS"
fi

# The official Python SDK (an agent that drives `moat serve`), the Python
# reference server mcp-server-time (run by the sandbox tests under this
# machine's interpreter, wherever it is installed), and componentize-py
# (builds the Python typed component in guests/py), pinned, into target/py
# (no virtualenv needed: tests and the guest build put it on PYTHONPATH).
PY_MCP=2.3.0
PY_TIME=2026.10.19
COMPONENTIZE_PY=0.25.1
# The Prometheus project's Python client: its OpenMetrics parser reads
# `moat serve`'s /metrics in tests/observability/.
PROMETHEUS_CLIENT=0.26.0
# The Python Cryptographic Authority's package: its Ed25519 checks a claim in
# tests/clients/verify_claim.py, the short verifier independent of Moat.
CRYPTOGRAPHY=50.0.2
if ! PYTHONPATH=target/py python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('mcp') != '$PY_MCP' or m.version('mcp-server-time') != '$PY_TIME' or m.version('componentize-py') != '$COMPONENTIZE_PY' or m.version('prometheus-client') != '$PROMETHEUS_CLIENT' or m.version('cryptography') != '$CRYPTOGRAPHY')" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check --target target/py --upgrade \
        "mcp==$PY_MCP" "mcp-server-time==$PY_TIME" "componentize-py==$COMPONENTIZE_PY" \
        "prometheus-client==$PROMETHEUS_CLIENT" "cryptography==$CRYPTOGRAPHY"
fi

# The egress clients of crates/host/tests/capabilities/egress.rs
# (native_egress_is_transparent_to_every_client): Python's requests and httpx,
# pinned, into target/py-egress (pure Python: the sandboxed server runs them
# under the system's /usr/bin/python3), and Go (Debian's golang-go), whose
# net/http client the test builds.
REQUESTS=2.34.2
HTTPX=0.28.1
if ! PYTHONPATH=target/py-egress python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('requests') != '$REQUESTS' or m.version('httpx') != '$HTTPX')" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check --target target/py-egress --upgrade \
        --only-binary=:all: --no-compile "requests==$REQUESTS" "httpx==$HTTPX"
fi
if ! command -v go >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null
    else
        echo "tests/setup.sh: go is needed (Debian: apt-get install golang-go)" >&2
        exit 1
    fi
fi

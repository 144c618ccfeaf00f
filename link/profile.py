#!/usr/bin/env python3
"""Records which functions of a `moat` binary its common paths run, for
link/order.sh: `moat serve` on stdio and on streamable HTTP, in front of the
bundled example's wasm server (examples/moat.toml), each run
under valgrind's callgrind, which names every function executed.

Usage: profile.py MOAT CONFIG OUTDIR. Writes OUTDIR/stdio.out.PID and
OUTDIR/http.out.PID (callgrind's files, names left mangled; a process
forked before it executes a server writes one of its own).
"""

import json
import os
import re
import subprocess
import sys
import tempfile

moat, config, out = sys.argv[1:4]
state = tempfile.mkdtemp(prefix="moat-profile-")
# Only the wasm server: under valgrind a native server's launch fails (it
# knows no Landlock system call, and the process that becomes the server
# runs under it until it executes, with valgrind's own rlimits). The
# config's relative paths are made absolute.
base = os.path.dirname(os.path.abspath(config))
with open(config) as f:
    text = f.read().replace('"../', f'"{base}/../')
text = text.split("[servers.everything-native]")[0]
config = f"{state}/moat.toml"
with open(config, "w") as f:
    f.write(text)
env = dict(os.environ, MOAT_CACHE_DIR=f"{state}/cache", MOAT_STATE_DIR=f"{state}/state", RUST_LOG="error")


def valgrind(tool, *args, **kw):
    # Bounded: a run that hangs ends the profile instead of the session.
    cmd = ["timeout", "600", "valgrind", "--quiet", f"--tool={tool}"]
    if tool == "callgrind":
        cmd += ["--demangle=no", f"--callgrind-out-file={kw.pop('to')}.%p"]
    return cmd + [moat, *args]


# Under valgrind the host's CPU features differ, and with them the key of
# the component cache: compile once under valgrind so that the recorded
# runs load from the cache and run no compiler.
subprocess.run(valgrind("none", "tools", "--config", config, "everything"), env=env,
               stdout=subprocess.DEVNULL, check=True)

# 1. stdio: what an agent that spawns `moat serve` does.
serve = subprocess.Popen(valgrind("callgrind", "serve", "--config", config, to=f"{out}/stdio.out"),
                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
ids = iter(range(1, 1 << 30))


def rpc(method, params=None):
    message = {"jsonrpc": "2.0", "id": next(ids), "method": method}
    if params is not None:
        message["params"] = params
    serve.stdin.write((json.dumps(message) + "\n").encode())
    serve.stdin.flush()
    while True:
        answer = json.loads(serve.stdout.readline())
        if answer.get("id") == message["id"]:
            if "error" in answer:
                sys.exit(f"profile.py: {method} failed: {answer['error']}")
            return answer["result"]


rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "profile", "version": "1"}})
serve.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
rpc("tools/list")
rpc("prompts/list")
rpc("resources/list")
for server in ["everything"]:
    for i in range(20):
        rpc("tools/call", {"name": f"{server}__echo", "arguments": {"message": f"call {i}"}})
    rpc("tools/call", {"name": f"{server}__add", "arguments": {"a": 2, "b": 40}})
serve.stdin.close()
if serve.wait() != 0:
    sys.exit("profile.py: moat serve (stdio) failed")

# 2. streamable HTTP, driven by Moat's own client (not recorded).
serve = subprocess.Popen(valgrind("callgrind", "serve", "--config", config, "--http", "127.0.0.1:0",
                                  to=f"{out}/http.out"),
                         env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
for line in serve.stderr:
    found = re.match(r"moat: serving MCP at (\S+)", line)
    if found:
        url = found.group(1)
        break
else:
    sys.exit("profile.py: moat serve --http ended before serving")
agent = f"{state}/agent.toml"
with open(agent, "w") as f:
    f.write(f'[servers.gateway]\nurl = "{url}"\nsandbox = "best-effort"\n')
client = [moat, "call", "--config", agent, "gateway"]
for server in ["everything"]:
    for i in range(3):
        subprocess.run(client + [f"{server}__echo", json.dumps({"message": f"call {i}"})],
                       env=env, stdout=subprocess.DEVNULL, check=True)
serve.terminate()
serve.stderr.read()
if serve.wait() != 0:
    sys.exit("profile.py: moat serve --http failed")

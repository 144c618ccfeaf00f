"""A replica told to stop (SIGTERM), seen through HAProxy
(tests/replicas.rs): an agent's 2025 session has a call in flight on it;
while it drains, new stateless requests are answered by the other
replicas, and the call in flight is answered in full.

Prints `HOLDER NAME` once the call is in flight (its first progress
notification has arrived), waits for a line from the test (which sends
SIGTERM to NAME meanwhile), then sends the stateless requests, reads the
rest of the call, and prints one JSON report.

usage: python3 py_drain.py URL
"""
import asyncio
import json
import sys

import httpx2 as httpx

URL = sys.argv[1]
MODERN = "2026-07-28"


async def main():
    report = {}
    async with httpx.AsyncClient(timeout=60) as http:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "MCP-Protocol-Version": "2025-06-18"}
        opened = await http.post(URL, headers=headers, content=json.dumps({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "drain", "version": "1"}}}))
        assert opened.status_code == 200, opened.text
        headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
        holder = opened.headers["moat-replica"]
        await http.post(URL, headers=headers, content=json.dumps(
            {"jsonrpc": "2.0", "method": "notifications/initialized"}))
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "wasm__progress", "arguments": {"steps": 6, "interval_ms": 250},
            "_meta": {"progressToken": 9}}}
        progress = 0
        async with http.stream("POST", URL, headers=headers, content=json.dumps(call)) as answer:
            report["call_replica"] = answer.headers.get("moat-replica")
            lines = answer.aiter_lines()
            async for line in lines:
                if line.startswith("data:") and "notifications/progress" in line:
                    progress += 1
                    break
            print(f"HOLDER {holder}", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            # The holder drains: new work goes to the others.
            others = []
            for n in range(10):
                response = await http.post(URL, headers={
                    "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                    "MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "wasm__add"},
                    content=json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
                        "name": "wasm__add", "arguments": {"a": n, "b": 1},
                        "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                                  "io.modelcontextprotocol/clientInfo": {"name": "drain", "version": "1"},
                                  "io.modelcontextprotocol/clientCapabilities": {}}}}),
                    # Answered at once by a live replica, or it is a hang.
                    timeout=10)
                others.append([response.status_code, response.headers.get("moat-replica"), str(n + 1) in response.text])
            report["during_drain"] = others
            result = None
            async for line in lines:
                if line.startswith("data:"):
                    message = json.loads(line[5:])
                    if message.get("method") == "notifications/progress":
                        progress += 1
                    elif message.get("id") == 2:
                        result = message
            report["progress"] = progress
            report["result"] = result
        report["holder"] = holder
    print(json.dumps(report), flush=True)


asyncio.run(main())

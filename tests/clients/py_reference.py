"""The official Python SDK drives `moat serve` in front of the reference
servers (mcp-server-time under this machine's Python, server-everything under
node), each under `sandbox = "required"`. Prints one JSON report on stdout
for tests/real_clients.rs to check.

usage: python3 py_reference.py MOAT CONFIG
"""
import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def text(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def main(moat, config):
    params = StdioServerParameters(
        command=moat,
        args=["serve", "--config", config],
        env={
            "PATH": os.environ["PATH"],
            "MOAT_CACHE_DIR": os.environ.get("MOAT_CACHE_DIR", ""),
            "MOAT_STATE_DIR": os.environ.get("MOAT_STATE_DIR", ""),
        },
    )
    report = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            report["tools"] = sorted(t.name for t in tools.tools)
            now = await session.call_tool("time__get_current_time", {"timezone": "UTC"})
            report["time_error"] = bool(now.is_error)
            report["time"] = json.loads(text(now))
            echo = await session.call_tool("everything__echo", {"message": "through moat"})
            report["echo"] = text(echo)
    print(json.dumps(report))


asyncio.run(main(sys.argv[1], sys.argv[2]))

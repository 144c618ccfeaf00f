"""An agent built on the official Python SDK (`mcp` from PyPI), driving
`moat serve` over stdio. Prints one JSON report on stdout for
tests/real_clients.rs to check.

usage: python3 py_agent.py MOAT CONFIG
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
        args=["serve", "--config", config]
        + (["--audit", os.environ["MOAT_AUDIT"]] if os.environ.get("MOAT_AUDIT") else []),
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
            report["wasm_add"] = text(await session.call_tool("wasm__add", {"a": 2, "b": 40}))
            report["native_add"] = text(await session.call_tool("native__add", {"a": 1, "b": 2}))
            progress = []

            async def on_progress(value, total, message):
                progress.append([value, total])

            done = await session.call_tool(
                "native__progress",
                {"steps": 3, "interval_ms": 50},
                progress_callback=on_progress,
            )
            report["progress"] = progress
            report["progress_result"] = text(done)
            # Cancel a long call while the server is busy with it.
            call = asyncio.ensure_future(session.call_tool("wasm__sleep", {"ms": 60000}))
            await asyncio.sleep(0.5)
            call.cancel()
            try:
                await call
                report["cancelled"] = False
            except asyncio.CancelledError:
                report["cancelled"] = True
            report["after_cancel"] = text(
                await session.call_tool("wasm__echo", {"message": "still here"})
            )
    print(json.dumps(report))


asyncio.run(main(sys.argv[1], sys.argv[2]))

"""The official Python SDK (`mcp` from PyPI) drives `moat serve --locked`
over stdio, as ts_calls.mjs does with the TypeScript SDK: it lists every
tool, then makes each call in CALLS (a JSON array of {name, arguments}) in
order. Prints one JSON report on stdout:
{tools: [names, sorted], results: [{isError, text}]}; a call the SDK itself
rejects is reported as {isError: true, text: its message}.

Variables named in PASS_ENV (comma-separated) reach `moat serve` too (a
node's token, say).

usage: python3 py_calls.py MOAT CONFIG CALLS
"""
import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def text(result):
    return "".join(getattr(c, "text", "") or "" for c in result.content)


async def main(moat, config, calls):
    params = StdioServerParameters(
        command=moat,
        args=["serve", "--locked", "--config", config],
        env={
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", ""),
            "MOAT_CACHE_DIR": os.environ.get("MOAT_CACHE_DIR", ""),
            "MOAT_STATE_DIR": os.environ.get("MOAT_STATE_DIR", ""),
            **{
                name: os.environ[name]
                for name in os.environ.get("PASS_ENV", "").split(",")
                if name in os.environ
            },
        },
    )
    report = {"results": []}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=120) as session:
            await session.initialize()
            tools = await session.list_tools()
            report["tools"] = sorted(t.name for t in tools.tools)
            for call in json.loads(calls):
                try:
                    result = await session.call_tool(call["name"], call["arguments"])
                    report["results"].append(
                        {"isError": bool(getattr(result, "is_error", None) or getattr(result, "isError", None)), "text": text(result)}
                    )
                except Exception as error:  # the SDK's own refusal, reported
                    report["results"].append({"isError": True, "text": repr(error)})
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))

"""An agent on the official Python SDK (`mcp` from PyPI) driving `moat serve`
over stdio in front of four `rounds` servers (`a` and `b` on 2026-07-28,
`c` on 2025-06-18 and `d` on 2025-11-25), once on
2026-07-28 (`server/discover`) and once on the initialize handshake. It
answers every elicitation with the name Py. Prints one JSON report on stdout
for tests/real_clients.rs to check.

usage: python3 py_rounds.py MOAT CONFIG
"""
import asyncio
import json
import os
import sys

from mcp import Client, StdioServerParameters, types
from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated


def text(result):
    return "".join(getattr(c, "text", "") for c in result.content)


def describe(event):
    if isinstance(event, ResourceUpdated):
        return ["updated", str(event.uri)]
    if isinstance(event, ResourcesListChanged):
        return ["listed"]
    return [type(event).__name__]


async def elicited(context, params):
    return types.ElicitResult(action="accept", content={"name": "Py"})


def moat(command, config):
    return StdioServerParameters(
        command=command,
        args=["serve", "--config", config],
        env={
            "PATH": os.environ["PATH"],
            "MOAT_CACHE_DIR": os.environ.get("MOAT_CACHE_DIR", ""),
            "MOAT_STATE_DIR": os.environ.get("MOAT_STATE_DIR", ""),
        },
    )


async def modern(command, config):
    """2026-07-28: requests for input through the SDK's own driver, and a
    subscription merged across both servers."""
    report = {}
    async with Client(moat(command, config), elicitation_callback=elicited) as client:
        report["revision"] = client.protocol_version
        for server in ["a", "b"]:
            report[f"{server}_ask"] = text(await client.call_tool(f"{server}__ask", {}))
        # Older servers ask with their own elicitation/create: two rounds,
        # then one.
        report["c_ask"] = text(await client.call_tool("c__ask", {"times": 2}))
        report["d_ask"] = text(await client.call_tool("d__ask", {}))
        resources = await client.list_resources()
        report["resources"] = sorted(str(r.uri) for r in resources.resources)
        async with client.listen(
            resources_list_changed=True,
            resource_subscriptions=["rounds://b/data", "rounds://d/data"],
        ) as subscription:
            # Moat opens the servers' streams once it has acknowledged this
            # one, then says that what it listens to may have changed.
            report["caught_up"] = sorted([describe(await anext(subscription)) for _ in range(3)])
            report["touched"] = [
                text(await client.call_tool(f"{server}__touch", {})) for server in ["a", "b", "d"]
            ]
            # The SDK folds an event into one still waiting in its backlog,
            # so list changes are counted once.
            wanted = [["listed"], ["updated", "rounds://b/data"], ["updated", "rounds://d/data"]]
            events = []
            while any(event not in events for event in wanted):
                event = describe(await anext(subscription))
                if event not in events:
                    events.append(event)
            report["events"] = sorted(events)
    return report


async def legacy(command, config):
    """The initialize handshake: Moat asks the agent with its own
    `elicitation/create` on the server's behalf."""
    async with Client(moat(command, config), mode="legacy", elicitation_callback=elicited) as client:
        return {
            "revision": client.protocol_version,
            "b_ask": text(await client.call_tool("b__ask", {})),
            "d_ask": text(await client.call_tool("d__ask", {})),
            "a_job": text(await client.call_tool("a__job", {"ms": 20})),
        }


async def main(command, config):
    report = {
        "modern": await asyncio.wait_for(modern(command, config), 120),
        "legacy": await asyncio.wait_for(legacy(command, config), 120),
    }
    print(json.dumps(report))


asyncio.run(main(sys.argv[1], sys.argv[2]))

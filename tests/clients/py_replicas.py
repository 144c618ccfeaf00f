"""Many agents at once through HAProxy in front of `moat serve --replica`
processes (tests/replicas.rs): raw HTTP sessions on 2026-07-28 (stateless),
2025-11-25 and 2025-06-18, whose every answer names the replica that gave it
(`Moat-Replica`), beside agents on the official Python SDK (`mcp`).

Each raw agent does a first step that leaves state on one replica (a
parked call, a task, a 2025 session, a subscription) or none (a stateless
call), then waits for all the others. The driver then prints `KILL` and
waits for a line naming the replica the test killed; then every agent does
its second step, which must reach the replica holding its state. An agent
whose state was on the killed replica must fail fast with an answer naming
that replica; every other agent must succeed. Then new agents start, and
all succeed.

usage: python3 py_replicas.py URL AGENTS
Prints one JSON report on stdout.
"""
import asyncio
import json
import sys
import time

import httpx2 as httpx
from mcp import Client, types

URL = sys.argv[1]
AGENTS = int(sys.argv[2])
MODERN = "2026-07-28"
TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
# A failure is fast when it comes this soon after the request.
FAST = 5.0

latencies = []
answers = {"requests": 0, "wrong_replica": []}


class Failed(Exception):
    pass


def payload(response):
    """The JSON-RPC answer: the JSON body, or the SSE event that carries it."""
    kind = response.headers.get("content-type", "")
    if kind.startswith("text/event-stream"):
        found = None
        for line in response.text.splitlines():
            if line.startswith("data:"):
                data = line[5:].strip()
                if data:
                    message = json.loads(data)
                    if "result" in message or "error" in message:
                        found = message
        return found
    if kind.startswith("application/json") and response.content:
        return response.json()
    return None


async def post(http, method, params, *, session=None, revision=MODERN, notify=False, expect=None):
    """One request. `expect`: the replica that must answer (None: any)."""
    body = {"jsonrpc": "2.0", "method": method, "params": params}
    if not notify:
        body["id"] = 1
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": revision,
    }
    if revision == MODERN:
        meta = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientInfo": {"name": "replicas", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        meta.update(params.get("_meta", {}))
        params["_meta"] = meta
        headers["Mcp-Method"] = method
        if "name" in params:
            headers["Mcp-Name"] = params["name"]
        elif "taskId" in params:
            headers["Mcp-Name"] = params["taskId"]
    if session:
        headers["Mcp-Session-Id"] = session
    began = time.monotonic()
    response = await http.post(URL, content=json.dumps(body), headers=headers)
    took = time.monotonic() - began
    latencies.append(took)
    answers["requests"] += 1
    replica = response.headers.get("moat-replica")
    answer = payload(response)
    # Another replica may only say that it does not hold the state.
    refused = f"held by replica `{expect}`" in ((answer or {}).get("error") or {}).get("message", "")
    if expect is not None and replica != expect and not refused:
        answers["wrong_replica"].append([method, expect, replica, response.status_code, response.text[:300]])
    return response, answer, replica, took


def replica_of(id):
    return id.rsplit(".", 1)[1]


def text(answer):
    return "".join(c.get("text", "") for c in answer["result"]["content"])


def failure(what, response, answer, took):
    message = (answer or {}).get("error", {}).get("message") or response.text[:300]
    return {"what": what, "status": response.status_code, "message": message, "seconds": round(took, 3)}


class Agent:
    """One raw agent: `first` leaves its state, `second` needs it."""

    def __init__(self, http, kind, n):
        self.http, self.kind, self.n = http, kind, n
        self.holder = None
        self.state = None

    async def first(self):
        return await getattr(self, f"{self.kind}_first")()

    async def second(self):
        return await getattr(self, f"{self.kind}_second")()

    # A stateless call: no state, any replica.
    async def stateless_first(self):
        response, answer, _, _ = await post(
            self.http, "tools/call", {"name": "wasm__add", "arguments": {"a": self.n, "b": 1}}
        )
        assert response.status_code == 200 and text(answer) == str(self.n + 1), response.text

    async def stateless_second(self):
        node = f"n{self.n % 2}"
        response, answer, _, took = await post(
            self.http, "tools/call", {"name": f"{node}__job", "arguments": {"ms": 1}}
        )
        if response.status_code != 200 or "result" not in (answer or {}):
            raise Failed(failure(node, response, answer, took))
        # Run inline by the server, or as a task the gateway follows for
        # an agent that takes none.
        assert text(answer).startswith(f"{node}: job done"), response.text

    # A call parked at the gateway while an older server asks for input.
    async def parked_first(self):
        response, answer, replica, _ = await post(
            self.http, "tools/call", {"name": "o__ask", "arguments": {"times": 1}}
        )
        assert response.status_code == 200, response.text
        result = answer["result"]
        assert result["resultType"] == "input_required", answer
        self.state = result["requestState"]
        self.holder = replica_of(self.state)
        assert self.holder == replica, (self.state, replica)

    async def parked_second(self):
        name = f"Agent{self.n}"
        response, answer, _, took = await post(
            self.http,
            "tools/call",
            {
                "name": "o__ask",
                "arguments": {"times": 1},
                "inputResponses": {"moat-1": {"action": "accept", "content": {"name": name}}},
                "requestState": self.state,
            },
            expect=self.holder,
        )
        if response.status_code != 200 or "result" not in (answer or {}) or answer["result"].get("isError"):
            raise Failed(failure("parked retry", response, answer, took))
        assert text(answer) == f"o: hello {name} (elicited)", answer

    # A task of a server, followed by id.
    async def task_first(self):
        response, answer, replica, _ = await post(
            self.http,
            "tools/call",
            {"name": "r__job", "arguments": {"ms": 20}, "_meta": {"io.modelcontextprotocol/clientCapabilities": TASKS}},
        )
        assert response.status_code == 200, response.text
        assert answer["result"]["resultType"] == "task", answer
        self.state = answer["result"]["taskId"]
        self.holder = replica_of(self.state)
        assert self.holder == replica, (self.state, replica)

    async def task_second(self):
        while True:
            response, answer, _, took = await post(
                self.http,
                "tasks/get",
                {"taskId": self.state, "_meta": {"io.modelcontextprotocol/clientCapabilities": TASKS}},
                expect=self.holder,
            )
            if response.status_code != 200 or "result" not in (answer or {}):
                raise Failed(failure("tasks/get", response, answer, took))
            status = answer["result"]["status"]
            if status == "completed":
                assert answer["result"]["result"]["content"][0]["text"] == "r: job done", answer
                return
            assert status == "working", answer
            await asyncio.sleep(0.02)

    # A 2025 session: sticky on Mcp-Session-Id.
    async def open_session(self, revision):
        response, answer, replica, _ = await post(
            self.http,
            "initialize",
            {"protocolVersion": revision, "capabilities": {}, "clientInfo": {"name": "replicas", "version": "1"}},
            revision=revision,
        )
        assert response.status_code == 200, response.text
        self.state = response.headers["mcp-session-id"]
        self.holder = replica_of(self.state)
        assert self.holder == replica, (self.state, replica)
        self.revision = answer["result"]["protocolVersion"]
        response, _, _, _ = await post(
            self.http, "notifications/initialized", {}, session=self.state, revision=self.revision, notify=True,
            expect=self.holder,
        )
        assert response.status_code == 202, response.text

    async def session_call(self, name, arguments, expected):
        response, answer, _, took = await post(
            self.http, "tools/call", {"name": name, "arguments": arguments},
            session=self.state, revision=self.revision, expect=self.holder,
        )
        if response.status_code != 200 or "result" not in (answer or {}):
            raise Failed(failure(f"{name} in session", response, answer, took))
        assert text(answer).startswith(expected), answer

    async def session_first(self):
        await self.open_session("2025-11-25" if self.n % 2 else "2025-06-18")
        await self.session_call("wasm__add", {"a": self.n, "b": 3}, str(self.n + 3))
        await self.session_call("o__job", {"ms": 1}, "o: job done")

    async def session_second(self):
        node = f"n{self.n % 2}"
        await self.session_call(f"{node}__job", {"ms": 1}, f"{node}: job done")
        await self.http.delete(URL, headers={"Mcp-Session-Id": self.state, "MCP-Protocol-Version": self.revision})

    # A 2025 session subscribed to a resource: the update arrives on its
    # own stream, from the replica that holds it.
    async def subscribed_first(self):
        await self.open_session("2025-11-25")
        for method, params in [("resources/list", {}), ("resources/subscribe", {"uri": "rounds://r/data"})]:
            response, answer, _, _ = await post(
                self.http, method, params, session=self.state, revision=self.revision, expect=self.holder
            )
            assert response.status_code == 200 and "result" in answer, response.text
        self.events = asyncio.Queue()
        self.stream = asyncio.create_task(self.listen())
        # The stream is open once its first bytes (headers) are in.
        self.stream_replica = await asyncio.wait_for(self.events.get(), 30)

    async def listen(self):
        headers = {"Mcp-Session-Id": self.state, "MCP-Protocol-Version": self.revision, "Accept": "text/event-stream"}
        try:
            async with self.http.stream("GET", URL, headers=headers, timeout=None) as response:
                await self.events.put(response.headers.get("moat-replica"))
                async for line in response.aiter_lines():
                    if line.startswith("data:") and line[5:].strip():
                        await self.events.put(json.loads(line[5:]))
        except httpx.HTTPError as error:
            await self.events.put({"stream_error": str(error)})
        await self.events.put({"stream_ended": time.monotonic()})

    async def subscribed_second(self):
        began = time.monotonic()
        response, answer, _, took = await post(
            self.http, "tools/call", {"name": "r__touch", "arguments": {}},
            session=self.state, revision=self.revision, expect=self.holder,
        )
        if response.status_code != 200 or "result" not in (answer or {}):
            ended = None
            while not self.events.empty():
                event = self.events.get_nowait()
                if isinstance(event, dict) and "stream_ended" in event:
                    ended = event["stream_ended"]
            failed = failure("r__touch in a subscribed session", response, answer, took)
            failed["stream_ended"] = ended is not None
            raise Failed(failed)
        while True:
            event = await asyncio.wait_for(self.events.get(), 30)
            if isinstance(event, dict) and event.get("method") == "notifications/resources/updated":
                assert event["params"]["uri"] == "rounds://r/data", event
                break
            assert not (isinstance(event, dict) and ("stream_ended" in event or "stream_error" in event)), event
        self.stream.cancel()
        await self.http.delete(URL, headers={"Mcp-Session-Id": self.state, "MCP-Protocol-Version": self.revision})
        return time.monotonic() - began


KINDS = ["stateless", "parked", "task", "session", "subscribed"]


async def sdk_agent(n):
    """The official Python SDK through the balancer: on 2026-07-28 it
    drives a parked call's rounds itself (its retry must find the
    replica); on the handshake it holds a session."""
    async def elicited(context, params):
        return types.ElicitResult(action="accept", content={"name": f"Sdk{n}"})

    mode = "auto" if n % 2 else "legacy"
    async with Client(URL, mode=mode, elicitation_callback=elicited) as client:
        asked = await client.call_tool("o__ask", {"times": 2})
        job = await client.call_tool("n1__job", {"ms": 1})
        return {
            "revision": client.protocol_version,
            "ask": "".join(c.text for c in asked.content),
            "job": "".join(c.text for c in job.content),
        }


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] if ordered else None


async def main():
    limits = httpx.Limits(max_connections=AGENTS + 50, max_keepalive_connections=AGENTS + 50)
    report = {}
    async with httpx.AsyncClient(limits=limits, timeout=60) as http:
        agents = [Agent(http, KINDS[n % len(KINDS)], n) for n in range(AGENTS)]
        began = time.monotonic()
        sdk = [asyncio.create_task(sdk_agent(n)) for n in range(10)]
        firsts = await asyncio.gather(*(agent.first() for agent in agents), return_exceptions=True)
        broken = [repr(error) for error in firsts if error is not None]
        assert not broken, broken[:5]
        report["sdk_before"] = await asyncio.gather(*sdk)
        first_done = time.monotonic()
        report["holders"] = {}
        for agent in agents:
            if agent.holder:
                report["holders"][agent.holder] = report["holders"].get(agent.holder, 0) + 1

        print("KILL", flush=True)
        killed = (await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)).split()[1]
        after_kill = time.monotonic()

        outcomes = await asyncio.gather(*(agent.second() for agent in agents), return_exceptions=True)
        second_done = time.monotonic()
        ok, failed, unexpected = 0, [], []
        for agent, outcome in zip(agents, outcomes):
            if isinstance(outcome, Failed):
                entry = dict(outcome.args[0], kind=agent.kind, holder=agent.holder)
                (failed if agent.holder == killed else unexpected).append(entry)
            elif isinstance(outcome, BaseException):
                unexpected.append({"kind": agent.kind, "holder": agent.holder, "error": repr(outcome)})
            elif agent.holder == killed:
                unexpected.append({"kind": agent.kind, "holder": agent.holder, "error": "succeeded on a killed replica"})
            else:
                ok += 1
        report["killed"] = killed
        report["second"] = {"ok": ok, "failed": failed, "unexpected": unexpected}

        # New agents after the kill: every one succeeds, on a live replica.
        fresh = [Agent(http, KINDS[n % len(KINDS)], AGENTS + n) for n in range(30)]
        sdk = [asyncio.create_task(sdk_agent(n)) for n in range(10, 14)]
        for agent in fresh:
            await agent.first()
        await asyncio.gather(*(agent.second() for agent in fresh))
        report["fresh"] = {"agents": len(fresh), "holders": sorted({a.holder for a in fresh if a.holder})}
        report["sdk_after"] = await asyncio.gather(*sdk)

    report["requests"] = answers["requests"]
    report["wrong_replica"] = answers["wrong_replica"]
    report["seconds"] = {
        "first_step": round(first_done - began, 3),
        "second_step": round(second_done - after_kill, 3),
    }
    report["latency_ms"] = {
        "p50": round(percentile(latencies, 0.50) * 1000, 2),
        "p99": round(percentile(latencies, 0.99) * 1000, 2),
        "max": round(max(latencies) * 1000, 2),
    }
    print(json.dumps(report), flush=True)


asyncio.run(main())

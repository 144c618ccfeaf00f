// An agent on the official TypeScript SDK (@modelcontextprotocol/sdk from
// the npm registry; it speaks 2025-11-25 at most) driving `moat serve` over
// stdio in front of four `rounds` servers (`a` and `b` on 2026-07-28, `c`
// on 2025-06-18, `d` on 2025-11-25). It
// takes elicitations and answers every one with the name Ts, so Moat can
// ask it on a server's behalf. Prints one JSON report on stdout for
// tests/real_clients.rs to check.
//
// usage: node ts_rounds.mjs SDK_DIR MOAT CONFIG
import { pathToFileURL } from "node:url";
import path from "node:path";

const [sdk, moat, config] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(sdk, "dist/esm", p)).href);
const { Client } = await load("client/index.js");
const { StdioClientTransport } = await load("client/stdio.js");
const { ElicitRequestSchema, LATEST_PROTOCOL_VERSION, ResourceUpdatedNotificationSchema } =
  await load("types.js");

const transport = new StdioClientTransport({
  command: moat,
  args: ["serve", "--config", config],
  env: {
    PATH: process.env.PATH,
    MOAT_CACHE_DIR: process.env.MOAT_CACHE_DIR ?? "",
    MOAT_STATE_DIR: process.env.MOAT_STATE_DIR ?? "",
  },
  stderr: "inherit",
});
const client = new Client(
  { name: "ts-rounds", version: "1.0.0" },
  { capabilities: { elicitation: { form: {} } } },
);
const asked = [];
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  asked.push(request.params.message);
  const field = request.params.message === "Go on?" ? "go" : "name";
  return { action: "accept", content: { [field]: "Ts" } };
});
const updated = [];
let heard;
const hearing = new Promise((resolve) => (heard = resolve));
client.setNotificationHandler(ResourceUpdatedNotificationSchema, async (notification) => {
  updated.push(notification.params.uri);
  heard();
});
await client.connect(transport);

const text = (result) => result.content.map((c) => c.text ?? "").join("");
const report = {
  revision: LATEST_PROTOCOL_VERSION,
  a_ask: text(await client.callTool({ name: "a__ask", arguments: {} })),
  b_job: text(await client.callTool({ name: "b__job", arguments: { ms: 20 } })),
  // An older server's own elicitation/create, passed on: two rounds.
  c_ask: text(await client.callTool({ name: "c__ask", arguments: { times: 2 } })),
};
await client.listResources();
await client.subscribeResource({ uri: "rounds://d/data" });
report.d_touch = text(await client.callTool({ name: "d__touch", arguments: {} }));
await hearing;
report.updated = updated;

// 2025-11-25's tasks: declared by Moat, and a task of Moat's at the
// agent's request at a server of each revision; `c`'s asks on the way
// (passed on to this agent as it was sent).
report.tasks_capability = client.getServerCapabilities()?.tasks ?? null;
const tools = (await client.listTools()).tools;
report.task_support = [...new Set(tools.map((tool) => tool.execution?.taskSupport ?? "none"))];
for (const [name, args] of [
  ["b__job", { ms: 20 }],
  ["c__job", { ms: 300, confirm: true }],
  ["d__job", { ms: 300 }],
]) {
  const seen = [];
  let outcome;
  const stream = client.experimental.tasks.callToolStream(
    { name, arguments: args },
    undefined,
    { task: { ttl: 60000 } },
  );
  for await (const message of stream) {
    seen.push(message.type);
    if (message.type === "taskCreated") outcome = { id: message.task.taskId };
    if (message.type === "result") outcome.result = text(message.result);
    if (message.type === "error") outcome.error = message.error.message;
  }
  outcome.id = outcome.id.startsWith(name.split("__")[0] + "__");
  report[name] = { seen: [...new Set(seen)], ...outcome };
}
// One to cancel: the call stops at the server.
const long = client.experimental.tasks.callToolStream(
  { name: "d__job", arguments: { ms: 600000 } },
  undefined,
  { task: { ttl: 60000 } },
);
const created = (await long.next()).value;
const cancelled = await client.experimental.tasks.cancelTask(created.task.taskId);
report.cancelled = cancelled.status;
report.listed = (await client.experimental.tasks.listTasks()).tasks.map((task) => task.status).sort();
report.asked = asked;
await client.close();
console.log(JSON.stringify(report));

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
import { tasks2025 } from "./ts_tasks.mjs";

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

Object.assign(report, await tasks2025(client));
report.asked = asked;
await client.close();
console.log(JSON.stringify(report));

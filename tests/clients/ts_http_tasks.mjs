// The official TypeScript SDK on 2025-11-25 over streamable HTTP against
// `moat serve --http` in front of the `rounds` servers: 2025-11-25's
// experimental tasks (ts_tasks.mjs). It answers every elicitation as
// ts_rounds.mjs does. Prints one JSON report on stdout.
//
// usage: node ts_http_tasks.mjs SDK_DIR URL TOKEN
import { pathToFileURL } from "node:url";
import path from "node:path";
import { tasks2025 } from "./ts_tasks.mjs";

const [sdk, url, token] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(sdk, "dist/esm", p)).href);
const { Client } = await load("client/index.js");
const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");
const { ElicitRequestSchema } = await load("types.js");

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client(
  { name: "ts-http-tasks", version: "1.0.0" },
  { capabilities: { elicitation: { form: {} } } },
);
const asked = [];
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  asked.push(request.params.message);
  return { action: "accept", content: { go: "Ts" } };
});
await client.connect(transport);
const report = await tasks2025(client);
report.asked = asked;
await client.close();
console.log(JSON.stringify(report));

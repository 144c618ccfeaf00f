// An agent on the official TypeScript SDK (@modelcontextprotocol/sdk; it
// speaks 2025-11-25 at most) through HAProxy in front of `moat serve
// --replica` processes (tests/replicas.rs): its session is sticky on its
// Mcp-Session-Id, it answers the older server's elicitation (Moat asks it
// on the server's behalf, inside the session), subscribes to a resource
// and hears its update on its own stream, and calls a node's profile.
// Prints one JSON report on stdout.
//
// usage: node ts_replicas.mjs SDK_DIR URL
import { pathToFileURL } from "node:url";
import path from "node:path";

const [sdk, url] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(sdk, "dist/esm", p)).href);
const { Client } = await load("client/index.js");
const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");
const { ElicitRequestSchema, ResourceUpdatedNotificationSchema } = await load("types.js");

const transport = new StreamableHTTPClientTransport(new URL(url));
const client = new Client(
  { name: "ts-replicas", version: "1.0.0" },
  { capabilities: { elicitation: { form: {} } } },
);
client.setRequestHandler(ElicitRequestSchema, async () => ({
  action: "accept",
  content: { name: "Ts" },
}));
let heard;
const hearing = new Promise((resolve) => (heard = resolve));
client.setNotificationHandler(ResourceUpdatedNotificationSchema, async (notification) => {
  heard(notification.params.uri);
});
await client.connect(transport);
const text = (result) => result.content.map((c) => c.text ?? "").join("");
const report = {
  session: transport.sessionId,
  revision: transport.protocolVersion ?? null,
  ask: text(await client.callTool({ name: "o__ask", arguments: { times: 2 } })),
  job: text(await client.callTool({ name: "n0__job", arguments: { ms: 1 } })),
};
await client.listResources();
await client.subscribeResource({ uri: "rounds://r/data" });
report.touch = text(await client.callTool({ name: "r__touch", arguments: {} }));
report.updated = await hearing;
await client.close();
console.log(JSON.stringify(report));

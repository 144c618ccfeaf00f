// The official TypeScript SDK over streamable HTTP against `moat serve
// --http`: lists tools across a wasm and a native server, calls both,
// receives progress, and cancels a long call.
//
// usage: node ts_http_agent.mjs SDK_DIR URL [TOKEN]
import { pathToFileURL } from "node:url";
import path from "node:path";

const [sdk, url, token] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(sdk, "dist/esm", p)).href);
const { Client } = await load("client/index.js");
const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");

const headers = token ? { Authorization: `Bearer ${token}` } : {};
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
const client = new Client({ name: "ts-http-agent", version: "1.0.0" });
await client.connect(transport);
const text = (result) => result.content.map((c) => c.text).join("");
const report = {
  tools: (await client.listTools()).tools.map((t) => t.name).sort(),
  wasm_add: text(await client.callTool({ name: "wasm__add", arguments: { a: 2, b: 40 } })),
  native_add: text(await client.callTool({ name: "native__add", arguments: { a: 1, b: 2 } })),
};
const progress = [];
const done = await client.callTool(
  { name: "native__progress", arguments: { steps: 3, interval_ms: 50 } },
  undefined,
  { onprogress: (p) => progress.push([p.progress, p.total]) },
);
report.progress = progress;
report.progress_result = text(done);
const abort = new AbortController();
const long = client.callTool(
  { name: "wasm__sleep", arguments: { ms: 60000 } },
  undefined,
  { signal: abort.signal },
);
setTimeout(() => abort.abort("the agent changed its mind"), 500);
try {
  await long;
  report.cancelled = false;
} catch (error) {
  report.cancelled = true;
}
report.after_cancel = text(await client.callTool({ name: "wasm__echo", arguments: { message: "still here" } }));
await client.close();
console.log(JSON.stringify(report));

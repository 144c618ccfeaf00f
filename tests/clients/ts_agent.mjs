// An agent built on the official TypeScript SDK (@modelcontextprotocol/sdk
// from the npm registry), driving `moat serve` over stdio. Prints one JSON
// report on stdout for tests/real_clients.rs to check.
//
// usage: node ts_agent.mjs SDK_DIR MOAT CONFIG
import { pathToFileURL } from "node:url";
import path from "node:path";

const [sdk, moat, config] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(sdk, "dist/esm", p)).href);
const { Client } = await load("client/index.js");
const { StdioClientTransport } = await load("client/stdio.js");

const transport = new StdioClientTransport({
  command: moat,
  args: ["serve", "--config", config, ...(process.env.MOAT_AUDIT ? ["--audit", process.env.MOAT_AUDIT] : [])],
  env: { PATH: process.env.PATH, MOAT_CACHE_DIR: process.env.MOAT_CACHE_DIR ?? "" },
  stderr: "inherit",
});
const client = new Client({ name: "ts-agent", version: "1.0.0" });
await client.connect(transport);

const report = {};
report.tools = (await client.listTools()).tools.map((t) => t.name).sort();
const text = (result) => result.content.map((c) => c.text).join("");
report.wasm_add = text(await client.callTool({ name: "wasm__add", arguments: { a: 2, b: 40 } }));
report.native_add = text(await client.callTool({ name: "native__add", arguments: { a: 1, b: 2 } }));

const progress = [];
const done = await client.callTool(
  // Spaced out: the SDK dispatches notifications a tick after responses, so
  // progress sent right before the answer can arrive after it is settled.
  { name: "wasm__progress", arguments: { steps: 3, interval_ms: 50 } },
  undefined,
  { onprogress: (p) => progress.push([p.progress, p.total]) },
);
report.progress = progress;
report.progress_result = text(done);

// Cancel a long call while the server is busy with it (half a second in),
// then keep going.
const abort = new AbortController();
const long = client.callTool(
  { name: "native__sleep", arguments: { ms: 60000 } },
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
report.after_cancel = text(await client.callTool({ name: "native__echo", arguments: { message: "still here" } }));

await client.close();
console.log(JSON.stringify(report));

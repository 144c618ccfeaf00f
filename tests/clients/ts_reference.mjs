// The official TypeScript SDK drives `moat serve` in front of the reference
// servers (mcp-server-time under this machine's Python, server-everything
// under node), each under `sandbox = "required"`. Prints one JSON report on
// stdout for tests/real_clients.rs to check, shaped as py_reference.py's.
//
// usage: node ts_reference.mjs SDK_DIR MOAT CONFIG
import { pathToFileURL } from "node:url";
import path from "node:path";

const [sdk, moat, config] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(sdk, "dist/esm", p)).href);
const { Client } = await load("client/index.js");
const { StdioClientTransport } = await load("client/stdio.js");

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
const client = new Client({ name: "ts-reference", version: "1.0.0" });
await client.connect(transport);
const text = (result) => result.content.map((c) => c.text ?? "").join("");
const tools = (await client.listTools()).tools.map((t) => t.name).sort();
const now = await client.callTool({ name: "time__get_current_time", arguments: { timezone: "UTC" } });
const echo = await client.callTool({ name: "everything__echo", arguments: { message: "through moat" } });
await client.close();
console.log(JSON.stringify({
  tools,
  time_error: Boolean(now.isError),
  time: JSON.parse(text(now)),
  echo: text(echo),
}));

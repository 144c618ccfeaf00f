// The official TypeScript SDK drives `moat serve --locked` over stdio: it
// lists every tool, then makes each call in CALLS (a JSON array of
// {name, arguments}) in order. Prints one JSON report on stdout:
// {tools: [names, sorted], results: [{isError, text}]}; a call the SDK
// itself rejects is reported as {isError: true, text: its message}.
// Variables named in PASS_ENV (comma-separated) reach `moat serve` too (a
// node's token, say).
//
// usage: node ts_calls.mjs SDK_DIR MOAT CONFIG CALLS
import { pathToFileURL } from "node:url";
import path from "node:path";

const [sdk, moat, config, calls] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(sdk, "dist/esm", p)).href);
const { Client } = await load("client/index.js");
const { StdioClientTransport } = await load("client/stdio.js");

const transport = new StdioClientTransport({
  command: moat,
  args: ["serve", "--locked", "--config", config],
  env: {
    PATH: process.env.PATH,
    HOME: process.env.HOME ?? "",
    MOAT_CACHE_DIR: process.env.MOAT_CACHE_DIR ?? "",
    MOAT_STATE_DIR: process.env.MOAT_STATE_DIR ?? "",
    ...Object.fromEntries(
      (process.env.PASS_ENV ?? "")
        .split(",")
        .filter((name) => name && process.env[name] !== undefined)
        .map((name) => [name, process.env[name]]),
    ),
  },
  stderr: "inherit",
});
const client = new Client({ name: "ts-calls", version: "1.0.0" });
await client.connect(transport);
const tools = (await client.listTools()).tools.map((t) => t.name).sort();
const results = [];
for (const call of JSON.parse(calls)) {
  try {
    const result = await client.callTool(call, undefined, { timeout: 120000 });
    results.push({
      isError: Boolean(result.isError),
      text: result.content.map((c) => c.text ?? "").join(""),
    });
  } catch (error) {
    results.push({ isError: true, text: String(error) });
  }
}
await client.close();
console.log(JSON.stringify({ tools, results }));

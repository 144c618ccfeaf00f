// The official TypeScript SDK over streamable HTTP against `moat serve
// --http`: lists tools across a wasm and a native server and calls both.
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
await client.close();
console.log(JSON.stringify(report));

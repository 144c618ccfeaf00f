// The official TypeScript SDK over streamable HTTP against `moat serve
// --http`: lists tools across a wasm and a native server, calls both,
// receives progress, and cancels a long call.
//
// usage: node ts_http_agent.mjs SDK_DIR URL [TOKEN]
import { pathToFileURL } from "node:url";
import path from "node:path";
import { exercise } from "./ts_exercise.mjs";

const [sdk, url, token] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(sdk, "dist/esm", p)).href);
const { Client } = await load("client/index.js");
const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");

const headers = token ? { Authorization: `Bearer ${token}` } : {};
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
const client = new Client({ name: "ts-http-agent", version: "1.0.0" });
await client.connect(transport);
const report = await exercise(client, "native", "wasm");
await client.close();
console.log(JSON.stringify(report));

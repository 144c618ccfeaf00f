// An agent built on the official TypeScript SDK (@modelcontextprotocol/sdk
// from the npm registry), driving `moat serve` over stdio. Prints one JSON
// report on stdout for tests/real_clients.rs to check.
//
// usage: node ts_agent.mjs SDK_DIR MOAT CONFIG
import { pathToFileURL } from "node:url";
import path from "node:path";
import { exercise } from "./ts_exercise.mjs";

const [sdk, moat, config] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(sdk, "dist/esm", p)).href);
const { Client } = await load("client/index.js");
const { StdioClientTransport } = await load("client/stdio.js");

const transport = new StdioClientTransport({
  command: moat,
  args: ["serve", "--config", config, ...(process.env.MOAT_AUDIT ? ["--audit", process.env.MOAT_AUDIT] : [])],
  env: {
    PATH: process.env.PATH,
    MOAT_CACHE_DIR: process.env.MOAT_CACHE_DIR ?? "",
    MOAT_STATE_DIR: process.env.MOAT_STATE_DIR ?? "",
  },
  stderr: "inherit",
});
const client = new Client({ name: "ts-agent", version: "1.0.0" });
await client.connect(transport);

const report = await exercise(client, "wasm", "native");
await client.close();
console.log(JSON.stringify(report));

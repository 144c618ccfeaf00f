// Builds this guest with componentize-js (installed by tests/setup.sh):
//   node build.mjs COMPONENTIZE_JS_DIR OUT.wasm
// Run from this directory by crates/test-guests/build.rs.
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [componentizeDir, out] = process.argv.slice(2);
const { componentize } = await import(
  pathToFileURL(join(componentizeDir, "src", "componentize.js")).href
);
const { component } = await componentize(await readFile("tools.js", "utf8"), {
  witPath: "wit",
  worldName: "js-tools",
  // No WASI beyond what the engine itself needs.
  disableFeatures: ["http", "random", "stdio", "clocks", "fetch-event"],
});
await writeFile(out, component);

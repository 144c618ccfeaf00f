// What every TypeScript agent asks of `moat serve`, whatever the transport:
// list tools across a wasm and a native server, call both, receive progress
// from `progressOn`, and cancel a long call on `cancelOn` half a second in,
// then keep going. Returns the report tests/real_clients.rs checks.
export async function exercise(client, progressOn, cancelOn) {
  const text = (result) => result.content.map((c) => c.text).join("");
  const report = {};
  report.tools = (await client.listTools()).tools.map((t) => t.name).sort();
  report.wasm_add = text(await client.callTool({ name: "wasm__add", arguments: { a: 2, b: 40 } }));
  report.native_add = text(await client.callTool({ name: "native__add", arguments: { a: 1, b: 2 } }));

  const progress = [];
  const done = await client.callTool(
    // Spaced out: the SDK dispatches notifications a tick after responses, so
    // progress sent right before the answer can arrive after it is settled.
    { name: `${progressOn}__progress`, arguments: { steps: 3, interval_ms: 50 } },
    undefined,
    { onprogress: (p) => progress.push([p.progress, p.total]) },
  );
  report.progress = progress;
  report.progress_result = text(done);

  const abort = new AbortController();
  const long = client.callTool(
    { name: `${cancelOn}__sleep`, arguments: { ms: 60000 } },
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
  report.after_cancel = text(
    await client.callTool({ name: `${cancelOn}__echo`, arguments: { message: "still here" } }),
  );
  return report;
}

// 2025-11-25's experimental tasks through `moat serve`, whatever the
// transport, in front of the `rounds` servers of tests/real_clients.rs
// (`b` on 2026-07-28, `c` on 2025-06-18, `d` on 2025-11-25): Moat declares
// them, makes a task of its own at the agent's request at a server of each
// revision (`c` asks on the way, which the agent's elicitation handler
// answers), lists them, and cancels one. Returns the report's part.
export async function tasks2025(client) {
  const text = (result) => result.content.map((c) => c.text ?? "").join("");
  const report = {};
  report.tasks_capability = client.getServerCapabilities()?.tasks ?? null;
  const tools = (await client.listTools()).tools;
  report.task_support = [...new Set(tools.map((tool) => tool.execution?.taskSupport ?? "none"))];
  for (const [name, args] of [
    ["b__job", { ms: 20 }],
    ["c__job", { ms: 300, confirm: true }],
    ["d__job", { ms: 300 }],
  ]) {
    const seen = [];
    let outcome;
    const stream = client.experimental.tasks.callToolStream(
      { name, arguments: args },
      undefined,
      { task: { ttl: 60000 } },
    );
    for await (const message of stream) {
      seen.push(message.type);
      if (message.type === "taskCreated") outcome = { id: message.task.taskId };
      if (message.type === "result") outcome.result = text(message.result);
      if (message.type === "error") outcome.error = message.error.message;
    }
    outcome.id = outcome.id.startsWith(name.split("__")[0] + "__");
    report[name] = { seen: [...new Set(seen)], ...outcome };
  }
  // One to cancel: the call stops at the server.
  const long = client.experimental.tasks.callToolStream(
    { name: "d__job", arguments: { ms: 600000 } },
    undefined,
    { task: { ttl: 60000 } },
  );
  const created = (await long.next()).value;
  const cancelled = await client.experimental.tasks.cancelTask(created.task.taskId);
  report.cancelled = cancelled.status;
  report.listed = (await client.experimental.tasks.listTasks()).tasks.map((task) => task.status).sort();
  return report;
}

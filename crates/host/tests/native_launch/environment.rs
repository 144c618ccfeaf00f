//! What a native server's sandbox gives it and takes back: the base
//! environment and nothing else, limits ordinary runtimes run under, its own
//! /proc/self, and no process left after close.

use super::*;

/// Host pids of live processes whose argv holds `token`.
fn processes_with(token: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            (running(pid) && String::from_utf8_lossy(&cmdline).contains(token)).then_some(pid)
        })
        .collect()
}

#[tokio::test]
async fn children_and_grandchildren_are_gone_after_close() {
    let mut spec = ServerSpec::native("fork-tree", guests::FORK_TREE_NATIVE);
    spec.allow_unmeasured = true;
    spec.limits.close_grace_ms = 200;
    // The server's /proc is its own PID namespace's: its processes are
    // found on the host by a token in their argv.
    let token = format!("moat-fork-tree-{}", std::process::id());
    spec.args = vec![token.clone()];
    let session = host().connect(&spec).await.unwrap();
    let result = session.call_tool("attack", None).await.unwrap();
    let answered: Vec<u32> = text(&result)
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(answered.len(), 2, "child and grandchild");
    let pids = processes_with(&token);
    assert_eq!(
        pids.len(),
        3,
        "the server, its child and grandchild: {pids:?}"
    );
    for pid in &pids {
        assert!(running(*pid), "{pid} should be running before close");
    }
    session.close().await.unwrap();
    for pid in &pids {
        assert!(!running(*pid), "{pid} outlived the session");
    }
}

/// Issue 33: a native server gets a small base environment and nothing
/// else of Moat's: a system `PATH` behind its interpreter's directory, a
/// private writable `HOME`, `TMPDIR`, `LANG=C.UTF-8`; the config's `env`
/// over it. The evidence says so.
#[tokio::test]
async fn a_native_server_gets_the_base_environment_and_nothing_else() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let interpreter = std::fs::canonicalize(python()).unwrap();
    let path = dir.path().join("env.py");
    std::fs::write(
        &path,
        format!(
            r#"#!{} -u
import json, os, sys
home = os.environ.get("HOME")
try:
    with open(os.path.join(home, ".probe"), "w") as f:
        f.write("x")
    written = True
except Exception as e:
    written = repr(e)
report = json.dumps({{"env": dict(os.environ), "home_written": written}})
for line in sys.stdin:
    message = json.loads(line)
    method, ident = message.get("method"), message.get("id")
    if method == "initialize":
        result = {{"protocolVersion": "2025-06-18", "capabilities": {{"tools": {{}}}}, "serverInfo": {{"name": "env", "version": "1"}}}}
    elif method == "tools/list":
        result = {{"tools": [{{"name": "env", "description": report, "inputSchema": {{"type": "object"}}}}]}}
    else:
        continue
    print(json.dumps({{"jsonrpc": "2.0", "id": ident, "result": result}}), flush=True)
"#,
            interpreter.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut spec = pinned("env", &path, digest_of(&path));
    spec.env.values.insert("MOAT_GIVEN".into(), "1".into());
    let session = host().connect(&spec).await.unwrap();
    let tools = session.list_tools().await.unwrap();
    let report: serde_json::Value =
        serde_json::from_str(tools[0].description.as_deref().unwrap()).unwrap();
    let env = report["env"].as_object().unwrap();
    let mut names: Vec<&str> = env.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(
        names,
        ["HOME", "LANG", "MOAT_GIVEN", "PATH", "TMPDIR"],
        "{report}"
    );
    assert_eq!(env["LANG"], "C.UTF-8");
    // The interpreter's directory first, unless it is a system directory
    // already (a Moat running as nobody finds /usr/bin/python3).
    let interpreter_dir = interpreter.parent().unwrap().display().to_string();
    let path = if native::SYSTEM_PATH
        .split(':')
        .any(|dir| dir == interpreter_dir)
    {
        native::SYSTEM_PATH.to_owned()
    } else {
        format!("{interpreter_dir}:{}", native::SYSTEM_PATH)
    };
    assert_eq!(env["PATH"], path);
    assert_eq!(env["TMPDIR"], "/tmp");
    let own_root = session
        .identity()
        .unwrap()
        .sandbox
        .lines()
        .iter()
        .any(|l| l.starts_with("enforced: own root:"));
    assert_eq!(
        env["HOME"],
        if own_root { "/tmp/home" } else { "/tmp" },
        "{report}"
    );
    assert_eq!(report["home_written"], true, "{report}");
    let lines = session.identity().unwrap().sandbox.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("enforced: environment: ")
                && l.contains(" LANG=C.UTF-8 ")
                && l.contains(", and the config's MOAT_GIVEN; nothing else")),
        "{lines:?}"
    );
    session.close().await.unwrap();
    // The home went with the server's private /tmp.
    assert!(!Path::new("/tmp/home/.probe").exists());
}

/// Issue 33: the default limits let ordinary runtimes run. Node reserves
/// about 10 GiB of address space for one WebAssembly memory (its `fetch`
/// makes one), which RLIMIT_AS at 8 GiB refused; RLIMIT_DATA bounds what a
/// server uses without counting reservations.
#[tokio::test]
async fn node_makes_a_webassembly_memory_under_the_default_limits() {
    let Some(node) = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("node"))
            .find(|candidate| candidate.is_file())
    }) else {
        panic!("node is not on PATH: run tests/setup.sh");
    };
    let node = std::fs::canonicalize(node).unwrap();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("server.js");
    std::fs::write(
        &path,
        format!(
            r#"#!{}
let report;
try {{ new WebAssembly.Memory({{ initial: 1 }}); report = "made"; }} catch (e) {{ report = String(e); }}
require("readline").createInterface({{ input: process.stdin }}).on("line", (line) => {{
  const m = JSON.parse(line);
  let result;
  if (m.method === "initialize") result = {{ protocolVersion: "2025-06-18", capabilities: {{ tools: {{}} }}, serverInfo: {{ name: "node", version: "1" }} }};
  else if (m.method === "tools/list") result = {{ tools: [{{ name: "wasm", description: report, inputSchema: {{ type: "object" }} }}] }};
  else return;
  process.stdout.write(JSON.stringify({{ jsonrpc: "2.0", id: m.id, result }}) + "\n");
}});
"#,
            node.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let spec = pinned("node", &path, digest_of(&path));
    assert_eq!(spec.limits.address_space_bytes, u64::MAX);
    let session = host().connect(&spec).await.unwrap();
    let tools = session.list_tools().await.unwrap();
    assert_eq!(tools[0].description.as_deref(), Some("made"));
    session.close().await.unwrap();
}

/// A process the server starts reads its own /proc/self, as the server
/// does (a Go binary behind a node launcher reads /proc/self/cgroup as it
/// starts): in a root of the server's own, /proc is its PID namespace's,
/// readable, and shows no process but the server's own.
#[tokio::test]
async fn a_process_the_server_starts_reads_its_own_proc_self() {
    let mut spec = ServerSpec::native("probe", guests::PROBE_NATIVE);
    spec.allow_unmeasured = true;
    let session = host().connect(&spec).await.unwrap();
    let run = |argv: &[&str]| {
        let arguments = serde_json::json!({"op": "exec", "argv": argv});
        let session = &session;
        async move {
            let result = session
                .call_tool("attack", arguments.as_object().cloned())
                .await
                .unwrap();
            serde_json::from_str::<serde_json::Value>(&text(&result)).unwrap()
        }
    };
    let cgroup = run(&["cat", "/proc/self/cgroup"]).await;
    assert_eq!(cgroup["ok"], true, "{cgroup}");
    let status = run(&["cat", "/proc/self/status"]).await;
    assert!(
        status["data"].as_str().unwrap().contains("Name:\tcat"),
        "{status}"
    );
    // Its own processes only: the server (PID 1) and this `ls`.
    let listed = run(&["ls", "/proc"]).await;
    let pids: Vec<&str> = listed["data"]
        .as_str()
        .unwrap()
        .lines()
        .filter(|name| name.chars().all(|c| c.is_ascii_digit()))
        .collect();
    assert_eq!(pids.len(), 2, "{listed}");
    assert!(pids.contains(&"1"), "{listed}");
    session.close().await.unwrap();
}

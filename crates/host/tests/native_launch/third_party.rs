//! Servers nobody here wrote: the npm registry's reference server under
//! node, and a server whose `server/discover` answer cannot be read, spoken
//! to with `initialize`.

use super::*;

/// The npm registry's reference server, installed by `tests/setup.sh`, run
/// under node with the interpreter pinned and the package measured.
#[tokio::test]
async fn a_real_mcp_server_from_npm_runs_under_node() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let package = root.join("target/npm/node_modules/@modelcontextprotocol/server-everything");
    assert!(
        package.join("dist/index.js").exists(),
        "{} is missing: run `bash tests/setup.sh` (the README's test command does)",
        package.display()
    );
    let node = resolve("node", Path::new("/"), std::env::var_os("PATH").as_deref())
        .expect("node on PATH (tests/setup.sh installs it)");
    let mut spec = ServerSpec::native("everything-js", "node");
    spec.sha256 = Some(digest_of(&node.target));
    spec.args = vec![
        package.join("dist/index.js").to_str().unwrap().into(),
        "stdio".into(),
    ];
    if let moat_host::ServerKind::Native { measure, .. } = &mut spec.kind {
        measure.push(package.join("dist"));
    }
    // Under the (default, required) sandbox the server reads only what it is
    // granted: its dependencies, read-only.
    spec.dirs = vec![moat_host::config::DirGrant {
        host: root.join("target/npm/node_modules"),
        guest: String::new(),
        mode: moat_host::config::DirMode::Ro,
        inode: None,
    }];
    let session = host().connect(&spec).await.unwrap();
    let identity = session.identity().unwrap();
    assert_eq!(identity.evidence, Evidence::NativeMeasured);
    assert_eq!(identity.measured.len(), 1);
    assert!(
        identity
            .sandbox
            .lines()
            .iter()
            .any(|l| l.starts_with("enforced: filesystem (Landlock")),
        "{:?}",
        identity.sandbox
    );
    assert!(identity.sandbox.kernel_filesystem, "{:?}", identity.sandbox);
    let tools = session.list_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "echo"), "{tools:?}");
    let echoed = session
        .call_tool(
            "echo",
            serde_json::json!({"message": "through moat"})
                .as_object()
                .cloned(),
        )
        .await
        .unwrap();
    assert!(text(&echoed).contains("through moat"), "{}", text(&echoed));
    session.close().await.unwrap();
}

/// A server that answers `server/discover` in a shape that cannot be read
/// as a discover result (an early draft's `versions`) is started again and
/// spoken to with `initialize`, instead of failing the handshake. (A draft
/// answer that only lacks `ttlMs` and `cacheScope`, as Google's MCP Toolbox
/// 1.12 gives, is read as a discover result: `transport.rs` unit tests and
/// `tests/third_party.rs`.)
#[tokio::test]
async fn a_server_whose_discover_answer_cannot_be_read_is_spoken_to_with_initialize() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let script = dir.path().join("draft-discover");
    std::fs::write(
        &script,
        r#"#!/usr/bin/python3
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    method, id = message.get("method"), message.get("id")
    if id is None:
        continue
    if method == "server/discover":
        result = {"resultType": "complete", "versions": ["2025-11-25", "2026-07-28"],
                  "capabilities": {"tools": {}},
                  "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "draft", "version": "1"}}}
    elif method == "initialize":
        result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "draft", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "hello", "inputSchema": {"type": "object"}}]}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": "hello from initialize"}]}
    else:
        result = {}
    print(json.dumps({"jsonrpc": "2.0", "id": id, "result": result}), flush=True)
"#,
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut spec = ServerSpec::native("draft", script.display().to_string());
    spec.allow_unmeasured = true;
    let session = host().connect(&spec).await.unwrap();
    assert_eq!(session.protocol_version().as_deref(), Some("2025-11-25"));
    let answer = session.call_tool("hello", None).await.unwrap();
    assert_eq!(text(&answer), "hello from initialize");
    session.close().await.unwrap();
    // Asked for server/discover only, the same answer is an error naming it.
    let error = host()
        .connect_with(&spec, moat_host::Handshake::Discover)
        .await
        .err()
        .expect("discover only")
        .to_string();
    assert!(
        error.contains("its answer to server/discover is not a discover result Moat can read"),
        "{error}"
    );
}

//! Issue 33: what Moat's egress refuses a native server is recorded in the
//! audit chain.

use super::*;

/// Issue 33 items 5 and 6: what Moat's egress refuses a native server is a
/// record in the audit chain (`egress_refused`, naming server, destination
/// and why): here an unlisted name asked of Moat's DNS, and the proxy asked
/// for an unlisted destination; each distinct refusal once. A refusal the
/// server's own error shows (a download that found no network, a write
/// to a read-only grant) is a `sandbox_refused` record.
#[tokio::test]
async fn egress_refusals_are_recorded_in_the_audit_log() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let notes = dir.path().canonicalize().unwrap().join("notes");
    std::fs::create_dir(&notes).unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.probe]\ncommand = {:?}\nallow_unmeasured = true\nnet = [\"127.0.0.1:9\"]\n\
             [[servers.probe.dirs]]\nhost = {:?}\nmode = \"ro\"\n\
             [servers.fetcher]\ncommand = \"/bin/sh\"\nallow_unmeasured = true\n\
             args = [\"-c\", \"echo 'getaddrinfo EAI_AGAIN pypi.org' >&2; exit 1\"]\n",
            guests::PROBE_NATIVE,
            notes.display().to_string(),
        ),
    )
    .unwrap();
    let audit = dir.path().join("audit.jsonl");
    let mut child = serve_stdio_with(
        &config,
        &["--audit".as_ref(), audit.as_ref()],
        Stdio::inherit(),
    );
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let agent = ().serve((stdout, stdin)).await.expect("initialize");
    // `fetcher` fails to start, reaching for the network at start-up.
    let names: Vec<String> = agent
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(
        names.contains(&"probe__attack".to_owned())
            && !names.iter().any(|n| n.starts_with("fetcher__")),
        "{names:?}"
    );
    let attempt = |arguments: serde_json::Value| {
        let agent = &agent;
        async move {
            let mut params = CallToolRequestParams::new("probe__attack");
            params.arguments = arguments.as_object().cloned();
            let result = agent.call_tool(params).await.unwrap();
            serde_json::to_value(&result.content).unwrap()[0]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    for _ in 0..2 {
        let resolved =
            attempt(serde_json::json!({"op": "resolve", "addr": "exfil.example:443"})).await;
        assert!(resolved.contains("Name or service not known"), "{resolved}");
    }
    let proxied = attempt(serde_json::json!({"op": "proxy", "addr": "203.0.113.9:443"})).await;
    assert!(proxied.contains("403 Forbidden"), "{proxied}");
    // Issue 33 items 6 and 10: a tool's error that shows a refusal (here a
    // download at run time that found no network) carries Moat's line.
    let mut params = CallToolRequestParams::new("probe__attack");
    params.arguments = serde_json::json!({"op": "exec", "tool_error": true, "argv": [
        "/bin/sh", "-c",
        "echo 'npm error request to https://registry.npmjs.org/turndown failed, reason: getaddrinfo EAI_AGAIN registry.npmjs.org' >&2; exit 1"
    ]})
    .as_object()
    .cloned();
    let failed = agent.call_tool(params).await.unwrap();
    assert_eq!(failed.is_error, Some(true));
    let texts: Vec<String> = failed
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(
        texts[1].starts_with("moat: the server tried to reach the network (registry.npmjs.org), which the native sandbox refuses"),
        "{texts:?}"
    );
    // A write refused under a read-only grant: the line names the entry to
    // change.
    let mut params = CallToolRequestParams::new("probe__attack");
    params.arguments = serde_json::json!({"op": "exec", "tool_error": true, "argv": [
        "/bin/sh", "-c",
        format!("echo \"Error: EROFS: read-only file system, open '{}/today.md'\" >&2; exit 1", notes.display())
    ]})
    .as_object()
    .cloned();
    let failed = agent.call_tool(params).await.unwrap();
    let texts: Vec<String> = failed
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    let read_only = format!(
        "{} is granted read-only: if the server is to write there, change that entry to `[[servers.probe.dirs]] host = {:?} mode = \"rw\"`",
        notes.display(),
        notes.display().to_string()
    );
    assert!(
        texts.len() == 2
            && texts[1].starts_with("moat: the native sandbox may be the cause")
            && texts[1].contains(&read_only),
        "{texts:?}"
    );
    // A tool's error that shows no refusal is left as the server wrote it.
    let mut params = CallToolRequestParams::new("probe__attack");
    params.arguments =
        serde_json::json!({"op": "read", "path": "relative/path", "tool_error": true})
            .as_object()
            .cloned();
    let plain = agent.call_tool(params).await.unwrap();
    assert_eq!((plain.is_error, plain.content.len()), (Some(true), 1));
    agent.cancel().await.unwrap();
    let status = child.wait().await.unwrap();
    assert!(status.success(), "moat serve exited with {status}");
    moat_host::audit::verify(&audit, &common::audit_key()).unwrap();
    let events: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .collect();
    // Each refusal a tool's error showed, once, and not the plain error.
    let seen: Vec<(String, String, String, String)> = events
        .iter()
        .filter(|e| e["event"] == "sandbox_refused")
        .map(|e| {
            let field = |name: &str| e[name].as_str().unwrap().to_owned();
            (
                field("server"),
                field("during"),
                field("kind"),
                field("subject"),
            )
        })
        .collect();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(
        seen[..2],
        [
            (
                "fetcher".to_owned(),
                "start".to_owned(),
                "network".to_owned(),
                "pypi.org".to_owned()
            ),
            (
                "probe".to_owned(),
                "tools/call attack".to_owned(),
                "network".to_owned(),
                "registry.npmjs.org".to_owned()
            )
        ]
    );
    assert!(
        seen[2].0 == "probe" && seen[2].2 == "filesystem" && seen[2].3.contains(&read_only),
        "{seen:?}"
    );
    let refused: Vec<(String, String, String)> = events
        .iter()
        .filter(|e| e["event"] == "egress_refused")
        .map(|e| {
            let field = |name: &str| e[name].as_str().unwrap().to_owned();
            (field("server"), field("destination"), field("reason"))
        })
        .collect();
    assert_eq!(
        refused,
        [
            (
                "probe".to_owned(),
                "exfil.example".to_owned(),
                "not in this server's net grants (DNS answered NXDOMAIN)".to_owned()
            ),
            (
                "probe".to_owned(),
                "203.0.113.9:443".to_owned(),
                "not in this server's net grants (proxy answered 403)".to_owned()
            ),
        ]
    );
}

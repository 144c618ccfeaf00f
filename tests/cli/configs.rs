//! Writing configs: `inspect` and `import` of client configs (escaping what
//! they hold), a Wassette policy imported with the same grants, and `moat add`.

use super::*;

#[test]
fn inspect_reports_every_server_and_import_converts_client_configs() {
    let output = moat(&["inspect", "--json", "--config", "examples/moat.toml"]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let reports: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let servers: Vec<&str> = reports
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["server"].as_str().unwrap())
        .collect();
    assert_eq!(servers, ["everything", "everything-native"]);
    assert_eq!(reports[0]["evidence"], "wasm-measured");
    assert_eq!(reports[1]["evidence"], "native-unmeasured");
    assert_eq!(reports[1]["limits"]["cpu_seconds"], 60);
    assert!(reports[1]["rules"].as_array().unwrap().len() >= 2);
    assert_eq!(reports[0]["tools"].as_array().unwrap().len(), 9);

    let dir = tempfile::tempdir().unwrap();
    let claude = dir.path().join("claude_desktop_config.json");
    std::fs::write(
        &claude,
        format!(
            r#"{{"mcpServers": {{"everything": {{"command": {:?}}}, "far": {{"url": "https://example.invalid/mcp"}}}}}}"#,
            guests::EVERYTHING_NATIVE
        ),
    )
    .unwrap();
    let output = moat(&["import", claude.to_str().unwrap()]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    assert!(stderr(&output).contains("`far`: a remote server at https://example.invalid/mcp"));
    let config = dir.path().join("moat.toml");
    std::fs::write(&config, &output.stdout).unwrap();
    let digest = moat_host::Digest::of(&std::fs::read(guests::EVERYTHING_NATIVE).unwrap());
    assert!(stdout(&output).contains(&format!("sha256 = \"{digest}\"")));
    // The imported, pinned entry runs as it is.
    let output = moat(&[
        "call",
        "--config",
        config.to_str().unwrap(),
        "everything",
        "add",
        r#"{"a":2,"b":40}"#,
    ]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
}

/// Issue 12, item 6: what a client config holds reaches neither the printed
/// TOML nor the terminal raw. A command path with newlines cannot add lines
/// to the TOML through its comment, and names and URLs with escape
/// sequences are shown escaped.
#[cfg(unix)]
#[test]
fn import_escapes_what_the_client_config_holds() {
    let dir = tempfile::tempdir().unwrap();
    let sneaky = dir.path().join("bin\n[servers.evil]\ncommand = \"sh\"\n#");
    std::fs::create_dir(&sneaky).unwrap();
    let server = sneaky.join("server");
    std::fs::copy(guests::EVERYTHING_NATIVE, &server).unwrap();
    let claude = dir.path().join("claude.json");
    let config = serde_json::json!({"mcpServers": {
        "good": {"command": server},
        "red\u{1b}[31mname": {"command": server},
        "far": {"url": "https://example.invalid/\u{1b}]0;owned\u{7}"}
    }});
    std::fs::write(&claude, config.to_string()).unwrap();
    let output = moat(&["import", claude.to_str().unwrap()]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    let parsed: toml::Table = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let servers = parsed["servers"].as_table().unwrap();
    let mut names: Vec<&String> = servers.keys().collect();
    names.sort();
    assert_eq!(names, ["good", "red--31mname"], "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("[servers.evil]")),
        "{text}"
    );
    assert!(text.contains("bin\\u{a}[servers.evil]"), "{text}");
    assert!(!output.stdout.contains(&0x1b), "raw escape on stdout");
    assert!(!output.stderr.contains(&0x1b), "raw escape on stderr");
    assert!(!output.stderr.contains(&0x07), "raw bell on stderr");
    assert!(
        stderr(&output).contains("`red\\u{1b}[31mname`: renamed to `red--31mname`"),
        "{}",
        stderr(&output)
    );
}

/// `moat import policy.yaml --component X.wasm` turns a Wassette policy into
/// a moat.toml entry that runs the component with the same grants: a
/// storage grant at the same path (read-only unless write is allowed), an
/// environment key passed through, a network host as an HTTPS origin.
#[test]
fn a_wassette_policy_imports_as_a_config_with_the_same_grants() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("notes.txt"), "granted notes").unwrap();
    std::fs::write(dir.path().join("secret.txt"), "not granted").unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "version: \"1.0\"\ndescription: \"Reads notes\"\npermissions:\n  storage:\n    allow:\n      - uri: \"fs://{}\"\n        access: [\"read\"]\n  network:\n    allow:\n      - host: \"localhost:8443\"\n  environment:\n    allow:\n      - key: \"MOAT_POLICY_TOKEN\"\n",
            data.display()
        ),
    )
    .unwrap();
    let imported = moat(&[
        "import",
        policy.to_str().unwrap(),
        "--component",
        guests::FETCH_WASM,
    ]);
    assert!(imported.status.success(), "stderr: {}", stderr(&imported));
    let config = dir.path().join("moat.toml");
    std::fs::write(&config, stdout(&imported)).unwrap();
    let config = config.to_str().unwrap();
    let call = |tool: &str, arguments: serde_json::Value| {
        let output = Command::new(env!("CARGO_BIN_EXE_moat"))
            .args([
                "call",
                "--config",
                config,
                "fetch",
                tool,
                &arguments.to_string(),
            ])
            .env(
                "MOAT_CACHE_DIR",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
            )
            .env("MOAT_POLICY_TOKEN", "t0ken")
            .env("MOAT_OTHER", "hidden")
            .output()
            .unwrap();
        if !output.status.success() {
            // An `err` result: `moat call` says so on stderr and fails.
            let text = stderr(&output);
            let err = text
                .split_once("reported an error: ")
                .map(|(_, json)| serde_json::from_str(json.trim()).unwrap())
                .unwrap_or_else(|| panic!("{tool}: {text}"));
            return err;
        }
        let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        result["structuredContent"]["result"].clone()
    };
    let notes = data.join("notes.txt");
    assert_eq!(
        call("read-file", serde_json::json!({"path": notes})),
        serde_json::json!({"ok": "granted notes"})
    );
    // The same path as on the host; nothing beside it.
    let outside = call(
        "read-file",
        serde_json::json!({"path": dir.path().join("secret.txt")}),
    );
    assert!(outside.get("err").is_some(), "{outside}");
    // Read only: the policy did not allow write.
    let write = call(
        "write-file",
        serde_json::json!({"path": data.join("new.txt"), "text": "x"}),
    );
    assert!(write.get("err").is_some(), "{write}");
    assert!(!data.join("new.txt").exists());
    assert_eq!(
        call("env-var", serde_json::json!({"key": "MOAT_POLICY_TOKEN"})),
        "t0ken"
    );
    assert_eq!(
        call("env-var", serde_json::json!({"key": "MOAT_OTHER"})),
        serde_json::Value::Null
    );
    let inspect = moat(&["inspect", "--config", config]);
    let text = stdout(&inspect);
    assert!(
        text.contains("HTTP (wasi:http): requests only to https://localhost:8443"),
        "{text}"
    );
    assert!(text.contains("sha256"), "{text}");
}

/// Issue 33 item 8: `moat add` refuses a name that is taken before it
/// installs anything, and `--replace` swaps the entry in place, keeping the
/// rest of moat.toml (its comments too) as written.
#[test]
fn moat_add_refuses_a_taken_name_and_replaces_an_entry_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "# my servers\n[servers.kept]\ncommand = {:?}\nallow_unmeasured = true\n\n[servers.everything]\ncommand = {:?}\nallow_unmeasured = true\nargs = [\"old\"]\n[servers.everything.env]\nOLD = \"1\"\n",
            guests::EVERYTHING_NATIVE,
            guests::EVERYTHING_NATIVE
        ),
    )
    .unwrap();
    let config_text = config.display().to_string();
    let add = |extra: &[&str]| {
        let mut args = vec!["add", "--config", &config_text, "--name", "everything"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", guests::EVERYTHING_NATIVE, "new"]);
        moat(&args)
    };
    let refused = add(&[]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains(
            "a server named `everything` is already configured (choose another with --name, or replace it with --replace)"
        ),
        "{}",
        stderr(&refused)
    );
    let replaced = add(&["--replace"]);
    assert!(replaced.status.success(), "{}", stderr(&replaced));
    assert!(
        stdout(&replaced).contains("replaced server `everything` in"),
        "{}",
        stdout(&replaced)
    );
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.starts_with("# my servers\n[servers.kept]\n"), "{text}");
    let loaded = moat_host::Config::load(&config).unwrap();
    let entry = loaded.server("everything").unwrap();
    assert_eq!(entry.args, ["new"], "{text}");
    assert!(
        entry.env.is_empty(),
        "the old entry's tables went with it: {text}"
    );
    assert!(loaded.server("kept").is_ok());
    assert_eq!(text.matches("[servers.everything]").count(), 1, "{text}");
}

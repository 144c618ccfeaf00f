//! What a launcher line installs: launchers naming more than the package
//! install it all and run the program, and `python -m` of a local module
//! stays local and installs nothing.

use super::*;

/// Issue 33: launchers that name more than the package, as READMEs write
/// them: `uvx --with REQ --from PKG==V CMD` and `npx -y -p PKG@V -p OTHER@V
/// CMD`. Every requirement goes into the one install, the named program
/// runs from it, and what `moat update` must install again is recorded.
#[test]
fn launchers_naming_more_than_the_package_install_it_all_and_run_the_program() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let config = dir.join("moat.toml");
    for (name, command) in [
        (
            "time",
            &[
                "uvx",
                "--with",
                "six==1.17.0",
                "--from",
                "mcp-server-time==2026.10.19",
                "mcp-server-time",
                "--local-timezone",
                "UTC",
            ][..],
        ),
        (
            "memory",
            &[
                "npx",
                "-y",
                "-p",
                "@modelcontextprotocol/server-memory@2026.8.31",
                "--package=is-number@7.0.0",
                "mcp-server-memory",
            ][..],
        ),
    ] {
        succeeded(
            moat(&dir)
                .args(["add", "--name", name, "--"])
                .args(command)
                .output()
                .unwrap(),
            "moat add",
        );
    }
    let loaded = Config::load(&config).unwrap();
    let time = loaded.server("time").unwrap().package().cloned().unwrap();
    assert_eq!(
        (
            time.name.as_str(),
            time.version.as_str(),
            time.entry.as_str()
        ),
        ("mcp-server-time", "2026.10.19", "mcp-server-time")
    );
    assert_eq!(time.with, ["six==1.17.0"]);
    let requirements = std::fs::read_to_string(time.store.join("requirements.txt")).unwrap();
    assert!(
        requirements
            .lines()
            .any(|l| l.starts_with("six==1.17.0 --hash=sha256:")),
        "{requirements}"
    );
    assert!(time.store.join("site/six.py").is_file());
    let memory = loaded.server("memory").unwrap().package().cloned().unwrap();
    assert_eq!(
        (
            memory.name.as_str(),
            memory.version.as_str(),
            memory.entry.as_str()
        ),
        (
            "@modelcontextprotocol/server-memory",
            "2026.8.31",
            "mcp-server-memory"
        )
    );
    assert_eq!(memory.with, ["is-number@7.0.0"]);
    let number: serde_json::Value = serde_json::from_slice(
        &std::fs::read(memory.store.join("node_modules/is-number/package.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(number["version"], "7.0.0");

    succeeded(moat(&dir).arg("lock").output().unwrap(), "moat lock");
    let now = succeeded(
        moat(&dir)
            .args(["call", "--locked", "time", "get_current_time"])
            .arg(r#"{"timezone": "UTC"}"#)
            .output()
            .unwrap(),
        "moat call time",
    );
    assert!(now.contains("datetime") && now.contains("UTC"), "{now}");
    let graph = succeeded(
        moat(&dir)
            .args(["call", "--locked", "memory", "read_graph", "{}"])
            .output()
            .unwrap(),
        "moat call memory",
    );
    assert!(graph.contains("entities"), "{graph}");
}

/// The real file of the `python3` on PATH (a pyenv shim resolved).
fn python() -> PathBuf {
    let output = Command::new("python3")
        .args([
            "-c",
            "import os, sys; print(os.path.realpath(sys.executable))",
        ])
        .output()
        .expect("python3 on PATH");
    PathBuf::from(succeeded(output, "python3").trim())
}

/// A module that is an MCP server by itself (stdio, no dependencies): its
/// one tool `where` answers with the file it runs from.
const LOCAL_SERVER: &str = r#"import json, os, sys
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    method = message.get("method")
    if method == "initialize":
        result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}}, "serverInfo": {"name": "local", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "where", "description": "The file this server runs from", "inputSchema": {"type": "object"}}]}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": os.path.realpath(__file__)}]}
    else:
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "not here"}}), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"#;

/// Issue 32, item 2: `python -m MOD` with a `MOD.py` importable from where
/// it runs is local code, not a package: `moat import` and `moat add` keep
/// it as a native server running that file (its directory measured and
/// granted read-only, its working directory kept), say so, and install
/// nothing from PyPI, where a package of the same name would have run with
/// the entry's secrets.
#[test]
fn python_dash_m_of_a_local_module_stays_local_and_installs_nothing() {
    const MODULE: &str = "moat_issue32_local_server";
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let project = dir.join("project");
    std::fs::create_dir(&project).unwrap();
    let file = project.join(format!("{MODULE}.py"));
    std::fs::write(&file, LOCAL_SERVER).unwrap();
    let python = python();
    let client = dir.join("claude_desktop_config.json");
    std::fs::write(
        &client,
        serde_json::json!({"mcpServers": {"local": {
            "command": python, "args": ["-m", MODULE], "env": {"API_TOKEN": "not for an index package"}
        }}})
        .to_string(),
    )
    .unwrap();
    // Run from the project, as the client would run the server.
    let in_project = || {
        let mut command = moat(&project);
        command.env("MOAT_DATA_DIR", dir.join("data"));
        command
    };
    let output = in_project().arg("import").arg(&client).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let toml = succeeded(output, "moat import");
    let kept = format!(
        "moat: import: `local`: {} -m {MODULE}: kept local: {} is importable from cwd {}; not installed from PyPI; runs in {}, and {} is measured and granted read-only",
        python.file_name().unwrap().to_string_lossy(),
        file.display(),
        project.display(),
        project.display(),
        project.display(),
    );
    assert!(stderr.lines().any(|l| l == kept), "{kept}\n{stderr}");
    assert!(
        !stderr.contains("installing") && !stderr.contains("is a package"),
        "{stderr}"
    );
    assert!(!dir.join("data/store").exists(), "nothing was installed");

    let config_path = dir.join("moat.toml");
    std::fs::write(&config_path, &toml).unwrap();
    let config = Config::load(&config_path).unwrap();
    let spec = config.server("local").unwrap();
    assert!(spec.package().is_none(), "{toml}");
    assert_eq!(spec.args, ["-m", MODULE]);
    assert_eq!(spec.env.passthrough, ["API_TOKEN"]);
    let ServerKind::Native {
        command,
        cwd,
        measure,
        ..
    } = &spec.kind
    else {
        panic!("native: {toml}");
    };
    assert_eq!(Path::new(command), python);
    assert_eq!(cwd, &project);
    assert_eq!(measure, std::slice::from_ref(&project));
    assert!(
        spec.dirs
            .iter()
            .any(|d| d.host == project && d.mode == moat_host::config::DirMode::Ro),
        "{toml}"
    );
    // The entry runs the local file, under the required sandbox.
    let output = moat(&dir)
        .args(["call", "--config"])
        .arg(&config_path)
        .args(["local", "where", "{}"])
        .env("API_TOKEN", "t")
        .output()
        .unwrap();
    let result: serde_json::Value = serde_json::from_str(&succeeded(output, "moat call")).unwrap();
    assert_eq!(
        result["content"][0]["text"],
        serde_json::json!(file.display().to_string())
    );

    // `moat add` takes the same path.
    let added = dir.join("added.toml");
    let output = in_project()
        .args(["add", "--config"])
        .arg(&added)
        .arg("--")
        .arg(&python)
        .args(["-m", MODULE])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    succeeded(output, "moat add");
    assert!(
        stderr.contains(&format!(
            "kept local: {} is importable from cwd",
            file.display()
        )),
        "{stderr}"
    );
    let added = Config::load(&added).unwrap();
    let spec = added.servers.values().next().unwrap();
    assert!(spec.package().is_none());
    assert!(matches!(&spec.kind, ServerKind::Native { cwd, .. } if cwd == &project));
    assert!(!dir.join("data/store").exists(), "nothing was installed");
}

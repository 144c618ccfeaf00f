//! Reference servers from client configs run installed under the required
//! sandbox.

use super::*;

/// A web server on loopback: 404 for robots.txt, a page for anything else.
fn web_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let (status, body) = if first.contains("/robots.txt") {
                ("404 Not Found", "no robots here")
            } else {
                (
                    "200 OK",
                    "<html><body><h1>Served on loopback</h1><p>The page behind the net grant.</p></body></html>",
                )
            };
            let _ = write!(
                reader.get_mut(),
                "HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[test]
fn reference_servers_from_client_configs_run_installed_under_the_required_sandbox() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sdk = root.join("target/npm/node_modules/@modelcontextprotocol/sdk");
    assert!(
        sdk.exists(),
        "run `bash tests/setup.sh` (the README's test command does)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let project = dir.join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("notes.txt"), "notes inside the project\n").unwrap();
    std::fs::write(dir.join("outside.txt"), "not for the filesystem server\n").unwrap();
    let repo = dir.join("repo");
    std::fs::create_dir(&repo).unwrap();
    run("git", &["init", "-q"], &repo);
    run(
        "git",
        &[
            "-c",
            "user.name=Moat",
            "-c",
            "user.email=moat@example.invalid",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "the commit git_log must show",
        ],
        &repo,
    );
    // One server as a pip console script in a virtualenv.
    let venv = dir.join("venv");
    run("python3", &["-m", "venv", venv.to_str().unwrap()], &dir);
    run(
        venv.join("bin/pip").to_str().unwrap(),
        &[
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            "mcp-server-time==2026.10.19",
        ],
        &dir,
    );
    let port = web_server();

    std::fs::write(
        dir.join("claude_desktop_config.json"),
        serde_json::json!({"mcpServers": {
            "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem@2026.8.31", project]},
            "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory@2026.8.31"]},
            "sequential-thinking": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-sequential-thinking@2026.8.31"]}
        }})
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("mcp.json"),
        serde_json::json!({"servers": {
            "time": {"type": "stdio", "command": "uvx", "args": ["mcp-server-time@2026.10.19", "--local-timezone", "UTC"]},
            "fetch": {"type": "stdio", "command": "uvx", "args": ["mcp-server-fetch@2026.10.24", "--allow-private-ips"]},
            "git": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git@2026.10.19", "--repository", repo]},
            "clock": {"type": "stdio", "command": venv.join("bin/mcp-server-time"), "args": ["--local-timezone", "UTC"]}
        }})
        .to_string(),
    )
    .unwrap();
    let mut toml = String::new();
    for file in ["claude_desktop_config.json", "mcp.json"] {
        toml.push_str(&succeeded(
            moat(&dir)
                .arg("import")
                .arg(dir.join(file))
                .output()
                .unwrap(),
            "moat import",
        ));
    }
    // The one grant import cannot know: fetch may reach the loopback page.
    let toml = toml.replacen(
        "[servers.fetch]\n",
        &format!("[servers.fetch]\nnet = [\"127.0.0.1:{port}\"]\n"),
        1,
    );
    let config_path = dir.join("moat.toml");
    std::fs::write(&config_path, &toml).unwrap();

    let config = Config::load(&config_path).unwrap();
    let store = dir.join("data/store");
    for (name, spec) in &config.servers {
        assert_eq!(spec.sandbox, Sandbox::Required, "{name}\n{toml}");
        assert!(
            spec.sha256.is_some() && !spec.allow_unmeasured,
            "{name}: {toml}"
        );
        let ServerKind::Native {
            command, measure, ..
        } = &spec.kind
        else {
            panic!("{name} is native");
        };
        // At run time nothing is fetched: no launcher, no registry, and no
        // network except fetch's loopback grant.
        assert!(
            !["npx", "uvx"].iter().any(|l| command.ends_with(l)),
            "{name}: {command}"
        );
        if name == "fetch" {
            assert_eq!(
                spec.net.iter().map(ToString::to_string).collect::<Vec<_>>(),
                [format!("127.0.0.1:{port}")]
            );
        } else {
            assert!(spec.net.is_empty(), "{name}: {:?}", spec.net);
        }
        if name == "clock" {
            assert!(spec.package().is_none());
            assert_eq!(measure, std::slice::from_ref(&venv), "the venv is measured");
            continue;
        }
        let package = spec.package().unwrap_or_else(|| panic!("{name}"));
        assert!(package.store.starts_with(&store), "{name}: {package:?}");
        assert!(package.store.join(package.ecosystem.lockfile()).is_file());
        assert_eq!(measure.first(), Some(&package.store), "{name}");
        assert!(
            spec.dirs
                .iter()
                .any(|d| d.host == package.store && d.mode == moat_host::config::DirMode::Ro),
            "{name}: the install is granted read-only"
        );
    }
    let filesystem = config.server("filesystem").unwrap();
    assert!(
        filesystem
            .dirs
            .iter()
            .any(|d| d.host == project && d.mode == moat_host::config::DirMode::Rw),
        "the filesystem server's directory is granted read-write"
    );

    succeeded(
        moat(&dir)
            .args(["lock", "--config"])
            .arg(&config_path)
            .output()
            .unwrap(),
        "moat lock",
    );
    let lock = moat_host::lock::Lock::load(&dir.join("moat.lock"))
        .unwrap()
        .unwrap();
    let memory = &lock.servers["memory"];
    let package = memory
        .package
        .as_ref()
        .expect("the lock records the package");
    assert_eq!(package.version, "2026.8.31");
    let store = &config.server("memory").unwrap().package().unwrap().store;
    assert_eq!(
        memory.measured.get(&store.display().to_string()),
        Some(&package.sha256),
        "the package digest is the measured tree"
    );

    let page = format!("http://127.0.0.1:{port}/page");
    let calls = serde_json::json!([
        {"name": "filesystem__read_text_file", "arguments": {"path": project.join("notes.txt")}},
        {"name": "filesystem__read_text_file", "arguments": {"path": dir.join("outside.txt")}},
        {"name": "memory__read_graph", "arguments": {}},
        {"name": "sequential-thinking__sequentialthinking", "arguments": {
            "thought": "one step", "nextThoughtNeeded": false, "thoughtNumber": 1, "totalThoughts": 1}},
        {"name": "time__get_current_time", "arguments": {"timezone": "UTC"}},
        {"name": "clock__get_current_time", "arguments": {"timezone": "UTC"}},
        {"name": "git__git_log", "arguments": {"repo_path": repo}},
        {"name": "fetch__fetch", "arguments": {"url": page, "raw": true}},
        {"name": "fetch__fetch", "arguments": {"url": format!("http://localhost:{port}/page"), "raw": true}},
    ]);
    let output = common::ts_client("ts_calls.mjs", &config_path)
        .arg(calls.to_string())
        .output()
        .expect("running node");
    let report: serde_json::Value =
        serde_json::from_str(&succeeded(output, "the TypeScript agent")).unwrap();
    let tools = report["tools"].as_array().unwrap();
    for server in [
        "filesystem",
        "memory",
        "sequential-thinking",
        "time",
        "clock",
        "git",
        "fetch",
    ] {
        assert!(
            tools
                .iter()
                .any(|t| t.as_str().unwrap().starts_with(&format!("{server}__"))),
            "{server} lists its tools: {tools:?}"
        );
    }
    let result = |i: usize| -> (bool, String) {
        let r = &report["results"][i];
        (
            r["isError"].as_bool().unwrap(),
            r["text"].as_str().unwrap().to_owned(),
        )
    };
    let ok = |i: usize, needle: &str| {
        let (error, text) = result(i);
        assert!(!error && text.contains(needle), "call {i}: {text}");
    };
    ok(0, "notes inside the project");
    let (error, text) = result(1);
    assert!(
        error && !text.contains("not for the filesystem server"),
        "outside its directory is refused: {text}"
    );
    ok(2, "entities");
    ok(3, "thoughtNumber");
    ok(4, "UTC");
    ok(5, "UTC");
    ok(6, "the commit git_log must show");
    ok(7, "Served on loopback");
    let (error, text) = result(8);
    assert!(
        error && text.contains("403") && !text.contains("Served on loopback"),
        "a name that is not listed is refused by the egress proxy: {text}"
    );
}

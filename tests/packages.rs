//! Agents' configs run as they are: a Claude Desktop config and a VS Code
//! `mcp.json` listing the official reference servers the way their READMEs
//! say (`npx -y`, `uvx`, a pip console script) are imported, installed by
//! Moat ahead of time, locked, and served by `moat serve` under the default
//! `sandbox = "required"`, driven by the official TypeScript SDK. The
//! registries (npm, PyPI) are the only network, and only at import.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use moat_host::config::Sandbox;
use moat_host::{Config, ServerKind};

fn moat(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_moat"));
    command
        .current_dir(dir)
        .env("MOAT_DATA_DIR", dir.join("data"))
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", common::state_dir());
    command
}

fn succeeded(output: Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

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

fn run(program: &str, args: &[&str], dir: &Path) {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    succeeded(output, program);
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

/// `moat update` on a package with a newer version prints the version and
/// tool diff and changes nothing; with --yes it re-pins moat.toml and
/// moat.lock, and the server runs under the new lock.
#[test]
fn update_shows_the_diff_and_re_pins_only_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let config = dir.join("moat.toml");
    succeeded(
        moat(&dir)
            .args(["add", "--"])
            .args(["npx", "-y", "@modelcontextprotocol/server-memory@2025.4.25"])
            .output()
            .unwrap(),
        "moat add",
    );
    succeeded(moat(&dir).arg("lock").output().unwrap(), "moat lock");
    let before = (
        std::fs::read(&config).unwrap(),
        std::fs::read(dir.join("moat.lock")).unwrap(),
    );
    let old: PathBuf = Config::load(&config)
        .unwrap()
        .server("memory")
        .unwrap()
        .package()
        .unwrap()
        .store
        .clone();
    // Added again, the same exact version is taken from the store as it
    // is: no installer runs (npm is not on PATH now, node is) and nothing
    // changes of the install.
    let node_only = dir.join("node-only");
    std::fs::create_dir(&node_only).unwrap();
    let node = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v node"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    std::os::unix::fs::symlink(node.trim(), node_only.join("node")).unwrap();
    let again = moat(&dir)
        .args(["add", "--name", "memory-again", "--"])
        .args(["npx", "-y", "@modelcontextprotocol/server-memory@2025.4.25"])
        .env("PATH", &node_only)
        .output()
        .unwrap();
    let told = String::from_utf8_lossy(&again.stderr).into_owned();
    succeeded(again, "moat add, again");
    assert!(
        told.contains(&format!(
            "npm package @modelcontextprotocol/server-memory 2025.4.25 is in the store already ({}): not resolved again",
            old.display()
        )),
        "{told}"
    );
    let text = std::fs::read_to_string(&config).unwrap();
    let restored = text[..text.find("\n[servers.memory-again]").unwrap()].to_owned() + "\n";
    std::fs::write(&config, restored).unwrap();
    assert_eq!(std::fs::read(&config).unwrap(), before.0);

    let shown = succeeded(
        moat(&dir)
            .args(["update", "memory", "--version", "2026.8.31"])
            .output()
            .unwrap(),
        "moat update",
    );
    assert!(
        shown.contains("memory: @modelcontextprotocol/server-memory 2025.4.25 -> 2026.8.31"),
        "{shown}"
    );
    assert!(
        shown.contains("~ create_entities (definition changed)"),
        "{shown}"
    );
    assert!(shown.contains("not re-pinned"), "{shown}");
    assert_eq!(
        (
            std::fs::read(&config).unwrap(),
            std::fs::read(dir.join("moat.lock")).unwrap()
        ),
        before,
        "nothing changes without --yes"
    );

    succeeded(
        moat(&dir)
            .args(["update", "memory", "--version", "2026.8.31", "--yes"])
            .output()
            .unwrap(),
        "moat update --yes",
    );
    let spec = Config::load(&config).unwrap();
    let package = spec.server("memory").unwrap().package().cloned().unwrap();
    assert_eq!(package.version, "2026.8.31");
    assert_ne!(package.store, old);
    let lock = moat_host::lock::Lock::load(&dir.join("moat.lock"))
        .unwrap()
        .unwrap();
    assert_eq!(
        lock.servers["memory"].package.as_ref().unwrap().version,
        "2026.8.31"
    );
    let tools = succeeded(
        moat(&dir)
            .args(["tools", "--locked", "memory"])
            .output()
            .unwrap(),
        "moat tools --locked",
    );
    assert!(tools.contains("read_graph"), "{tools}");
    assert!(!tools.contains("drifted"), "{tools}");
}

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
    assert_eq!(spec.env_passthrough, ["API_TOKEN"]);
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

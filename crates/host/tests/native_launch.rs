//! Native-only checks of the native launcher: the measured launch (links,
//! changed bytes, a swap after the check), process-group cleanup checked
//! through /proc, and a real MCP server that nobody here wrote.
#![cfg(target_os = "linux")]

mod common;

use common::{running, text};

use std::path::{Path, PathBuf};

use moat_host::native::{self, NativeError, NativeLaunch};
use moat_host::resolve_command as resolve;
use moat_host::{
    ConnectError, Digest, Evidence, Expectation, Handshake, Host, LaunchError, ServerSpec, Session,
};
use moat_test_guests as guests;

fn host() -> Host {
    Host::new(None).expect("host")
}

fn digest_of(path: impl AsRef<Path>) -> Digest {
    Digest::of(&std::fs::read(path).unwrap())
}

/// A copy of a guest binary in a fresh directory, as `server`.
fn copy_guest(source: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("server");
    std::fs::copy(source, &path).unwrap();
    (dir, path)
}

fn pinned(name: &str, path: &Path, digest: Digest) -> ServerSpec {
    let mut spec = ServerSpec::native(name, path.to_str().unwrap());
    spec.sha256 = Some(digest);
    spec
}

/// A launch of the file at `path`, pinned to `digest`, with nothing granted.
fn pinned_launch(name: &str, path: &Path, digest: Digest, cwd: PathBuf) -> NativeLaunch {
    let mut spec = ServerSpec::native(name, path.to_str().unwrap());
    if let moat_host::ServerKind::Native { cwd: dir, .. } = &mut spec.kind {
        *dir = cwd;
    }
    NativeLaunch::new(
        spec,
        resolve(path.to_str().unwrap(), Path::new("/"), None).unwrap(),
        Expectation::Pinned(digest),
    )
}

fn expect_native_error(result: Result<Session, ConnectError>) -> NativeError {
    match result {
        Err(ConnectError::Launch(LaunchError::Native(error))) => error,
        Err(other) => panic!("expected a native launch error, got {other}"),
        Ok(_) => panic!("the launch must be refused"),
    }
}

#[tokio::test]
async fn a_pinned_executable_runs_with_native_measured_evidence() {
    let digest = digest_of(guests::EVERYTHING_NATIVE);
    let spec = pinned("everything", Path::new(guests::EVERYTHING_NATIVE), digest);
    let session = host().connect(&spec).await.unwrap();
    let identity = session.identity().unwrap();
    assert_eq!(identity.evidence, Evidence::NativeMeasured);
    assert_eq!(identity.digest, Some(digest));
    session.close().await.unwrap();
}

#[tokio::test]
async fn one_changed_byte_is_refused() {
    let (_dir, path) = copy_guest(guests::EVERYTHING_NATIVE);
    let genuine = digest_of(&path);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    match expect_native_error(host().connect(&pinned("server", &path, genuine)).await) {
        NativeError::Digest { mismatch, .. } => {
            assert_eq!(mismatch.expected, genuine);
            assert_eq!(mismatch.actual, Digest::of(&bytes));
        }
        other => panic!("expected a digest mismatch, got {other}"),
    }
}

#[tokio::test]
async fn a_symlink_put_in_place_of_the_executable_is_refused() {
    let (dir, path) = copy_guest(guests::EVERYTHING_NATIVE);
    let digest = digest_of(&path);
    let spec = pinned("server", &path, digest);
    let resolved = path.canonicalize().unwrap();
    // The transport resolves the configured path now ...
    let transport = host().transport(&spec).unwrap();
    // ... and then a link to the very same bytes takes the file's place.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::rename(&path, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
    let result = Session::connect(transport, Handshake::Auto)
        .await
        .map_err(ConnectError::from);
    match expect_native_error(result) {
        NativeError::Symlink { path: refused } => assert_eq!(refused, resolved),
        other => panic!("expected a symlink refusal, got {other}"),
    }
}

#[tokio::test]
async fn a_configured_link_is_resolved_once_and_argv0_kept() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("report-link");
    std::os::unix::fs::symlink(guests::REPORT_NATIVE, &link).unwrap();
    let mut spec = pinned("report", &link, digest_of(guests::REPORT_NATIVE));
    spec.args = vec!["x".into()];
    let session = host().connect(&spec).await.unwrap();
    let result = session.call_tool("attack", None).await.unwrap();
    session.close().await.unwrap();
    let seen: serde_json::Value = serde_json::from_str(&text(&result)).unwrap();
    assert_eq!(seen["argv"][0], link.to_str().unwrap());
    assert_eq!(seen["argv"][1], "x");
}

/// Whatever replaces the file after the digest check, the measured bytes
/// are what runs: the descriptor that was hashed is the one executed.
#[tokio::test]
async fn replacing_the_file_after_the_check_still_runs_the_measured_bytes() {
    let (_dir, path) = copy_guest(guests::EVERYTHING_NATIVE);
    let digest = digest_of(&path);
    let executable = native::open_measured(&path, Expectation::Pinned(digest), None).unwrap();
    assert_eq!(executable.digest(), Some(digest));

    // Swap in other bytes (a different server) under the same name.
    let swapped = path.with_file_name("swapped");
    std::fs::copy(guests::REPORT_NATIVE, &swapped).unwrap();
    std::fs::rename(&swapped, &path).unwrap();

    let launch = pinned_launch("everything", &path, digest, std::env::temp_dir());
    let session = Session::connect(opened(launch, executable), Handshake::Auto)
        .await
        .unwrap();
    let mut tools: Vec<String> = session
        .list_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    tools.sort();
    // `everything`'s tools, not the swapped-in `report`'s `attack`.
    assert_eq!(
        tools,
        [
            "add", "blob", "calls", "drift", "echo", "fail", "progress", "shape", "sleep"
        ]
    );
    session.close().await.unwrap();
}

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

#[tokio::test]
async fn a_command_missing_from_path_is_an_explicit_error() {
    let mut spec = ServerSpec::native("ghost", "moat-no-such-command-anywhere");
    spec.allow_unmeasured = true;
    match host().transport(&spec) {
        Err(LaunchError::Native(NativeError::Resolve(error))) => {
            let message = error.to_string();
            assert!(
                message.starts_with("command `moat-no-such-command-anywhere` not found on PATH"),
                "{message}"
            );
        }
        Err(other) => panic!("expected a resolution error, got {other}"),
        Ok(_) => panic!("a missing command must not resolve"),
    }
}

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

/// A server that dies during the handshake because the sandbox hides what
/// it needs (here node's own script, its package directory not granted) is
/// told that the sandbox may be why, with the path its stderr names and the
/// command that finds what to grant.
#[tokio::test]
async fn a_server_that_dies_under_the_sandbox_is_told_the_sandbox_may_be_why() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = root
        .join("target/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .canonicalize()
        .expect("run `bash tests/setup.sh`");
    let mut spec = ServerSpec::native("everything-js", "node");
    spec.allow_unmeasured = true;
    spec.args = vec![script.display().to_string(), "stdio".into()];
    let error = match host().connect(&spec).await {
        Err(error) => error,
        Ok(_) => panic!("node cannot read an ungranted script under the sandbox"),
    };
    let message = error.to_string();
    let Some(moat_host::SessionError::Sandboxed { denied, .. }) = error.session() else {
        panic!("expected a sandbox hint, got {message}");
    };
    assert!(
        denied.contains(&script.display().to_string()),
        "the hint names the script: {message}"
    );
    assert!(
        message.contains("The native sandbox may be the cause")
            && message.contains("moat learn everything-js"),
        "{message}"
    );
    // Issue 13: the first run names the grant that is probably missing, the
    // package the script belongs to.
    let package = script.parent().unwrap().parent().unwrap();
    assert!(package.join("package.json").is_file());
    assert!(
        denied.contains(&format!(
            "so the grant probably missing is [[servers.everything-js.dirs]] host = \"{}\" mode = \"ro\"",
            package.display()
        )),
        "{message}"
    );
}

/// The real Python interpreter (not a pyenv shim, which is itself a
/// script), as `sys.executable` names it.
fn python() -> PathBuf {
    let output = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// A Python MCP server as a `#!` script whose one tool is `tool`.
fn script_server(dir: &Path, name: &str, shebang: &str, tool: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            r#"#!{shebang}
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    method, ident = message.get("method"), message.get("id")
    if method == "initialize":
        result = {{"protocolVersion": "2025-06-18", "capabilities": {{"tools": {{}}}}, "serverInfo": {{"name": "script", "version": "1"}}}}
    elif method == "tools/list":
        result = {{"tools": [{{"name": "{tool}", "inputSchema": {{"type": "object"}}}}]}}
    else:
        continue
    print(json.dumps({{"jsonrpc": "2.0", "id": ident, "result": result}}), flush=True)
"#
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

async fn tool_names(session: &Session) -> Vec<String> {
    session
        .list_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect()
}

/// Issue 13: a `#!` script runs as its interpreter (resolved through `env`
/// on PATH, measured, named in the identity and the evidence) reading the
/// script's measured descriptor: a script swapped in after the measurement
/// does not run.
#[tokio::test]
async fn a_script_runs_its_measured_bytes_through_its_measured_interpreter() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let interpreter = python();
    let shebang = format!("/usr/bin/env -S {} -u", interpreter.display());
    let path = script_server(dir.path(), "server.py", &shebang, "measured");
    let digest = digest_of(&path);
    let executable = native::open_measured(&path, Expectation::Pinned(digest), None).unwrap();
    let found = executable
        .interpreter()
        .expect("a script has an interpreter");
    let real = std::fs::canonicalize(&interpreter).unwrap();
    assert_eq!(found.path, real);
    assert_eq!(found.args, ["-u"]);
    assert_eq!(found.digest, Some(digest_of(&real)));

    // Other bytes under the same name before the exec.
    let swapped = script_server(dir.path(), "swapped.py", &shebang, "swapped");
    std::fs::rename(&swapped, &path).unwrap();
    let launch = pinned_launch("script", &path, digest, dir.path().to_owned());
    let session = Session::connect(opened(launch, executable), Handshake::Auto)
        .await
        .unwrap();
    assert_eq!(tool_names(&session).await, ["measured"]);
    let identity = session.identity().unwrap();
    assert!(
        identity
            .measured
            .contains(&(real.clone(), digest_of(&real))),
        "{:?}",
        identity.measured
    );
    assert!(
        identity
            .sandbox
            .lines()
            .iter()
            .any(|l| l.starts_with(&format!("enforced: #! interpreter {} -u", real.display()))),
        "{:?}",
        identity.sandbox
    );
    session.close().await.unwrap();

    // Through the host: a pinned script whose bytes changed is refused.
    let original = script_server(dir.path(), "original.py", &shebang, "measured");
    let pinned_digest = digest_of(&original);
    std::fs::write(
        &original,
        std::fs::read_to_string(&original)
            .unwrap()
            .replace("measured", "changed"),
    )
    .unwrap();
    match expect_native_error(
        host()
            .connect(&pinned("script", &original, pinned_digest))
            .await,
    ) {
        NativeError::Digest { mismatch, .. } => assert_eq!(mismatch.expected, pinned_digest),
        other => panic!("{other}"),
    }
}

/// Issue 32: a script rewritten in place (same inode, by a writer Moat's
/// path checks cannot see: a hard link inside the server's own `rw`
/// grant) after it was measured. Deterministic: the script's first act is
/// the rewrite, then it reads the script its interpreter was given, as an
/// interpreter reading lazily would. It reads the measured bytes (Moat's
/// sealed copy, bound over the script's path, so a module beside it is
/// still imported), while the file itself has changed: the next launch of
/// the same pin is refused.
#[tokio::test]
async fn a_script_rewritten_in_place_after_its_measurement_runs_the_measured_bytes() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let dir = std::fs::canonicalize(dir.path()).unwrap();
    let writable = dir.join("rw");
    std::fs::create_dir(&writable).unwrap();
    let script = dir.join("server.py");
    let alias = writable.join("alias.py");
    std::fs::write(
        &script,
        format!(
            r##"#!{python} -u
# marker: AAAAAAAA
import json, sys
import moat_sibling
before, after = b"# marker: " + b"A" * 8, b"# marker: " + b"B" * 8
with open({alias:?}, "r+b") as same_inode:
    data = same_inode.read()
    same_inode.seek(0)
    same_inode.write(data.replace(before, after))
given = open(sys.argv[0], "rb").read()
tool = "measured" if before in given else "rewritten" if after in given else "neither"
for line in sys.stdin:
    message = json.loads(line)
    method, ident = message.get("method"), message.get("id")
    if method == "initialize":
        result = {{"protocolVersion": "2025-06-18", "capabilities": {{"tools": {{}}}}, "serverInfo": {{"name": "script", "version": "1"}}}}
    elif method == "tools/list":
        result = {{"tools": [{{"name": tool, "description": sys.argv[0], "inputSchema": {{"type": "object"}}}}]}}
    else:
        continue
    print(json.dumps({{"jsonrpc": "2.0", "id": ident, "result": result}}), flush=True)
"##,
            python = python().display(),
            alias = alias.to_str().unwrap(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::hard_link(&script, &alias).unwrap();
    // A module beside the script: the script's directory is on sys.path as
    // on the host.
    std::fs::write(dir.join("moat_sibling.py"), "").unwrap();
    let digest = digest_of(&script);
    let mut spec = pinned("rewriter", &script, digest);
    spec.dirs.push(moat_host::config::DirGrant {
        host: dir.clone(),
        guest: dir.to_str().unwrap().to_owned(),
        mode: moat_host::config::DirMode::Ro,
        inode: None,
    });
    spec.dirs.push(moat_host::config::DirGrant {
        host: writable.clone(),
        guest: writable.to_str().unwrap().to_owned(),
        mode: moat_host::config::DirMode::Rw,
        inode: None,
    });
    let session = host().connect(&spec).await.unwrap();
    let tools = session.list_tools().await.unwrap();
    assert_eq!(
        tools.iter().map(|t| t.name.to_string()).collect::<Vec<_>>(),
        ["measured"]
    );
    assert_eq!(
        tools[0].description.as_deref(),
        Some(script.to_str().unwrap()),
        "the interpreter is given the script's own path"
    );
    let identity = session.identity().unwrap();
    assert_eq!(identity.digest, Some(digest));
    assert!(
        identity.sandbox.lines().iter().any(|l| l.contains(&format!(
            "reading the script's sealed copy (a memfd filled as it was hashed), bound read-only over {}",
            script.display()
        ))),
        "{:?}",
        identity.sandbox
    );
    session.close().await.unwrap();
    // The file did change, in place.
    assert!(
        std::fs::read_to_string(&script)
            .unwrap()
            .contains("# marker: BBBBBBBB")
    );
    match expect_native_error(host().connect(&spec).await) {
        NativeError::Digest { mismatch, .. } => assert_eq!(mismatch.expected, digest),
        other => panic!("{other}"),
    }
}

/// Issue 32: an `rw` grant of any server over what another server (or the
/// same one) runs or measures is refused, naming both servers and paths:
/// when the config is loaded, and at the launch of a spec made in code.
#[tokio::test]
async fn an_rw_grant_over_what_a_server_runs_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::create_dir_all(dir.join("pkg/data")).unwrap();
    let server = dir.join("bin/server");
    std::fs::copy(guests::EVERYTHING_NATIVE, &server).unwrap();
    let config_path = dir.join("moat.toml");
    let config = |grant: &str, mode: &str| {
        format!(
            "[servers.a]\ncommand = \"bin/server\"\nallow_unmeasured = true\nmeasure = [\"pkg\"]\n\n[servers.b]\ncommand = \"bin/server\"\nallow_unmeasured = true\n[[servers.b.dirs]]\nhost = \"{}/{grant}\"\nmode = \"{mode}\"\n",
            dir.display()
        )
    };
    let refused = |grant: &str| {
        moat_host::config::Config::parse(&config_path, &config(grant, "rw"))
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        refused("bin"),
        format!(
            "{config}: server `b`: rw grant {dir}/bin overlaps the executable {dir}/bin/server of server `a`: a server Moat launches may not write what a server runs after it is measured; grant it `ro`, or a directory that neither holds {dir}/bin/server nor lies inside it",
            config = config_path.display(),
            dir = dir.display()
        )
    );
    assert_eq!(
        refused("pkg/data"),
        format!(
            "{config}: server `b`: rw grant {dir}/pkg/data overlaps the measure path {dir}/pkg of server `a`: a server Moat launches may not write what a server runs after it is measured; grant it `ro`, or a directory that neither holds {dir}/pkg nor lies inside it",
            config = config_path.display(),
            dir = dir.display()
        )
    );
    moat_host::config::Config::parse(&config_path, &config("bin", "ro"))
        .expect("a read-only grant over an executable is fine");
    moat_host::config::Config::parse(&config_path, &config("other", "rw"))
        .expect("an rw grant beside them is fine");

    // At the launch: a spec made in code, its own rw grant over its script's
    // interpreter's directory.
    let interpreter_dir = dir.join("interp");
    std::fs::create_dir(&interpreter_dir).unwrap();
    let interpreter = interpreter_dir.join("python3");
    std::fs::copy(python(), &interpreter).unwrap();
    let script = script_server(&dir, "tool.py", interpreter.to_str().unwrap(), "t");
    let mut spec = ServerSpec::native("self", script.to_str().unwrap());
    spec.allow_unmeasured = true;
    spec.dirs.push(moat_host::config::DirGrant {
        host: interpreter_dir.clone(),
        guest: interpreter_dir.to_str().unwrap().to_owned(),
        mode: moat_host::config::DirMode::Rw,
        inode: None,
    });
    match expect_native_error(host().connect(&spec).await) {
        NativeError::Grant(error) => assert_eq!(
            error.to_string(),
            format!(
                "server `self`: rw grant {} overlaps the #! interpreter {} of server `self`: a server Moat launches may not write what a server runs after it is measured; grant it `ro`, or a directory that neither holds {} nor lies inside it",
                interpreter_dir.display(),
                interpreter.display(),
                interpreter.display()
            )
        ),
        other => panic!("{other}"),
    }
}

/// A `#!` chain (an interpreter that is itself a script) and a `#!` naming
/// a missing interpreter are refused with errors that say so.
#[tokio::test]
async fn nested_and_missing_interpreters_are_refused_by_name() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let wrapper = dir.path().join("python-wrapper");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec {} \"$@\"\n", python().display()),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let nested = script_server(dir.path(), "nested.py", wrapper.to_str().unwrap(), "x");
    let mut spec = ServerSpec::native("nested", nested.to_str().unwrap());
    spec.allow_unmeasured = true;
    match expect_native_error(host().connect(&spec).await) {
        NativeError::Script { path, detail } => {
            assert_eq!(path, nested);
            assert_eq!(
                detail,
                format!(
                    "its interpreter {} is itself a script (#!/bin/sh): Moat runs one level of #! only; point the #! line, or `command`, at the real interpreter (under pyenv: `pyenv which python3`)",
                    std::fs::canonicalize(&wrapper).unwrap().display()
                )
            );
        }
        other => panic!("{other}"),
    }
    let missing = script_server(dir.path(), "missing.py", "/nonexistent/python3", "x");
    let mut spec = ServerSpec::native("missing", missing.to_str().unwrap());
    spec.allow_unmeasured = true;
    match expect_native_error(host().connect(&spec).await) {
        NativeError::Script { detail, .. } => assert!(
            detail.starts_with("its #! interpreter /nonexistent/python3 does not exist"),
            "{detail}"
        ),
        other => panic!("{other}"),
    }
}

/// An executable unchanged since it was hashed is known by its seal; one
/// byte changed in place afterwards (same size, same inode) breaks the
/// seal, is hashed again, and the launch is refused.
#[tokio::test]
async fn a_sealed_executable_changed_in_place_is_hashed_again_and_refused() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("everything");
    std::fs::copy(guests::EVERYTHING_NATIVE, &path).unwrap();
    let digest = digest_of(&path);
    let cache = dir.path().join("cache");
    let mut spec = ServerSpec::native("sealed", path.to_str().unwrap());
    spec.sha256 = Some(digest);
    // The seal rule is about the file's age: wait on the clock for it.
    let deadline = std::time::Instant::now() + moat_host::seal::SETTLED * 3;
    while !moat_host::seal::Stat::of(&std::fs::metadata(&path).unwrap())
        .unwrap()
        .settled(moat_host::seal::now_ns())
    {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for _ in 0..2 {
        let host = Host::new(Some(cache.clone())).unwrap();
        let session = host.connect(&spec).await.unwrap();
        session.close().await.unwrap();
    }
    let seals: Vec<_> = std::fs::read_dir(cache.join("seals")).unwrap().collect();
    assert_eq!(seals.len(), 1, "the executable's digest is sealed");

    let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.seek(SeekFrom::Start(100)).unwrap();
    file.write_all(&[0xAB]).unwrap();
    drop(file);
    let host = Host::new(Some(cache.clone())).unwrap();
    match expect_native_error(host.connect(&spec).await) {
        NativeError::Digest { mismatch, .. } => assert_eq!(mismatch.expected, digest),
        other => panic!("expected a digest mismatch, got {other}"),
    }
}

/// A transport that spawns `executable`, already opened and measured.
fn opened(
    launch: native::NativeLaunch,
    executable: native::MeasuredExecutable,
) -> moat_host::ServerTransport {
    let (name, limits) = (launch.spec().name.clone(), launch.spec().limits.clone());
    moat_host::Planned::NativeOpened(Box::new((launch, executable))).transport(&name, limits)
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
    spec.env.insert("MOAT_GIVEN".into(), "1".into());
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

/// Issue 33: a server that outgrows `data_bytes` is stopped by it, and the
/// error names the limit.
#[tokio::test]
async fn a_server_past_its_data_limit_is_told_which_limit() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let interpreter = std::fs::canonicalize(python()).unwrap();
    let path = dir.path().join("hog.py");
    std::fs::write(
        &path,
        format!(
            "#!{}\nimport sys\nhog = bytearray(512 << 20)\nsys.stdin.read()\n",
            interpreter.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut spec = pinned("hog", &path, digest_of(&path));
    spec.limits.data_bytes = 128 << 20;
    let error = match host().connect(&spec).await {
        Ok(_) => panic!("a 512 MiB allocation under a 128 MiB data limit started"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("memory limit: data_bytes = 134217728 exhausted (RLIMIT_DATA"),
        "{error}"
    );
}

/// Issue 33 items 6 and 8: a server refused a write under a read-only
/// grant (EROFS) is told which entry to change, and the sandbox is named
/// as the cause; the path outside every grant is not what is suggested.
#[tokio::test]
async fn a_write_refused_under_a_read_only_grant_names_the_entry_to_change() {
    let data = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = data.path().canonicalize().unwrap();
    let mut spec = ServerSpec::native("notes", "/bin/sh");
    spec.allow_unmeasured = true;
    spec.args = vec![
        "-c".into(),
        format!("echo note > {}/new.md; exit 1", data.display()),
    ];
    spec.dirs = vec![moat_host::config::DirGrant {
        host: data.clone(),
        guest: data.display().to_string(),
        mode: moat_host::config::DirMode::Ro,
        inode: None,
    }];
    let error = match host().connect(&spec).await {
        Err(error) => error.to_string(),
        Ok(_) => panic!("the shell exits"),
    };
    assert!(
        error.contains("The native sandbox may be the cause")
            && error.contains(&format!(
                "; {} is granted read-only: if the server is to write there, change that entry to `[[servers.notes.dirs]] host = \"{}\" mode = \"rw\"`",
                data.display(),
                data.display()
            )),
        "{error}"
    );
    assert!(!std::path::Path::new(&data.join("new.md")).exists());
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

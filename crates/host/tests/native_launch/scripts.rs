//! `#!` scripts: a script runs its measured bytes through its measured
//! interpreter (also when rewritten in place after the measurement), and
//! nested or missing interpreters are refused by name.

use super::*;

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

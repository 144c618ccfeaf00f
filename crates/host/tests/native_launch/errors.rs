//! Errors that tell the user what to change: a command missing from PATH,
//! a server that dies under the sandbox, one past its data limit, and a
//! write refused under a read-only grant.

use super::*;

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

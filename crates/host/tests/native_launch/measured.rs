//! The measured launch: what runs is the file that was hashed. A pinned
//! executable runs with native measured evidence; one changed byte, a
//! symlink put in its place, a swap after the check and a change in place
//! after sealing are refused or still run the measured bytes; a configured
//! link is resolved once; an `rw` grant over what a server runs is refused.

use super::*;

/// A copy of a guest binary in a fresh directory, as `server`.
fn copy_guest(source: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("server");
    std::fs::copy(source, &path).unwrap();
    (dir, path)
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

//! `moat update` shows the diff and re-pins only when asked.

use super::*;

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

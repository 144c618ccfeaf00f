//! Reload of the config and moat.lock on disk: new sessions get the new
//! config while open ones keep theirs, and a reloaded lock that no longer
//! matches a running server stops it.

use super::*;

both_launchers!(
    a_reload_gives_new_sessions_the_new_config_and_open_ones_keep_theirs,
    a_reloaded_lock_that_no_longer_matches_a_running_server_stops_it,
);

/// The `[servers.NAME]` table that runs `guest` under `launcher`, unpinned.
fn server_toml(name: &str, launcher: Launcher, guest: moat_test_guests::Guest) -> String {
    let (key, path) = match launcher {
        Launcher::Wasm => ("wasm", guest.wasm),
        Launcher::Native => ("command", guest.native),
    };
    format!("[servers.{name}]\n{key} = {path:?}\nallow_unmeasured = true\n")
}

/// A gateway on the config at `path` (and the moat.lock beside it, if
/// any), audited to `audit`, as `moat serve` starts one.
async fn gateway_on_disk(path: &Path, audit: &Path) -> Gateway {
    let config = Config::load(path).unwrap();
    let mut host = host();
    if let Some(lock) = moat_host::lock::Lock::load(&moat_host::lock::Lock::path_for(path)).unwrap()
    {
        host = host.with_lock(lock, moat_host::lock::Lock::path_for(path));
    }
    let audit = std::sync::Arc::new(moat_host::audit::AuditLog::open(audit, audit_key()).unwrap());
    let gateway = Gateway::new(host, config, Some(audit));
    if !gateway.host().is_locked() {
        gateway.check_names().await;
    }
    gateway
}

/// The audit log's events of `kind`.
fn events_of(audit: &Path, kind: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"] == kind)
        .collect()
}

/// Reload (SIGHUP, --watch): a session opened after it sees the new
/// config's servers, the session opened before keeps its own and goes on
/// answering; a config that no longer parses changes nothing, names the
/// file and line, and is audited.
async fn a_reload_gives_new_sessions_the_new_config_and_open_ones_keep_theirs(launcher: Launcher) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moat.toml");
    let audit = dir.path().join("audit.jsonl");
    std::fs::write(&path, server_toml("a", launcher, guests::EVERYTHING)).unwrap();
    let gateway = gateway_on_disk(&path, &audit).await;
    let before = gateway.session();
    let add = args(json!({"a": 1, "b": 2}));
    assert_eq!(
        text(&before.call("a__add", add.clone()).await.unwrap()),
        "3"
    );

    std::fs::write(
        &path,
        server_toml("a", launcher, guests::EVERYTHING)
            + &server_toml("b", launcher, guests::EVERYTHING),
    )
    .unwrap();
    let reloaded = gateway.reload("test").await.unwrap();
    assert_eq!((reloaded.generation, reloaded.servers), (2, 2));
    assert_eq!(reloaded.enforced.stopped, 0, "nothing stale: no lock");
    let after = gateway.session();
    assert_eq!(text(&after.call("b__add", add.clone()).await.unwrap()), "3");
    let names = exposed(&after).await;
    assert!(names.contains(&"a__add".to_owned()) && names.contains(&"b__add".to_owned()));
    let refused = before.call("b__add", add.clone()).await.unwrap_err();
    assert_eq!(refused.message, r#"no server "b" behind tool "b__add""#);
    assert_eq!(
        text(&before.call("a__add", add.clone()).await.unwrap()),
        "3"
    );
    assert!(exposed(&before).await.iter().all(|n| n.starts_with("a__")));

    std::fs::write(&path, "[servers.a\n").unwrap();
    let error = gateway.reload("test").await.unwrap_err().to_string();
    assert!(
        error.starts_with(&format!("{}:1:", path.display())),
        "{error}"
    );
    assert_eq!(gateway.generation(), 2, "unchanged");
    let later = gateway.session();
    assert_eq!(text(&later.call("b__add", add).await.unwrap()), "3");
    let reloads = events_of(&audit, "reload");
    assert_eq!(reloads.len(), 2, "{reloads:?}");
    assert_eq!(reloads[0]["outcome"], "reloaded");
    assert_eq!(reloads[0]["generation"], 2);
    assert_eq!(reloads[1]["outcome"], "refused");
    assert_eq!(reloads[1]["error"], error.as_str());
    for session in [before, after, later] {
        assert!(session.close().await.is_empty());
    }
    assert!(gateway.close_all().await.is_empty());
}

/// A reloaded lock that no longer matches what a session runs (the server
/// was re-pinned with another environment, so another execution identity)
/// stops it in that session at once, as a revocation does, and refuses it
/// there from then on, saying why; a new session runs the newly pinned
/// server, and a server whose entry did not change keeps running.
async fn a_reloaded_lock_that_no_longer_matches_a_running_server_stops_it(launcher: Launcher) {
    use moat_host::lock::Lock;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moat.toml");
    let audit = dir.path().join("audit.jsonl");
    let lock_path = Lock::path_for(&path);
    let write = |extra_env: &str| {
        let mut text = server_toml("a", launcher, guests::EVERYTHING);
        text.push_str(extra_env);
        text.push_str(&server_toml("b", launcher, guests::EVERYTHING));
        // Not one child for both names: b differs from a in more than its name.
        text.push_str("env = { SERVER = \"b\" }\n");
        std::fs::write(&path, &text).unwrap();
        text
    };
    let relock = async || {
        let config = Config::load(&path).unwrap();
        let mut lock = Lock::load(&lock_path).unwrap().unwrap_or_default();
        lock.version = moat_host::lock::LOCK_VERSION;
        for (name, spec) in &config.servers {
            lock.servers
                .insert(name.clone(), host().measure(spec).await.unwrap());
        }
        lock.write(&lock_path).unwrap();
    };
    write("");
    relock().await;
    let gateway = gateway_on_disk(&path, &audit).await;
    let before = gateway.session();
    let add = args(json!({"a": 1, "b": 2}));
    for tool in ["a__add", "b__add"] {
        assert_eq!(text(&before.call(tool, add.clone()).await.unwrap()), "3");
    }
    assert_eq!(gateway.host().running("a"), 1);

    write("env = { EVERYTHING_DRIFT = \"0\" }\n");
    relock().await;
    let reloaded = gateway.reload("test").await.unwrap();
    assert_eq!(reloaded.enforced.stopped, 1, "{reloaded:?}");
    assert_eq!(gateway.host().running("a"), 0, "a's child stopped");
    let refused = before.call("a__add", add.clone()).await.unwrap_err();
    assert_eq!(
        refused.message,
        "server `a` is refused in this session: moat.lock was reloaded and no longer matches what this session runs (its execution identity changed in the lock); a new session runs what the lock pins now"
    );
    assert_eq!(
        text(&before.call("b__add", add.clone()).await.unwrap()),
        "3"
    );
    let after = gateway.session();
    assert_eq!(text(&after.call("a__add", add).await.unwrap()), "3");
    let exits: Vec<_> = events_of(&audit, "server_exit")
        .into_iter()
        .filter(|e| e["server"] == "a")
        .map(|e| e["outcome"].clone())
        .collect();
    assert_eq!(exits, vec![serde_json::json!("stale")]);

    // What a reload may not do changes nothing, and says why.
    let good = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("[wasm]\npool_instances = 7\n{good}")).unwrap();
    let error = gateway.reload("test").await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{}: the [wasm] table changed, and the engine cannot change while serving: restart `moat serve` to apply it",
            path.display()
        )
    );
    std::fs::write(&path, &good).unwrap();
    std::fs::remove_file(&lock_path).unwrap();
    let error = gateway.reload("test").await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{} is gone: a reload never drops the pins of a gateway that enforces a lock (restart `moat serve` to run without one)",
            lock_path.display()
        )
    );
    assert_eq!(gateway.generation(), 2);
    assert!(gateway.host().is_locked());
    let refusals = events_of(&audit, "reload")
        .iter()
        .filter(|e| e["outcome"] == "refused")
        .count();
    assert_eq!(refusals, 2);
    for session in [before, after] {
        assert!(session.close().await.is_empty());
    }
    assert!(gateway.close_all().await.is_empty());
}

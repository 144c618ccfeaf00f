//! The stdio rows' setups: the configs each row serves (wasm, locked, typed,
//! pooled, native, native script) and the rows they make.

use super::*;

/// The guest builds a binary's rows run: this build's (crates/test-guests),
/// or those of another guests target dir (`$MOAT_BENCH_BASELINE_GUESTS`,
/// laid out as crates/test-guests builds it) for the baseline's rows.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Guests {
    pub(super) everything_wasm: String,
    /// The floor: `everything` built natively and spawned directly.
    pub(super) everything_native: String,
    pub(super) kinds_wasm: String,
}

impl Guests {
    pub(super) fn built() -> Self {
        Self {
            everything_wasm: guests::EVERYTHING_WASM.to_owned(),
            everything_native: guests::EVERYTHING_NATIVE.to_owned(),
            kinds_wasm: guests::KINDS_WASM.to_owned(),
        }
    }

    /// The guests of a target dir built as crates/test-guests builds them.
    /// Its `dist` builds where there are any (what `cargo bench` builds),
    /// else its `release` builds (what `cargo test` builds).
    pub(super) fn in_dir(dir: &Path) -> Self {
        let profile = if dir.join("wasm32-wasip2/dist").exists() {
            "dist"
        } else {
            "release"
        };
        let path = |relative: &str| {
            let relative = relative.replace("PROFILE", profile);
            let path = dir.join(relative);
            assert!(
                path.exists(),
                "MOAT_BENCH_BASELINE_GUESTS: no {}",
                path.display()
            );
            path.to_str().unwrap().to_owned()
        };
        Self {
            everything_wasm: path("wasm32-wasip2/PROFILE/everything.wasm"),
            everything_native: path("PROFILE/everything"),
            kinds_wasm: path("wasm32-wasip2/PROFILE/kinds.wasm"),
        }
    }
}

/// The configs one `moat` binary is measured with, each in its own
/// directory with its own cache and state (a baseline binary may not read
/// this build's cache).
pub(super) struct Configs {
    pub(super) cache: PathBuf,
    pub(super) state: PathBuf,
    pub(super) wasm: PathBuf,
    /// The same component with `preinit = false`: its initialiser run in
    /// every start, not once into a snapshot.
    pub(super) wasm_fresh: PathBuf,
    pub(super) locked: PathBuf,
    pub(super) typed_call: PathBuf,
    pub(super) typed_session: PathBuf,
    pub(super) wasm_pooled: PathBuf,
    pub(super) typed_call_pooled: PathBuf,
    pub(super) native: PathBuf,
    pub(super) native_script: PathBuf,
}

pub(super) fn digest(path: &str) -> String {
    let output = Command::new(moat_binary())
        .args(["digest", path])
        .output()
        .unwrap();
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

pub(super) fn pooled(config: &Path, name: &str, instances: usize) -> PathBuf {
    let dir = config.parent().unwrap().parent().unwrap();
    write_config(
        dir,
        name,
        &format!(
            "{}
[wasm]
allocator = \"pooling\"\npool_instances = {instances}\n",
            std::fs::read_to_string(config).unwrap()
        ),
    )
}

/// Writes the configs under `dir`, locks one, and warms the component
/// cache, all with the current binary. A binary that does not know
/// `preinit` (`knows_preinit` false: one older than snapshots, which has
/// none) gets the no-snapshot row's config without it.
pub(super) fn prepare(dir: &Path, knows_preinit: bool, guests: &Guests) -> Configs {
    let cache = dir.join("cache");
    let state = dir.join("state");
    let wasm = write_config(
        dir,
        "wasm",
        &format!(
            "[servers.everything]\nwasm = {:?}\nsha256 = {:?}\n",
            guests.everything_wasm,
            digest(&guests.everything_wasm)
        ),
    );
    let locked = write_config(dir, "locked", &std::fs::read_to_string(&wasm).unwrap());
    let wasm_fresh = write_config(
        dir,
        "wasm-fresh",
        &format!(
            "{}{}",
            std::fs::read_to_string(&wasm).unwrap(),
            if knows_preinit {
                "preinit = false\n"
            } else {
                ""
            }
        ),
    );
    // The typed tool component `kinds`, a fresh instance per call and one
    // per session.
    let typed = |name: &str, instance: &str| {
        write_config(
            dir,
            name,
            &format!(
                "[servers.kinds]\nwasm = {:?}\nsha256 = {:?}\ninstance = {instance:?}\n",
                guests.kinds_wasm,
                digest(&guests.kinds_wasm)
            ),
        )
    };
    let typed_call = typed("typed-call", "call");
    let typed_session = typed("typed-session", "session");
    let wasm_pooled = pooled(&wasm, "wasm-pooled", 1000);
    let typed_call_pooled = pooled(&typed_call, "typed-call-pooled", 1000);
    let native = write_config(
        dir,
        "native",
        &format!(
            "[servers.everything]\ncommand = {:?}\nsha256 = {:?}\n",
            guests.everything_native,
            digest(&guests.everything_native)
        ),
    );
    // A `#!` script run by the native guest (which ignores its argv).
    let script = dir.join("everything-script");
    std::fs::write(&script, format!("#!{}\n", guests.everything_native)).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let native_script = write_config(
        dir,
        "native-script",
        &format!(
            "[servers.everything]\ncommand = {:?}\nsha256 = {:?}\n",
            script.to_str().unwrap(),
            digest(script.to_str().unwrap())
        ),
    );
    // Warm the component cache, and lock one copy.
    let status = Command::new(moat_binary())
        .args(["lock", "--config"])
        .arg(&locked)
        .env("MOAT_CACHE_DIR", &cache)
        .env("MOAT_STATE_DIR", &state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "moat lock");
    // The steady state: cache files older than the seal rule's settling
    // time, sealed by one start.
    std::thread::sleep(moat_host::seal::SETTLED + Duration::from_millis(200));
    for config in [
        &wasm,
        &wasm_fresh,
        &locked,
        &typed_call,
        &typed_session,
        &wasm_pooled,
        &typed_call_pooled,
    ] {
        let mut driver = Driver::spawn(moat(config, &cache, &state));
        driver.initialize();
        driver.request("tools/list", json!({}));
        driver.close();
    }
    Configs {
        cache,
        state,
        wasm,
        wasm_fresh,
        locked,
        typed_call,
        typed_session,
        wasm_pooled,
        typed_call_pooled,
        native,
        native_script,
    }
}

/// The stdio rows after the floor, for each binary with its configs: one
/// row is measured with every binary before the next row, so drift on the
/// machine falls on each alike. `[binary][row]`.
pub(super) fn serve_rows(runs: &[(&std::ffi::OsString, &Configs)]) -> Vec<Vec<Row>> {
    type Pick = fn(&Configs) -> &PathBuf;
    let specs: [(&'static str, &str, Pick, bool); 9] = [
        ("serve → wasm", "everything__echo", |c| &c.wasm, false),
        (
            "serve → wasm, locked",
            "everything__echo",
            |c| &c.locked,
            true,
        ),
        (
            "serve → native child",
            "everything__echo",
            |c| &c.native,
            false,
        ),
        (
            "serve → native script",
            "everything__echo",
            |c| &c.native_script,
            false,
        ),
        (
            "serve → typed, per call",
            "kinds__greet",
            |c| &c.typed_call,
            false,
        ),
        (
            "serve → typed, session",
            "kinds__greet",
            |c| &c.typed_session,
            false,
        ),
        (
            "serve → wasm, pooled",
            "everything__echo",
            |c| &c.wasm_pooled,
            false,
        ),
        (
            "serve → typed/call, pooled",
            "kinds__greet",
            |c| &c.typed_call_pooled,
            false,
        ),
        (
            "serve → wasm, no snapshot",
            "everything__echo",
            |c| &c.wasm_fresh,
            false,
        ),
    ];
    let mut out: Vec<Vec<Row>> = runs.iter().map(|_| Vec::new()).collect();
    for (name, tool, pick, locked) in specs {
        for (rows, (binary, c)) in out.iter_mut().zip(runs) {
            rows.push(with_binary(binary, || {
                measure(name, tool, &|| {
                    let mut command = moat(pick(c), &c.cache, &c.state);
                    if locked {
                        command.arg("--locked");
                    }
                    command
                })
            }));
        }
    }
    out
}

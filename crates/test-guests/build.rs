//! Builds every guest binary in `guests/` for wasm32-wasip2 and natively, and
//! every library component (a `cdylib` package: a typed tool component, with
//! no `wasi:cli/run`) for wasm32-wasip2 only, in a target dir of its own with
//! the host's RUSTFLAGS stripped, and generates a constant per guest and
//! target for tests to use. Fails when a guest has no test that uses it.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where tests that use guests live, relative to the workspace root.
const TEST_DIRS: &[&str] = &[
    "tests",
    "crates/host/tests",
    "crates/fuzz-targets/tests",
    "benches",
];

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir
        .join("../..")
        .canonicalize()
        .expect("workspace root");
    let guests = root.join("guests");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out; another build
    // of the host crates in a target dir of its own (`cargo fuzz`'s, README
    // "Fuzzing the guest boundary") can name the guests' target dir, to
    // share one build of the guests.
    println!("cargo:rerun-if-env-changed=MOAT_GUESTS_TARGET_DIR");
    let target_dir = match std::env::var_os("MOAT_GUESTS_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => out_dir
            .ancestors()
            .nth(4)
            .map(|target| target.join("guests"))
            .unwrap_or_else(|| root.join("target/guests")),
    };

    for path in ["guests", "crates/wit-bindings"] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    for dir in TEST_DIRS {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }

    require_wasm_target();
    let profile = guests_profile();
    let bins = guest_bins(&guests);
    let mut components = guest_components(&guests);
    let host = std::env::var("HOST").unwrap();
    // A guest built with features of its own (its manifest says
    // `build-alone = true`) gets a cargo invocation of its own, so those
    // features never unify into the other guests' builds.
    let alone = build_alone_packages(&guests);
    let mut together = vec!["--workspace".to_owned()];
    for package in &alone {
        together.extend(["--exclude".to_owned(), package.clone()]);
    }
    let mut selections = vec![together];
    selections.extend(alone.iter().map(|p| vec!["-p".to_owned(), p.clone()]));
    for target in [Some("wasm32-wasip2"), None] {
        for selection in &selections {
            let mut selection = selection.clone();
            if target.is_none() {
                // A library component is wasm only.
                if selection.first().is_some_and(|s| s == "-p")
                    && components.contains(&selection[1])
                {
                    continue;
                }
                if selection.first().is_some_and(|s| s == "--workspace") {
                    for package in &components {
                        selection.extend(["--exclude".to_owned(), package.clone()]);
                    }
                }
            }
            build(&root, &guests, &target_dir, target, &selection, profile);
        }
    }

    let mut generated = String::new();
    let mut all = String::new();
    for bin in &bins {
        let constant = bin.to_uppercase().replace('-', "_");
        let wasm = target_dir.join(format!("wasm32-wasip2/{profile}/{bin}.wasm"));
        let native = target_dir.join(format!("{profile}/{bin}{}", std::env::consts::EXE_SUFFIX));
        for path in [&wasm, &native] {
            assert!(
                path.exists(),
                "guest build did not produce {}",
                path.display()
            );
        }
        writeln!(
            generated,
            "/// The `{bin}` guest built for wasm32-wasip2.\npub const {constant}_WASM: &str = {:?};",
            wasm.display().to_string()
        )
        .unwrap();
        writeln!(
            generated,
            "/// The `{bin}` guest built natively for {host}.\npub const {constant}_NATIVE: &str = {:?};",
            native.display().to_string()
        )
        .unwrap();
        writeln!(
            generated,
            "/// The `{bin}` guest, both builds.\npub const {constant}: Guest = Guest {{ name: {bin:?}, wasm: {constant}_WASM, native: {constant}_NATIVE }};"
        )
        .unwrap();
        writeln!(all, "    ({bin:?}, {constant}_WASM, {constant}_NATIVE),").unwrap();
    }
    for package in &components {
        let constant = package.to_uppercase().replace('-', "_");
        let wasm = target_dir.join(format!(
            "wasm32-wasip2/{profile}/{}.wasm",
            package.replace('-', "_")
        ));
        assert!(
            wasm.exists(),
            "guest build did not produce {}",
            wasm.display()
        );
        writeln!(
            generated,
            "/// The `{package}` library component (typed tools), built for wasm32-wasip2.\npub const {constant}_WASM: &str = {:?};",
            wasm.display().to_string()
        )
        .unwrap();
    }
    writeln!(
        generated,
        "/// Every guest: (name, wasm path, native path).\npub const ALL: &[(&str, &str, &str)] = &[\n{all}];"
    )
    .unwrap();

    for (name, wasm) in build_foreign_components(&root, &guests, &target_dir) {
        let constant = name.to_uppercase().replace('-', "_");
        writeln!(
            generated,
            "/// The `{name}` typed component, built by its language's own toolchain.\npub const {constant}_WASM: &str = {:?};",
            wasm.display().to_string()
        )
        .unwrap();
        components.insert(name);
    }
    std::fs::write(out_dir.join("guests.rs"), &generated).unwrap();

    let mut every = bins.clone();
    every.extend(components);
    check_every_guest_is_tested(&root, &every);
}

/// Typed components in JavaScript (`guests/js`, componentize-js) and Python
/// (`guests/py`, componentize-py), built with the tools tests/setup.sh
/// installs under `target/npm` and `target/py`. Neither toolchain embeds
/// the WIT's doc comments, so a `package-docs` section is appended, as
/// wit-parser encodes it. Returns (name, component).
fn build_foreign_components(
    root: &Path,
    guests: &Path,
    target_dir: &Path,
) -> Vec<(String, PathBuf)> {
    let out = target_dir.join("components");
    std::fs::create_dir_all(&out).unwrap();
    let setup = "run `bash tests/setup.sh` first: it installs the JavaScript and Python component toolchains";
    let componentize_js = root.join("target/npm/node_modules/@bytecodealliance/componentize-js");
    assert!(
        componentize_js.join("package.json").exists(),
        "componentize-js is not installed at {}: {setup}",
        componentize_js.display()
    );
    let py = root.join("target/py");
    assert!(
        py.join("componentize_py").exists(),
        "componentize-py is not installed in {}: {setup}",
        py.display()
    );
    let js = out.join("js-tools.wasm");
    let python = out.join("py-tools.wasm");
    // Built already from these very sources and tools (another host build
    // sharing the guests' target dir, such as CI's fuzz build while the
    // tests run): left as they are, not written again under a reader.
    let inputs = [
        // How they are built, as much as what from.
        root.join("crates/test-guests/build.rs"),
        guests.join("js"),
        guests.join("py"),
        componentize_js.join("package.json"),
        py.join("componentize_py"),
    ];
    if newer_than_all(&[&js, &python], &inputs) {
        return vec![("js-tools".into(), js), ("py-tools".into(), python)];
    }
    run(
        Command::new("node")
            .current_dir(guests.join("js"))
            .arg("build.mjs")
            .arg(&componentize_js)
            .arg(&js),
        "building guests/js with componentize-js",
    );
    // componentize-py runs the app to snapshot it, and Python writes
    // `__pycache__` beside the source it imports. Written under guests/,
    // that would be newer than this script's last run, so the next cargo
    // command would run the script again and rebuild every crate above
    // this one (97 s of CI's test stage). It builds a copy instead.
    let py_source = out.join("py-source");
    copy_tree(&guests.join("py"), &py_source);
    run(
        Command::new("python3")
            .current_dir(&py_source)
            .env("PYTHONPATH", &py)
            .args([
                "-c",
                "import sys, componentize_py; sys.argv[0] = 'componentize-py'; componentize_py.script()",
                "-d",
                "wit",
                "-w",
                "py-tools",
                "componentize",
                "app",
                "-o",
            ])
            .arg(&python),
        "building guests/py with componentize-py",
    );
    for (dir, wasm) in [("js", &js), ("py", &python)] {
        append_package_docs(&guests.join(dir).join("wit"), wasm);
    }
    vec![("js-tools".into(), js), ("py-tools".into(), python)]
}

/// Whether every one of `outputs` exists and is newer than every file
/// under `inputs` (files, or directories walked whole).
fn newer_than_all(outputs: &[&Path], inputs: &[PathBuf]) -> bool {
    fn latest(path: &Path) -> Option<std::time::SystemTime> {
        let meta = std::fs::metadata(path).ok()?;
        let mut newest = meta.modified().ok()?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(path).ok()? {
                newest = newest.max(latest(&entry.ok()?.path())?);
            }
        }
        Some(newest)
    }
    let Some(input) = inputs.iter().map(|i| latest(i)).collect::<Option<Vec<_>>>() else {
        return false;
    };
    let input = input.into_iter().max();
    outputs.iter().all(|output| {
        std::fs::metadata(output)
            .and_then(|m| m.modified())
            .is_ok_and(|built| input.is_none_or(|input| built > input))
    })
}

/// Copies the files of `from` into `to` (made afresh), directories
/// recursively; `__pycache__` is left out.
fn copy_tree(from: &Path, to: &Path) {
    if to.exists() {
        std::fs::remove_dir_all(to).unwrap_or_else(|e| panic!("removing {}: {e}", to.display()));
    }
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("creating {}: {e}", to.display()));
    for entry in
        std::fs::read_dir(from).unwrap_or_else(|e| panic!("reading {}: {e}", from.display()))
    {
        let entry = entry.unwrap();
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type().unwrap().is_dir() {
            if entry.file_name() != "__pycache__" {
                copy_tree(&source, &target);
            }
        } else {
            std::fs::copy(&source, &target)
                .unwrap_or_else(|e| panic!("copying {}: {e}", source.display()));
        }
    }
}

fn run(command: &mut Command, what: &str) {
    let status = command.status().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(status.success(), "{what} failed ({status})");
}

/// Appends the doc comments of the WIT package in `wit` to `wasm` as a
/// top-level `package-docs` custom section.
fn append_package_docs(wit: &Path, wasm: &Path) {
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve
        .push_path(wit)
        .unwrap_or_else(|e| panic!("parsing {}: {e:#}", wit.display()));
    let docs = wit_parser::PackageMetadata::extract(&resolve, package)
        .encode()
        .expect("encoding package docs");
    let name = b"package-docs";
    let mut payload = leb128(name.len());
    payload.extend_from_slice(name);
    payload.extend_from_slice(&docs);
    let mut section = vec![0u8];
    section.extend(leb128(payload.len()));
    section.extend(payload);
    let mut bytes = std::fs::read(wasm).unwrap();
    bytes.extend(section);
    std::fs::write(wasm, bytes).unwrap();
}

fn leb128(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// A clear error, rather than a wall of `can't find crate for std`, when the
/// toolchain lacks the wasm32-wasip2 target.
fn require_wasm_target() {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if let Some(sysroot) = sysroot {
        let target = sysroot.join("lib/rustlib/wasm32-wasip2");
        assert!(
            target.exists(),
            "the wasm32-wasip2 target is not installed in {}: run `rustup toolchain install` \
             in the repository (it reads rust-toolchain.toml) or `rustup target add wasm32-wasip2`",
            sysroot.display()
        );
    }
}

/// Guest binaries: each package's main binary, and every `src/bin/*.rs`.
fn guest_bins(guests: &Path) -> Vec<String> {
    let mut bins = BTreeSet::new();
    for entry in std::fs::read_dir(guests).unwrap() {
        let package = entry.unwrap().path();
        if !package.join("Cargo.toml").exists() {
            continue;
        }
        if package.join("src/main.rs").exists() {
            bins.insert(package.file_name().unwrap().to_string_lossy().into_owned());
        }
        if let Ok(entries) = std::fs::read_dir(package.join("src/bin")) {
            for entry in entries {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "rs") {
                    bins.insert(path.file_stem().unwrap().to_string_lossy().into_owned());
                }
            }
        }
    }
    bins.into_iter().collect()
}

/// Library components: packages whose manifest makes a `cdylib`.
fn guest_components(guests: &Path) -> BTreeSet<String> {
    packages_whose_manifest_says(guests, "crate-type=[\"cdylib\"]")
}

/// The guests' profile (guests/Cargo.toml): `dist`, whole-program, for a
/// host build of the release profile (`cargo bench`, whose figures are
/// those of the guests a server author ships); `release`, which builds in
/// half the time, for the tests'.
fn guests_profile() -> &'static str {
    match std::env::var("PROFILE").as_deref() {
        Ok("release") => "dist",
        _ => "release",
    }
}

/// Packages whose manifest asks for a build of their own.
fn build_alone_packages(guests: &Path) -> Vec<String> {
    packages_whose_manifest_says(guests, "build-alone=true")
        .into_iter()
        .collect()
}

/// Packages with a manifest line that is `line` once spaces are removed.
fn packages_whose_manifest_says(guests: &Path, line: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(guests).unwrap() {
        let package = entry.unwrap().path();
        let manifest = std::fs::read_to_string(package.join("Cargo.toml")).unwrap_or_default();
        if manifest.lines().any(|l| l.replace(' ', "") == line) {
            found.insert(package.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    found
}

fn build(
    root: &Path,
    guests: &Path,
    target_dir: &Path,
    target: Option<&str>,
    selection: &[String],
    profile: &str,
) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(guests)
        .arg("build")
        .args(["--profile", profile])
        .args(selection)
        .arg("--locked")
        .arg("--target-dir")
        .arg(target_dir);
    if let Some(target) = target {
        cmd.arg("--target").arg(target);
    }
    // The host build's flags (and wrappers, coverage, sanitizers) are not the
    // guests' business.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PROFILE_RELEASE_DEBUG",
        "CARGO_INCREMENTAL",
    ] {
        cmd.env_remove(var);
    }
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_FEATURE_") || key.starts_with("CARGO_CFG_") {
            cmd.env_remove(key.as_ref());
        }
    }
    // Keep the build machine's paths (home, checkout) out of the guests.
    // (Bytes still differ between checkouts: cargo hashes path dependencies'
    // locations into crate metadata.)
    let mut flags = vec![format!("--remap-path-prefix={}=/moat", root.display())];
    if let Some(home) = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
    {
        flags.push(format!("--remap-path-prefix={}=/cargo", home.display()));
    }
    cmd.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"));
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running cargo to build the guests: {e}"));
    assert!(
        status.success(),
        "building the guests in {} ({}) for {} failed",
        guests.display(),
        selection.join(" "),
        target.unwrap_or("the host")
    );
}

/// Every guest must be used by some test: a guest nobody runs is a hostile
/// case nobody checks.
fn check_every_guest_is_tested(root: &Path, bins: &[String]) {
    let mut sources = String::new();
    for dir in TEST_DIRS {
        collect_sources(&root.join(dir), &mut sources);
    }
    let untested: Vec<&String> = bins
        .iter()
        .filter(|bin| !uses(&sources, &bin.to_uppercase().replace('-', "_")))
        .collect();
    assert!(
        untested.is_empty(),
        "guests without a test that uses them: {untested:?}; use moat_test_guests::<NAME> (or <NAME>_WASM, <NAME>_NATIVE) in a test under {TEST_DIRS:?}"
    );
}

/// Whether `sources` name the guest's constant: `::NAME`, `::NAME_WASM` or
/// `::NAME_NATIVE`.
fn uses(sources: &str, constant: &str) -> bool {
    let needle = format!("::{constant}");
    sources.match_indices(&needle).any(|(at, _)| {
        let rest = &sources[at + needle.len()..];
        rest.starts_with("_WASM")
            || rest.starts_with("_NATIVE")
            || !rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
    })
}

fn collect_sources(dir: &Path, out: &mut String) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
}

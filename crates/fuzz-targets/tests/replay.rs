//! Every file of the fuzz corpus (`fuzz/corpus/TARGET/`) and every crash the
//! fuzzer ever saved (`fuzz/artifacts/TARGET/`) runs through its target as a
//! plain test: what was found once stays found. The `wasm_boundary` target
//! drives the `replay` guest (moat_test_guests::REPLAY_WASM).

use std::path::Path;

fn inputs(target: &str) -> Vec<std::path::PathBuf> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut files = Vec::new();
    for dir in ["corpus", "artifacts"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else {
            continue;
        };
        files.extend(
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file()),
        );
    }
    files.sort();
    files
}

#[test]
fn every_corpus_file_and_past_crash_replays_cleanly() {
    let mut replayed = 0;
    for (target, run) in moat_fuzz_targets::TARGETS {
        let files = inputs(target);
        assert!(!files.is_empty(), "fuzz/corpus/{target} has no seed");
        for file in files {
            let data = std::fs::read(&file).unwrap();
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{target}: {} fails", file.display());
            replayed += 1;
        }
    }
    assert!(replayed >= moat_fuzz_targets::TARGETS.len());
}

/// The planted crash is real: the config target panics on it when built
/// with the test-only feature, which is how CI shows a short fuzz run finds
/// crashes. Without the feature the same input is harmless.
#[test]
fn the_planted_crash_fires_only_with_its_feature() {
    let outcome = std::panic::catch_unwind(|| moat_fuzz_targets::config(b"# MOAT-PLANTED-CRASH\n"));
    assert_eq!(outcome.is_err(), cfg!(feature = "planted-crash"));
}

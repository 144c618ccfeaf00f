//! Holds the layer table in `lib.rs` against the code: every module is in
//! the table once, every `crate::` path outside comments and unit tests
//! names a module of its own layer or one below, and no module reaches
//! itself through others.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The table in `lib.rs`: module → layer.
fn table(lib: &str) -> BTreeMap<String, u32> {
    let mut layers = BTreeMap::new();
    for line in lib.lines() {
        let Some(row) = line.strip_prefix("//! | ") else {
            continue;
        };
        let cells: Vec<&str> = row.split(" | ").collect();
        let Ok(layer) = cells[0].trim().parse::<u32>() else {
            continue;
        };
        for module in cells[1].split(',') {
            let module = module.trim().trim_matches('`');
            let before = layers.insert(module.to_owned(), layer);
            assert!(before.is_none(), "`{module}` is in the table twice");
        }
    }
    layers
}

/// The source files of each module: `src/NAME.rs`, or every file under
/// `src/NAME/`.
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" || name == "layers" {
            continue;
        }
        // `NAME.rs` and `NAME/` are one module.
        let files = modules.entry(name).or_insert_with(Vec::new);
        if path.is_dir() {
            walk(&path, files);
        } else {
            files.push(path);
        }
    }
    modules
}

/// The modules `source` names as `crate::NAME`, outside comments and its
/// unit tests.
fn uses(source: &str) -> BTreeSet<String> {
    let code = source
        .find("#[cfg(test)]\nmod tests")
        .map_or(source, |at| &source[..at]);
    let mut used = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or_default();
        for (at, _) in line.match_indices("crate::") {
            // Not `moat_host_crate::` or the like.
            if line[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = line[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !name.is_empty() {
                used.insert(name);
            }
        }
    }
    used
}

#[test]
fn every_module_imports_only_its_own_layer_and_those_below_and_nothing_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layers = table(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let modules = modules(&src);
    let mut graph: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut broken = Vec::new();
    for (module, files) in &modules {
        let Some(&layer) = layers.get(module) else {
            broken.push(format!("`{module}` is not in lib.rs's layer table"));
            continue;
        };
        let mut used = BTreeSet::new();
        for file in files {
            for name in uses(&std::fs::read_to_string(file).unwrap()) {
                if name == *module {
                    continue;
                }
                match layers.get(&name) {
                    Some(&to) if to > layer => broken.push(format!(
                        "{} (layer {layer}) imports `{name}` (layer {to})",
                        file.strip_prefix(&src).unwrap().display()
                    )),
                    _ => {}
                }
                used.insert(name);
            }
        }
        graph.insert(module, used);
    }
    for listed in layers.keys() {
        if !modules.contains_key(listed) {
            broken.push(format!("`{listed}` is in the table but not in src/"));
        }
    }
    // No circle: a module never reaches itself.
    for start in graph.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(&str, Vec<&str>)> = vec![(start, vec![start])];
        while let Some((at, path)) = stack.pop() {
            for next in graph.get(at).into_iter().flatten() {
                if next == start {
                    broken.push(format!("a circle: {} -> {start}", path.join(" -> ")));
                } else if seen.insert(next.as_str()) {
                    let mut path = path.clone();
                    path.push(next);
                    stack.push((next, path));
                }
            }
        }
    }
    broken.sort();
    broken.dedup();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn a_path_upward_is_caught_and_comments_and_tests_are_not_read() {
    let used = uses(
        "use crate::config::X;\n// crate::gateway in a comment\nlet x = crate::wasm::y; // crate::http\nfn f() { moat_crate::z(); }\n#[cfg(test)]\nmod tests {\n    use crate::fuzz;\n}\n",
    );
    assert_eq!(
        used.into_iter().collect::<Vec<_>>(),
        ["config".to_owned(), "wasm".to_owned()]
    );
    let layers =
        table("//! | 1 | `a`, `b` | x |\n//! | 2 | `c` | y |\n//! | layer | modules | what |\n");
    assert_eq!(layers.get("b"), Some(&1));
    assert_eq!(layers.get("c"), Some(&2));
}

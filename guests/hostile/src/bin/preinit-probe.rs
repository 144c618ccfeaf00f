//! Not hostile: its initialiser (`wizer-initialize`, run once when Moat
//! snapshots the component) keeps a string, and `attack` answers, as JSON
//! text, `{"snapshot": bool, "kept": ..., "run": {...}}`: whether this
//! instance started from the snapshot, what the initialiser kept (null
//! without a snapshot), and what `main` is given: `args`, `env` (every
//! variable) and `data` (the names in the directory `/data`, or null when
//! it cannot be listed).

moat_wit::preinit!(keep);

fn keep() -> String {
    "kept by the initialiser".to_owned()
}

fn given() -> serde_json::Value {
    let args: Vec<String> = std::env::args().collect();
    let env: serde_json::Map<String, serde_json::Value> = std::env::vars()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    let data: Option<Vec<String>> = std::fs::read_dir("/data").ok().map(|entries| {
        entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    });
    serde_json::json!({"args": args, "env": env, "data": data})
}

fn main() {
    let snapshot = moat_wit::is_preinitialized();
    let kept = snapshot.then(|| moat_wit::preinitialized(String::new));
    hostile::serve("preinit-probe", move |id: &serde_json::Value| {
        let report = serde_json::json!({"snapshot": snapshot, "kept": kept, "run": given()});
        Some(hostile::text_result(id, &report.to_string()))
    });
}

//! Not hostile: answers `attack` with what it was given, as JSON text:
//! `{"argv": [...], "env": {...}, "cwd": "...", "pid": N, "meta": {...}}`
//! (`meta`: the call's `_meta`). Tests use it to
//! check that argv, the environment and the working directory arrive exactly,
//! and which process answered (`pid`, as the host sees it, is null under
//! wasm, which has none).
fn main() {
    hostile::serve("report", |id: &serde_json::Value| {
        let argv: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let env: serde_json::Map<String, serde_json::Value> = std::env::vars_os()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    serde_json::Value::String(v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        let cwd = std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        // The pid as the host sees it: /proc is the host's, so /proc/self
        // names this process even inside its own PID namespace.
        #[cfg(not(target_os = "wasi"))]
        let pid = Some(
            std::fs::read_link("/proc/self")
                .ok()
                .and_then(|p| p.to_str()?.parse::<u32>().ok())
                .unwrap_or_else(std::process::id),
        );
        #[cfg(target_os = "wasi")]
        let pid: Option<u32> = None;
        let report = serde_json::json!({
            "argv": argv, "env": env, "cwd": cwd, "pid": pid, "meta": hostile::call_meta(),
        });
        Some(hostile::text_result(id, &report.to_string()))
    });
}

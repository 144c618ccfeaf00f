//! Not hostile: answers `attack` with what it was given, as JSON text:
//! `{"argv": [...], "env": {...}, "cwd": "...", "pid": N, "pid_ns": "...",
//! "meta": {...}}` (`meta`: the call's `_meta`). Tests use it to check that
//! argv, the environment and the working directory arrive exactly, and which
//! process answered: `pid` as its own /proc names it, and `pid_ns`, its PID
//! namespace (`pid:[inode]`), which the host can look for in its /proc
//! (both null under wasm, which has no processes).
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
        // The pid as this process's /proc names it (1 in a server's own
        // PID namespace), and that namespace.
        #[cfg(not(target_os = "wasi"))]
        let pid = Some(
            std::fs::read_link("/proc/self")
                .ok()
                .and_then(|p| p.to_str()?.parse::<u32>().ok())
                .unwrap_or_else(std::process::id),
        );
        #[cfg(not(target_os = "wasi"))]
        let pid_ns = std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .map(|p| p.display().to_string());
        #[cfg(target_os = "wasi")]
        let (pid, pid_ns): (Option<u32>, Option<String>) = (None, None);
        let report = serde_json::json!({
            "argv": argv, "env": env, "cwd": cwd, "pid": pid, "pid_ns": pid_ns,
            "meta": hostile::call_meta(),
        });
        Some(hostile::text_result(id, &report.to_string()))
    });
}

//! Before answering `tools/call`, sends 100,000 notifications (log messages
//! and progress for a token nobody asked for).
fn main() {
    hostile::serve("notification-flood", |id: &serde_json::Value| {
        for i in 0..100_000u32 {
            let note = if i % 2 == 0 {
                serde_json::json!({"jsonrpc": "2.0", "method": "notifications/message",
                    "params": {"level": "info", "data": format!("flood {i}")}})
            } else {
                serde_json::json!({"jsonrpc": "2.0", "method": "notifications/progress",
                    "params": {"progressToken": "nobody-asked", "progress": i}})
            };
            hostile::send(&note);
        }
        Some(hostile::text_result(id, "after the flood"))
    });
}

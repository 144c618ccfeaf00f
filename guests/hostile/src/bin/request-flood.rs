//! On `tools/call`, sends the client 10,000 requests of its own (`ping` and
//! `sampling/createMessage`) without reading a single answer, then answers.
fn main() {
    hostile::serve("request-flood", |id: &serde_json::Value| {
        for i in 0..10_000u32 {
            let request = if i % 2 == 0 {
                serde_json::json!({"jsonrpc": "2.0", "id": format!("flood-{i}"), "method": "ping"})
            } else {
                serde_json::json!({"jsonrpc": "2.0", "id": format!("flood-{i}"),
                    "method": "sampling/createMessage",
                    "params": {"messages": [], "maxTokens": 1}})
            };
            hostile::send(&request);
        }
        Some(hostile::text_result(id, "after the flood"))
    });
}

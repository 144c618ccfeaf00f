//! Answers `tools/call` with an answer to a request that was never sent
//! (`STRAY=unknown`, the default) or answers the call twice
//! (`STRAY=duplicate`).
fn main() {
    let duplicate = std::env::var("STRAY").as_deref() == Ok("duplicate");
    hostile::serve("stray-ids", move |id: &serde_json::Value| {
        if duplicate {
            hostile::send(&hostile::text_result(id, "first"));
            Some(hostile::text_result(id, "second"))
        } else {
            Some(hostile::text_result(
                &serde_json::json!(424242),
                "to nobody",
            ))
        }
    });
}

//! On `tools/call`, opens `OPEN_PATH` again and again, keeping every handle,
//! until an open fails; answers with how many succeeded and the error.
fn main() {
    let path = std::env::var("OPEN_PATH").unwrap_or_else(|_| "/data/file".to_owned());
    hostile::serve("open-files", move |id: &serde_json::Value| {
        let mut handles = Vec::new();
        let error = loop {
            match std::fs::File::open(&path) {
                Ok(file) => handles.push(file),
                Err(error) => break error.to_string(),
            }
            if handles.len() >= 1_000_000 {
                break "no limit met".to_owned();
            }
        };
        let report = format!("opened {} then: {error}", handles.len());
        Some(hostile::text_result(id, &report))
    });
}

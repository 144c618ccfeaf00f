//! Canonical forms: JSON with sorted keys and no insignificant space, a
//! tool's, prompt's or resource's canonical definition, a tool's pin, and
//! the execution identity digest of a server.

use std::collections::BTreeMap;

use crate::identity::Digest;

/// JSON with object keys sorted at every level and no insignificant space.
pub fn canonical_json(value: &serde_json::Value) -> String {
    fn write(value: &serde_json::Value, out: &mut String) {
        match value {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::String(key.clone()).to_string());
                    out.push(':');
                    write(&map[key], out);
                }
                out.push('}');
            }
            serde_json::Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// A tool's canonical definition: name, description, inputSchema and
/// outputSchema (null when absent), as canonical JSON.
pub fn canonical_tool(tool: &rmcp::model::Tool) -> String {
    let value = serde_json::to_value(tool).unwrap_or_default();
    let field = |name: &str| value.get(name).cloned().unwrap_or(serde_json::Value::Null);
    canonical_json(&serde_json::json!({
        "name": field("name"),
        "description": field("description"),
        "inputSchema": field("inputSchema"),
        "outputSchema": field("outputSchema"),
    }))
}

/// A prompt's or resource's canonical definition: everything it is listed
/// with, as canonical JSON.
pub fn canonical_listing(item: &impl serde::Serialize) -> String {
    canonical_json(&serde_json::to_value(item).unwrap_or_default())
}

/// A tool's pin: bound to the server's identity, so the same definition
/// served by other bytes is a different pin.
pub fn tool_pin(identity: &Digest, canonical_definition: &str) -> Digest {
    Digest::of(format!("{identity}\n{canonical_definition}").as_bytes())
}

/// What a server's execution identity is made of.
#[derive(Clone, Debug)]
pub struct IdentityParts<'a> {
    pub kind: &'a str,
    pub sha256: Option<Digest>,
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env_names: Vec<String>,
    pub measured: BTreeMap<String, String>,
    /// Whether a component runs from a snapshot of its initialised state
    /// rather than its measured bytes as they are (the snapshot's own
    /// digest is not reproducible, so only the mode is part of it).
    pub snapshot: bool,
}

/// The execution identity digest: (kind, digest, argv, cwd, environment
/// names, measured files, and `"snapshot": true` for a component started
/// from a snapshot, absent otherwise) as canonical JSON, hashed. It keys
/// reuse; a display name never does.
pub fn execution_identity(parts: &IdentityParts<'_>) -> Digest {
    let mut env_names = parts.env_names.clone();
    env_names.sort();
    env_names.dedup();
    let mut value = serde_json::json!({
        "kind": parts.kind,
        "sha256": parts.sha256.map(|d| d.to_string()),
        "argv": parts.argv,
        "cwd": parts.cwd,
        "env": env_names,
        "measured": parts.measured,
    });
    if parts.snapshot {
        value["snapshot"] = serde_json::Value::Bool(true);
    }
    Digest::of(canonical_json(&value).as_bytes())
}

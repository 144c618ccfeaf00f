//! Flags on untrusted text meant for people and models (tool, prompt and
//! resource definitions): control and invisible characters, planted
//! instructions, override phrases, sensitive paths, and references to
//! another server's tools.

use super::Lock;
use crate::text::{is_bidi_control, is_zero_width};

/// Findings about untrusted text meant for people and models: control
/// characters (other than newline and tab), ANSI escapes, zero-width and
/// bidirectional-override characters.
pub fn metadata_flags(text: &str) -> Vec<String> {
    let mut flags = Vec::new();
    if text.contains('\u{1b}') {
        flags.push("ansi-escape".to_owned());
    }
    if text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t' && c != '\u{1b}')
    {
        flags.push("control-characters".to_owned());
    }
    if text.chars().any(is_zero_width) {
        flags.push("zero-width-characters".to_owned());
    }
    if text.chars().any(is_bidi_control) {
        flags.push("bidi-controls".to_owned());
    }
    flags
}

/// Markers of instructions planted for the model, in lower case
/// (`instruction-tags`).
pub const INSTRUCTION_TAGS: &[&str] = &[
    "<important",
    "</important",
    "<system",
    "</system",
    "<instruction",
    "</instruction",
    "<admin",
    "<secret",
    "[inst]",
    "<|im_start|>",
    "<|system|>",
];

/// Phrases that try to override the agent's instructions or hide what a tool
/// does, in lower case (`override-phrases`).
pub const OVERRIDE_PHRASES: &[&str] = &[
    "ignore previous instructions",
    "ignore all previous",
    "ignore the previous",
    "ignore prior instructions",
    "ignore all prior",
    "disregard previous",
    "disregard all previous",
    "disregard the above",
    "disregard prior",
    "forget your instructions",
    "forget all previous",
    "new instructions:",
    "you are now",
    "do not tell the user",
    "don't tell the user",
    "do not inform the user",
    "do not mention this",
    "without telling the user",
    "without informing the user",
    "the user must not know",
    "hide this from the user",
];

/// Paths and files that hold secrets or other agents' configs, in lower case
/// (`sensitive-paths`).
pub const SENSITIVE_PATHS: &[&str] = &[
    "~/.ssh",
    ".ssh/",
    "id_rsa",
    "id_ed25519",
    "~/.aws",
    ".aws/credentials",
    "/etc/passwd",
    "/etc/shadow",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".git-credentials",
    ".kube/config",
    ".docker/config.json",
    "mcp.json",
    "claude_desktop_config",
    ".config/gcloud",
    "private key",
];

/// Every flag for untrusted text: [`metadata_flags`], then the rule lists
/// above, each named once when any of its entries occurs (case-insensitive).
/// `.env` counts as a sensitive path only as a whole name.
pub fn text_flags(text: &str) -> Vec<String> {
    let mut flags = metadata_flags(text);
    let lower = text.to_lowercase();
    let rules: [(&str, &[&str]); 3] = [
        ("instruction-tags", INSTRUCTION_TAGS),
        ("override-phrases", OVERRIDE_PHRASES),
        ("sensitive-paths", SENSITIVE_PATHS),
    ];
    for (flag, entries) in rules {
        let mut hit = entries.iter().any(|entry| lower.contains(entry));
        if flag == "sensitive-paths" && !hit {
            hit = lower.match_indices(".env").any(|(at, _)| {
                let before = lower[..at].chars().next_back();
                let after = lower[at + 4..].chars().next();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
            });
        }
        if hit {
            flags.push(flag.to_owned());
        }
    }
    flags
}

/// Every string in a canonical definition (names, descriptions, schema
/// titles and descriptions, property names), for checking.
fn strings_in(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::String(text) => out.push(text.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|v| strings_in(v, out)),
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                out.push(key.clone());
                strings_in(value, out);
            }
        }
        _ => {}
    }
}

/// The flags of a canonical definition: [`text_flags`] over every string in
/// it, sorted and without repeats.
pub fn definition_flags(definition: &str) -> Vec<String> {
    let mut strings = Vec::new();
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(definition) {
        strings_in(&value, &mut strings);
    }
    let mut flags: Vec<String> = strings.iter().flat_map(|s| text_flags(s)).collect();
    flags.sort();
    flags.dedup();
    flags
}

/// Adds `names-other-server:SERVER` to every tool, prompt and resource
/// whose definition names another server's tools: by an exposed name
/// (`SERVER__TOOL`), or by the server's name together with one of its tool
/// names, each as a word. A description that steers the model towards
/// another server's tools is the cross-server injection of tool poisoning;
/// a server's name alone is often a common word (`excel`, `git`, `time`)
/// that a harmless description uses, and is no sign of it.
pub fn flag_cross_server_references(lock: &mut Lock) {
    let names: Vec<(String, Vec<String>, Vec<String>)> = lock
        .servers
        .iter()
        .map(|(server, entry)| {
            let tools: Vec<String> = entry
                .tools
                .iter()
                .chain(&entry.prompts)
                .map(|t| t.name.to_lowercase())
                .collect();
            let exposed = tools
                .iter()
                .map(|t| format!("{}__{t}", server.to_lowercase()))
                .collect();
            (server.clone(), exposed, tools)
        })
        .collect();
    for (server, entry) in lock.servers.iter_mut() {
        for item in entry
            .tools
            .iter_mut()
            .chain(entry.prompts.iter_mut())
            .chain(entry.resources.iter_mut())
        {
            let mut strings = Vec::new();
            if let Ok(value) = serde_json::from_str::<serde_json::Value>(&item.definition) {
                strings_in(&value, &mut strings);
            }
            let text = strings.join("\n").to_lowercase();
            for (other, exposed, tools) in &names {
                if other == server {
                    continue;
                }
                let named = exposed.iter().any(|e| text.contains(e.as_str()))
                    || (contains_word(&text, &other.to_lowercase())
                        && tools.iter().any(|t| contains_word(&text, t)));
                let flag = format!("names-other-server:{other}");
                if named && !item.flags.contains(&flag) {
                    item.flags.push(flag);
                    item.flags.sort();
                }
            }
        }
    }
}

/// Whether `word` occurs in `text` with no letter, digit, `_` or `-` on
/// either side.
fn contains_word(text: &str, word: &str) -> bool {
    let part = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    text.match_indices(word).any(|(at, _)| {
        !text[..at].chars().next_back().is_some_and(part)
            && !text[at + word.len()..].chars().next().is_some_and(part)
    })
}

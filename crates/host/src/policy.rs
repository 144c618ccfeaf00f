//! Policy: tool pins and schema checks. What a server says about its tools is
//! untrusted: with a lock, only pinned tools are exposed, with their pinned
//! definitions; a drifted or new tool is unavailable; arguments are validated
//! against the pinned input schema before they reach the server, and
//! structured output against the pinned output schema.

use std::collections::BTreeMap;

use rmcp::model::Tool;

use crate::identity::Digest;
use crate::lock::{LockedServer, canonical_tool, tool_pin};

/// Where a tool stands against the lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolStatus {
    /// The live definition is the pinned one.
    Pinned { sha256: String },
    /// The server now describes the tool differently.
    Drifted { locked: String, live: String },
    /// The server lists a tool the lock does not know.
    New { live: String },
    /// The lock pins a tool the server no longer lists.
    Missing { locked: String },
}

impl ToolStatus {
    /// One word for tables: pinned, drifted, new, missing.
    pub fn word(&self) -> &'static str {
        match self {
            Self::Pinned { .. } => "pinned",
            Self::Drifted { .. } => "drifted",
            Self::New { .. } => "new",
            Self::Missing { .. } => "missing",
        }
    }
}

/// A tool's name and status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolReport {
    pub name: String,
    pub status: ToolStatus,
}

/// Why a lock entry cannot be used.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("lock entry for tool `{tool}`: the definition is not a tool: {detail}")]
    Definition { tool: String, detail: String },
    #[error("lock entry for tool `{tool}`: inputSchema is not a usable JSON Schema: {detail}")]
    Schema { tool: String, detail: String },
}

/// A schema check that failed: the JSON pointer of the failing value and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("at `{pointer}`: {message}")]
pub struct SchemaViolation {
    pub pointer: String,
    pub message: String,
}

struct PinnedTool {
    sha256: String,
    definition: Tool,
    input: jsonschema::Validator,
    output: Option<jsonschema::Validator>,
}

/// The pins of one server, ready to check live tools and calls against.
pub struct Pins {
    identity: Digest,
    tools: BTreeMap<String, PinnedTool>,
}

impl Pins {
    /// Pins from a lock entry, for a server whose live identity is `identity`.
    pub fn from_locked(locked: &LockedServer, identity: Digest) -> Result<Self, PolicyError> {
        let mut tools = BTreeMap::new();
        for entry in &locked.tools {
            let definition: Tool =
                serde_json::from_str(&entry.definition).map_err(|e| PolicyError::Definition {
                    tool: entry.name.clone(),
                    detail: e.to_string(),
                })?;
            let input_schema = serde_json::Value::Object((*definition.input_schema).clone());
            let input =
                jsonschema::validator_for(&input_schema).map_err(|e| PolicyError::Schema {
                    tool: entry.name.clone(),
                    detail: e.to_string(),
                })?;
            let output = match &definition.output_schema {
                Some(schema) => Some(
                    jsonschema::validator_for(&serde_json::Value::Object((**schema).clone()))
                        .map_err(|e| PolicyError::Schema {
                            tool: entry.name.clone(),
                            detail: e.to_string(),
                        })?,
                ),
                None => None,
            };
            tools.insert(
                entry.name.clone(),
                PinnedTool {
                    sha256: entry.sha256.clone(),
                    definition,
                    input,
                    output,
                },
            );
        }
        Ok(Self { identity, tools })
    }

    /// Compares what the server lists now with the pins.
    pub fn evaluate(&self, live: &[Tool]) -> Vec<ToolReport> {
        let mut reports = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for tool in live {
            let name = tool.name.to_string();
            let live_pin = tool_pin(&self.identity, &canonical_tool(tool)).to_string();
            let status = match self.tools.get(&name) {
                Some(pinned) if pinned.sha256 == live_pin => {
                    ToolStatus::Pinned { sha256: live_pin }
                }
                Some(pinned) => ToolStatus::Drifted {
                    locked: pinned.sha256.clone(),
                    live: live_pin,
                },
                None => ToolStatus::New { live: live_pin },
            };
            seen.insert(name.clone());
            reports.push(ToolReport { name, status });
        }
        for (name, pinned) in &self.tools {
            if !seen.contains(name) {
                reports.push(ToolReport {
                    name: name.clone(),
                    status: ToolStatus::Missing {
                        locked: pinned.sha256.clone(),
                    },
                });
            }
        }
        reports.sort_by(|a, b| a.name.cmp(&b.name));
        reports
    }

    /// The pinned definitions of the tools whose status is pinned: what an
    /// agent gets to read, taken from the lock and not from the server.
    pub fn exposed(&self, reports: &[ToolReport]) -> Vec<Tool> {
        reports
            .iter()
            .filter(|r| matches!(r.status, ToolStatus::Pinned { .. }))
            .filter_map(|r| self.tools.get(&r.name).map(|t| t.definition.clone()))
            .collect()
    }

    /// Checks arguments against the pinned input schema.
    pub fn check_arguments(
        &self,
        tool: &str,
        arguments: &serde_json::Value,
    ) -> Result<(), SchemaViolation> {
        match self.tools.get(tool) {
            Some(pinned) => first_violation(&pinned.input, arguments),
            None => Ok(()),
        }
    }

    /// Checks structured output against the pinned output schema, if any.
    pub fn check_output(
        &self,
        tool: &str,
        structured: &serde_json::Value,
    ) -> Result<(), SchemaViolation> {
        match self.tools.get(tool).and_then(|t| t.output.as_ref()) {
            Some(validator) => first_violation(validator, structured),
            None => Ok(()),
        }
    }
}

pub(crate) fn first_violation(
    validator: &jsonschema::Validator,
    instance: &serde_json::Value,
) -> Result<(), SchemaViolation> {
    match validator.iter_errors(instance).next() {
        None => Ok(()),
        Some(error) => {
            let pointer = error.instance_path().to_string();
            Err(SchemaViolation {
                pointer: if pointer.is_empty() {
                    "/".to_owned()
                } else {
                    pointer
                },
                message: error.to_string(),
            })
        }
    }
}

/// The pins of a server's prompts or resources (`kind`): a listed item is
/// served from its pinned definition when the live one matches it, and is
/// unavailable otherwise.
pub struct ListingPins {
    kind: &'static str,
    identity: Digest,
    /// By name (prompts) or URI (resources): the pin and the definition.
    items: BTreeMap<String, (String, String)>,
}

impl ListingPins {
    /// From the lock's entries of `kind` ("prompt" or "resource").
    pub fn from_locked(
        kind: &'static str,
        entries: &[crate::lock::LockedTool],
        identity: Digest,
    ) -> Self {
        Self {
            kind,
            identity,
            items: entries
                .iter()
                .map(|e| (e.name.clone(), (e.sha256.clone(), e.definition.clone())))
                .collect(),
        }
    }

    /// What `kind` this pins.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Of `live` items, as (name, canonical definition): the pinned
    /// definitions of those as pinned, and a report of every other (drifted,
    /// new, missing).
    pub fn evaluate(&self, live: &[(String, String)]) -> (Vec<(String, String)>, Vec<ToolReport>) {
        let mut served = Vec::new();
        let mut others = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (name, definition) in live {
            seen.insert(name.clone());
            let live_pin = tool_pin(&self.identity, definition).to_string();
            let status = match self.items.get(name) {
                Some((pinned, definition)) if *pinned == live_pin => {
                    served.push((name.clone(), definition.clone()));
                    continue;
                }
                Some((pinned, _)) => ToolStatus::Drifted {
                    locked: pinned.clone(),
                    live: live_pin,
                },
                None => ToolStatus::New { live: live_pin },
            };
            others.push(ToolReport {
                name: name.clone(),
                status,
            });
        }
        for (name, (pinned, _)) in &self.items {
            if !seen.contains(name) {
                others.push(ToolReport {
                    name: name.clone(),
                    status: ToolStatus::Missing {
                        locked: pinned.clone(),
                    },
                });
            }
        }
        (served, others)
    }
}

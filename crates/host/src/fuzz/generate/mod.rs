//! Case generation: tool calls derived from each tool's inputSchema (valid
//! values, boundary values, then invalid ones), mutations of earlier inputs
//! and of the corpus, and protocol-level cases.
//!
//! Every choice comes from one seeded generator and never from what a case
//! did, so the same seed, tools and corpus give the same cases in the same
//! order, however the server behaves.
//!
//! This file holds the cases and the [`Generator`] that takes turns among
//! the tools and keeps each tool's pool of inputs; `values` makes JSON
//! values from schemas, `mutate` makes inputs invalid or changes earlier
//! ones, and `protocol` makes the cases that are not a plain call.

mod mutate;
mod protocol;
#[cfg(test)]
mod tests;
mod values;

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One tool call inside a protocol case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Call {
    pub tool: String,
    pub arguments: Value,
}

/// What the fuzzer sends the server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Case {
    /// `tools/call` of `tool` with `arguments` (any JSON value: a non-object
    /// is sent as it is).
    Call { tool: String, arguments: Value },
    /// A request for a method no server implements.
    UnknownMethod {
        method: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        params: Option<Value>,
    },
    /// A known method with params of the wrong shape.
    MalformedParams { method: String, params: Value },
    /// A tool call cancelled (`notifications/cancelled`) as soon as it is sent.
    CancelMidCall { tool: String, arguments: Value },
    /// Tool calls sent at once, without waiting for each other.
    Concurrent { calls: Vec<Call> },
}

/// Where findings of protocol cases are filed (tool cases are filed under
/// their tool).
pub const PROTOCOL_SUBJECT: &str = "(protocol)";

impl Case {
    /// The tool a case exercises, or [`PROTOCOL_SUBJECT`].
    pub fn subject(&self) -> &str {
        match self {
            Self::Call { tool, .. } => tool,
            _ => PROTOCOL_SUBJECT,
        }
    }

    /// The kind, as written in case files.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Call { .. } => "call",
            Self::UnknownMethod { .. } => "unknown-method",
            Self::MalformedParams { .. } => "malformed-params",
            Self::CancelMidCall { .. } => "cancel-mid-call",
            Self::Concurrent { .. } => "concurrent",
        }
    }
}

/// A tool as the generator sees it: its name and input schema.
#[derive(Clone, Debug)]
pub struct ToolSchema {
    pub name: String,
    pub input_schema: Value,
}

/// Recent inputs kept per tool for mutation.
const POOL_PER_TOOL: usize = 32;

/// Generates cases, deterministically from a seed.
pub struct Generator {
    rng: Xoshiro256PlusPlus,
    tools: Vec<ToolSchema>,
    /// Per tool: inputs to mutate (the corpus first, then recent cases).
    pool: Vec<Vec<Value>>,
    /// Per tool: how many corpus inputs lead its pool (never evicted).
    corpus_len: Vec<usize>,
    /// Probability that a leaf takes a boundary value, for the current case.
    boundary: f64,
    /// Nodes generated for the current value: past [`values::NODE_BUDGET`] arrays
    /// stop growing, so nested boundary sizes cannot multiply.
    nodes: usize,
    /// String bytes generated for the current value: past [`values::BYTE_BUDGET`]
    /// strings stop being long.
    bytes: usize,
    count: u64,
}

impl Generator {
    /// A generator for `tools` (sorted by name for determinism), mutating
    /// `corpus` inputs as well as its own.
    pub fn new(seed: u64, mut tools: Vec<ToolSchema>, corpus: &[Case]) -> Self {
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let mut pool = vec![Vec::new(); tools.len()];
        for case in corpus {
            if let Case::Call { tool, arguments } | Case::CancelMidCall { tool, arguments } = case
                && let Some(index) = tools.iter().position(|t| &t.name == tool)
            {
                pool[index].push(arguments.clone());
            }
        }
        let corpus_len = pool.iter().map(Vec::len).collect();
        Self {
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            tools,
            pool,
            corpus_len,
            boundary: 0.0,
            nodes: 0,
            bytes: 0,
            count: 0,
        }
    }

    /// The tools cases are generated for, in order.
    pub fn tools(&self) -> &[ToolSchema] {
        &self.tools
    }

    /// The next case. Tools take turns; every tenth case is a protocol case.
    pub fn next_case(&mut self) -> Case {
        let n = self.count;
        self.count += 1;
        if self.tools.is_empty() || n % 10 == 9 {
            return self.protocol_case();
        }
        let index = (n as usize) % self.tools.len();
        let tool = self.tools[index].name.clone();
        let arguments = self.arguments(index);
        Case::Call { tool, arguments }
    }

    /// Arguments for tool `index`: valid, at the boundaries, invalid, or a
    /// mutation of an earlier input.
    fn arguments(&mut self, index: usize) -> Value {
        let roll = self.rng.random_range(0..100u32);
        let schema = self.tools[index].input_schema.clone();
        let arguments = if roll < 30 {
            self.boundary = 0.0;
            self.value(&schema, &schema, 0)
        } else if roll < 60 {
            self.boundary = 0.35;
            self.value(&schema, &schema, 0)
        } else if roll < 82 {
            self.boundary = 0.2;
            let valid = self.value(&schema, &schema, 0);
            self.invalidate(valid, &schema)
        } else if !self.pool[index].is_empty() {
            // Half the mutations start from the corpus, when there is one,
            // so that a user's inputs are not drowned by recent ones.
            let corpus = self.corpus_len[index];
            let pick = if corpus > 0 && self.rng.random_bool(0.5) {
                self.rng.random_range(0..corpus)
            } else {
                self.rng.random_range(0..self.pool[index].len())
            };
            let base = self.pool[index][pick].clone();
            self.mutate(base)
        } else {
            self.boundary = 0.35;
            self.value(&schema, &schema, 0)
        };
        self.remember(index, &arguments);
        arguments
    }

    fn remember(&mut self, index: usize, arguments: &Value) {
        let pool = &mut self.pool[index];
        let fixed = self.corpus_len[index];
        if pool.len() >= fixed + POOL_PER_TOOL {
            pool.remove(fixed);
        }
        pool.push(arguments.clone());
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.rng.random_range(0..items.len())]
    }

    fn boundary(&mut self) -> bool {
        self.boundary > 0.0 && self.rng.random_bool(self.boundary)
    }
}

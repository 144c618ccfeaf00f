//! Case generation: tool calls derived from each tool's inputSchema (valid
//! values, boundary values, then invalid ones), mutations of earlier inputs
//! and of the corpus, and protocol-level cases.
//!
//! Every choice comes from one seeded generator and never from what a case
//! did, so the same seed, tools and corpus give the same cases in the same
//! order, however the server behaves.

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value, json};

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

/// Strings chosen to upset parsers, renderers and buffers.
const ODD_STRINGS: &[&str] = &[
    "",
    " ",
    "\u{0}",
    "\n\r\t",
    "\"'\\",
    "e\u{301}",
    "\u{202e}txt.exe",
    "\u{feff}bom",
    "\u{200b}\u{200d}",
    "👍🏽🏳️‍🌈",
    "𝕏𝕐",
    "\u{fffd}",
    "%s%n%x",
    "../../../../etc/passwd",
    "<script>alert(1)</script>",
    "' OR 1=1 --",
    "${jndi:ldap://x}",
    "null",
    "-1",
    "NaN",
];

/// Lengths of long strings, around common buffer sizes.
const LONG_LENGTHS: &[usize] = &[255, 256, 1024, 4095, 4096, 4097, 8192, 65_536, 262_144];

/// Characters long strings are made of (1 to 4 bytes in UTF-8).
const FILL_CHARS: &[char] = &['a', 'Z', 'é', '€', '😀', '\u{0}'];

/// Integers at the edges of common widths.
const EDGE_INTEGERS: &[i128] = &[
    0,
    1,
    -1,
    2,
    255,
    256,
    65_535,
    65_536,
    2_147_483_647,
    -2_147_483_648,
    4_294_967_295,
    4_294_967_296,
    9_007_199_254_740_993,
    i64::MAX as i128,
    i64::MIN as i128,
    u64::MAX as i128,
];

/// Floats at the edges of what JSON can carry.
const EDGE_FLOATS: &[f64] = &[0.0, -0.0, 0.1, 1e-7, 5e-324, 1e308, -1e308, 0.5, -1.5];

/// Methods no MCP server implements.
const UNKNOWN_METHODS: &[&str] = &[
    "tools/destroy",
    "resources/write",
    "rpc.discover",
    "$/cancelRequest",
    "tools/call/again",
    "x",
    "notifications/initialized/extra",
    "sampling/createMessage",
];

/// Methods a server knows, to receive params of the wrong shape.
const KNOWN_METHODS: &[&str] = &[
    "tools/call",
    "tools/list",
    "resources/read",
    "resources/list",
    "prompts/get",
    "prompts/list",
    "logging/setLevel",
    "completion/complete",
];

/// How deep generated values nest before the generator picks leaves. (Far
/// below serde_json's recursion limit of 128, which servers hit before they
/// could answer at all.)
const MAX_DEPTH: u32 = 8;

/// How deep the deliberately deep value nests: deep for a handler, still
/// parsable by a server's JSON reader with the message envelope around it.
const DEEP_NESTING: usize = 96;

/// How deep generation goes at all, whatever the schema asks for.
const HARD_DEPTH: u32 = 32;

/// The most a schema's `minLength` or `minItems` is taken at.
const MAX_MINIMUM: usize = 1 << 16;

/// Nodes in one generated value before arrays stop growing.
const NODE_BUDGET: usize = 4096;

/// String bytes in one generated value before strings stop being long.
const BYTE_BUDGET: usize = 2 << 20;

/// The largest input a mutation may produce, serialised.
const MUTATION_BUDGET: usize = 4 << 20;

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
    /// Nodes generated for the current value: past [`NODE_BUDGET`] arrays
    /// stop growing, so nested boundary sizes cannot multiply.
    nodes: usize,
    /// String bytes generated for the current value: past [`BYTE_BUDGET`]
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

    fn protocol_case(&mut self) -> Case {
        let kinds = if self.tools.is_empty() { 2 } else { 4 };
        match self.rng.random_range(0..kinds) {
            0 => {
                let method = self.pick(UNKNOWN_METHODS).to_owned();
                let params = match self.rng.random_range(0..3u32) {
                    0 => None,
                    1 => Some(json!({})),
                    _ => Some(self.any_value(2)),
                };
                Case::UnknownMethod { method, params }
            }
            1 => {
                let method = self.pick(KNOWN_METHODS).to_owned();
                let params = self.malformed_params(&method);
                Case::MalformedParams { method, params }
            }
            2 => {
                let index = self.rng.random_range(0..self.tools.len());
                let schema = self.tools[index].input_schema.clone();
                self.boundary = 0.0;
                let arguments = self.value(&schema, &schema, 0);
                Case::CancelMidCall {
                    tool: self.tools[index].name.clone(),
                    arguments,
                }
            }
            _ => {
                let n = self.rng.random_range(2..=8usize);
                let calls = (0..n)
                    .map(|_| {
                        let index = self.rng.random_range(0..self.tools.len());
                        let schema = self.tools[index].input_schema.clone();
                        self.boundary = 0.1;
                        Call {
                            tool: self.tools[index].name.clone(),
                            arguments: self.value(&schema, &schema, 0),
                        }
                    })
                    .collect();
                Case::Concurrent { calls }
            }
        }
    }

    /// Params of the wrong shape for `method`.
    fn malformed_params(&mut self, method: &str) -> Value {
        let tool = self
            .tools
            .first()
            .map_or_else(|| "nothing".to_owned(), |t| t.name.clone());
        match self.rng.random_range(0..6u32) {
            0 => json!([1, 2, 3]),
            1 => json!("params"),
            2 => json!(null),
            3 if method == "tools/call" => json!({ "name": 5 }),
            3 => json!({ "cursor": 5, "uri": false, "name": [] }),
            4 if method == "tools/call" => json!({ "name": tool, "arguments": [1] }),
            4 => json!({ "level": "loudest", "ref": {} }),
            _ => json!({ "name": tool, "_meta": { "progressToken": [] } }),
        }
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.rng.random_range(0..items.len())]
    }

    fn boundary(&mut self) -> bool {
        self.boundary > 0.0 && self.rng.random_bool(self.boundary)
    }

    /// A value meeting `schema` (as far as the generator understands it),
    /// with boundary values at the current rate.
    pub fn value(&mut self, schema: &Value, root: &Value, depth: u32) -> Value {
        if depth == 0 {
            self.nodes = 0;
            self.bytes = 0;
        }
        self.nodes += 1;
        if depth > HARD_DEPTH {
            // A schema that requires itself (`{"$ref": "#"}` as a required
            // property) has no finite instance; stop here.
            return Value::Null;
        }
        let schema = resolve(schema, root);
        let Some(object) = schema.as_object() else {
            // `true` or a schema the generator cannot read: anything.
            return self.any_value(2);
        };
        if let Some(value) = object.get("const") {
            return value.clone();
        }
        if let Some(Value::Array(options)) = object.get("enum")
            && !options.is_empty()
        {
            return options[self.rng.random_range(0..options.len())].clone();
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = object.get(key)
                && !branches.is_empty()
            {
                let branch = if depth >= MAX_DEPTH {
                    // Deep enough: prefer a branch that does not nest.
                    branches
                        .iter()
                        .find(|b| !nests(resolve(b, root)))
                        .unwrap_or(&branches[0])
                } else {
                    &branches[self.rng.random_range(0..branches.len())]
                };
                return self.value(branch, root, depth + 1);
            }
        }
        if let Some(Value::Array(parts)) = object.get("allOf") {
            let merged = merge_all_of(object, parts, root);
            return self.value(&merged, root, depth + 1);
        }
        let ty = match object.get("type") {
            Some(Value::String(ty)) => ty.clone(),
            Some(Value::Array(types)) if !types.is_empty() => types
                [self.rng.random_range(0..types.len())]
            .as_str()
            .unwrap_or("null")
            .to_owned(),
            _ if object.contains_key("properties") => "object".to_owned(),
            _ if object.contains_key("items") => "array".to_owned(),
            _ => return self.any_value(2),
        };
        match ty.as_str() {
            "null" => Value::Null,
            "boolean" => Value::Bool(self.rng.random_bool(0.5)),
            "integer" => self.integer(object),
            "number" => self.number(object),
            "string" => Value::String(self.string(object)),
            "array" => self.array(object, root, depth),
            "object" => self.object(object, root, depth),
            _ => self.any_value(2),
        }
    }

    fn integer(&mut self, schema: &Map<String, Value>) -> Value {
        let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
        let mut lo = bound("minimum").map_or(i64::MIN as i128, |v| v.ceil() as i128);
        let mut hi = bound("maximum").map_or(
            if lo >= 0 {
                u64::MAX as i128
            } else {
                i64::MAX as i128
            },
            |v| v.floor() as i128,
        );
        if let Some(v) = bound("exclusiveMinimum") {
            lo = lo.max(v.floor() as i128 + 1);
        }
        if let Some(v) = bound("exclusiveMaximum") {
            hi = hi.min(v.ceil() as i128 - 1);
        }
        if lo > hi {
            return integer_value(lo);
        }
        let n = if self.boundary() {
            let edges: Vec<i128> = EDGE_INTEGERS
                .iter()
                .copied()
                .chain([lo, hi, lo.saturating_add(1), hi.saturating_sub(1)])
                .filter(|n| (lo..=hi).contains(n))
                .collect();
            edges[self.rng.random_range(0..edges.len())]
        } else {
            let small_lo = lo.max(-1000);
            let small_hi = hi.min(1000).max(small_lo);
            self.rng.random_range(small_lo as i64..=small_hi as i64) as i128
        };
        integer_value(n)
    }

    fn number(&mut self, schema: &Map<String, Value>) -> Value {
        let lo = schema.get("minimum").and_then(Value::as_f64);
        let hi = schema.get("maximum").and_then(Value::as_f64);
        let x = if self.boundary() {
            let edges: Vec<f64> = EDGE_FLOATS
                .iter()
                .copied()
                .chain(lo)
                .chain(hi)
                .filter(|x| lo.is_none_or(|lo| *x >= lo) && hi.is_none_or(|hi| *x <= hi))
                .collect();
            if edges.is_empty() {
                lo.unwrap_or(0.0)
            } else {
                edges[self.rng.random_range(0..edges.len())]
            }
        } else {
            let lo = lo.unwrap_or(-1000.0).max(-1e6);
            let hi = hi.unwrap_or(1000.0).min(1e6).max(lo);
            lo + (hi - lo) * self.rng.random::<f64>()
        };
        Number::from_f64(x).map_or(json!(0), Value::Number)
    }

    fn string(&mut self, schema: &Map<String, Value>) -> String {
        let min = schema
            .get("minLength")
            .and_then(Value::as_u64)
            .map_or(0, |m| usize::try_from(m).unwrap_or(usize::MAX))
            .min(MAX_MINIMUM);
        let max = schema
            .get("maxLength")
            .and_then(Value::as_u64)
            .map_or(usize::MAX, |m| m as usize);
        let s = if self.boundary() {
            if self.rng.random_bool(0.5) || self.bytes > BYTE_BUDGET {
                self.pick(ODD_STRINGS).to_owned()
            } else {
                let len = LONG_LENGTHS[self.rng.random_range(0..LONG_LENGTHS.len())];
                let fill = FILL_CHARS[self.rng.random_range(0..FILL_CHARS.len())];
                std::iter::repeat_n(fill, len).collect()
            }
        } else {
            let len = self.rng.random_range(0..=12usize);
            (0..len)
                .map(|_| {
                    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789 -_";
                    ALPHABET[self.rng.random_range(0..ALPHABET.len())] as char
                })
                .collect()
        };
        let s = fit_length(s, min, max);
        self.bytes += s.len();
        s
    }

    fn array(&mut self, schema: &Map<String, Value>, root: &Value, depth: u32) -> Value {
        let min = schema
            .get("minItems")
            .and_then(Value::as_u64)
            .map_or(0, |m| usize::try_from(m).unwrap_or(usize::MAX))
            .min(MAX_MINIMUM);
        // Over budget, even a schema's minimum gives way (the value is then
        // invalid, which is a case too).
        let min = if self.nodes > NODE_BUDGET { 0 } else { min };
        let max = schema
            .get("maxItems")
            .and_then(Value::as_u64)
            .map_or(usize::MAX, |m| m as usize);
        let len = if depth >= MAX_DEPTH || self.nodes > NODE_BUDGET {
            min
        } else if self.boundary() {
            [0, 1, 16, 256][self.rng.random_range(0..4)]
        } else {
            self.rng.random_range(0..=3usize)
        };
        let len = len.clamp(min, max.max(min));
        let items = schema.get("items").cloned().unwrap_or(Value::Bool(true));
        Value::Array(
            (0..len)
                .map(|_| self.value(&items, root, depth + 1))
                .collect(),
        )
    }

    fn object(&mut self, schema: &Map<String, Value>, root: &Value, depth: u32) -> Value {
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut out = Map::new();
        if let Some(Value::Object(properties)) = schema.get("properties") {
            for (name, property) in properties {
                if required.contains(&name.as_str()) || self.rng.random_bool(0.5) {
                    let value = self.value(property, root, depth + 1);
                    out.insert(name.clone(), value);
                }
            }
        }
        Value::Object(out)
    }

    /// Any JSON value, up to `depth` levels deep.
    fn any_value(&mut self, depth: u32) -> Value {
        match self.rng.random_range(0..if depth == 0 { 5 } else { 7u32 }) {
            0 => Value::Null,
            1 => Value::Bool(self.rng.random_bool(0.5)),
            2 => integer_value(EDGE_INTEGERS[self.rng.random_range(0..EDGE_INTEGERS.len())]),
            3 => Number::from_f64(EDGE_FLOATS[self.rng.random_range(0..EDGE_FLOATS.len())])
                .map_or(Value::Null, Value::Number),
            4 => Value::String(self.pick(ODD_STRINGS).to_owned()),
            5 => Value::Array(
                (0..self.rng.random_range(0..3))
                    .map(|_| self.any_value(depth - 1))
                    .collect(),
            ),
            _ => {
                let mut map = Map::new();
                for i in 0..self.rng.random_range(0..3) {
                    let value = self.any_value(depth - 1);
                    map.insert(format!("k{i}"), value);
                }
                Value::Object(map)
            }
        }
    }

    /// Makes `valid` invalid in one way: a wrong type somewhere, a missing
    /// required field, an extra field, or arguments that are not an object.
    fn invalidate(&mut self, valid: Value, schema: &Value) -> Value {
        match self.rng.random_range(0..5u32) {
            0 => {
                let mut value = valid;
                let paths = paths(&value);
                let path = &paths[self.rng.random_range(0..paths.len())];
                let replacement = self.wrong_type(at(&value, path));
                *at_mut(&mut value, path) = replacement;
                value
            }
            1 => {
                let required: Vec<String> = resolve(schema, schema)
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| {
                        r.iter()
                            .filter_map(Value::as_str)
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default();
                let mut value = valid;
                if let (Value::Object(map), false) = (&mut value, required.is_empty()) {
                    map.remove(&required[self.rng.random_range(0..required.len())]);
                }
                value
            }
            2 => {
                let mut value = valid;
                let name = self.pick(&["extra", "", "__proto__", "constructor", "$ref"]);
                let extra = self.any_value(1);
                if let Value::Object(map) = &mut value {
                    map.insert(name.to_owned(), extra);
                }
                value
            }
            3 => match self.rng.random_range(0..4u32) {
                0 => Value::Null,
                1 => json!([valid]),
                2 => json!("arguments"),
                _ => json!(-1),
            },
            _ => {
                let mut value = valid;
                let paths = paths(&value);
                let path = &paths[self.rng.random_range(0..paths.len())];
                *at_mut(&mut value, path) = deep_nesting();
                value
            }
        }
    }

    /// A value of another type than `value`.
    fn wrong_type(&mut self, value: &Value) -> Value {
        loop {
            let candidate = match self.rng.random_range(0..8u32) {
                0 => Value::Null,
                1 => Value::Bool(true),
                2 => json!(-1),
                3 => json!(1.5),
                4 => json!(""),
                5 => json!([]),
                6 => json!({}),
                _ => json!(1e300),
            };
            if std::mem::discriminant(&candidate) != std::mem::discriminant(value) {
                return candidate;
            }
        }
    }

    /// One to three changes to an earlier input: a leaf at a boundary, an
    /// element duplicated or dropped, a level of nesting added, a field
    /// removed.
    fn mutate(&mut self, base: Value) -> Value {
        self.bytes = 0;
        let mut value = base.clone();
        for _ in 0..self.rng.random_range(1..=3u32) {
            let paths = paths(&value);
            let path = paths[self.rng.random_range(0..paths.len())].clone();
            let node = at_mut(&mut value, &path);
            self.boundary = 1.0;
            let replacement = match node {
                Value::String(_) => Some(Value::String(self.string(&Map::new()))),
                Value::Number(n) if n.is_f64() => Some(self.number(&Map::new())),
                Value::Number(_) => Some(self.integer(&Map::new())),
                Value::Bool(b) => Some(Value::Bool(!*b)),
                Value::Array(items) => {
                    match (self.rng.random_range(0..3u32), items.is_empty()) {
                        (0, false) => {
                            let i = self.rng.random_range(0..items.len());
                            let copy = items[i].clone();
                            items.push(copy);
                        }
                        (1, false) => {
                            let i = self.rng.random_range(0..items.len());
                            items.remove(i);
                        }
                        _ => {
                            let inner = std::mem::take(items);
                            items.push(Value::Array(inner));
                        }
                    }
                    None
                }
                Value::Object(map) if !map.is_empty() => {
                    let keys: Vec<String> = map.keys().cloned().collect();
                    map.remove(&keys[self.rng.random_range(0..keys.len())]);
                    None
                }
                _ => Some(self.any_value(1)),
            };
            if let Some(replacement) = replacement {
                *at_mut(&mut value, &path) = replacement;
            }
        }
        // Duplicating elements of duplicated elements would grow inputs
        // without end: past the budget, the base is sent as it was.
        if serde_json::to_vec(&value).map_or(usize::MAX, |v| v.len()) > MUTATION_BUDGET {
            return base;
        }
        value
    }
}

/// `n` as a JSON number (integers beyond u64 become floats).
fn integer_value(n: i128) -> Value {
    if let Ok(n) = i64::try_from(n) {
        json!(n)
    } else if let Ok(n) = u64::try_from(n) {
        json!(n)
    } else {
        Number::from_f64(n as f64).map_or(Value::Null, Value::Number)
    }
}

/// `s` cut or padded (with `a`) to between `min` and `max` characters.
fn fit_length(s: String, min: usize, max: usize) -> String {
    let count = s.chars().count();
    if count > max {
        s.chars().take(max).collect()
    } else if count < min {
        let mut s = s;
        s.extend(std::iter::repeat_n('a', min - count));
        s
    } else {
        s
    }
}

/// [[[...]]], deep.
fn deep_nesting() -> Value {
    let mut value = json!(0);
    for _ in 0..DEEP_NESTING {
        value = Value::Array(vec![value]);
    }
    value
}

/// Follows a local `$ref` (`#`, `#/$defs/..`, `#/definitions/..`, any JSON
/// pointer into the root), at most a few times.
pub fn resolve<'a>(mut schema: &'a Value, root: &'a Value) -> &'a Value {
    for _ in 0..16 {
        let Some(reference) = schema.get("$ref").and_then(Value::as_str) else {
            return schema;
        };
        let Some(pointer) = reference.strip_prefix('#') else {
            return schema;
        };
        match root.pointer(pointer) {
            Some(target) => schema = target,
            None => return schema,
        }
    }
    schema
}

/// Whether a schema describes a value that contains others.
fn nests(schema: &Value) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "array" || t == "object",
        _ => schema.get("items").is_some() || schema.get("properties").is_some(),
    }
}

/// `allOf` folded into one schema: properties and required lists merged,
/// the first type wins.
fn merge_all_of(object: &Map<String, Value>, parts: &[Value], root: &Value) -> Value {
    let mut merged = object.clone();
    merged.remove("allOf");
    let mut properties = merged
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut required: Vec<Value> = merged
        .get("required")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for part in parts {
        let Some(part) = resolve(part, root).as_object() else {
            continue;
        };
        if let Some(Value::Object(p)) = part.get("properties") {
            properties.extend(p.clone());
        }
        if let Some(Value::Array(r)) = part.get("required") {
            required.extend(r.iter().cloned());
        }
        for (key, value) in part {
            if key != "properties" && key != "required" {
                merged.entry(key.clone()).or_insert_with(|| value.clone());
            }
        }
    }
    if !properties.is_empty() {
        merged.insert("properties".into(), Value::Object(properties));
    }
    if !required.is_empty() {
        merged.insert("required".into(), Value::Array(required));
    }
    Value::Object(merged)
}

/// A step into a JSON value: an object key or an array index.
#[derive(Clone, Debug)]
pub enum Step {
    Key(String),
    Index(usize),
}

/// Every path in `value`, the root (empty path) first.
pub fn paths(value: &Value) -> Vec<Vec<Step>> {
    fn walk(value: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
        out.push(prefix.clone());
        match value {
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    prefix.push(Step::Index(i));
                    walk(item, prefix, out);
                    prefix.pop();
                }
            }
            Value::Object(map) => {
                for (key, item) in map {
                    prefix.push(Step::Key(key.clone()));
                    walk(item, prefix, out);
                    prefix.pop();
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, &mut Vec::new(), &mut out);
    out
}

/// The node at `path` (which must exist).
pub fn at<'a>(value: &'a Value, path: &[Step]) -> &'a Value {
    path.iter().fold(value, |node, step| match step {
        Step::Key(key) => &node[key.as_str()],
        Step::Index(i) => &node[*i],
    })
}

/// The node at `path`, mutably (which must exist).
pub fn at_mut<'a>(value: &'a mut Value, path: &[Step]) -> &'a mut Value {
    path.iter().fold(value, |node, step| match step {
        Step::Key(key) => &mut node[key.as_str()],
        Step::Index(i) => &mut node[*i],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<ToolSchema> {
        vec![
            ToolSchema {
                name: "echo".into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {"text": {"type": "string", "maxLength": 10}},
                    "required": ["text"]
                }),
            },
            ToolSchema {
                name: "tree".into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
                    "required": ["items"],
                    "$defs": {"Item": {"anyOf": [
                        {"type": "integer", "minimum": -5, "maximum": 5},
                        {"type": "array", "items": {"$ref": "#/$defs/Item"}}
                    ]}}
                }),
            },
        ]
    }

    #[test]
    fn the_same_seed_gives_the_same_cases_and_another_seed_others() {
        let run = |seed| {
            let mut g = Generator::new(seed, tools(), &[]);
            (0..500).map(|_| g.next_case()).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn valid_values_meet_the_schema_with_refs_and_bounds() {
        let tools = tools();
        let mut g = Generator::new(1, tools.clone(), &[]);
        for tool in &tools {
            let validator = jsonschema::validator_for(&tool.input_schema).unwrap();
            for boundary in [0.0, 0.35, 1.0] {
                for _ in 0..300 {
                    g.boundary = boundary;
                    let value = g.value(&tool.input_schema, &tool.input_schema, 0);
                    assert!(
                        validator.is_valid(&value),
                        "{} generated {value} outside its schema",
                        tool.name
                    );
                }
            }
        }
    }

    #[test]
    fn cases_cover_every_kind_nested_arrays_and_invalid_arguments() {
        let tools = tools();
        let validator = jsonschema::validator_for(&tools[1].input_schema).unwrap();
        let mut g = Generator::new(3, tools.clone(), &[]);
        let cases: Vec<Case> = (0..2000).map(|_| g.next_case()).collect();
        for kind in [
            "call",
            "unknown-method",
            "malformed-params",
            "cancel-mid-call",
            "concurrent",
        ] {
            assert!(cases.iter().any(|c| c.kind() == kind), "no {kind} case");
        }
        let tree_args: Vec<&Value> = cases
            .iter()
            .filter_map(|c| match c {
                Case::Call { tool, arguments } if tool == "tree" => Some(arguments),
                _ => None,
            })
            .collect();
        assert!(
            tree_args.iter().any(|a| a["items"]
                .as_array()
                .is_some_and(|i| i.iter().any(Value::is_array))),
            "no nested array generated"
        );
        assert!(tree_args.iter().any(|a| !validator.is_valid(a)));
        assert!(tree_args.iter().any(|a| !a.is_object()));
    }

    #[test]
    fn schemas_without_finite_or_sane_instances_do_not_hang_or_panic() {
        let hostile = [
            json!({"type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]}),
            json!({"allOf": [{"allOf": [{"$ref": "#"}]}]}),
            json!({"type": "string", "minLength": 1_000_000_000_000u64}),
            json!({"type": "array", "minItems": 1_000_000_000_000u64, "items": {"type": "array", "minItems": 1_000_000_000_000u64}}),
            json!({"type": "integer", "minimum": 1e30, "maximum": 1e31}),
            json!({"type": "integer", "minimum": 10, "maximum": 5}),
            json!({"$ref": "#/nowhere"}),
            json!({"type": ["string", 5, null]}),
        ];
        for schema in hostile {
            let tools = vec![ToolSchema {
                name: "t".into(),
                input_schema: schema.clone(),
            }];
            let mut g = Generator::new(9, tools, &[]);
            for _ in 0..50 {
                let case = g.next_case();
                let size = serde_json::to_vec(&case).unwrap().len();
                assert!(size < 64 << 20, "{schema}: a case of {size} bytes");
            }
        }
    }

    #[test]
    fn corpus_inputs_are_mutated() {
        let original = json!({"text": "corpus", "marker": 1});
        let corpus = [Case::Call {
            tool: "echo".into(),
            arguments: original.clone(),
        }];
        let mut g = Generator::new(5, tools(), &corpus);
        // Only a mutation of the corpus input can carry its marker.
        let mutated = (0..400).any(|_| match g.next_case() {
            Case::Call { arguments, .. } => {
                arguments.get("marker").is_some() && arguments != original
            }
            _ => false,
        });
        assert!(mutated);
    }
}

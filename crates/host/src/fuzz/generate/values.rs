//! JSON values from schemas: a value meeting a tool's inputSchema as far as
//! the generator understands it (`$ref`, `allOf`, `anyOf`/`oneOf`, enums,
//! bounds), with boundary values at the current rate, within depth, node
//! and byte budgets.

use rand::RngExt;
use serde_json::{Map, Number, Value, json};

use super::Generator;

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

/// How deep generated values nest before the generator picks leaves. (Far
/// below serde_json's recursion limit of 128, which servers hit before they
/// could answer at all.)
const MAX_DEPTH: u32 = 8;

/// How deep generation goes at all, whatever the schema asks for.
const HARD_DEPTH: u32 = 32;

/// The most a schema's `minLength` or `minItems` is taken at.
const MAX_MINIMUM: usize = 1 << 16;

/// Nodes in one generated value before arrays stop growing.
const NODE_BUDGET: usize = 4096;

/// String bytes in one generated value before strings stop being long.
const BYTE_BUDGET: usize = 2 << 20;

impl Generator {
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

    pub(super) fn integer(&mut self, schema: &Map<String, Value>) -> Value {
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

    pub(super) fn number(&mut self, schema: &Map<String, Value>) -> Value {
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

    pub(super) fn string(&mut self, schema: &Map<String, Value>) -> String {
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
    pub(super) fn any_value(&mut self, depth: u32) -> Value {
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

//! Mutations: a valid input made invalid in one way (a wrong type, a
//! missing or extra field, not an object, nested too deep), and an earlier
//! input changed in one to three places; and the paths into a JSON value
//! the changes are made at.

use rand::RngExt;
use serde_json::{Map, Value, json};

use super::Generator;
use super::values::resolve;

/// How deep the deliberately deep value nests: deep for a handler, still
/// parsable by a server's JSON reader with the message envelope around it.
const DEEP_NESTING: usize = 96;

/// The largest input a mutation may produce, serialised.
const MUTATION_BUDGET: usize = 4 << 20;

impl Generator {
    /// Makes `valid` invalid in one way: a wrong type somewhere, a missing
    /// required field, an extra field, or arguments that are not an object.
    pub(super) fn invalidate(&mut self, valid: Value, schema: &Value) -> Value {
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
    pub(super) fn mutate(&mut self, base: Value) -> Value {
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

/// [[[...]]], deep.
fn deep_nesting() -> Value {
    let mut value = json!(0);
    for _ in 0..DEEP_NESTING {
        value = Value::Array(vec![value]);
    }
    value
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

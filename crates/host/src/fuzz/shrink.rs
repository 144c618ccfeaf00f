//! Shrinking: simpler variants of a case that still fails the same way. The
//! runner tries them in order (most aggressive first) and keeps the first
//! that reproduces, until none does or the budget runs out.

use serde_json::{Map, Value, json};

use super::generate::{Call, Case};

/// Simpler variants of `case`, most aggressive first.
pub fn case_candidates(case: &Case) -> Vec<Case> {
    match case {
        Case::Call { tool, arguments } => candidates(arguments)
            .into_iter()
            .map(|arguments| Case::Call {
                tool: tool.clone(),
                arguments,
            })
            .collect(),
        Case::CancelMidCall { tool, arguments } => {
            // Without the cancellation first: the call alone may be the bug.
            let mut out = vec![Case::Call {
                tool: tool.clone(),
                arguments: arguments.clone(),
            }];
            out.extend(
                candidates(arguments)
                    .into_iter()
                    .map(|arguments| Case::CancelMidCall {
                        tool: tool.clone(),
                        arguments,
                    }),
            );
            out
        }
        Case::UnknownMethod { method, params } => {
            let mut out = Vec::new();
            if let Some(params) = params {
                out.push(Case::UnknownMethod {
                    method: method.clone(),
                    params: None,
                });
                out.extend(candidates(params).into_iter().map(|p| Case::UnknownMethod {
                    method: method.clone(),
                    params: Some(p),
                }));
            }
            out
        }
        Case::MalformedParams { method, params } => candidates(params)
            .into_iter()
            .map(|params| Case::MalformedParams {
                method: method.clone(),
                params,
            })
            .collect(),
        Case::Concurrent { calls } => {
            let mut out = Vec::new();
            // A single call alone is the simplest answer.
            for call in calls {
                out.push(Case::Call {
                    tool: call.tool.clone(),
                    arguments: call.arguments.clone(),
                });
            }
            if calls.len() > 2 {
                for i in 0..calls.len() {
                    let mut fewer = calls.clone();
                    fewer.remove(i);
                    out.push(Case::Concurrent { calls: fewer });
                }
            }
            for (i, call) in calls.iter().enumerate() {
                for arguments in candidates(&call.arguments) {
                    let mut simpler = calls.clone();
                    simpler[i] = Call {
                        tool: call.tool.clone(),
                        arguments,
                    };
                    out.push(Case::Concurrent { calls: simpler });
                }
            }
            out
        }
    }
}

/// Simpler variants of `value`: the value itself made simpler, then each
/// child's variants in place.
pub fn candidates(value: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    match value {
        Value::Null => {}
        Value::Bool(b) => {
            if *b {
                out.push(Value::Bool(false));
            }
        }
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                integer_candidates(i128::from(i), &mut out);
            } else if let Some(u) = n.as_u64() {
                integer_candidates(i128::from(u), &mut out);
            } else if let Some(f) = n.as_f64() {
                for c in [0.0, f.trunc(), f / 2.0] {
                    if c != f && c.abs() < f.abs() {
                        out.push(json!(c));
                    }
                }
            }
        }
        Value::String(s) => string_candidates(s, &mut out),
        Value::Array(items) => {
            if !items.is_empty() {
                out.push(json!([]));
            }
            if items.len() > 1 {
                out.push(Value::Array(items[..items.len() / 2].to_vec()));
                out.push(Value::Array(items[items.len() / 2..].to_vec()));
            }
            for i in 0..items.len().min(64) {
                let mut fewer = items.clone();
                fewer.remove(i);
                if !fewer.is_empty() {
                    out.push(Value::Array(fewer));
                }
            }
            // A level of nesting less: an element that is itself an array
            // takes the place of the array.
            for item in items.iter().take(16) {
                if item.is_array() {
                    out.push(item.clone());
                }
            }
            for (i, item) in items.iter().enumerate().take(64) {
                for simpler in candidates(item) {
                    let mut changed = items.clone();
                    changed[i] = simpler;
                    out.push(Value::Array(changed));
                }
            }
        }
        Value::Object(map) => {
            for key in map.keys() {
                let mut fewer = map.clone();
                fewer.remove(key);
                out.push(Value::Object(fewer));
            }
            for (key, item) in map {
                for simpler in candidates(item) {
                    let mut changed: Map<String, Value> = map.clone();
                    changed.insert(key.clone(), simpler);
                    out.push(Value::Object(changed));
                }
            }
        }
    }
    out
}

/// Toward zero: 0, the unit of the same sign, half, one step closer.
fn integer_candidates(n: i128, out: &mut Vec<Value>) {
    if n == 0 {
        return;
    }
    let mut seen = Vec::new();
    for c in [0, n.signum(), n / 2, n - n.signum()] {
        if c != n && !seen.contains(&c) {
            seen.push(c);
            out.push(match i64::try_from(c) {
                Ok(c) => json!(c),
                Err(_) => json!(c as u64),
            });
        }
    }
}

/// Empty; the same length in plain `a`s (bytes kept, so a length bug still
/// shows); then shorter prefixes, halving down to one character less.
fn string_candidates(s: &str, out: &mut Vec<Value>) {
    if s.is_empty() {
        return;
    }
    out.push(json!(""));
    if s.bytes().any(|b| b != b'a') {
        out.push(json!("a".repeat(s.len())));
    }
    let chars: Vec<char> = s.chars().collect();
    let n = chars.len();
    let mut cut = n / 2;
    let mut lengths = Vec::new();
    while cut > 0 {
        lengths.push(n - cut);
        cut /= 2;
    }
    for len in lengths {
        if len > 0 && len < n {
            out.push(json!(chars[..len].iter().collect::<String>()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Greedy shrinking as the runner does it, against a predicate.
    fn shrink(mut value: Value, fails: impl Fn(&Value) -> bool) -> Value {
        loop {
            match candidates(&value).into_iter().find(|c| fails(c)) {
                Some(simpler) => value = simpler,
                None => return value,
            }
        }
    }

    #[test]
    fn a_length_bug_shrinks_to_one_byte_past_the_limit() {
        let long = "é😀".repeat(5000);
        let shrunk = shrink(json!({"text": long, "x": [1, 2]}), |v| {
            v["text"].as_str().is_some_and(|t| t.len() > 4096)
        });
        assert_eq!(shrunk, json!({"text": "a".repeat(4097)}));
    }

    #[test]
    fn a_sign_bug_shrinks_to_minus_one() {
        for start in [i64::MIN, -987_654_321, -2] {
            let shrunk = shrink(json!({"from": start}), |v| {
                v["from"].as_i64().is_some_and(|n| n < 0)
            });
            assert_eq!(shrunk, json!({"from": -1}));
        }
    }

    #[test]
    fn a_nesting_bug_shrinks_to_one_empty_inner_array() {
        let shrunk = shrink(json!({"items": [3, [[4, 5], -1], 7, [8]]}), |v| {
            v["items"]
                .as_array()
                .is_some_and(|items| items.iter().any(Value::is_array))
        });
        assert_eq!(shrunk, json!({"items": [[]]}));
    }

    #[test]
    fn a_concurrent_case_shrinks_to_the_one_call_that_fails() {
        let case = Case::Concurrent {
            calls: vec![
                Call {
                    tool: "a".into(),
                    arguments: json!({}),
                },
                Call {
                    tool: "bad".into(),
                    arguments: json!({"n": 5}),
                },
            ],
        };
        let first = case_candidates(&case)
            .into_iter()
            .find(|c| matches!(c, Case::Call { tool, .. } if tool == "bad"));
        assert_eq!(
            first,
            Some(Case::Call {
                tool: "bad".into(),
                arguments: json!({"n": 5})
            })
        );
    }
}

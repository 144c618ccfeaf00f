//! Values across a typed component's boundary: JSON arguments into
//! component values, checked against the WIT type (each error names the
//! argument's path and what was expected), and component results back into
//! JSON, in the shapes [`super::schema`] describes.

use serde_json::{Map, Value};
use wasmtime::component::{Type, Val};

/// Why an argument cannot become a component value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("argument {path}: expected {expected}, got {got}")]
pub struct ValueError {
    /// Where in the arguments: `name`, `name.field`, `name[2]`.
    pub path: String,
    /// What the type wanted.
    pub expected: String,
    /// What was there, in brief.
    pub got: String,
}

/// Converts a tool call's arguments into the function's parameters, in
/// order. Every parameter is required; an argument that names no parameter
/// is refused.
pub fn to_params(
    arguments: &Map<String, Value>,
    params: &[(String, Type)],
) -> Result<Vec<Val>, ValueError> {
    if let Some(extra) = arguments
        .keys()
        .find(|k| !params.iter().any(|(name, _)| name == *k))
    {
        // Quoted: the name is the caller's, and may be empty or odd.
        return Err(ValueError {
            path: format!("{extra:?}"),
            expected: "no such parameter".into(),
            got: "an argument".into(),
        });
    }
    params
        .iter()
        .map(|(name, ty)| match arguments.get(name) {
            Some(value) => to_val(value, ty, name),
            None => Err(ValueError {
                path: name.clone(),
                expected: "a value (every parameter is required)".into(),
                got: "nothing".into(),
            }),
        })
        .collect()
}

fn brief(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) if s.chars().count() <= 16 => format!("{s:?}"),
        Value::String(s) => format!("a string of {} characters", s.chars().count()),
        Value::Array(a) => format!("an array of {}", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

/// Converts one JSON value into a value of `ty`; `path` names it in errors.
pub fn to_val(value: &Value, ty: &Type, path: &str) -> Result<Val, ValueError> {
    let fail = |expected: &str| ValueError {
        path: path.to_owned(),
        expected: expected.to_owned(),
        got: brief(value),
    };
    macro_rules! int {
        ($variant:ident, $t:ty, $what:literal) => {{
            let n = match value {
                Value::Number(n) => n,
                _ => return Err(fail($what)),
            };
            // JSON Schema's integer is any number without a fraction: 2.0
            // is one.
            let parsed = n
                .as_i64()
                .and_then(|i| <$t>::try_from(i).ok())
                .or_else(|| n.as_u64().and_then(|u| <$t>::try_from(u).ok()))
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0)
                        .and_then(|f| <$t>::try_from(f as i128).ok())
                });
            parsed.map(Val::$variant).ok_or_else(|| fail($what))
        }};
    }
    match ty {
        Type::Bool => value
            .as_bool()
            .map(Val::Bool)
            .ok_or_else(|| fail("a boolean")),
        Type::S8 => int!(S8, i8, "an integer in -128..=127 (s8)"),
        Type::U8 => int!(U8, u8, "an integer in 0..=255 (u8)"),
        Type::S16 => int!(S16, i16, "an integer in -32768..=32767 (s16)"),
        Type::U16 => int!(U16, u16, "an integer in 0..=65535 (u16)"),
        Type::S32 => int!(S32, i32, "a 32-bit signed integer (s32)"),
        Type::U32 => int!(U32, u32, "a 32-bit unsigned integer (u32)"),
        Type::S64 => int!(S64, i64, "a 64-bit signed integer (s64)"),
        Type::U64 => int!(U64, u64, "a 64-bit unsigned integer (u64)"),
        Type::Float32 => value
            .as_f64()
            .map(|f| Val::Float32(f as f32))
            .ok_or_else(|| fail("a number (f32)")),
        Type::Float64 => value
            .as_f64()
            .map(Val::Float64)
            .ok_or_else(|| fail("a number (f64)")),
        Type::Char => {
            let s = value
                .as_str()
                .ok_or_else(|| fail("a one-character string"))?;
            let mut chars = s.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) => Ok(Val::Char(c)),
                _ => Err(fail("a one-character string")),
            }
        }
        Type::String => value
            .as_str()
            .map(|s| Val::String(s.to_owned()))
            .ok_or_else(|| fail("a string")),
        Type::List(list) => items(value, &list.ty(), path, None).map(Val::List),
        Type::FixedLengthList(list) => {
            items(value, &list.ty(), path, Some(list.len() as usize)).map(Val::FixedLengthList)
        }
        Type::Map(map) => {
            let entries = value
                .as_array()
                .ok_or_else(|| fail("an array of {\"key\", \"value\"} objects"))?;
            let (kt, vt) = (map.key(), map.value());
            let mut pairs = Vec::with_capacity(entries.len());
            for (i, entry) in entries.iter().enumerate() {
                let at = format!("{path}[{i}]");
                let get = |field: &str| {
                    entry.get(field).ok_or_else(|| ValueError {
                        path: at.clone(),
                        expected: format!("an object with `{field}`"),
                        got: brief(entry),
                    })
                };
                pairs.push((
                    to_val(get("key")?, &kt, &format!("{at}.key"))?,
                    to_val(get("value")?, &vt, &format!("{at}.value"))?,
                ));
            }
            Ok(Val::Map(pairs))
        }
        Type::Record(record) => {
            let object = value.as_object().ok_or_else(|| fail("an object"))?;
            if let Some(extra) = object
                .keys()
                .find(|k| !record.fields().any(|f| f.name == *k))
            {
                return Err(ValueError {
                    path: format!("{path}.{extra:?}"),
                    expected: "no such field".into(),
                    got: "a value".into(),
                });
            }
            let mut fields = Vec::new();
            for field in record.fields() {
                let at = format!("{path}.{}", field.name);
                let v = object.get(field.name).ok_or_else(|| ValueError {
                    path: at.clone(),
                    expected: "a value (every field is required)".into(),
                    got: "nothing".into(),
                })?;
                fields.push((field.name.to_owned(), to_val(v, &field.ty, &at)?));
            }
            Ok(Val::Record(fields))
        }
        Type::Tuple(tuple) => {
            let items = value.as_array().ok_or_else(|| fail("an array"))?;
            let types: Vec<Type> = tuple.types().collect();
            if items.len() != types.len() {
                return Err(fail(&format!("an array of exactly {}", types.len())));
            }
            items
                .iter()
                .zip(&types)
                .enumerate()
                .map(|(i, (item, ty))| to_val(item, ty, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()
                .map(Val::Tuple)
        }
        Type::Variant(variant) => {
            let names = || {
                variant
                    .cases()
                    .map(|c| c.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let object = value
                .as_object()
                .ok_or_else(|| fail(&format!("an object {{\"tag\": one of {}}}", names())))?;
            let tag = object.get("tag").and_then(Value::as_str);
            let case = variant
                .cases()
                .find(|c| Some(c.name) == tag)
                .ok_or_else(|| fail(&format!("an object whose tag is one of {}", names())))?;
            let payload = match &case.ty {
                Some(ty) => {
                    let v = object
                        .get("val")
                        .ok_or_else(|| fail(&format!("a `val` for the case `{}`", case.name)))?;
                    Some(Box::new(to_val(v, ty, &format!("{path}.val"))?))
                }
                None if object.contains_key("val") => {
                    return Err(fail(&format!(
                        "no `val`: the case `{}` has none",
                        case.name
                    )));
                }
                None => None,
            };
            if let Some(extra) = object.keys().find(|k| *k != "tag" && *k != "val") {
                return Err(fail(&format!("only `tag` and `val`, not `{extra}`")));
            }
            Ok(Val::Variant(case.name.to_owned(), payload))
        }
        Type::Enum(e) => {
            let s = value.as_str();
            match e.names().find(|n| Some(*n) == s) {
                Some(name) => Ok(Val::Enum(name.to_owned())),
                None => Err(fail(&format!(
                    "one of {}",
                    e.names().collect::<Vec<_>>().join(", ")
                ))),
            }
        }
        Type::Option(option) => match value {
            Value::Null => Ok(Val::Option(None)),
            v => Ok(Val::Option(Some(Box::new(to_val(v, &option.ty(), path)?)))),
        },
        Type::Result(result) => {
            let object = value
                .as_object()
                .filter(|o| o.len() == 1)
                .ok_or_else(|| fail("an object with exactly one of `ok` or `err`"))?;
            let side = |key: &str, ty: Option<Type>| -> Result<Option<Box<Val>>, ValueError> {
                let v = &object[key];
                match ty {
                    Some(ty) => Ok(Some(Box::new(to_val(v, &ty, &format!("{path}.{key}"))?))),
                    None if v.is_null() => Ok(None),
                    None => Err(ValueError {
                        path: format!("{path}.{key}"),
                        expected: "null".into(),
                        got: brief(v),
                    }),
                }
            };
            if object.contains_key("ok") {
                Ok(Val::Result(Ok(side("ok", result.ok())?)))
            } else if object.contains_key("err") {
                Ok(Val::Result(Err(side("err", result.err())?)))
            } else {
                Err(fail("an object with exactly one of `ok` or `err`"))
            }
        }
        Type::Flags(flags) => {
            let all = || flags.names().collect::<Vec<_>>().join(", ");
            let items = value
                .as_array()
                .ok_or_else(|| fail(&format!("an array of names from {}", all())))?;
            let mut set = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let name = item
                    .as_str()
                    .filter(|s| flags.names().any(|n| n == *s))
                    .ok_or_else(|| ValueError {
                        path: format!("{path}[{i}]"),
                        expected: format!("one of {}", all()),
                        got: brief(item),
                    })?;
                if set.iter().any(|s| s == name) {
                    return Err(ValueError {
                        path: format!("{path}[{i}]"),
                        expected: "each flag once".into(),
                        got: brief(item),
                    });
                }
                set.push(name.to_owned());
            }
            // In the type's order, as the component model lists them.
            Ok(Val::Flags(
                flags
                    .names()
                    .filter(|n| set.iter().any(|s| s == n))
                    .map(str::to_owned)
                    .collect(),
            ))
        }
        Type::Own(_) | Type::Borrow(_) | Type::Future(_) | Type::Stream(_) | Type::ErrorContext => {
            Err(fail("a type JSON cannot carry"))
        }
    }
}

/// The items of a list (of exactly `len`, when fixed), each of `ty`.
fn items(value: &Value, ty: &Type, path: &str, len: Option<usize>) -> Result<Vec<Val>, ValueError> {
    let fail = |expected: String| ValueError {
        path: path.to_owned(),
        expected,
        got: brief(value),
    };
    let items = value.as_array().ok_or_else(|| fail("an array".into()))?;
    if let Some(len) = len
        && items.len() != len
    {
        return Err(fail(format!("an array of exactly {len}")));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| to_val(item, ty, &format!("{path}[{i}]")))
        .collect()
}

/// Converts a component value into JSON.
pub fn to_json(val: &Val) -> Value {
    fn float(f: f64) -> Value {
        serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(f.to_string()))
    }
    match val {
        Val::Bool(b) => Value::Bool(*b),
        Val::S8(n) => (*n).into(),
        Val::U8(n) => (*n).into(),
        Val::S16(n) => (*n).into(),
        Val::U16(n) => (*n).into(),
        Val::S32(n) => (*n).into(),
        Val::U32(n) => (*n).into(),
        Val::S64(n) => (*n).into(),
        Val::U64(n) => (*n).into(),
        Val::Float32(f) => float(f64::from(*f)),
        Val::Float64(f) => float(*f),
        Val::Char(c) => Value::String(c.to_string()),
        Val::String(s) => Value::String(s.clone()),
        Val::List(items) | Val::Tuple(items) | Val::FixedLengthList(items) => {
            Value::Array(items.iter().map(to_json).collect())
        }
        Val::Map(pairs) => Value::Array(
            pairs
                .iter()
                .map(|(k, v)| serde_json::json!({"key": to_json(k), "value": to_json(v)}))
                .collect(),
        ),
        Val::Record(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), to_json(v)))
                .collect(),
        ),
        Val::Variant(tag, payload) => {
            let mut object = Map::new();
            object.insert("tag".into(), Value::String(tag.clone()));
            if let Some(payload) = payload {
                object.insert("val".into(), to_json(payload));
            }
            Value::Object(object)
        }
        Val::Enum(name) => Value::String(name.clone()),
        Val::Option(None) => Value::Null,
        Val::Option(Some(v)) => to_json(v),
        Val::Result(result) => {
            let (key, v) = match result {
                Ok(v) => ("ok", v),
                Err(v) => ("err", v),
            };
            let mut object = Map::new();
            object.insert(key.into(), v.as_deref().map_or(Value::Null, to_json));
            Value::Object(object)
        }
        Val::Flags(names) => Value::Array(names.iter().cloned().map(Value::String).collect()),
        Val::Resource(_) | Val::Future(_) | Val::Stream(_) | Val::ErrorContext(_) => Value::Null,
    }
}

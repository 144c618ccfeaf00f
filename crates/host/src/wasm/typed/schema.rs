//! What a typed tool component's exports look like as MCP tools: their
//! names, descriptions, input and output schemas, derived from the
//! component's type and its `package-docs` section.
//!
//! Names and argument shapes follow Wassette's `component2json`, so that
//! agents' prompts and configs carry over:
//!
//! - a function exported at world level keeps its name (`read-file`);
//! - a function of an exported interface is `<interface export name>_<func>`,
//!   each part lower-cased with every character outside `[a-z0-9-]` turned
//!   into `_` (`microsoft:time-server-js/time` + `get-current-time` →
//!   `microsoft_time-server-js_time_get-current-time`);
//! - tools come in export order; every parameter is required, under its WIT
//!   name;
//! - the output schema wraps the result as `{"result": …}`;
//! - values: records are objects, lists and tuples arrays, variants
//!   `{"tag": case, "val": payload}`, enums their case name, options `null`
//!   or the value, results `{"ok": …}` / `{"err": …}`, flags an array of the
//!   names that are set.
//!
//! Objects (the arguments, records) name every key they take, and refuse
//! others (`additionalProperties: false`): a misspelt argument is an error,
//! not a silently missing value. Wassette ignores unknown keys.
//!
//! Where Wassette's schemas lose information, these keep it: integers are
//! `integer` with their kind's range (Wassette says only `number`), a `char`
//! is a string of exactly one character, flags are an array of their names
//! (Wassette's schema says an object of booleans, which its own conversion
//! refuses), variants and results are objects with exactly their case's
//! fields, and descriptions come from interface functions' doc comments too
//! (Wassette reads only world-level ones).
//!
//! Functions that take or return a resource, a future, a stream or an error
//! context cannot be called with JSON, and are left out with the reason;
//! so is the internal `init` that componentize-py exports in an instance
//! named `exports`.

use serde_json::{Map, Value, json};
use wasmtime::Engine;
use wasmtime::component::types::{ComponentFunc, ComponentItem};
use wasmtime::component::{Component, Type};

/// Where an exported function is: at world level, or in an exported
/// interface (by its export name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportPath {
    /// The interface's export name (`moat:kinds/shapes@0.1.0`), if any.
    pub interface: Option<String>,
    /// The function's name.
    pub function: String,
}

impl std::fmt::Display for ExportPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.interface {
            Some(interface) => write!(f, "{interface}#{}", self.function),
            None => f.write_str(&self.function),
        }
    }
}

/// One exported function, as a tool.
#[derive(Clone, Debug)]
pub struct ToolShape {
    /// The tool's name, as Wassette derives it.
    pub name: String,
    /// Where the function is exported.
    pub export: ExportPath,
    /// Its doc comment, or Wassette's stand-in.
    pub description: String,
    /// The JSON schema of its arguments: an object of every parameter.
    pub input_schema: Map<String, Value>,
    /// The JSON schema of `{"result": …}`, when it returns something.
    pub output_schema: Option<Map<String, Value>>,
    /// Its parameters, in order.
    pub params: Vec<(String, Type)>,
    /// Its results (zero or one).
    pub results: Vec<Type>,
}

/// An exported function that is not a tool, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Where it is exported.
    pub export: ExportPath,
    /// Why it is not a tool.
    pub reason: String,
}

/// The tools of a component, and the functions left out.
#[derive(Clone, Debug, Default)]
pub struct Shapes {
    pub tools: Vec<ToolShape>,
    pub skipped: Vec<Skipped>,
}

/// Wassette's normalisation of one part of a tool name.
pub fn normalize_part(part: &str) -> String {
    part.to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The tool name of a function exported at `export`.
pub fn tool_name(export: &ExportPath) -> String {
    match &export.interface {
        Some(interface) => format!(
            "{}_{}",
            normalize_part(interface),
            normalize_part(&export.function)
        ),
        None => normalize_part(&export.function),
    }
}

/// Derives the tools of `component`, in export order, with descriptions
/// from `docs` (a decoded `package-docs` section) when given.
pub fn derive(component: &Component, engine: &Engine, docs: Option<&PackageDocs>) -> Shapes {
    let mut shapes = Shapes::default();
    let ty = component.component_type();
    for (name, export) in ty.exports(engine) {
        match &export.ty {
            ComponentItem::ComponentFunc(func) => {
                let path = ExportPath {
                    interface: None,
                    function: name.to_owned(),
                };
                add(&mut shapes, path, func, docs);
            }
            ComponentItem::ComponentInstance(instance) => {
                for (function, item) in instance.exports(engine) {
                    if let ComponentItem::ComponentFunc(func) = &item.ty {
                        let path = ExportPath {
                            interface: Some(name.to_owned()),
                            function: function.to_owned(),
                        };
                        add(&mut shapes, path, func, docs);
                    }
                }
            }
            _ => {}
        }
    }
    shapes
}

fn add(shapes: &mut Shapes, export: ExportPath, func: &ComponentFunc, docs: Option<&PackageDocs>) {
    let skip = |reason: String| Skipped {
        export: export.clone(),
        reason,
    };
    if export.interface.as_deref() == Some("exports") && export.function == "init" {
        shapes.skipped.push(skip(
            "componentize-py's internal `exports#init` is not a tool".into(),
        ));
        return;
    }
    if export.interface.is_none() && export.function == crate::wasm::INIT_EXPORT {
        shapes.skipped.push(skip(
            "Wizer's initialiser (`wizer-initialize`) is not a tool".into(),
        ));
        return;
    }
    if func.async_() {
        shapes
            .skipped
            .push(skip("async functions are not supported yet".into()));
        return;
    }
    let params: Vec<(String, Type)> = func
        .params()
        .map(|(name, ty)| (name.to_owned(), ty))
        .collect();
    let results: Vec<Type> = func.results().collect();
    let mut properties = Map::new();
    let mut required = Vec::new();
    for (name, ty) in &params {
        match schema(ty) {
            Ok(s) => {
                properties.insert(name.clone(), s);
                required.push(Value::String(name.clone()));
            }
            Err(kind) => {
                shapes
                    .skipped
                    .push(skip(format!("its parameter `{name}` is {kind}")));
                return;
            }
        }
    }
    let output_schema = match results.first() {
        None => None,
        Some(ty) => match schema(ty) {
            Ok(s) => Some(object(json!({
                "type": "object",
                "properties": {"result": s},
                "required": ["result"],
            }))),
            Err(kind) => {
                shapes.skipped.push(skip(format!("its result is {kind}")));
                return;
            }
        },
    };
    let name = tool_name(&export);
    let description = docs
        .and_then(|d| d.function(&export))
        .unwrap_or_else(|| format!("Auto-generated schema for function '{name}'"));
    shapes.tools.push(ToolShape {
        name,
        export,
        description,
        input_schema: object(json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        })),
        output_schema,
        params,
        results,
    });
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// The JSON schema of the values [`super::value::to_val`] accepts for `ty`,
/// or what kind of type it is that JSON cannot carry.
pub fn schema(ty: &Type) -> Result<Value, &'static str> {
    fn integer(min: i128, max: i128) -> Value {
        json!({"type": "integer", "minimum": min, "maximum": max})
    }
    Ok(match ty {
        Type::Bool => json!({"type": "boolean"}),
        Type::S8 => integer(i8::MIN.into(), i8::MAX.into()),
        Type::U8 => integer(0, u8::MAX.into()),
        Type::S16 => integer(i16::MIN.into(), i16::MAX.into()),
        Type::U16 => integer(0, u16::MAX.into()),
        Type::S32 => integer(i32::MIN.into(), i32::MAX.into()),
        Type::U32 => integer(0, u32::MAX.into()),
        Type::S64 => integer(i64::MIN.into(), i64::MAX.into()),
        Type::U64 => integer(0, u64::MAX.into()),
        Type::Float32 | Type::Float64 => json!({"type": "number"}),
        Type::Char => json!({"type": "string", "minLength": 1, "maxLength": 1}),
        Type::String => json!({"type": "string"}),
        Type::List(list) => json!({"type": "array", "items": schema(&list.ty())?}),
        Type::FixedLengthList(list) => json!({
            "type": "array",
            "items": schema(&list.ty())?,
            "minItems": list.len(),
            "maxItems": list.len(),
        }),
        Type::Map(map) => json!({
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"key": schema(&map.key())?, "value": schema(&map.value())?},
                "required": ["key", "value"],
            },
        }),
        Type::Record(record) => {
            let mut properties = Map::new();
            let mut required = Vec::new();
            for field in record.fields() {
                properties.insert(field.name.to_owned(), schema(&field.ty)?);
                required.push(Value::String(field.name.to_owned()));
            }
            json!({
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            })
        }
        Type::Tuple(tuple) => {
            let items = tuple
                .types()
                .map(|t| schema(&t))
                .collect::<Result<Vec<_>, _>>()?;
            json!({
                "type": "array",
                "prefixItems": items,
                "items": false,
                "minItems": items.len(),
                "maxItems": items.len(),
            })
        }
        Type::Variant(variant) => {
            let mut cases = Vec::new();
            for case in variant.cases() {
                cases.push(match &case.ty {
                    Some(payload) => json!({
                        "type": "object",
                        "properties": {"tag": {"const": case.name}, "val": schema(payload)?},
                        "required": ["tag", "val"],
                        "additionalProperties": false,
                    }),
                    None => json!({
                        "type": "object",
                        "properties": {"tag": {"const": case.name}},
                        "required": ["tag"],
                        "additionalProperties": false,
                    }),
                });
            }
            json!({"oneOf": cases})
        }
        Type::Enum(e) => json!({"type": "string", "enum": e.names().collect::<Vec<_>>()}),
        Type::Option(option) => json!({"anyOf": [{"type": "null"}, schema(&option.ty())?]}),
        Type::Result(result) => {
            let side =
                |t: Option<Type>| t.map(|t| schema(&t)).unwrap_or(Ok(json!({"type": "null"})));
            json!({"oneOf": [
                {"type": "object", "properties": {"ok": side(result.ok())?},
                 "required": ["ok"], "additionalProperties": false},
                {"type": "object", "properties": {"err": side(result.err())?},
                 "required": ["err"], "additionalProperties": false},
            ]})
        }
        Type::Flags(flags) => json!({
            "type": "array",
            "items": {"type": "string", "enum": flags.names().collect::<Vec<_>>()},
            "uniqueItems": true,
        }),
        Type::Own(_) | Type::Borrow(_) => return Err("a resource"),
        Type::Future(_) => return Err("a future"),
        Type::Stream(_) => return Err("a stream"),
        Type::ErrorContext => return Err("an error context"),
    })
}

/// A decoded `package-docs` section: the doc comments of the component's
/// WIT package (wit-parser's `PackageMetadata`, a version byte and JSON).
#[derive(Clone, Debug, Default)]
pub struct PackageDocs(Value);

impl PackageDocs {
    /// Finds the `package-docs` custom section anywhere in `bytes` (at the
    /// component's level or in a module inside it) and decodes it. `None`
    /// when there is none or it does not decode: docs are optional.
    pub fn find(bytes: &[u8]) -> Option<Self> {
        for payload in wasmparser::Parser::new(0).parse_all(bytes) {
            match payload {
                Ok(wasmparser::Payload::CustomSection(section))
                    if section.name() == "package-docs" =>
                {
                    return Self::decode(section.data());
                }
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    }

    /// Decodes the section's contents: version 0 or 1, then JSON.
    pub fn decode(data: &[u8]) -> Option<Self> {
        let (version, json) = data.split_first()?;
        if *version > 1 {
            return None;
        }
        serde_json::from_slice(json).ok().map(Self)
    }

    /// The doc comment of the function at `export`: a world-level export's
    /// from the worlds, an interface function's from its interface (by the
    /// interface's name within the package).
    pub fn function(&self, export: &ExportPath) -> Option<String> {
        let docs = |meta: &Value| -> Option<String> {
            match meta {
                Value::String(s) => Some(s.clone()),
                Value::Object(m) => m.get("docs")?.as_str().map(str::to_owned),
                _ => None,
            }
        };
        match &export.interface {
            None => self
                .0
                .get("worlds")?
                .as_object()?
                .values()
                .find_map(|world| {
                    ["func_exports", "funcs"]
                        .iter()
                        .find_map(|key| docs(world.get(key)?.get(&export.function)?))
                }),
            Some(interface) => {
                let bare = interface
                    .rsplit_once('/')
                    .map_or(interface.as_str(), |(_, i)| i);
                let bare = bare.split_once('@').map_or(bare, |(i, _)| i);
                docs(
                    self.0
                        .get("interfaces")?
                        .get(bare)?
                        .get("funcs")?
                        .get(&export.function)?,
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(interface: Option<&str>, function: &str) -> ExportPath {
        ExportPath {
            interface: interface.map(str::to_owned),
            function: function.to_owned(),
        }
    }

    #[test]
    fn names_follow_wassette() {
        assert_eq!(tool_name(&path(None, "read-file")), "read-file");
        assert_eq!(
            tool_name(&path(
                Some("microsoft:time-server-js/time"),
                "get-current-time"
            )),
            "microsoft_time-server-js_time_get-current-time"
        );
        assert_eq!(
            tool_name(&path(Some("moat:kinds/shapes@0.1.0"), "next-colour")),
            "moat_kinds_shapes_0_1_0_next-colour"
        );
        assert_eq!(tool_name(&path(None, "Get.Thing")), "get_thing");
        assert_eq!(tool_name(&path(None, "naïve")), "na_ve");
    }

    #[test]
    fn docs_are_found_for_world_and_interface_functions_in_both_formats() {
        let docs = PackageDocs::decode(
            &[
                &[1u8][..],
                br#"{"worlds":{"w":{"func_exports":{"greet":{"docs":"Greets."}}}},
                    "interfaces":{"shapes":{"funcs":{"describe":{"docs":"Describes."}}}}}"#,
            ]
            .concat(),
        )
        .unwrap();
        assert_eq!(
            docs.function(&path(None, "greet")).as_deref(),
            Some("Greets.")
        );
        assert_eq!(
            docs.function(&path(Some("moat:kinds/shapes@0.1.0"), "describe"))
                .as_deref(),
            Some("Describes.")
        );
        assert_eq!(docs.function(&path(None, "describe")), None);
        let v0 = PackageDocs::decode(
            &[
                &[0u8][..],
                br#"{"worlds":{"w":{"funcs":{"greet":"Old."}}}}"#,
            ]
            .concat(),
        )
        .unwrap();
        assert_eq!(v0.function(&path(None, "greet")).as_deref(), Some("Old."));
        assert!(PackageDocs::decode(&[2, b'{', b'}']).is_none());
        assert!(PackageDocs::decode(&[1, b'x']).is_none());
        assert!(PackageDocs::decode(&[]).is_none());
    }
}

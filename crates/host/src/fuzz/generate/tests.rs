//! Unit tests of case generation: determinism, valid values, coverage of
//! every kind, hostile schemas, and corpus mutation.

use serde_json::json;

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
        Case::Call { arguments, .. } => arguments.get("marker").is_some() && arguments != original,
        _ => false,
    });
    assert!(mutated);
}

//! Tool names and schemas: each exported function is a tool, named and
//! ordered as Wassette derives it, with schemas that keep the WIT types and
//! descriptions taken from the docs.

use super::*;

#[tokio::test]
async fn tools_are_named_and_ordered_as_wassette_derives_them() {
    let session = connect(Instances::Call).await;
    let names: Vec<String> = session
        .list_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    let interface =
        ["translate", "describe", "next-colour", "grant-exec"].map(|f| format!("{SHAPES}{f}"));
    let world = [
        "greet",
        "add",
        "scalars",
        "sum",
        "maybe-double",
        "checked-div",
        "count",
        "whisper",
        "trap",
        "spin",
        "hog",
        "prefix",
    ];
    let expected: Vec<String> = world
        .iter()
        .map(|s| s.to_string())
        .chain(interface)
        .collect();
    // In the component's export order (wit-component puts the world's
    // functions before its interfaces), not sorted; the resource's
    // constructor and method, and the function returning a resource, are
    // not tools.
    assert_eq!(names, expected);
    session.close().await.unwrap();
}

#[tokio::test]
async fn schemas_keep_the_wit_types_and_descriptions_come_from_the_docs() {
    let session = connect(Instances::Call).await;
    let tools = session.list_tools().await.unwrap();
    let tool = |name: &str| {
        let tool = tools
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tool {name}"));
        serde_json::to_value(tool).unwrap()
    };
    let add = tool("add");
    assert_eq!(add["description"], "Adds two small numbers.");
    assert_eq!(
        add["inputSchema"],
        json!({
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 255},
                "b": {"type": "integer", "minimum": 0, "maximum": 255},
            },
            "required": ["a", "b"],
            "additionalProperties": false,
        })
    );
    assert_eq!(
        add["outputSchema"],
        json!({
            "type": "object",
            "properties": {"result": {"type": "integer", "minimum": 0, "maximum": 65535}},
            "required": ["result"],
        })
    );
    // An interface function's doc comment (Wassette drops these).
    let translate = tool(&format!("{SHAPES}translate"));
    assert_eq!(translate["description"], "Moves a point by (dx, dy).");
    assert_eq!(
        translate["inputSchema"]["properties"]["p"],
        json!({
            "type": "object",
            "properties": {
                "x": {"type": "integer", "minimum": i32::MIN, "maximum": i32::MAX},
                "y": {"type": "integer", "minimum": i32::MIN, "maximum": i32::MAX},
            },
            "required": ["x", "y"],
            "additionalProperties": false,
        })
    );
    let scalars = tool("scalars");
    let props = &scalars["inputSchema"]["properties"];
    assert_eq!(
        props["letter"],
        json!({"type": "string", "minLength": 1, "maxLength": 1})
    );
    assert_eq!(props["big"]["maximum"], json!(u64::MAX));
    assert_eq!(props["long"]["minimum"], json!(i64::MIN));
    assert_eq!(props["double"], json!({"type": "number"}));
    assert_eq!(
        scalars["outputSchema"]["properties"]["result"]["prefixItems"]
            .as_array()
            .unwrap()
            .len(),
        10
    );
    assert_eq!(
        tool("maybe-double")["inputSchema"]["properties"]["x"],
        json!({"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 0, "maximum": u32::MAX}]})
    );
    assert_eq!(
        tool(&format!("{SHAPES}grant-exec"))["inputSchema"]["properties"]["p"],
        json!({
            "type": "array",
            "items": {"type": "string", "enum": ["read", "write", "exec"]},
            "uniqueItems": true,
        })
    );
    assert_eq!(
        tool(&format!("{SHAPES}next-colour"))["inputSchema"]["properties"]["c"],
        json!({"type": "string", "enum": ["red", "green", "blue"]})
    );
    let shape = &tool(&format!("{SHAPES}describe"))["inputSchema"]["properties"]["s"];
    assert_eq!(shape["oneOf"].as_array().unwrap().len(), 3);
    assert_eq!(shape["oneOf"][2]["required"], json!(["tag"]));
    // No parameters: an empty object that takes no key; no result: no
    // output schema.
    let count = tool("count");
    assert_eq!(
        count["inputSchema"],
        json!({"type": "object", "properties": {}, "required": [], "additionalProperties": false})
    );
    assert!(tool("whisper").get("outputSchema").is_none());
    session.close().await.unwrap();
}

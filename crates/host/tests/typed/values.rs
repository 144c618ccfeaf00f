//! Values across the boundary: every type kind converts from JSON and back,
//! an `err` result is an error the model sees, and arguments that do not fit
//! the types are refused by name.

use super::*;

#[tokio::test]
async fn every_type_kind_crosses_the_boundary_and_back() {
    let session = connect(Instances::Call).await;
    assert_eq!(
        result(&session, "greet", json!({"name": "Ada"})).await,
        "Hello, Ada!"
    );
    assert_eq!(
        result(&session, "add", json!({"a": 200, "b": 100})).await,
        300
    );
    // An integer is any number without a fraction, as in JSON Schema.
    assert_eq!(result(&session, "add", json!({"a": 2.0, "b": 1})).await, 3);
    let scalars = json!([
        true,
        -128,
        -32768,
        i32::MIN,
        i64::MIN,
        u32::MAX,
        u64::MAX,
        1.5,
        -2.25,
        "é"
    ]);
    let arguments = json!({
        "b": true, "small": -128, "short": -32768, "int": i32::MIN, "long": i64::MIN,
        "word": u32::MAX, "big": u64::MAX, "single": 1.5, "double": -2.25, "letter": "é",
    });
    assert_eq!(result(&session, "scalars", arguments).await, scalars);
    assert_eq!(
        result(&session, "sum", json!({"xs": [1, 2, 3, -10]})).await,
        -4
    );
    assert_eq!(result(&session, "sum", json!({"xs": []})).await, 0);
    assert_eq!(result(&session, "maybe-double", json!({"x": 21})).await, 42);
    assert_eq!(
        result(&session, "maybe-double", json!({"x": null})).await,
        Value::Null
    );
    assert_eq!(
        result(&session, "checked-div", json!({"a": 7, "b": 2})).await,
        json!({"ok": 3})
    );
    assert_eq!(
        result(
            &session,
            &format!("{SHAPES}translate"),
            json!({"p": {"x": 1, "y": 2}, "dx": 10, "dy": -20})
        )
        .await,
        json!({"x": 11, "y": -18})
    );
    let describe = format!("{SHAPES}describe");
    assert_eq!(
        result(
            &session,
            &describe,
            json!({"s": {"tag": "circle", "val": 3}})
        )
        .await,
        "a circle of radius 3"
    );
    assert_eq!(
        result(
            &session,
            &describe,
            json!({"s": {"tag": "square", "val": {"x": 4, "y": 5}}})
        )
        .await,
        "a square at (4, 5)"
    );
    assert_eq!(
        result(&session, &describe, json!({"s": {"tag": "nothing"}})).await,
        "nothing"
    );
    assert_eq!(
        result(
            &session,
            &format!("{SHAPES}next-colour"),
            json!({"c": "blue"})
        )
        .await,
        "red"
    );
    assert_eq!(
        result(
            &session,
            &format!("{SHAPES}grant-exec"),
            json!({"p": ["write", "read"]})
        )
        .await,
        json!(["read", "write", "exec"])
    );
    // No result: Wassette's text "null" and no structured content.
    let whisper = call(&session, "whisper", json!({"msg": "hi"})).await;
    assert_eq!(whisper.is_error, Some(false));
    assert_eq!(text(&whisper), "null");
    assert!(whisper.structured_content.is_none());
    session.close().await.unwrap();
}

#[tokio::test]
async fn an_err_result_is_an_error_the_model_sees() {
    let session = connect(Instances::Call).await;
    let answer = call(&session, "checked-div", json!({"a": 1, "b": 0})).await;
    assert_eq!(answer.is_error, Some(true));
    assert_eq!(
        answer.structured_content,
        Some(json!({"result": {"err": "cannot divide 1 by 0"}}))
    );
    assert_eq!(text(&answer), r#"{"err":"cannot divide 1 by 0"}"#);
    session.close().await.unwrap();
}

#[tokio::test]
async fn arguments_that_do_not_fit_the_types_are_refused_by_name() {
    let session = connect(Instances::Call).await;
    let cases = [
        (
            "add",
            json!({"a": 256, "b": 1}),
            "argument a: expected an integer in 0..=255 (u8), got 256",
        ),
        (
            "add",
            json!({"a": 1}),
            "argument b: expected a value (every parameter is required), got nothing",
        ),
        (
            "add",
            json!({"a": 1, "b": 2, "c": 3}),
            "argument \"c\": expected no such parameter",
        ),
        (
            "add",
            json!({"a": 1.5, "b": 2}),
            "argument a: expected an integer in 0..=255 (u8), got 1.5",
        ),
        (
            "scalars",
            json!({"b": true, "small": 0, "short": 0, "int": 0, "long": 0, "word": 0, "big": 0,
                           "single": 0, "double": 0, "letter": "ab"}),
            "argument letter: expected a one-character string, got \"ab\"",
        ),
        (
            "sum",
            json!({"xs": [1, "2"]}),
            "argument xs[1]: expected a 64-bit signed integer (s64), got \"2\"",
        ),
        (
            &format!("{SHAPES}describe"),
            json!({"s": {"tag": "hexagon"}}),
            "argument s: expected an object whose tag is one of circle, square, nothing",
        ),
        (
            &format!("{SHAPES}describe"),
            json!({"s": {"tag": "nothing", "val": 1}}),
            "argument s: expected no `val`: the case `nothing` has none",
        ),
        (
            &format!("{SHAPES}translate"),
            json!({"p": {"x": 1}, "dx": 0, "dy": 0}),
            "argument p.y: expected a value (every field is required)",
        ),
        (
            &format!("{SHAPES}translate"),
            json!({"p": {"x": 1, "y": 2, "z": 3}, "dx": 0, "dy": 0}),
            "argument p.\"z\": expected no such field",
        ),
        (
            &format!("{SHAPES}grant-exec"),
            json!({"p": ["read", "read"]}),
            "argument p[1]: expected each flag once",
        ),
        (
            &format!("{SHAPES}grant-exec"),
            json!({"p": ["delete"]}),
            "argument p[0]: expected one of read, write, exec, got \"delete\"",
        ),
        (
            &format!("{SHAPES}next-colour"),
            json!({"c": "mauve"}),
            "argument c: expected one of red, green, blue, got \"mauve\"",
        ),
    ];
    for (tool, arguments, message) in cases {
        let error = refused(&session, tool, arguments.clone()).await;
        assert!(error.contains(message), "{tool} {arguments}: {error}");
    }
    let error = refused(&session, "nope", json!({})).await;
    assert!(
        error.contains("server `kinds` has no tool `nope`"),
        "{error}"
    );
    // The server is unharmed.
    assert_eq!(result(&session, "add", json!({"a": 1, "b": 2})).await, 3);
    session.close().await.unwrap();
}

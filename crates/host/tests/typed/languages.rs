//! Components built from other languages: componentize-js keeps
//! Wassette's names and its thrown error is the `err`; componentize-py's
//! internal init is not a tool.

use super::*;

/// A host for the JavaScript and Python components (11 and 18 MB, several
/// seconds each to compile), whose cache is the CLI tests': each is
/// compiled once per test run.
fn foreign_host() -> &'static moat_host::Host {
    static HOST: std::sync::OnceLock<moat_host::Host> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache");
        moat_host::Host::new(Some(cache)).expect("host")
    })
}

/// Tools in export order with their descriptions, as (name, description).
async fn listed(session: &Session) -> Vec<(String, String)> {
    session
        .list_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| {
            (
                t.name.to_string(),
                t.description.as_deref().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// A component built by componentize-js: a world-level function keeps its
/// name, an interface's are `<interface export name>_<func>` with `:` and
/// `/` turned into `_`, and JavaScript's thrown error is the `err`.
#[tokio::test]
async fn a_javascript_component_is_served_with_wassettes_names() {
    let session = foreign_host()
        .connect(&foreign("js", guests::JS_TOOLS_WASM))
        .await
        .expect("connect to the JavaScript component");
    assert_eq!(
        listed(&session).await,
        [
            ("reverse", "Reverses a list of numbers."),
            ("moat_js-tools_text_shout", "Upper-cases a line of text."),
            (
                "moat_js-tools_text_count-words",
                "Counts the words in a line."
            ),
            (
                "moat_js-tools_text_repeat",
                "Repeats a word, or says why it will not."
            ),
        ]
        .map(|(n, d)| (n.to_owned(), d.to_owned()))
    );
    assert_eq!(
        result(
            &session,
            "moat_js-tools_text_shout",
            json!({"line": "quiet"})
        )
        .await,
        "QUIET"
    );
    assert_eq!(
        result(
            &session,
            "moat_js-tools_text_count-words",
            json!({"line": " a b  c "})
        )
        .await,
        3
    );
    assert_eq!(
        result(&session, "reverse", json!({"xs": [1, 2, 3]})).await,
        json!([3, 2, 1])
    );
    assert_eq!(
        result(
            &session,
            "moat_js-tools_text_repeat",
            json!({"word": "la", "times": 3})
        )
        .await,
        json!({"ok": "la la la"})
    );
    let refused = call(
        &session,
        "moat_js-tools_text_repeat",
        json!({"word": "la", "times": 11}),
    )
    .await;
    assert_eq!(refused.is_error, Some(true));
    assert_eq!(
        refused.structured_content,
        Some(json!({"result": {"err": "will not repeat 11 times (at most 10)"}}))
    );
    session.close().await.unwrap();
}

/// A component built by componentize-py: its internal `exports#init` is
/// not a tool, and a raised `Err` is the `err`.
#[tokio::test]
async fn a_python_component_is_served_without_its_internal_init() {
    let session = foreign_host()
        .connect(&foreign("py", guests::PY_TOOLS_WASM))
        .await
        .expect("connect to the Python component");
    assert_eq!(
        listed(&session).await,
        [
            (
                "calculate",
                "Evaluates an arithmetic expression of integers, + - * and parentheses."
            ),
            ("join", "Joins words with a separator."),
        ]
        .map(|(n, d)| (n.to_owned(), d.to_owned()))
    );
    assert_eq!(
        result(&session, "calculate", json!({"expression": "(2 + 3) * -7"})).await,
        json!({"ok": -35})
    );
    assert_eq!(
        result(
            &session,
            "join",
            json!({"words": ["a", "b"], "separator": "+"})
        )
        .await,
        "a+b"
    );
    let refused = call(&session, "calculate", json!({"expression": "2 ** 64"})).await;
    assert_eq!(refused.is_error, Some(true));
    let err = &refused.structured_content.unwrap()["result"]["err"];
    assert!(
        err.as_str()
            .unwrap()
            .starts_with("not an integer expression"),
        "{err}"
    );
    let identity = session.identity().unwrap();
    assert_eq!(
        identity.component.unwrap().not_tools,
        ["exports#init: componentize-py's internal `exports#init` is not a tool"]
    );
    session.close().await.unwrap();
}

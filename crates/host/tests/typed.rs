//! Typed tool components (no `wasi:cli/run`): each exported function is a
//! tool, named and shaped as Wassette derives it, with schemas that keep the
//! WIT types; calls convert JSON to component values and back, run under
//! the server's limits, and fail alone, in both instance modes.

#[macro_use]
mod common;

use common::{args, host, text};

use moat_host::ServerSpec;
use moat_host::config::{Instances, ServerKind};
use moat_host::rmcp::model::CallToolResult;
use moat_host::{Session, SessionError};
use moat_test_guests as guests;
use serde_json::{Value, json};

fn kinds(instances: Instances) -> ServerSpec {
    let mut spec = ServerSpec::wasm("kinds", guests::KINDS_WASM);
    spec.allow_unmeasured = true;
    if let ServerKind::Wasm {
        instances: mode, ..
    } = &mut spec.kind
    {
        *mode = instances;
    }
    spec
}

async fn connect(instances: Instances) -> Session {
    host()
        .connect(&kinds(instances))
        .await
        .expect("connect to kinds")
}

async fn call(session: &Session, tool: &str, arguments: Value) -> CallToolResult {
    session
        .call_tool(tool, args(arguments))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// The structured result of a successful call: the `result` it wraps.
async fn result(session: &Session, tool: &str, arguments: Value) -> Value {
    let answer = call(session, tool, arguments).await;
    assert_ne!(answer.is_error, Some(true), "{tool}: {answer:?}");
    let structured = answer
        .structured_content
        .clone()
        .expect("structured content");
    let value = structured["result"].clone();
    // The text is the value itself when it is a string, else compact JSON.
    let expected_text = match &value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    assert_eq!(text(&answer), expected_text, "{tool}");
    value
}

const SHAPES: &str = "moat_kinds_shapes_0_1_0_";

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

/// The message of a refused call.
async fn refused(session: &Session, tool: &str, arguments: Value) -> String {
    match session.call_tool(tool, args(arguments)).await {
        Err(SessionError::Server { code, message, .. }) => {
            assert_eq!(code, -32602, "{tool}: invalid params");
            message
        }
        other => panic!("{tool}: expected a refusal, got {other:?}"),
    }
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

#[tokio::test]
async fn a_fresh_instance_per_call_keeps_no_state_and_a_session_instance_does() {
    let fresh = connect(Instances::Call).await;
    let held = connect(Instances::Session).await;
    let mut counts = (Vec::new(), Vec::new());
    for _ in 0..3 {
        counts.0.push(result(&fresh, "count", json!({})).await);
        counts.1.push(result(&held, "count", json!({})).await);
    }
    assert_eq!(counts.0, [json!(1), json!(1), json!(1)]);
    assert_eq!(counts.1, [json!(1), json!(2), json!(3)]);
    // A failed call replaces the session's instance.
    assert_eq!(call(&held, "trap", json!({})).await.is_error, Some(true));
    assert_eq!(result(&held, "count", json!({})).await, 1);
    // Two sessions never share an instance.
    let other = connect(Instances::Session).await;
    assert_eq!(result(&other, "count", json!({})).await, 1);
    for session in [fresh, held, other] {
        session.close().await.unwrap();
    }
}

/// The text of a call that failed alone.
async fn failed(session: &Session, tool: &str, arguments: Value) -> String {
    let answer = call(session, tool, arguments).await;
    assert_eq!(answer.is_error, Some(true), "{tool}: {answer:?}");
    assert!(answer.structured_content.is_none());
    text(&answer)
}

async fn failures_stay_within_their_call(host: &moat_host::Host, instances: Instances) {
    let mut spec = kinds(instances);
    spec.limits.memory_bytes = 16 << 20;
    spec.limits.fuel_per_request = 50_000_000;
    let session = host.connect(&spec).await.expect("connect");
    let trap = failed(&session, "trap", json!({})).await;
    assert!(
        trap.starts_with(
            "server `kinds`: tool `trap` failed: wasm trap: wasm `unreachable` instruction executed"
        ),
        "{trap}"
    );
    let spin = failed(&session, "spin", json!({})).await;
    assert_eq!(
        spin,
        "server `kinds`: tool `spin` hit its CPU limit: fuel_per_request = 50000000 used up; \
         the server still answers other calls"
    );
    let hog = failed(&session, "hog", json!({"mib": 64})).await;
    assert!(
        hog.starts_with("server `kinds`: tool `hog` hit its memory limit"),
        "{hog}"
    );
    // Within the limit, the same function works.
    assert_eq!(result(&session, "hog", json!({"mib": 4})).await, 4);
    // A neighbour answers while a call spins.
    let spinning = session.call_tool("spin", args(json!({})));
    let neighbour = async {
        let answer = result(&session, "greet", json!({"name": "neighbour"})).await;
        assert_eq!(answer, "Hello, neighbour!");
    };
    let (spun, ()) = tokio::join!(spinning, neighbour);
    assert_eq!(spun.unwrap().is_error, Some(true));
    assert_eq!(result(&session, "add", json!({"a": 2, "b": 40})).await, 42);
    session.close().await.unwrap();
}

#[tokio::test]
async fn a_trap_fuel_and_memory_fail_only_their_call_with_an_instance_per_call() {
    failures_stay_within_their_call(host(), Instances::Call).await;
}

#[tokio::test]
async fn a_trap_fuel_and_memory_fail_only_their_call_with_an_instance_per_session() {
    failures_stay_within_their_call(host(), Instances::Session).await;
}

#[tokio::test]
async fn a_call_past_its_deadline_fails_alone() {
    let mut spec = kinds(Instances::Call);
    spec.limits.fuel_per_request = u64::MAX / 4;
    spec.limits.request_timeout_ms = 300;
    let session = host().connect(&spec).await.expect("connect");
    let late = failed(&session, "spin", json!({})).await;
    assert_eq!(
        late,
        "server `kinds`: tool `spin` hit its deadline: request_timeout_ms = 300 passed \
         without an answer; the server still answers other calls"
    );
    assert_eq!(result(&session, "add", json!({"a": 1, "b": 1})).await, 2);
    session.close().await.unwrap();
}

/// `moat fuzz` on a typed component: a call cancelled as it is sent still
/// runs to its end on the server, and the panic it writes to stderr after
/// the case's answer (the ping's) belongs to that case; the next case, a
/// sound call, is not blamed for it. Repeated, since before the fix it
/// depended on which of the ping's answer and the stderr reader came first
/// (`moat fuzz` runs on a multi-thread runtime, where the cancelled call and
/// the ping are handled at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_calls_panic_is_found_in_its_own_case_not_the_next() {
    use moat_host::fuzz::{Case, Class, Runner};
    let mut runner = Runner::start(host().clone(), kinds(Instances::Call), false, None)
        .await
        .expect("start the fuzz runner");
    let cancelled = Case::CancelMidCall {
        tool: "prefix".into(),
        arguments: json!({"text": "", "count": 1}),
    };
    let sound = Case::Call {
        tool: "greet".into(),
        arguments: json!({"name": "next"}),
    };
    for round in 0..20 {
        let outcome = runner.run(&cancelled).await;
        assert_eq!(outcome.class, Class::Panic, "round {round}: {outcome:?}");
        assert!(
            outcome
                .detail
                .contains("end byte index 1 is out of bounds of ``"),
            "round {round}: {outcome:?}"
        );
        let next = runner.run(&sound).await;
        assert_eq!(next.class, Class::Ok, "round {round}: {next:?}");
    }
    runner.close().await;
}

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

fn foreign(name: &str, wasm: &str) -> ServerSpec {
    let mut spec = ServerSpec::wasm(name, wasm);
    spec.allow_unmeasured = true;
    spec
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

/// A host whose engine takes instances from a pool of `instances` slots.
fn pooled_host(instances: u32) -> moat_host::Host {
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache-pooled");
    moat_host::Host::with_options(
        Some(cache),
        moat_host::wasm::Metering::Fuel,
        moat_host::wasm::Allocator::Pooling(moat_host::wasm::Pool {
            instances,
            max_memory_bytes: 256 << 20,
        }),
    )
    .expect("pooled host")
}

#[tokio::test]
async fn pooled_instances_fail_alone_and_are_reused_past_the_pools_size() {
    let host = pooled_host(4);
    failures_stay_within_their_call(&host, Instances::Call).await;
    failures_stay_within_their_call(&host, Instances::Session).await;
    // Many more calls than slots: each call's instance goes back reset.
    let session = host.connect(&kinds(Instances::Call)).await.unwrap();
    for _ in 0..20 {
        assert_eq!(result(&session, "count", json!({})).await, 1);
    }
    session.close().await.unwrap();
}

#[tokio::test]
async fn an_exhausted_pool_fails_the_call_that_found_it_full_and_nothing_else() {
    let host = pooled_host(1);
    // A session instance holds the only slot once it has answered.
    let holder = host.connect(&kinds(Instances::Session)).await.unwrap();
    assert_eq!(result(&holder, "count", json!({})).await, 1);
    let other = host.connect(&kinds(Instances::Call)).await.unwrap();
    let refused = failed(&other, "greet", json!({"name": "late"})).await;
    assert!(
        refused.contains("maximum concurrent limit of 1 for component instances reached"),
        "{refused}"
    );
    // The holder is unharmed, and once it closes the slot serves the other.
    assert_eq!(result(&holder, "count", json!({})).await, 2);
    holder.close().await.unwrap();
    assert_eq!(
        result(&other, "greet", json!({"name": "again"})).await,
        "Hello, again!"
    );
    other.close().await.unwrap();
}

#[tokio::test]
async fn the_javascript_and_python_components_run_from_the_pool() {
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache");
    let host = moat_host::Host::with_options(
        Some(cache),
        moat_host::wasm::Metering::Fuel,
        moat_host::wasm::Allocator::Pooling(moat_host::wasm::Pool {
            instances: 8,
            max_memory_bytes: 256 << 20,
        }),
    )
    .expect("pooled host");
    let js = host
        .connect(&foreign("js", guests::JS_TOOLS_WASM))
        .await
        .expect("connect to the JavaScript component");
    let py = host
        .connect(&foreign("py", guests::PY_TOOLS_WASM))
        .await
        .expect("connect to the Python component");
    for _ in 0..3 {
        let shout = json!({"line": "quiet"});
        assert_eq!(
            result(&js, "moat_js-tools_text_shout", shout).await,
            "QUIET"
        );
        let sum = json!({"expression": "(2 + 3) * -7"});
        assert_eq!(result(&py, "calculate", sum).await, json!({"ok": -35}));
    }
    js.close().await.unwrap();
    py.close().await.unwrap();
}

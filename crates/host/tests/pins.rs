//! Tool pins and the lock, on both launchers: drift is refused and reported,
//! restored tools come back, invalid arguments never reach the server,
//! structured output is checked, and the bytes and identity must be the
//! locked ones.

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{Launcher, args, spec, text};
use moat_host::ToolStatus;
use moat_host::lock::{LOCK_VERSION, Lock, LockedServer};
use moat_host::{ConnectError, Host, LaunchError, ServerSpec, Session, SessionError};
use moat_test_guests as guests;
use serde_json::json;

both_launchers!(
    a_drifted_tool_is_reported_and_refused_and_comes_back_when_restored,
    list_changed_triggers_the_pin_check_again,
    invalid_arguments_never_reach_the_server,
    structured_output_is_checked_against_the_pinned_schema,
    other_bytes_than_the_locked_ones_are_refused,
    a_changed_identity_is_refused,
    drifted_prompts_and_resources_are_neither_listed_nor_served,
    a_pinned_schema_that_is_no_json_schema_refuses_the_server_naming_the_tool,
    the_sessions_of_a_server_share_one_compile_of_its_pins,
);

fn cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache")
}

/// `everything` with the drift switch set to `drift`.
fn everything(launcher: Launcher, drift: &str) -> ServerSpec {
    let mut spec = spec(launcher, guests::EVERYTHING);
    spec.env
        .values
        .insert("EVERYTHING_DRIFT".into(), drift.into());
    spec
}

async fn lock_of(specs: &[&ServerSpec]) -> Lock {
    let host = Host::new(Some(cache())).unwrap();
    let mut servers = BTreeMap::new();
    for spec in specs {
        servers.insert(
            spec.name.clone(),
            host.measure(spec).await.expect("measure"),
        );
    }
    Lock {
        version: LOCK_VERSION,
        revoked: Vec::new(),
        servers,
    }
}

fn locked_host(lock: Lock) -> Host {
    Host::new(Some(cache()))
        .unwrap()
        .with_lock(lock, PathBuf::from("moat.lock"))
}

async fn status_of(session: &Session, tool: &str) -> ToolStatus {
    session
        .tool_reports()
        .await
        .unwrap()
        .expect("pins are enforced")
        .into_iter()
        .find(|r| r.name == tool)
        .map(|r| r.status)
        .expect("a report for every tool")
}

async fn a_drifted_tool_is_reported_and_refused_and_comes_back_when_restored(launcher: Launcher) {
    let approved = everything(launcher, "0");
    let host = locked_host(lock_of(&[&approved]).await);

    let session = host.connect(&approved).await.unwrap();
    assert!(matches!(
        status_of(&session, "echo").await,
        ToolStatus::Pinned { .. }
    ));
    assert_eq!(session.list_tools().await.unwrap().len(), 9);
    session.close().await.unwrap();

    // The same bytes and identity (an env value, not a name, changed), but
    // the server now describes `echo` differently.
    let drifted = everything(launcher, "1");
    let session = host.connect(&drifted).await.unwrap();
    let status = status_of(&session, "echo").await;
    let ToolStatus::Drifted { locked, live } = &status else {
        panic!("expected drift, got {status:?}");
    };
    assert_ne!(locked, live);
    let exposed: Vec<String> = session
        .list_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(!exposed.contains(&"echo".to_owned()), "{exposed:?}");
    assert_eq!(exposed.len(), 8, "the other tools stay available");
    match session
        .call_tool("echo", args(json!({"message": "hi"})))
        .await
    {
        Err(SessionError::ToolUnavailable { tool, reason, .. }) => {
            assert_eq!(tool, "echo");
            assert!(reason.contains("drifted"), "{reason}");
            assert!(reason.contains(locked.as_str()), "{reason}");
        }
        other => panic!("a drifted tool must be refused, got {other:?}"),
    }
    // Nothing reached the server.
    let calls = session.call_tool("calls", None).await.unwrap();
    assert_eq!(text(&calls), "1");
    session.close().await.unwrap();

    let restored = everything(launcher, "0");
    let session = host.connect(&restored).await.unwrap();
    let echoed = session
        .call_tool("echo", args(json!({"message": "back"})))
        .await
        .unwrap();
    assert_eq!(text(&echoed), "back");
    session.close().await.unwrap();
}

async fn list_changed_triggers_the_pin_check_again(launcher: Launcher) {
    let approved = everything(launcher, "0");
    let host = locked_host(lock_of(&[&approved]).await);
    let session = host.connect(&approved).await.unwrap();
    let hi = args(json!({"message": "hi"}));
    assert_eq!(
        text(&session.call_tool("echo", hi.clone()).await.unwrap()),
        "hi"
    );

    // The server changes `echo` at run time and announces it.
    session
        .call_tool("drift", args(json!({"on": true})))
        .await
        .unwrap();
    match session.call_tool("echo", hi.clone()).await {
        Err(SessionError::ToolUnavailable { reason, .. }) => {
            assert!(reason.contains("drifted"), "{reason}")
        }
        other => panic!("after list_changed the drift must be caught, got {other:?}"),
    }
    assert!(
        !session
            .list_tools()
            .await
            .unwrap()
            .iter()
            .any(|t| t.name == "echo")
    );

    session
        .call_tool("drift", args(json!({"on": false})))
        .await
        .unwrap();
    assert_eq!(text(&session.call_tool("echo", hi).await.unwrap()), "hi");
    session.close().await.unwrap();
}

async fn invalid_arguments_never_reach_the_server(launcher: Launcher) {
    let approved = everything(launcher, "0");
    let host = locked_host(lock_of(&[&approved]).await);
    let session = host.connect(&approved).await.unwrap();
    let cases = [
        (json!({"a": "two", "b": 1}), "/a"),
        (json!({"a": 1}), "/"),
        (json!({"a": 1.5, "b": 2}), "/a"),
    ];
    for (arguments, pointer) in cases {
        match session.call_tool("add", args(arguments.clone())).await {
            Err(SessionError::InvalidArguments {
                tool, violation, ..
            }) => {
                assert_eq!(tool, "add");
                assert_eq!(violation.pointer, pointer, "{arguments}: {violation}");
            }
            other => panic!("{arguments} must be refused, got {other:?}"),
        }
    }
    let ok = session
        .call_tool("add", args(json!({"a": 2, "b": 40})))
        .await
        .unwrap();
    assert_eq!(text(&ok), "42");
    // The server saw the valid `add` and this `calls`, nothing else.
    let calls = session.call_tool("calls", None).await.unwrap();
    assert_eq!(text(&calls), "2");
    session.close().await.unwrap();
}

async fn structured_output_is_checked_against_the_pinned_schema(launcher: Launcher) {
    let approved = everything(launcher, "0");
    let host = locked_host(lock_of(&[&approved]).await);
    let session = host.connect(&approved).await.unwrap();
    let good = session
        .call_tool("shape", args(json!({"valid": true})))
        .await
        .unwrap();
    assert_eq!(good.structured_content, Some(json!({"count": 3})));
    match session
        .call_tool("shape", args(json!({"valid": false})))
        .await
    {
        Err(SessionError::InvalidOutput {
            tool, violation, ..
        }) => {
            assert_eq!(tool, "shape");
            assert_eq!(violation.pointer, "/count");
        }
        other => panic!("output outside the schema must be withheld, got {other:?}"),
    }
    session.close().await.unwrap();
}

async fn other_bytes_than_the_locked_ones_are_refused(launcher: Launcher) {
    let approved = everything(launcher, "0");
    let mut lock = lock_of(&[&approved]).await;
    // Lock `everything` as the bytes of another guest.
    let other = lock_of(&[&spec(launcher, guests::REPORT)]).await;
    let entry: &mut LockedServer = lock.servers.get_mut("everything").unwrap();
    entry.sha256 = other.servers["report"].sha256.clone();
    let host = locked_host(lock);
    match host.connect(&approved).await {
        Err(ConnectError::Launch(error)) => {
            let message = error.to_string();
            assert!(message.contains("digest mismatch"), "{message}");
            assert!(
                matches!(error, LaunchError::Wasm(_) | LaunchError::Native(_)),
                "{error:?}"
            );
        }
        Err(other) => panic!("expected a digest refusal, got {other}"),
        Ok(_) => panic!("bytes other than the locked ones must not launch"),
    }
}

async fn a_changed_identity_is_refused(launcher: Launcher) {
    let approved = everything(launcher, "0");
    let host = locked_host(lock_of(&[&approved]).await);
    let mut changed = approved.clone();
    changed.args = vec!["--extra".into()];
    match host.connect(&changed).await {
        Err(ConnectError::IdentityChanged { server, .. }) => assert_eq!(server, "everything"),
        Err(other) => panic!("expected an identity refusal, got {other}"),
        Ok(_) => panic!("a changed identity must not pass the lock"),
    }
    let mut unknown = approved.clone();
    unknown.name = "stranger".into();
    match host.connect(&unknown).await {
        Err(ConnectError::NotLocked { server, .. }) => assert_eq!(server, "stranger"),
        Err(other) => panic!("expected a not-locked refusal, got {other}"),
        Ok(_) => panic!("a server missing from the lock must not run"),
    }
}

/// The pinned schemas compile while the server starts (host/mod.rs): a
/// schema that does not compile still refuses the server, naming the tool,
/// and leaves nothing running.
async fn a_pinned_schema_that_is_no_json_schema_refuses_the_server_naming_the_tool(
    launcher: Launcher,
) {
    let approved = everything(launcher, "0");
    let mut lock = lock_of(&[&approved]).await;
    let entry = lock.servers.get_mut("everything").unwrap();
    let tool = entry
        .tools
        .iter_mut()
        .find(|tool| tool.name == "add")
        .expect("`add` is locked");
    let mut definition: serde_json::Value = serde_json::from_str(&tool.definition).unwrap();
    definition["inputSchema"]["properties"]["a"]["type"] = json!(5);
    tool.definition = definition.to_string();
    let host = locked_host(lock);
    match host.connect(&approved).await {
        Err(ConnectError::Session(error)) if matches!(*error, SessionError::Policy(_)) => {
            let message = error.to_string();
            assert!(
                message.starts_with(
                    "lock entry for tool `add`: inputSchema is not a usable JSON Schema: "
                ),
                "{message}"
            );
        }
        Err(other) => panic!("expected the pinned schema refused, got {other}"),
        Ok(_) => panic!("a pinned schema that does not compile must refuse the server"),
    }
    assert_eq!(
        host.running("everything"),
        0,
        "the refused server was left running"
    );
}

/// Each session of a server enforces the same pins, compiled once for the
/// lock (they were compiled again for every session), and a new lock
/// compiles them again.
async fn the_sessions_of_a_server_share_one_compile_of_its_pins(launcher: Launcher) {
    let approved = everything(launcher, "0");
    let lock = lock_of(&[&approved]).await;
    let host = locked_host(lock.clone());
    let sessions = futures::future::join_all((0..3).map(|_| host.connect(&approved))).await;
    assert_eq!(host.pin_compiles(), 1, "three sessions, one compile");
    for session in sessions {
        let session = session.expect("connect");
        assert!(matches!(
            status_of(&session, "add").await,
            ToolStatus::Pinned { .. }
        ));
        let refused = session
            .call_tool("add", args(json!({"a": "two", "b": 2})))
            .await;
        assert!(
            matches!(refused, Err(SessionError::InvalidArguments { .. })),
            "{refused:?}"
        );
        session.close().await.unwrap();
    }
    let relocked = host.relocked(Some((lock, PathBuf::from("moat.lock"))));
    let session = relocked.connect(&approved).await.expect("connect");
    assert_eq!(relocked.pin_compiles(), 2, "a new lock compiles its own");
    session.close().await.unwrap();
}

#[tokio::test]
async fn the_same_servers_lock_byte_identically() {
    let approved = everything(Launcher::Native, "0");
    let wasm = everything(Launcher::Wasm, "0");
    let mut wasm = wasm.clone();
    wasm.name = "everything-wasm".into();
    let first = lock_of(&[&approved, &wasm]).await.to_text();
    let second = lock_of(&[&approved, &wasm]).await.to_text();
    assert_eq!(first, second);
    assert!(first.contains("[servers.everything]"), "{first}");
    assert!(first.contains("evidence = \"native-measured\""), "{first}");
    assert!(first.contains("evidence = \"wasm-measured\""), "{first}");
}

#[tokio::test]
async fn untrusted_metadata_is_flagged_at_lock_time() {
    let lock = lock_of(&[&spec(Launcher::Wasm, guests::SHADY_METADATA)]).await;
    let tool = &lock.servers["shady-metadata"].tools[0];
    assert_eq!(
        tool.flags,
        [
            "ansi-escape",
            "bidi-controls",
            "instruction-tags",
            "override-phrases",
            "sensitive-paths",
            "zero-width-characters"
        ]
    );
}

/// Issue 12, item 8: prompts and resources are pinned like tools. Under
/// the lock the pinned definitions are listed; a drifted prompt or resource
/// is neither listed nor served.
async fn drifted_prompts_and_resources_are_neither_listed_nor_served(launcher: Launcher) {
    let approved = everything(launcher, "0");
    let lock = lock_of(&[&approved]).await;
    let locked = &lock.servers[&approved.name];
    assert_eq!(
        locked
            .prompts
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>(),
        ["greet"]
    );
    assert_eq!(
        locked
            .resources
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["moat://everything/readme"]
    );
    let host = locked_host(lock);

    let session = host.connect(&approved).await.unwrap();
    let prompts = session.list_prompts().await.unwrap();
    assert_eq!(prompts.len(), 1);
    assert_eq!(
        prompts[0].description.as_deref(),
        Some("Greets someone by name")
    );
    session
        .get_prompt("greet", args(json!({"name": "Ada"})))
        .await
        .unwrap();
    assert_eq!(session.list_resources().await.unwrap().len(), 1);
    session
        .read_resource("moat://everything/readme")
        .await
        .unwrap();
    session.close().await.unwrap();

    let drifted = everything(launcher, "1");
    let session = host.connect(&drifted).await.unwrap();
    let listed = session.list_prompts().await.unwrap();
    assert!(listed.is_empty(), "{listed:?}");
    assert!(session.list_resources().await.unwrap().is_empty());
    match session
        .get_prompt("greet", args(json!({"name": "Ada"})))
        .await
    {
        Err(SessionError::NotPinned { kind, name, .. }) => {
            assert_eq!((kind, name.as_str()), ("prompt", "greet"))
        }
        other => panic!("{other:?}"),
    }
    match session.read_resource("moat://everything/readme").await {
        Err(SessionError::NotPinned { kind, .. }) => assert_eq!(kind, "resource"),
        other => panic!("{other:?}"),
    }
    session.close().await.unwrap();
}

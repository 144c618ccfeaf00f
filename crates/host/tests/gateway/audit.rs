//! The gateway fails closed on its audit log: a call whose record cannot
//! be written gets no result, and nothing more is admitted.

use super::*;

both_launchers!(a_call_that_cannot_be_audited_gets_no_result_and_nothing_more_is_admitted,);

/// Fails closed: once the audit log (here its anchor) cannot be written,
/// the call whose record failed gets the log's error instead of its result,
/// and every later call, in that session or a new one, is refused before
/// any server sees it; the log ends where it failed.
async fn a_call_that_cannot_be_audited_gets_no_result_and_nothing_more_is_admitted(
    launcher: Launcher,
) {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let gateway = gateway_audited(&[spec(launcher, guests::EVERYTHING)], 30_000, Some(&audit));
    let session = gateway.session();
    let add = || args(json!({"a": 1, "b": 2}));
    let result = session.call("everything__add", add()).await.unwrap();
    assert_eq!(text(&result), "3");
    assert!(gateway.audit_failure().is_none());

    // The anchor cannot be replaced: its temporary name is a directory.
    let tmp = dir.path().join("audit.jsonl.anchor.tmp");
    std::fs::create_dir(&tmp).unwrap();
    let expected = format!(
        "audit log {} cannot be written ({}: Is a directory (os error 21)): Moat admits no calls until it can record them; free space (or fix the error) and restart Moat",
        audit.display(),
        moat_host::audit::anchor_path(&audit).display()
    );
    let error = session.call("everything__add", add()).await.unwrap_err();
    assert_eq!(error.message, expected, "the answer is withheld");
    std::fs::remove_dir(&tmp).unwrap();

    // Nothing more is admitted, though the anchor could be written again.
    let launches = gateway.host().launches();
    let again = session.call("everything__add", add()).await.unwrap_err();
    assert_eq!(again.message, expected);
    let other = gateway.session();
    let refused = other.call("everything__add", add()).await.unwrap_err();
    assert_eq!(refused.message, expected);
    assert_eq!(gateway.host().launches(), launches, "no server started");
    assert_eq!(
        gateway.audit_failure().map(|e| e.to_string()),
        Some(expected)
    );
    assert!(other.close().await.is_empty());
    assert!(session.close().await.is_empty());

    // The failed call's line got in, the anchor did not move, and nothing
    // was written after it.
    assert_eq!(
        moat_host::audit::verify(&audit, &audit_key()).unwrap(),
        moat_host::audit::Verified {
            lines: 4,
            unanchored: 1
        }
    );
    let kinds: Vec<String> = audited(&audit).into_iter().map(|(e, _)| e).collect();
    assert_eq!(
        kinds,
        ["session_open", "server_launch", "tool_call", "tool_call"]
    );
}

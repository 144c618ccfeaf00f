//! Signed claims (issue 35): at a session's end the gateway signs what ran
//! in it; the claim verifies with the public key alone and against the
//! audit log, and every way of breaking it is refused with its reason.

use super::*;
use moat_host::claim::{ClaimError, Claims, Place, SigningKey};
use std::sync::Arc;

both_launchers!(a_sessions_claim_is_signed_and_matches_its_audit_log,);

/// A gateway writing claims into `dir/claims`, signed with a key in
/// `dir/keys`, over an audit log at `dir/audit.jsonl`.
fn claiming(dir: &Path, servers: &[moat_host::ServerSpec]) -> (Gateway, Arc<SigningKey>) {
    let gateway = gateway_audited(servers, 30_000, Some(&dir.join("audit.jsonl")));
    let key = Arc::new(SigningKey::in_dir(&dir.join("keys"), true).unwrap());
    gateway.sign_claims(Claims {
        key: key.clone(),
        place: Place::Dir(dir.join("claims")),
    });
    (gateway, key)
}

/// The one claim written into `dir/claims`.
fn the_claim(dir: &Path) -> std::path::PathBuf {
    let claims: Vec<_> = std::fs::read_dir(dir.join("claims"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(claims.len(), 1, "{claims:?}");
    claims.into_iter().next().unwrap()
}

async fn a_sessions_claim_is_signed_and_matches_its_audit_log(launcher: Launcher) {
    let dir = tempfile::tempdir().unwrap();
    let mut broken = moat_host::ServerSpec::wasm("broken", dir.path().join("absent.wasm"));
    broken.allow_unmeasured = true;
    let (gateway, key) = claiming(dir.path(), &[spec(launcher, guests::EVERYTHING), broken]);
    let session = gateway.session();
    let _ = session.tools().await;
    let sum = session
        .call("everything__add", args(json!({"a": 1, "b": 2})))
        .await
        .unwrap();
    assert_eq!(text(&sum), "3");
    let refused_by_the_tool = session
        .call("everything__add", args(json!({"a": "one"})))
        .await
        .unwrap();
    assert_eq!(refused_by_the_tool.is_error, Some(true));
    let id = session.id().to_owned();
    assert!(session.close().await.is_empty());

    let path = the_claim(dir.path());
    let claim = moat_host::claim::verify(&path, &key.public()).unwrap();
    assert_eq!(claim.session, id);
    assert!(claim.incomplete.is_empty());
    assert!(claim.started_unix_ms <= claim.ended_unix_ms);
    assert_eq!(
        claim.calls,
        [("ok".to_owned(), 1), ("tool-error".to_owned(), 1)].into()
    );
    // The server that ran, as the audit log's launch line names it.
    let audit = dir.path().join("audit.jsonl");
    let launch: serde_json::Value = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["event"] == "server_launch")
        .unwrap();
    let [ran] = &claim.servers[..] else {
        panic!("one server ran: {:?}", claim.servers)
    };
    assert_eq!(ran.name, "everything");
    assert_eq!(ran.identity, launch["identity"].as_str().unwrap());
    assert_eq!(ran.evidence, launch["evidence"].as_str().unwrap());
    assert_eq!(ran.sha256.as_deref(), launch["sha256"].as_str());
    assert!(
        ran.sandbox.iter().any(|l| l.starts_with("enforced: ")),
        "{:?}",
        ran.sandbox
    );
    // The server that could not start is a refusal, in Moat's words.
    assert!(
        claim
            .refusals
            .iter()
            .any(|r| r.server == "broken" && r.during == "start"),
        "{:?}",
        claim.refusals
    );
    let checked = moat_host::claim::check_against_log(&path, &claim, &audit).unwrap();
    assert_eq!(checked.calls, claim.calls);

    // A claim signed right but not matching the log (one launch more, a
    // call fewer) is refused against it.
    for (what, change) in [
        (
            "launches",
            Box::new(|c: &mut moat_host::claim::Claim| c.servers[0].launches += 1)
                as Box<dyn Fn(&mut moat_host::claim::Claim)>,
        ),
        (
            "calls",
            Box::new(|c: &mut moat_host::claim::Claim| {
                c.calls.remove("ok");
            }),
        ),
    ] {
        let mut wrong = claim.clone();
        change(&mut wrong);
        let wrong_path = dir.path().join(format!("wrong-{what}.json"));
        std::fs::write(&wrong_path, wrong.sign(&key).to_text()).unwrap();
        let wrong = moat_host::claim::verify(&wrong_path, &key.public()).unwrap();
        let error = moat_host::claim::check_against_log(&wrong_path, &wrong, &audit)
            .unwrap_err()
            .to_string();
        let expected = match what {
            "launches" => "the log's launches in session",
            _ => "the log holds these calls of session",
        };
        assert!(error.contains(expected), "{what}: {error}");
    }

    // One byte changed: the signature no longer holds.
    let text = std::fs::read_to_string(&path).unwrap();
    let altered = dir.path().join("altered.json");
    let needle = format!("\"session\": \"{id}\"");
    assert!(text.contains(&needle), "{text}");
    std::fs::write(
        &altered,
        text.replacen(&needle, &format!("\"session\": \"{id}0\""), 1),
    )
    .unwrap();
    let error = moat_host::claim::verify(&altered, &key.public()).unwrap_err();
    assert!(matches!(error, ClaimError::BadSignature { .. }), "{error}");
    assert_eq!(
        error.to_string(),
        format!(
            "claim {}: the signature does not verify with {}: the claim was altered after it was signed, or signed by another key",
            altered.display(),
            key.public()
        )
    );

    // Another key's public half is not the signer's.
    let other = SigningKey::in_dir(&dir.path().join("other-keys"), true).unwrap();
    let error = moat_host::claim::verify(&path, &other.public()).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "claim {}: signed by the key {}, not by the key given ({})",
            path.display(),
            key.public(),
            other.public()
        )
    );

    // A log that lacks the claim's chain head (cut before the close).
    let cut = dir.path().join("cut.jsonl");
    let log = std::fs::read_to_string(&audit).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    let head = claim.audit.as_ref().unwrap();
    assert_eq!(head.lines, lines.len());
    std::fs::write(&cut, lines[..lines.len() - 1].join("\n") + "\n").unwrap();
    let error = moat_host::claim::check_against_log(&path, &claim, &cut).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "claim {} against the audit log {}: the log holds no line with the claim's chain head {} (lines were removed or changed, or this is another log)",
            path.display(),
            cut.display(),
            head.head
        )
    );
}

/// An audit write of the session failed: the claim is not signed, says
/// why, and verifying it is refused with that reason.
#[tokio::test]
async fn a_claim_after_a_failed_audit_write_is_unsigned_and_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (gateway, key) = claiming(dir.path(), &[spec(Launcher::Wasm, guests::EVERYTHING)]);
    let session = gateway.session();
    let add = || args(json!({"a": 1, "b": 2}));
    session.call("everything__add", add()).await.unwrap();
    let audit = dir.path().join("audit.jsonl");
    // The anchor cannot be replaced: its temporary name is a directory.
    std::fs::create_dir(dir.path().join("audit.jsonl.anchor.tmp")).unwrap();
    session.call("everything__add", add()).await.unwrap_err();
    assert!(session.close().await.is_empty());

    let path = the_claim(dir.path());
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(written["signature"], serde_json::Value::Null);
    let reason = format!(
        "an audit write failed: audit log {} cannot be written ({}: Is a directory (os error 21)): Moat admits no calls until it can record them; free space (or fix the error) and restart Moat",
        audit.display(),
        moat_host::audit::anchor_path(&audit).display()
    );
    assert_eq!(written["claim"]["incomplete"], json!([reason]));
    let error = moat_host::claim::verify(&path, &key.public()).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "claim {}: not signed: the session's record is incomplete: {reason}",
            path.display()
        )
    );
}

/// `--claims audit`: the signed claim is the line after the session's
/// close in the audit log itself, and names that close as its head.
#[tokio::test]
async fn a_claim_can_go_into_the_audit_log_after_the_close_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let gateway = gateway_audited(
        &[spec(Launcher::Wasm, guests::EVERYTHING)],
        30_000,
        Some(&audit),
    );
    let key = Arc::new(SigningKey::in_dir(&dir.path().join("keys"), true).unwrap());
    gateway.sign_claims(Claims {
        key: key.clone(),
        place: Place::AuditLog,
    });
    let session = gateway.session();
    session
        .call("everything__add", args(json!({"a": 1, "b": 2})))
        .await
        .unwrap();
    assert!(session.close().await.is_empty());

    moat_host::audit::verify(&audit, &audit_key()).unwrap();
    let log = std::fs::read_to_string(&audit).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    let last: serde_json::Value = serde_json::from_str(lines[lines.len() - 1]).unwrap();
    assert_eq!(last["event"], "claim");
    let close: serde_json::Value = serde_json::from_str(lines[lines.len() - 2]).unwrap();
    assert_eq!(close["event"], "session_close");
    assert_eq!(
        last["claim"]["claim"]["audit"]["head"],
        moat_host::Digest::of(lines[lines.len() - 2].as_bytes()).to_string()
    );
    let path = dir.path().join("extracted.json");
    std::fs::write(&path, last["claim"].to_string()).unwrap();
    let claim = moat_host::claim::verify(&path, &key.public()).unwrap();
    moat_host::claim::check_against_log(&path, &claim, &audit).unwrap();
}

/// Without an audit log a claim still counts every call (its ledger is fed
/// the same events), and says it names no point in a log.
#[tokio::test]
async fn a_claim_without_an_audit_log_still_counts_the_calls() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = gateway(&[spec(Launcher::Wasm, guests::EVERYTHING)]);
    let key = Arc::new(SigningKey::in_dir(&dir.path().join("keys"), true).unwrap());
    gateway.sign_claims(Claims {
        key: key.clone(),
        place: Place::Dir(dir.path().join("claims")),
    });
    let session = gateway.session();
    for _ in 0..3 {
        session
            .call("everything__add", args(json!({"a": 1, "b": 2})))
            .await
            .unwrap();
    }
    assert!(session.close().await.is_empty());
    let claim = moat_host::claim::verify(&the_claim(dir.path()), &key.public()).unwrap();
    assert_eq!(claim.calls, [("ok".to_owned(), 3)].into());
    assert_eq!(claim.servers.len(), 1);
    assert!(claim.audit.is_none());
}

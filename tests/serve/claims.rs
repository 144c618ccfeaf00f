//! `moat serve --claims DIR` end to end (issue 35): the agent's session
//! ends, its claim is signed with the key `moat key show` prints, and both
//! `moat claim verify` (with the audit log) and a short verifier written
//! apart from Moat (Python, tests/clients/verify_claim.py) accept it, and
//! refuse it once one byte is changed.

use super::*;

fn moat(args: &[&std::ffi::OsStr]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(args)
        .env("MOAT_STATE_DIR", common::state_dir())
        .output()
        .expect("moat")
}

fn python_verifier(claim: &Path, key: &str) -> std::process::Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::process::Command::new("python3")
        .arg(root.join("tests/clients/verify_claim.py"))
        .arg(claim)
        .arg(key)
        .env("PYTHONPATH", root.join("target/py"))
        .output()
        .expect("python3")
}

/// A config in `dir` serving the `everything` wasm guest.
fn everything_config(dir: &Path) -> std::path::PathBuf {
    let config = dir.join("moat.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.everything]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM
        ),
    )
    .unwrap();
    config
}

#[tokio::test]
async fn a_served_sessions_claim_verifies_with_moat_and_with_an_independent_verifier() {
    let dir = tempfile::tempdir().unwrap();
    let config = everything_config(dir.path());
    let audit = dir.path().join("audit.jsonl");
    let claims = dir.path().join("claims");
    let mut child = serve_stdio(
        &config,
        &[
            "--audit".as_ref(),
            audit.as_ref(),
            "--claims".as_ref(),
            claims.as_ref(),
        ],
    );
    let client = Agent
        .serve((child.stdout.take().unwrap(), child.stdin.take().unwrap()))
        .await
        .expect("handshake with moat serve");
    let mut params = CallToolRequestParams::new("everything__add");
    params.arguments = serde_json::json!({"a": 2, "b": 3}).as_object().cloned();
    client.peer().call_tool(params).await.unwrap();
    client.cancel().await.unwrap();
    assert!(child.wait().await.unwrap().success());

    let written: Vec<_> = std::fs::read_dir(&claims)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let [claim] = &written[..] else {
        panic!("one claim: {written:?}")
    };
    let shown = moat(&["key".as_ref(), "show".as_ref(), "--public".as_ref()]);
    assert!(shown.status.success(), "{shown:?}");
    let key = String::from_utf8(shown.stdout).unwrap().trim().to_owned();
    assert_eq!(key.len(), 64, "{key}");

    let verified = moat(&[
        "claim".as_ref(),
        "verify".as_ref(),
        claim.as_ref(),
        "--public-key".as_ref(),
        key.as_ref(),
        "--audit".as_ref(),
        audit.as_ref(),
    ]);
    let stdout = String::from_utf8_lossy(&verified.stdout);
    assert!(verified.status.success(), "{verified:?}");
    assert!(
        stdout.contains(&format!(
            ", signed by {key}: 1 servers, 1 calls, 0 refusals"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("with the calls and launches the claim counts"),
        "{stdout}"
    );
    let python = python_verifier(claim, &key);
    assert_eq!(
        String::from_utf8_lossy(&python.stdout).trim(),
        "ok s1",
        "{python:?}"
    );

    // One byte changed: a call count.
    let text = std::fs::read_to_string(claim).unwrap();
    let altered = dir.path().join("altered.json");
    assert!(text.contains("\"ok\": 1"), "{text}");
    std::fs::write(&altered, text.replacen("\"ok\": 1", "\"ok\": 0", 1)).unwrap();
    let refused = moat(&[
        "claim".as_ref(),
        "verify".as_ref(),
        altered.as_ref(),
        "--public-key".as_ref(),
        key.as_ref(),
    ]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains(&format!(
            "the signature does not verify with {key}: the claim was altered after it was signed"
        )),
        "{refused:?}"
    );
    let python = python_verifier(&altered, &key);
    assert_eq!(python.status.code(), Some(1), "{python:?}");
    assert_eq!(
        String::from_utf8_lossy(&python.stdout).trim(),
        "bad signature"
    );
}

/// No server may reach the claim signing key (it would sign for Moat) or
/// the claims directory (it could remove a claim): a grant of either is
/// refused at launch, naming what it overlaps, and the rest is served.
#[tokio::test]
async fn no_grant_reaches_the_claim_key_or_the_claims() {
    let dir = tempfile::tempdir().unwrap();
    let claims = dir.path().join("claims");
    let state = common::state_dir();
    std::fs::create_dir_all(&state).unwrap();
    let config = dir.path().join("moat.toml");
    let server = |name: &str, granted: &Path| {
        format!(
            "[servers.{name}]\ncommand = {:?}\nallow_unmeasured = true\n[[servers.{name}.dirs]]\nhost = {:?}\nmode = \"ro\"\n",
            guests::EVERYTHING_NATIVE,
            granted
        )
    };
    std::fs::write(
        &config,
        format!(
            "{}{}[servers.plain]\ncommand = {:?}\nallow_unmeasured = true\n",
            server("claims", &claims),
            server("key", &state),
            guests::EVERYTHING_NATIVE
        ),
    )
    .unwrap();
    let mut child = serve_stdio(&config, &["--claims".as_ref(), claims.as_ref()]);
    let client = Agent
        .serve((child.stdout.take().unwrap(), child.stdin.take().unwrap()))
        .await
        .expect("handshake with moat serve");
    let call = |tool: &str| {
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = serde_json::json!({"a": 2, "b": 3}).as_object().cloned();
        client.peer().call_tool(params)
    };
    let refused = call("claims__add").await.unwrap_err().to_string();
    assert!(
        refused.contains(&format!(
            "grant {} overlaps Moat's claims directory",
            claims.display()
        )),
        "{refused}"
    );
    let refused = call("key__add").await.unwrap_err().to_string();
    assert!(
        refused.contains(&format!(
            "grant {} overlaps Moat's claim signing key",
            state.display()
        )),
        "{refused}"
    );
    call("plain__add").await.unwrap();
    client.cancel().await.unwrap();
    assert!(child.wait().await.unwrap().success());
}

/// `--claims audit` with no audit log is refused before anything is served,
/// saying what to give instead.
#[test]
fn claims_into_an_audit_log_that_is_not_kept_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = everything_config(dir.path());
    let output = moat(&[
        "serve".as_ref(),
        "--config".as_ref(),
        config.as_ref(),
        "--claims".as_ref(),
        "audit".as_ref(),
    ]);
    assert!(!output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim(),
        "moat: error: --claims audit: claims go into the audit log, and there is none: give --audit FILE, or --claims DIR"
    );
}

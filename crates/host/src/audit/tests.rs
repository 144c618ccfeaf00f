use super::*;
use crate::identity::Digest;

fn call(tool: &str) -> Event {
    Event::ToolCall {
        session: "s1".into(),
        server: "everything".into(),
        tool: tool.into(),
        arguments_sha256: Digest::of(b"{}").to_string(),
        arguments_bytes: 2,
        result_sha256: None,
        result_bytes: 0,
        duration_ms: 1,
        fuel: 0,
        outcome: Outcome::plain("ok"),
    }
}

fn key() -> Key {
    let dir = tempfile::tempdir().unwrap();
    key_in(dir.path(), true).unwrap()
}

fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(
        path,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
}

/// A log of four calls, a to d.
fn four(dir: &Path, key: Key) -> PathBuf {
    let path = dir.join("audit.jsonl");
    let log = AuditLog::open(&path, key).unwrap();
    for tool in ["a", "b", "c", "d"] {
        log.record(&call(tool)).unwrap();
    }
    path
}

#[test]
fn a_chain_verifies_and_continues_across_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let key = key();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::open(&path, key).unwrap();
    log.record(&Event::SessionOpen {
        session: "s1".into(),
    })
    .unwrap();
    log.record(&call("add")).unwrap();
    drop(log);
    let log = AuditLog::open(&path, key).unwrap();
    log.record(&call("echo")).unwrap();
    assert_eq!(
        verify(&path, &key).unwrap(),
        Verified {
            lines: 3,
            unanchored: 0
        }
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.lines().next().unwrap().contains(GENESIS));
    assert!(!text.contains("arguments\""), "no arguments are recorded");
    // Another user's key (or none of Moat's) verifies nothing.
    assert!(matches!(
        verify(&path, &super::tests::key()),
        Err(AuditError::Altered { line: 1, .. })
    ));
}

#[test]
fn an_edited_line_is_named_even_with_the_chain_recomputed() {
    let dir = tempfile::tempdir().unwrap();
    let key = key();
    let path = four(dir.path(), key);
    let mut lines = lines_of(&path);
    lines[1] = lines[1].replace("\"tool\":\"b\"", "\"tool\":\"x\"");
    write_lines(&path, &lines);
    let error = verify(&path, &key).unwrap_err();
    assert!(
        matches!(error, AuditError::Altered { line: 2, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("line 2 was altered"), "{error}");

    // The chain after it recomputed, as one would without the key.
    let mut prev = Digest::of(lines[0].as_bytes()).to_string();
    for line in lines.iter_mut().skip(1) {
        let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
        value["prev"] = prev.clone().into();
        *line = crate::lock::canonical_json(&value);
        prev = Digest::of(line.as_bytes()).to_string();
    }
    write_lines(&path, &lines);
    assert!(matches!(
        verify(&path, &key),
        Err(AuditError::Altered { line: 2, .. })
    ));
}

#[test]
fn a_removed_line_breaks_the_chain_where_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let key = key();
    let path = four(dir.path(), key);
    let lines = lines_of(&path);
    write_lines(
        &path,
        &[lines[0].clone(), lines[2].clone(), lines[3].clone()],
    );
    match verify(&path, &key) {
        Err(AuditError::Broken { line, .. }) => assert_eq!(line, 2),
        other => panic!("{other:?}"),
    }
    std::fs::write(&path, "not json\n").unwrap();
    assert!(matches!(
        verify(&path, &key),
        Err(AuditError::Malformed { line: 1, .. })
    ));
}

#[test]
fn lines_cut_from_the_end_are_named_and_an_edited_anchor_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = key();
    let path = four(dir.path(), key);
    let lines = lines_of(&path);
    write_lines(&path, &lines[..2]);
    let error = verify(&path, &key).unwrap_err();
    assert!(
        matches!(
            error,
            AuditError::Truncated {
                anchored: 4,
                found: 2,
                first_missing: 3,
                ..
            }
        ),
        "{error}"
    );
    assert!(
        error.to_string().contains("lines 3 to 4 are missing"),
        "{error}"
    );
    // Appending to a damaged log would hide the damage.
    assert!(AuditLog::open(&path, key).is_err());

    // The anchor moved back to match: its MAC fails.
    let anchor = anchor_path(&path);
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&anchor).unwrap()).unwrap();
    value["lines"] = 2.into();
    value["head"] = Digest::of(lines[1].as_bytes()).to_string().into();
    std::fs::write(&anchor, value.to_string()).unwrap();
    assert!(matches!(
        verify(&path, &key),
        Err(AuditError::Anchor { .. })
    ));
    // No anchor at all: refused, not trusted.
    std::fs::remove_file(&anchor).unwrap();
    assert!(matches!(
        verify(&path, &key),
        Err(AuditError::Anchor { .. })
    ));
}

#[test]
fn a_second_writer_is_refused_while_the_first_holds_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let key = key();
    let path = dir.path().join("audit.jsonl");
    let first = AuditLog::open(&path, key).unwrap();
    first.record(&call("a")).unwrap();
    // Another open file description of the same log: its OFD lock
    // conflicts even within one process. (The holder's pid comes from
    // a POSIX lock, which a process never conflicts with: another
    // process is told it, see tests/serve/.)
    let Err(error) = AuditLog::open(&path, key) else {
        panic!("a second writer was let in");
    };
    assert!(
        matches!(&error, AuditError::Locked { path: p, .. } if *p == path),
        "{error}"
    );
    assert!(
        error.to_string().starts_with(&format!(
            "audit log {} is being written by another Moat (pid",
            path.display()
        )),
        "{error}"
    );
    assert!(
        error.to_string().ends_with(
            "two writers would break its chain: give each `moat serve` its own --audit file"
        ),
        "{error}"
    );
    // The refused writer wrote nothing, not even the anchor; the first
    // goes on, and a reader needs no lock.
    first.record(&call("b")).unwrap();
    assert_eq!(verify(&path, &key).unwrap().lines, 2);
    drop(first);
    // The lock goes with the writer.
    let next = AuditLog::open(&path, key).unwrap();
    next.record(&call("c")).unwrap();
    assert_eq!(verify(&path, &key).unwrap().lines, 3);
}

#[test]
fn a_log_that_cannot_be_written_is_poisoned_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let key = key();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::open(&path, key).unwrap();
    log.record(&call("a")).unwrap();
    assert!(log.failure().is_none());
    // The anchor cannot be replaced (its temporary name is taken by a
    // directory): the line is in, the anchor stays one behind.
    let tmp = dir.path().join("audit.jsonl.anchor.tmp");
    std::fs::create_dir(&tmp).unwrap();
    let error = log.record(&call("b")).unwrap_err();
    let expected = format!(
        "audit log {} cannot be written ({}: Is a directory (os error 21)): Moat admits no calls until it can record them",
        path.display(),
        anchor_path(&path).display()
    );
    assert!(error.to_string().starts_with(&expected), "{error}");
    assert!(matches!(error, AuditError::Unwritable { .. }), "{error}");
    // Poisoned: even once the anchor could be written again, nothing
    // more is, and every record says why.
    std::fs::remove_dir(&tmp).unwrap();
    let again = log.record(&call("c")).unwrap_err();
    assert!(again.to_string().starts_with(&expected), "{again}");
    assert_eq!(log.failure().unwrap().to_string(), again.to_string());
    assert_eq!(lines_of(&path).len(), 2);
    assert_eq!(
        verify(&path, &key).unwrap(),
        Verified {
            lines: 2,
            unanchored: 1
        }
    );
}

#[test]
fn a_fault_is_recorded_without_the_servers_text() {
    let dir = tempfile::tempdir().unwrap();
    let key = key();
    let path = dir.path().join("audit.jsonl");
    let log = AuditLog::open(&path, key).unwrap();
    let fault = crate::transport::Fault::Exited {
        server: "s".into(),
        code: 1,
        stderr_tail: "AWS_SECRET_ACCESS_KEY=hunter2".into(),
    };
    log.record(&Event::ServerExit {
        session: "s1".into(),
        server: "s".into(),
        identity: String::new(),
        evidence: "native-measured".into(),
        outcome: Outcome::of_fault(&fault),
    })
    .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("hunter2"), "{text}");
    let value: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(
        value["outcome"],
        "fault: server `s` exited with code 1 before closing"
    );
    assert_eq!(
        value["server_text_sha256"],
        Digest::of(b"AWS_SECRET_ACCESS_KEY=hunter2").to_string()
    );
    assert_eq!(value["server_text_bytes"], 29);
}

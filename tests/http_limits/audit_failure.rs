//! An audit log that cannot be written stops admitting calls.

use super::*;

/// Fails closed (issue 32): once the audit log cannot be written (here it
/// outgrows the server's RLIMIT_FSIZE, set while it serves: EFBIG, and
/// SIGXFSZ, which must not kill it), the call whose record failed gets the
/// log's error and not its result, every later call gets it too, `/readyz`
/// answers 503, a new session 503, the error is printed once, and the log
/// keeps whole lines only (the part of a line that got in is cut back) and
/// verifies.
#[test]
fn an_audit_log_that_cannot_be_written_stops_admitting_calls() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let audit = dir.path().join("audit.jsonl");
    let (child, url, lines) = common::serve_http_logged(&config, TOKEN, &audit, &[]);
    let mut server = Server {
        child,
        address: common::address_of(&url),
        audit: audit.clone(),
        _dir: dir,
    };
    let id = session_with_a_child(&server.address).unwrap();
    let before = std::fs::read(&audit).unwrap();
    // Room for 10 more bytes: the next line gets 10 bytes in, then EFBIG.
    let limit = libc::rlimit {
        rlim_cur: before.len() as u64 + 10,
        rlim_max: before.len() as u64 + 10,
    };
    // SAFETY: prlimit reads the one struct given and writes nothing (no old
    // limit asked for); the pid is our child's, alive until it is reaped.
    let set = unsafe {
        libc::prlimit(
            server.child.id() as libc::pid_t,
            libc::RLIMIT_FSIZE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());

    let call = |text: &str| {
        post(
            &server.address,
            Some(&id),
            &format!(
                r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"everything__echo","arguments":{{"message":"{text}"}}}}}}"#
            ),
        )
    };
    let expected = format!(
        "audit log {} cannot be written (File too large (os error 27)): Moat admits no calls until it can record them",
        audit.display()
    );
    let failed = call("kept from the agent");
    assert!(failed.body.contains(&expected), "{}", failed.body);
    assert!(
        !failed.body.contains("kept from the agent"),
        "{}",
        failed.body
    );
    let again = call("after");
    assert!(again.body.contains(&expected), "{}", again.body);
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "moat serve died"
    );

    let mut probe = TcpStream::connect(&server.address).unwrap();
    write!(
        probe,
        "GET /readyz HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        server.address
    )
    .unwrap();
    let ready = read_until_closed(&mut probe);
    assert!(ready.starts_with("HTTP/1.1 503 "), "{ready}");
    assert!(
        ready.ends_with("not ready: the audit log cannot be written\n"),
        "{ready}"
    );
    let init = post(&server.address, None, INITIALIZE);
    assert_eq!(init.status, 503, "{}", init.body);

    // The log is as it was before the failure, whole lines, and verifies.
    assert_eq!(std::fs::read(&audit).unwrap(), before);
    let verified = moat_host::audit::verify(&audit, &common::audit_key()).unwrap();
    assert_eq!(verified.unanchored, 0);

    // Said once on stderr by the log, however many calls were refused
    // (rmcp warns of every error answer on its own).
    let _ = server.child.kill();
    let _ = server.child.wait();
    let said: Vec<String> = lines
        .iter()
        .filter(|line| line.contains("moat_host::audit") && line.contains("cannot be written"))
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains(&expected), "{said:?}");
}

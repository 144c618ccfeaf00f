//! `moat serve --http` under the limits of `[serve]` (issue 12, item 10):
//! each limit answers with its status and an audit event, a flood of idle
//! connections and abandoned sessions leaves a normal agent served and the
//! memory back where it was, and EMFILE on accept does not end the process.
//! Driven over raw HTTP/1.1, as a hostile client would.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use moat_test_guests as guests;

const TOKEN: &str = "s3cret";

/// A config for `everything` (wasm) with small limits.
fn config(dir: &Path, serve: &str) -> std::path::PathBuf {
    let path = dir.join("moat.toml");
    std::fs::write(
        &path,
        format!(
            "[serve]\n{serve}\n[servers.everything]\nwasm = {:?}\nallow_unmeasured = true\n",
            guests::EVERYTHING_WASM
        ),
    )
    .unwrap();
    path
}

const SMALL: &str = "max_sessions = 4\nsession_idle_ms = 1500\nmax_connections = 64\nheader_timeout_ms = 400\nmax_body_bytes = 65536";

/// A running `moat serve --http` and its address.
struct Server {
    child: std::process::Child,
    address: String,
    audit: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(serve: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path(), serve);
        let audit = dir.path().join("audit.jsonl");
        let (child, url) = common::serve_http(&config, TOKEN, &audit);
        let address = common::address_of(&url);
        Self {
            child,
            address,
            audit,
            _dir: dir,
        }
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap()
    }

    /// The `http_refused` events of the audit log, as (reason, status).
    fn refusals(&self) -> Vec<(String, u64)> {
        std::fs::read_to_string(&self.audit)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["event"] == "http_refused")
            .map(|e| {
                (
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                    e["status"].as_u64().unwrap_or_default(),
                )
            })
            .collect()
    }

    fn audited(&self, event: &str) -> usize {
        std::fs::read_to_string(&self.audit)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&format!("\"event\":\"{event}\"")))
            .count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response: status, the session id if one was given, and the body.
struct Answer {
    status: u16,
    session: Option<String>,
    body: String,
}

/// One request on its own connection (`Connection: close`), read to EOF.
fn post(address: &str, session: Option<&str>, body: &str) -> Answer {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let session = session
        .map(|s| format!("Mcp-Session-Id: {s}\r\nMcp-Protocol-Version: 2025-06-18\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {TOKEN}\r\n{session}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Answer {
        status: head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        session: head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("mcp-session-id")
                .then(|| value.trim().to_owned())
        }),
        body: body.to_owned(),
    }
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

/// An agent session that calls `everything__echo` once (so it holds a
/// child) and is then left open: its session id, or the refusal's status.
fn session_with_a_child(address: &str) -> Result<String, u16> {
    let init = post(address, None, INITIALIZE);
    if init.status != 200 {
        return Err(init.status);
    }
    let id = init.session.expect("a session id");
    let initialized = post(
        address,
        Some(&id),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(initialized.status, 202, "{}", initialized.body);
    let call = post(
        address,
        Some(&id),
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"everything__echo","arguments":{"message":"still here"}}}"#,
    );
    assert_eq!(call.status, 200, "{}", call.body);
    assert!(call.body.contains("still here"), "{}", call.body);
    Ok(id)
}

/// Reads what the server sends until it closes, or 30 s pass.
fn read_until_closed(stream: &mut TcpStream) -> String {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
}

/// Polls `done` every 50 ms until it holds or `limit` passes.
fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    done()
}

#[test]
fn headers_too_slow_get_408_and_a_body_too_large_gets_413() {
    let server = Server::start(SMALL);
    // Nothing at all, then half a request line: both closed with 408.
    let mut silent = TcpStream::connect(&server.address).unwrap();
    let mut slow = TcpStream::connect(&server.address).unwrap();
    slow.write_all(b"POST /mcp HTTP/1.1\r\nHost: ").unwrap();
    for stream in [&mut silent, &mut slow] {
        let answer = read_until_closed(stream);
        assert!(
            answer.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
            "{answer:?}"
        );
    }

    // Declared too large: 413 before the body is read.
    let mut big = TcpStream::connect(&server.address).unwrap();
    write!(
        big,
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\nConnection: close\r\n\r\n",
        server.address
    )
    .unwrap();
    assert!(read_until_closed(&mut big).starts_with("HTTP/1.1 413 Payload Too Large\r\n"));
    // Chunked, with no length declared: 413 once it passes the limit.
    let mut chunked = TcpStream::connect(&server.address).unwrap();
    write!(
        chunked,
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        server.address
    )
    .unwrap();
    let chunk = vec![b' '; 16 * 1024];
    for _ in 0..5 {
        if write!(chunked, "{:x}\r\n", chunk.len()).is_err()
            || chunked.write_all(&chunk).is_err()
            || chunked.write_all(b"\r\n").is_err()
        {
            break;
        }
    }
    assert!(read_until_closed(&mut chunked).starts_with("HTTP/1.1 413 Payload Too Large\r\n"));

    // A wrong token: 401.
    assert_eq!(
        post(&server.address, None, INITIALIZE).status,
        200,
        "the right token is served"
    );
    let mut wrong = TcpStream::connect(&server.address).unwrap();
    write!(
        wrong,
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer s3creT\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        server.address
    )
    .unwrap();
    assert!(read_until_closed(&mut wrong).starts_with("HTTP/1.1 401 Unauthorized\r\n"));

    let refusals = server.refusals();
    for expected in [
        ("header-timeout", 408),
        ("body-too-large", 413),
        ("unauthorized", 401),
    ] {
        assert!(
            refusals
                .iter()
                .any(|(r, s)| (r.as_str(), *s) == (expected.0, expected.1)),
            "{expected:?} in {refusals:?}"
        );
    }
}

#[test]
fn sessions_beyond_the_limit_get_503_and_idle_ones_close_with_their_children() {
    let server = Server::start(SMALL);
    let ids: Vec<String> = (0..4)
        .map(|_| session_with_a_child(&server.address).unwrap())
        .collect();
    assert_eq!(ids.len(), 4);
    assert_eq!(session_with_a_child(&server.address), Err(503));
    assert!(
        server
            .refusals()
            .contains(&("max-sessions".to_owned(), 503))
    );
    // Left idle, they are closed (each with its child) and make room.
    assert!(
        wait_for(Duration::from_secs(30), || server.audited("session_close")
            >= 4),
        "idle sessions were not closed"
    );
    assert!(server.audited("server_exit") >= 4);
    session_with_a_child(&server.address).expect("room again after the idle timeout");
}

/// Raises this process's soft descriptor limit to the hard one; returns it.
fn raise_descriptor_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit write and read the one struct given.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    limit.rlim_cur
}

#[test]
fn a_flood_of_idle_connections_and_abandoned_sessions_leaves_an_agent_served() {
    let limit = raise_descriptor_limit();
    let server = Server::start(
        "max_sessions = 16\nsession_idle_ms = 10000\nmax_connections = 256\nheader_timeout_ms = 10000",
    );
    // The baseline: one agent served and gone, so the engine and the
    // component are warm.
    session_with_a_child(&server.address).unwrap();
    assert!(wait_for(Duration::from_secs(30), || server
        .audited("session_close")
        >= 1));
    let baseline = server.rss_kib();

    // 10,000 idle connections (as many as this process may open), held.
    let wanted = 10_000.min(limit.saturating_sub(200) as usize);
    let mut idle = Vec::with_capacity(wanted);
    for _ in 0..wanted {
        match TcpStream::connect(&server.address) {
            Ok(stream) => idle.push(stream),
            Err(error) => panic!("connect {} failed: {error}", idle.len()),
        }
    }
    // 1,000 sessions opened (each with a child, while there is room) and
    // abandoned.
    let mut opened = 0;
    let mut refused = 0;
    for _ in 0..1_000 {
        match session_with_a_child(&server.address) {
            Ok(_) => opened += 1,
            Err(503) => refused += 1,
            Err(other) => panic!("status {other}"),
        }
    }
    assert_eq!(opened, 16, "max_sessions bounds the sessions");
    assert_eq!(refused, 984);

    // Still flooded: a normal agent's request is evicting no one but idle
    // connections, and is served within a second once sessions have room.
    assert!(
        wait_for(Duration::from_secs(30), || server.audited("session_close")
            >= 17),
        "abandoned sessions were not closed after the idle timeout"
    );
    let start = Instant::now();
    session_with_a_child(&server.address).expect("an agent is served after the flood");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(
        server
            .refusals()
            .iter()
            .any(|(r, s)| r == "evicted-idle" && *s == 408)
    );
    drop(idle);

    // Once the idle timeout has passed again, memory is back to within 10%
    // of the baseline.
    assert!(wait_for(Duration::from_secs(30), || server
        .audited("session_close")
        >= 18));
    let settled = wait_for(Duration::from_secs(10), || {
        server.rss_kib() <= baseline + baseline / 10
    });
    assert!(
        settled,
        "RSS {} KiB against a baseline of {baseline} KiB",
        server.rss_kib()
    );
}

#[test]
fn running_out_of_descriptors_on_accept_does_not_end_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "max_connections = 1024");
    // The server gets 128 descriptors; 300 connections exhaust them.
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 128 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_moat"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--token",
            TOKEN,
            "--config",
        ])
        .arg(&config)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", common::state_dir())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines_tx.send(line);
        }
    });
    let url = lines_rx
        .iter()
        .find_map(|l| l.strip_prefix("moat: serving MCP at ").map(str::to_owned))
        .unwrap();
    let address = common::address_of(&url);
    let held: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(&address).ok())
        .collect();
    assert!(
        wait_for(Duration::from_secs(30), || lines_rx
            .try_iter()
            .any(|l| l.contains("accept failed; retrying"))),
        "the server never ran out of descriptors"
    );
    assert!(child.try_wait().unwrap().is_none(), "the server exited");
    drop(held);
    // Served again once descriptors are back.
    assert!(wait_for(Duration::from_secs(30), || post(
        &address, None, INITIALIZE
    )
    .status
        == 200));
    assert!(child.try_wait().unwrap().is_none());
    let _ = child.kill();
    let _ = child.wait();
}

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

/// A POST whose body is announced and then sent a byte at a time, as the
/// test says: once its `100 Continue` has come back, Moat has read its
/// head and is waiting for its body.
struct Dripper {
    stream: TcpStream,
}

impl Dripper {
    fn start(address: &str) -> Self {
        let mut stream = TcpStream::connect(address).unwrap();
        write!(
            stream,
            "POST /mcp HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n{{"
        )
        .unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(stream.read(&mut byte).unwrap(), 1, "{head:?}");
            head.push(byte[0]);
        }
        assert_eq!(head, b"HTTP/1.1 100 Continue\r\n\r\n");
        Self { stream }
    }

    /// Drips a byte of body every 100 ms (the wait for an answer between
    /// two bytes is the pace) until Moat answers and closes, or 30 s pass;
    /// returns what it answered.
    fn drip_until_answered(&mut self) -> String {
        self.stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let start = Instant::now();
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        while start.elapsed() < Duration::from_secs(30) {
            match self.stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    // Moat may close while a byte is on its way: the answer
                    // is still there to read.
                    let _ = self.stream.write_all(b" ");
                }
                Err(_) => break,
            }
        }
        String::from_utf8_lossy(&answer).into_owned()
    }
}

/// Issue 32, item 1: `max_connections` POSTs that drip their bodies no
/// longer lock agents out. At the limit, the oldest connection whose body
/// is still arriving is closed with 408 (as an idle one is) and the agent
/// is served; and a body still arriving `request_timeout_ms` after its
/// request began gets 408 however steadily it drips.
#[test]
fn dripping_bodies_are_evicted_for_an_agent_and_time_out() {
    // Eviction: a deadline too long to matter here.
    let server = Server::start(
        "max_sessions = 4\nmax_connections = 4\nheader_timeout_ms = 60000\nrequest_timeout_ms = 60000",
    );
    let mut drippers: Vec<Dripper> = (0..4).map(|_| Dripper::start(&server.address)).collect();
    let agent = post(&server.address, None, INITIALIZE);
    assert_eq!(agent.status, 200, "the agent is served: {}", agent.body);
    assert!(agent.body.contains("serverInfo"), "{}", agent.body);
    let evicted = read_until_closed(&mut drippers[0].stream);
    assert!(
        evicted.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "the oldest dripper is closed to make room: {evicted:?}"
    );
    assert!(
        server
            .refusals()
            .contains(&("evicted-slow-body".to_owned(), 408)),
        "{:?}",
        server.refusals()
    );
    drop(drippers);
    drop(server);

    // The deadline: every dripper gets 408, and the agent is served.
    let server = Server::start(
        "max_sessions = 4\nmax_connections = 4\nheader_timeout_ms = 60000\nrequest_timeout_ms = 1000",
    );
    let drippers: Vec<Dripper> = (0..4).map(|_| Dripper::start(&server.address)).collect();
    let answers: Vec<String> = std::thread::scope(|scope| {
        let dripping: Vec<_> = drippers
            .into_iter()
            .map(|mut d| scope.spawn(move || d.drip_until_answered()))
            .collect();
        dripping.into_iter().map(|d| d.join().unwrap()).collect()
    });
    for answer in &answers {
        assert!(
            answer.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
            "{answer:?}"
        );
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{answer:?}"
        );
    }
    let timed_out = server
        .refusals()
        .iter()
        .filter(|r| *r == &("request-timeout".to_owned(), 408))
        .count();
    assert_eq!(timed_out, 4, "{:?}", server.refusals());
    assert_eq!(post(&server.address, None, INITIALIZE).status, 200);
}

/// Issue 32, item 2: Moat takes every descriptor it may have: started with
/// a soft RLIMIT_NOFILE of 256 under a higher hard limit, `moat serve`
/// runs with its soft limit raised to the hard one.
#[test]
fn moat_raises_its_soft_descriptor_limit_to_the_hard_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -S -n 256 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_moat"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--token",
            TOKEN,
            "--config",
        ])
        .arg(&config)
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", common::state_dir())
        .env("RUST_LOG", "moat=debug")
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut logged = None;
    for line in std::io::BufRead::lines(stderr).map_while(Result::ok) {
        if line.contains("RLIMIT_NOFILE") {
            logged = Some(line.clone());
        }
        if line.starts_with("moat: serving MCP at ") {
            break;
        }
    }
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let open_files: Vec<&str> = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect();
    let hard = open_files[1];
    assert_eq!(open_files[0], hard, "{limits}");
    if hard != "256" {
        let logged = logged.expect("the raised limit is logged at debug");
        assert!(
            logged.contains(&format!("soft={hard}")) && logged.contains("was=256"),
            "{logged}"
        );
    }
}

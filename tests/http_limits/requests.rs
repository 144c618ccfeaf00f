//! Slow and oversized requests and too many sessions: headers too slow get
//! 408, a body too large 413, sessions beyond the limit 503, idle sessions
//! close with their children, and dripping bodies are evicted and time out.

use super::*;

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

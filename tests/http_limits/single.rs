//! An answer that is all its request's stream carries goes out as one JSON
//! body with its length, so that a client that stops reading at the answer
//! (rmcp's own) can use its connection again; a stream with anything else
//! in it, or an answer slower than the hold, stays a stream, in order.
//! Driven over one raw HTTP/1.1 connection kept open.

use super::*;

/// One response read off a connection that stays open: its status, its
/// headers (lower-cased names) and its body, read by its length or to its
/// last chunk.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn read_response(stream: &mut TcpStream) -> Response {
    let mut bytes = Vec::new();
    let mut byte = [0u8; 1];
    while !bytes.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).unwrap();
        assert!(
            n > 0,
            "closed in the headers: {:?}",
            String::from_utf8_lossy(&bytes)
        );
        bytes.push(byte[0]);
    }
    let head = String::from_utf8(bytes).unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut response = Response {
        status,
        headers,
        body: String::new(),
    };
    let mut body = Vec::new();
    if let Some(length) = response.header("content-length") {
        body.resize(length.parse().unwrap(), 0);
        stream.read_exact(&mut body).unwrap();
    } else if response.header("transfer-encoding") == Some("chunked") {
        loop {
            let mut size = Vec::new();
            while !size.ends_with(b"\r\n") {
                stream.read_exact(&mut byte).unwrap();
                size.push(byte[0]);
            }
            let size = usize::from_str_radix(String::from_utf8_lossy(&size).trim(), 16).unwrap();
            let mut chunk = vec![0; size + 2];
            stream.read_exact(&mut chunk).unwrap();
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    response.body = String::from_utf8(body).unwrap();
    response
}

/// Sends `body` on `stream` (kept open) within `session`, and reads the
/// response.
fn exchange(stream: &mut TcpStream, address: &str, session: Option<&str>, body: &str) -> Response {
    let session = session
        .map(|s| format!("Mcp-Session-Id: {s}\r\nMcp-Protocol-Version: 2025-06-18\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {TOKEN}\r\n{session}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    read_response(stream)
}

/// A connection kept open, with a session on it that has said it is
/// initialized.
fn session(server: &Server) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(&server.address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let init = exchange(&mut stream, &server.address, None, INITIALIZE);
    assert_eq!(init.status, 200, "{}", init.body);
    let id = init.header("mcp-session-id").unwrap().to_owned();
    let initialized = exchange(
        &mut stream,
        &server.address,
        Some(&id),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(initialized.status, 202, "{}", initialized.body);
    (stream, id)
}

/// The messages of a stream of server-sent events (its priming event's
/// empty data left out).
fn events(body: &str) -> Vec<serde_json::Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn call(id: u32, tool: &str, arguments: &str, meta: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"everything__{tool}","arguments":{arguments}{meta}}}}}"#
    )
}

#[test]
fn a_call_answered_alone_comes_as_one_json_body_and_the_connection_serves_the_next() {
    let server = Server::start(SMALL);
    let (mut stream, id) = session(&server);
    for (n, message) in [(2, "first"), (3, "second")] {
        let answer = exchange(
            &mut stream,
            &server.address,
            Some(&id),
            &call(n, "echo", &format!(r#"{{"message":"{message}"}}"#), ""),
        );
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.header("content-type"), Some("application/json"));
        assert_eq!(
            answer.header("content-length"),
            Some(answer.body.len().to_string().as_str())
        );
        let json: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(json["id"], n, "{json}");
        assert_eq!(json["result"]["content"][0]["text"], message, "{json}");
    }
    // A tool's error is an answer too.
    let failed = exchange(
        &mut stream,
        &server.address,
        Some(&id),
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"nobody__nothing","arguments":{}}}"#,
    );
    assert_eq!(failed.header("content-type"), Some("application/json"));
    let json: serde_json::Value = serde_json::from_str(&failed.body).unwrap();
    assert_eq!(json["id"], 4, "{json}");
    assert!(
        json.get("error").is_some() || json["result"]["isError"] == true,
        "{json}"
    );
}

#[test]
fn a_call_with_progress_stays_a_stream_with_its_events_in_order() {
    let server = Server::start(SMALL);
    let (mut stream, id) = session(&server);
    let answer = exchange(
        &mut stream,
        &server.address,
        Some(&id),
        &call(
            2,
            "progress",
            r#"{"steps":2}"#,
            r#","_meta":{"progressToken":"p"}"#,
        ),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.header("content-type"), Some("text/event-stream"));
    let messages = events(&answer.body);
    let methods: Vec<&str> = messages
        .iter()
        .map(|m| m["method"].as_str().unwrap_or("answer"))
        .collect();
    assert_eq!(
        methods,
        ["notifications/progress", "notifications/progress", "answer"],
        "{}",
        answer.body
    );
    assert_eq!(messages[2]["id"], 2);
    // The connection still serves the session.
    let next = exchange(
        &mut stream,
        &server.address,
        Some(&id),
        &call(3, "echo", r#"{"message":"after"}"#, ""),
    );
    assert!(next.body.contains("after"), "{}", next.body);
}

#[test]
fn an_answer_slower_than_the_hold_comes_in_the_stream() {
    let server = Server::start(SMALL);
    let (mut stream, id) = session(&server);
    // 100 ms is the hold (front/http/single.rs); the call takes 600.
    let answer = exchange(
        &mut stream,
        &server.address,
        Some(&id),
        &call(2, "sleep", r#"{"ms":600}"#, ""),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.header("content-type"), Some("text/event-stream"));
    let json = events(&answer.body)
        .pop()
        .unwrap_or_else(|| panic!("no answer: {}", answer.body));
    assert_eq!(json["id"], 2, "{json}");
    assert!(json.get("result").is_some(), "{json}");
}

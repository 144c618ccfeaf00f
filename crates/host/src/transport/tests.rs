//! Unit tests of the transport's connection: the per-request deadline
//! while a request waits for the agent, and requests sent past rmcp's
//! client service.

use std::sync::atomic::AtomicBool;

use super::*;

/// The deadline bounds the server's work, not the agent's time to
/// answer the server's own request; and it is not lost either.
#[tokio::test(start_paused = true)]
async fn a_request_waiting_for_the_agent_holds_the_deadline_and_moves_it_back() {
    let shared = Arc::new(Shared::new("s".into(), &Limits::default()));
    shared.book.sent(
        rmcp::model::RequestId::Number(7),
        "tools/call".to_owned(),
        Instant::now() + Duration::from_secs(60),
    );
    let first = shared.book.next_deadline().unwrap();
    let stopped = Arc::new(AtomicBool::new(false));
    let (_exit, exit) = watch::channel(None);
    let stop = stopped.clone();
    let watching = tokio::spawn(watchdog(
        shared.clone(),
        60_000,
        exit,
        Arc::new(move || stop.store(true, Ordering::SeqCst)),
    ));
    let settle = || async {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    };
    let asking = shared.asking_agent();
    settle().await;
    tokio::time::advance(Duration::from_secs(90)).await;
    settle().await;
    assert!(
        shared.fault().is_none(),
        "the deadline passed while the agent was asked"
    );
    assert!(!stopped.load(Ordering::SeqCst));
    drop(asking);
    assert_eq!(
        shared.book.next_deadline(),
        Some(first + Duration::from_secs(90))
    );
    settle().await;
    tokio::time::advance(Duration::from_secs(59)).await;
    settle().await;
    assert!(shared.fault().is_none(), "fired before the moved deadline");
    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    assert!(
        stopped.load(Ordering::SeqCst),
        "the moved deadline never fired"
    );
    assert!(matches!(
        shared.fault(),
        Some(Fault::Limit {
            limit: LimitHit::Deadline {
                request_timeout_ms: 60_000
            },
            ..
        })
    ));
    watching.await.unwrap();
}

/// A connected transport to a server the test plays by hand: what it
/// writes to the server is read from `from_host`, and what the server says
/// is written to `to_host`; the server exits when `exit` is sent.
struct ByHand {
    connected: Connected,
    from_host: tokio::io::Lines<tokio::io::BufReader<tokio::io::DuplexStream>>,
    to_host: tokio::io::DuplexStream,
    exit: Option<tokio::sync::oneshot::Sender<()>>,
}

fn by_hand() -> ByHand {
    use crate::identity::Evidence;
    use crate::instance::{Identity, InProcess};
    use tokio::io::AsyncBufReadExt;
    let (stdin, server_in) = tokio::io::duplex(64 * 1024);
    let (server_out, stdout) = tokio::io::duplex(64 * 1024);
    let (_stderr_end, stderr) = tokio::io::duplex(64);
    let (exit, exited) = tokio::sync::oneshot::channel::<()>();
    let limits = Limits::default();
    let shared = Arc::new(Shared::new("s".into(), &limits));
    let launched = InProcess {
        stdin: Box::new(stdin),
        stdout: Box::new(stdout),
        stderr: Box::new(stderr),
        identity: Identity {
            digest: None,
            measured: Vec::new(),
            sandbox: Default::default(),
            evidence: Evidence::WasmMeasured,
            component: None,
            oci: None,
        },
        metrics: Arc::default(),
        on_request: None,
        terminate: None,
        answers_deadlines: false,
    }
    .spawn("s", "a server by hand", &shared.tracker, async move {
        let _stderr = _stderr_end;
        let _ = exited.await;
        Exit::Code(0)
    });
    ByHand {
        connected: Connected::start(shared, &limits, launched),
        from_host: tokio::io::BufReader::new(server_in).lines(),
        to_host: server_out,
        exit: Some(exit),
    }
}

impl ByHand {
    /// The server exits and closes its ends; the transport closes.
    async fn finish(self) {
        let Self {
            mut connected,
            exit,
            from_host,
            to_host,
        } = self;
        if let Some(exit) = exit {
            // Gone already when a fault stopped it.
            let _ = exit.send(());
        }
        drop((from_host, to_host));
        connected.shutdown().await;
    }

    /// The next line the host wrote to the server, as JSON.
    async fn read(&mut self) -> serde_json::Value {
        let line = self.from_host.next_line().await.unwrap().unwrap();
        serde_json::from_str(&line).unwrap()
    }

    async fn say(&mut self, message: serde_json::Value) {
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        self.to_host.write_all(&line).await.unwrap();
    }

    /// Whether rmcp's side has a message waiting, once the reader has
    /// read everything written so far (a ping is answered through rmcp's
    /// side, so anything the server said before it is there first).
    async fn rmcp_got_before_a_ping(&mut self) -> Vec<ServerJsonRpcMessage> {
        use rmcp::transport::Transport;
        let ping = rmcp::model::ClientRequest::PingRequest(Default::default());
        let id = rmcp::model::RequestId::Number(1);
        self.connected
            .send(ClientJsonRpcMessage::request(ping, id.clone()))
            .await
            .unwrap();
        assert_eq!(self.read().await["method"], "ping");
        self.say(serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": {}}))
            .await;
        let mut got = Vec::new();
        loop {
            let message = self.connected.receive().await.unwrap();
            if frame::response_id(&message) == Some(id.clone()) {
                return got;
            }
            got.push(message);
        }
    }
}

fn call(name: &str) -> rmcp::model::ClientRequest {
    rmcp::model::ClientRequest::CallToolRequest(rmcp::model::Request::new(
        rmcp::model::CallToolRequestParams::new(name.to_owned()),
    ))
}

/// A direct request is the line rmcp would write, under an id above
/// rmcp's; its answer goes to its caller and never to rmcp, while what
/// is not an answer to it still does.
#[tokio::test]
async fn a_direct_request_is_answered_to_its_caller_and_not_to_rmcp() {
    let mut server = by_hand();
    let direct = server.connected.direct();
    let id = direct.next_id();
    assert_eq!(id, rmcp::model::RequestId::Number(direct::FIRST_DIRECT_ID));
    let mut in_flight = direct.send(id.clone(), call("echo")).await.unwrap();
    let sent = server.read().await;
    let expected =
        serde_json::to_value(ClientJsonRpcMessage::request(call("echo"), id.clone())).unwrap();
    assert_eq!(sent, expected);
    assert_eq!(sent["id"], serde_json::json!(1_u64 << 32));
    assert_eq!(server.connected.shared.book.requests_sent(), 1);
    server
        .say(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}))
        .await;
    server
        .say(
            serde_json::json!({"jsonrpc": "2.0", "id": sent["id"], "result": {
                "content": [{"type": "text", "text": "hi"}]
            }}),
        )
        .await;
    match in_flight.answer().await {
        Some(ServerJsonRpcMessage::Response(response)) => {
            assert_eq!(response.id, id);
            let rmcp::model::ServerResult::CallToolResult(result) = response.result else {
                panic!("not decoded as a call's result: {:?}", response.result);
            };
            assert_eq!(result.content.len(), 1);
        }
        other => panic!("{other:?}"),
    }
    let rmcp_got = server.rmcp_got_before_a_ping().await;
    assert_eq!(rmcp_got.len(), 1, "{rmcp_got:?}");
    assert!(matches!(
        &rmcp_got[0],
        ServerJsonRpcMessage::Notification(_)
    ));
    assert!(server.connected.shared.fault().is_none());
    // The next id is the next one up.
    assert_eq!(
        direct.next_id(),
        rmcp::model::RequestId::Number(direct::FIRST_DIRECT_ID + 1)
    );
    server.finish().await;
}

/// A cancelled direct request is cancelled on the server and its late
/// answer is dropped; an answer to a direct id nobody sent is an answer
/// to nothing, and ends the session as one to rmcp's would.
#[tokio::test]
async fn a_cancelled_direct_requests_late_answer_is_dropped_and_an_answer_to_nothing_faults() {
    let mut server = by_hand();
    let direct = server.connected.direct();
    let in_flight = direct.send(direct.next_id(), call("slow")).await.unwrap();
    let sent = server.read().await;
    in_flight.cancel(Some("enough".into())).await.unwrap();
    let cancelled = server.read().await;
    assert_eq!(cancelled["method"], "notifications/cancelled");
    assert_eq!(cancelled["params"]["requestId"], sent["id"]);
    assert_eq!(cancelled["params"]["reason"], "enough");
    server
        .say(serde_json::json!({"jsonrpc": "2.0", "id": sent["id"], "result": {"content": []}}))
        .await;
    assert!(server.rmcp_got_before_a_ping().await.is_empty());
    assert!(server.connected.shared.fault().is_none());
    let nobody = direct::FIRST_DIRECT_ID + 99;
    server
        .say(serde_json::json!({"jsonrpc": "2.0", "id": nobody, "result": {"content": []}}))
        .await;
    use rmcp::transport::Transport;
    assert!(server.connected.receive().await.is_none());
    assert!(
        matches!(
            server.connected.shared.fault(),
            Some(Fault::UnknownResponse { ref id, .. }) if *id == nobody.to_string()
        ),
        "{:?}",
        server.connected.shared.fault()
    );
    server.finish().await;
}

/// A direct request waiting when the session ends learns that it ended,
/// after the fault that ended it is set; one sent afterwards fails at
/// once, naming the fault.
#[tokio::test]
async fn a_direct_request_learns_of_the_fault_that_ends_the_session() {
    let mut server = by_hand();
    let direct = server.connected.direct();
    let mut in_flight = direct.send(direct.next_id(), call("echo")).await.unwrap();
    server.read().await;
    server.to_host.write_all(b"not json\n").await.unwrap();
    assert!(in_flight.answer().await.is_none());
    assert!(
        matches!(
            server.connected.shared.fault(),
            Some(Fault::NotJsonRpc { .. })
        ),
        "{:?}",
        server.connected.shared.fault()
    );
    let again = direct.send(direct.next_id(), call("echo")).await;
    assert!(
        matches!(
            again,
            Err(TransportError::Faulted {
                fault: Fault::NotJsonRpc { .. },
                ..
            })
        ),
        "{again:?}"
    );
    server.finish().await;
}

/// A direct request whose line is never written (its stdin closed here;
/// a send dropped part-way is the same) leaves nothing booked: no deadline
/// stops the server for it, and an answer to it is a late one, dropped.
#[tokio::test]
async fn a_direct_request_never_written_is_taken_off_the_book() {
    let mut server = by_hand();
    let direct = server.connected.direct();
    drop(server.connected.stdin.lock().await.take());
    let id = direct.next_id();
    let sent = direct.send(id.clone(), call("echo")).await;
    assert!(
        matches!(sent, Err(TransportError::Closed { .. })),
        "{sent:?}"
    );
    assert_eq!(server.connected.shared.book.next_deadline(), None);
    server
        .say(serde_json::json!({"jsonrpc": "2.0", "id": direct::FIRST_DIRECT_ID, "result": {"content": []}}))
        .await;
    // Read past it: the reader is still there, and nothing faulted.
    server
        .say(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}))
        .await;
    use rmcp::transport::Transport;
    assert!(matches!(
        server.connected.receive().await,
        Some(ServerJsonRpcMessage::Notification(_))
    ));
    assert!(server.connected.shared.fault().is_none());
    server.finish().await;
}

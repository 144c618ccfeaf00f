//! Unit tests of the transport's connection: the per-request deadline
//! while a request waits for the agent.

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

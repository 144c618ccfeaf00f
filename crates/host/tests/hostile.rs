//! Hostile guests at the boundary, on both launchers: whatever a server
//! writes or withholds ends in a typed error (or is absorbed), the host's
//! memory stays bounded, and a well-behaved server served at the same time by
//! the same host keeps answering throughout.

#[macro_use]
mod common;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{
    Launcher, args, connect, fault_of, host_still_serves_everything, peak_rss_bytes, spec, text,
};
use moat_host::{Fault, LimitHit};
use moat_test_guests as guests;
use serde_json::json;

both_launchers!(
    an_answer_to_a_request_never_sent_faults_the_session,
    a_second_answer_to_one_request_faults_the_session,
    a_hundred_thousand_notifications_are_absorbed_with_memory_bounded,
    a_hundred_megabyte_message_is_refused_with_memory_bounded,
    a_server_that_ignores_eof_is_stopped_on_close,
    an_answer_at_one_byte_a_second_meets_the_deadline,
    a_flood_of_requests_to_the_client_fails_closed,
    asking_for_four_gigabytes_of_randomness_hits_a_limit,
    opening_files_without_end_meets_a_limit,
    a_server_reaching_for_what_it_was_not_granted_is_refused_every_time,
);

/// How much the process's peak RSS may grow while one attack runs. The
/// attacks below would cost hundreds of megabytes if buffered.
const RSS_BOUND: u64 = 128 << 20;

/// Peak RSS is the whole test process's: an attack that measures it runs
/// alone (write), every other attack of this file beside the others
/// (read), so no other test's allocations count against its bound.
static MEMORY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Runs `attack` while a well-behaved `everything` server on the same host
/// answers calls in a loop; asserts that every one of those calls succeeded
/// and that at least one was answered while the attack ran.
async fn with_a_neighbour<F: Future>(launcher: Launcher, attack: F) -> F::Output {
    let neighbour = connect(&spec(launcher, guests::EVERYTHING)).await;
    let done = Arc::new(AtomicBool::new(false));
    let calls = async {
        let mut answered = 0u32;
        while !done.load(Ordering::SeqCst) || answered == 0 {
            let result = neighbour
                .call_tool("echo", args(json!({"message": "still here"})))
                .await
                .expect("the neighbour keeps answering");
            assert_eq!(text(&result), "still here");
            answered += 1;
        }
        answered
    };
    let attack = async {
        let outcome = attack.await;
        done.store(true, Ordering::SeqCst);
        outcome
    };
    let (outcome, answered) = tokio::join!(attack, calls);
    assert!(answered >= 1);
    neighbour.close().await.expect("the neighbour closes");
    outcome
}

/// Calls `attack` with a neighbour answering alongside; the fault it ends in.
async fn attack_faults(launcher: Launcher, session: &moat_host::Session) -> Fault {
    let error = with_a_neighbour(launcher, session.call_tool("attack", None))
        .await
        .expect_err("the attack must fail");
    fault_of(error)
}

async fn an_answer_to_a_request_never_sent_faults_the_session(launcher: Launcher) {
    let _shared = MEMORY.read().await;
    let session = connect(&spec(launcher, guests::STRAY_IDS)).await;
    assert_eq!(
        attack_faults(launcher, &session).await,
        Fault::UnknownResponse {
            server: "stray-ids".into(),
            id: "424242".into(),
        }
    );
    session.close().await.unwrap();
    host_still_serves_everything(launcher).await;
}

async fn a_second_answer_to_one_request_faults_the_session(launcher: Launcher) {
    let _shared = MEMORY.read().await;
    let mut twice = spec(launcher, guests::STRAY_IDS);
    twice.env.values.insert("STRAY".into(), "duplicate".into());
    let session = connect(&twice).await;
    // The first answer is the answer; the second ends the session.
    let first = session.call_tool("attack", None).await.unwrap();
    assert_eq!(text(&first), "first");
    let error = session.call_tool("attack", None).await.unwrap_err();
    match fault_of(error) {
        Fault::UnknownResponse { server, .. } => assert_eq!(server, "stray-ids"),
        other => panic!("expected a fail-closed fault, got {other:?}"),
    }
    session.close().await.unwrap();
    host_still_serves_everything(launcher).await;
}

async fn a_hundred_thousand_notifications_are_absorbed_with_memory_bounded(launcher: Launcher) {
    let _alone = MEMORY.write().await;
    let mut flood = spec(launcher, guests::NOTIFICATION_FLOOD);
    // The deadline is not under test: an unoptimised host on 2 cores takes
    // up to 46 s to absorb the wasm guest's 100,000 notifications (native:
    // 5 s), which the default 30 s would cut short.
    flood.limits.request_timeout_ms = 180_000;
    let session = connect(&flood).await;
    let before = peak_rss_bytes();
    let result = with_a_neighbour(launcher, session.call_tool("attack", None))
        .await
        .expect("the call is answered after the flood");
    assert_eq!(text(&result), "after the flood");
    let grown = peak_rss_bytes().saturating_sub(before);
    assert!(grown < RSS_BOUND, "peak RSS grew by {grown} bytes");
    session.close().await.unwrap();
}

async fn a_hundred_megabyte_message_is_refused_with_memory_bounded(launcher: Launcher) {
    let _alone = MEMORY.write().await;
    // The default limit: 16 MiB per message.
    let huge = spec(launcher, guests::HUGE_MESSAGE);
    let max_line_bytes = huge.limits.max_line_bytes;
    let session = connect(&huge).await;
    let before = peak_rss_bytes();
    assert_eq!(
        attack_faults(launcher, &session).await,
        Fault::Limit {
            server: "huge-message".into(),
            limit: LimitHit::LineLength { max_line_bytes },
        }
    );
    let grown = peak_rss_bytes().saturating_sub(before);
    assert!(grown < RSS_BOUND, "peak RSS grew by {grown} bytes");
    session.close().await.unwrap();
    host_still_serves_everything(launcher).await;
}

async fn a_server_that_ignores_eof_is_stopped_on_close(launcher: Launcher) {
    let _shared = MEMORY.read().await;
    let mut deaf = spec(launcher, guests::DEAF);
    deaf.limits.close_grace_ms = 100;
    let session = connect(&deaf).await;
    let tracker = session.tracker().clone();
    let result = session.call_tool("attack", None).await.unwrap();
    assert_eq!(text(&result), "going deaf");
    // EOF goes unheard: after the grace period the host stops it.
    with_a_neighbour(launcher, session.close())
        .await
        .expect("close stops a server that never reads EOF");
    assert_eq!(tracker.live(), 0, "nothing of the deaf server is left");
}

async fn an_answer_at_one_byte_a_second_meets_the_deadline(launcher: Launcher) {
    let _shared = MEMORY.read().await;
    let mut drip = spec(launcher, guests::SLOW_DRIP);
    drip.limits.request_timeout_ms = 1_500;
    let session = connect(&drip).await;
    let tracker = session.tracker().clone();
    assert_eq!(
        attack_faults(launcher, &session).await,
        Fault::Limit {
            server: "slow-drip".into(),
            limit: LimitHit::Deadline {
                request_timeout_ms: 1_500
            },
        }
    );
    session.close().await.unwrap();
    assert_eq!(tracker.live(), 0);
}

async fn a_flood_of_requests_to_the_client_fails_closed(launcher: Launcher) {
    let _alone = MEMORY.write().await;
    // The server never reads the host's answers: they wait in the host until
    // more than the bound are unanswered, and the session ends. Nothing piles
    // up in the host meanwhile.
    let session = connect(&spec(launcher, guests::REQUEST_FLOOD)).await;
    let before = peak_rss_bytes();
    assert_eq!(
        attack_faults(launcher, &session).await,
        Fault::RequestFlood {
            server: "request-flood".into(),
            limit: moat_host::MAX_UNANSWERED_SERVER_REQUESTS,
        }
    );
    let grown = peak_rss_bytes().saturating_sub(before);
    assert!(grown < RSS_BOUND, "peak RSS grew by {grown} bytes");
    session.close().await.unwrap();
    host_still_serves_everything(launcher).await;
}

async fn asking_for_four_gigabytes_of_randomness_hits_a_limit(launcher: Launcher) {
    let _shared = MEMORY.read().await;
    let mut hog = spec(launcher, guests::RANDOM_HOG);
    hog.limits.address_space_bytes = 1 << 30;
    let session = connect(&hog).await;
    let limit = match launcher {
        // wasi:random is served by the host: its per-call limit answers.
        Launcher::Wasm => LimitHit::RandomBytes {
            max_random_bytes: hog.limits.max_random_bytes,
        },
        // The kernel serves a native process's randomness; the 4 GiB
        // buffer is what a limit can stop.
        Launcher::Native => LimitHit::AddressSpace {
            address_space_bytes: 1 << 30,
        },
    };
    assert_eq!(
        attack_faults(launcher, &session).await,
        Fault::Limit {
            server: "random-hog".into(),
            limit,
        }
    );
    session.close().await.unwrap();
    host_still_serves_everything(launcher).await;
}

async fn opening_files_without_end_meets_a_limit(launcher: Launcher) {
    let _shared = MEMORY.read().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), b"x").unwrap();
    let mut opener = spec(launcher, guests::OPEN_FILES);
    opener.dirs.push(moat_host::config::DirGrant {
        host: dir.path().to_owned(),
        guest: "/data".into(),
        mode: moat_host::config::DirMode::Ro,
        inode: None,
    });
    if launcher == Launcher::Native {
        opener.env.values.insert(
            "OPEN_PATH".into(),
            dir.path().join("file").display().to_string(),
        );
    }
    opener.limits.resource_table_capacity = 256;
    opener.limits.open_files = 64;
    let session = connect(&opener).await;
    match launcher {
        // Each open file is a host resource: the table's capacity ends it.
        Launcher::Wasm => assert_eq!(
            attack_faults(launcher, &session).await,
            Fault::Limit {
                server: "open-files".into(),
                limit: LimitHit::ResourceTable {
                    resource_table_capacity: 256
                },
            }
        ),
        // RLIMIT_NOFILE: the server's own open fails, and it says so.
        Launcher::Native => {
            let result = with_a_neighbour(launcher, session.call_tool("attack", None))
                .await
                .unwrap();
            let report = text(&result);
            assert!(
                report.ends_with("then: Too many open files (os error 24)"),
                "{report}"
            );
        }
    }
    session.close().await.unwrap();
    host_still_serves_everything(launcher).await;
}

/// Everything it was not granted, tried while a neighbour is served: each
/// attempt is refused with the error `capabilities.rs` pins grant by grant.
async fn a_server_reaching_for_what_it_was_not_granted_is_refused_every_time(launcher: Launcher) {
    let _shared = MEMORY.read().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let session = connect(&spec(launcher, guests::PROBE)).await;
    let ours = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .find(|name| !["HOME", "PATH", "LANG", "TMPDIR"].contains(&name.as_str()))
        .expect("the test runs with a variable beyond the native base (cargo sets several)");
    let attempts = [
        json!({"op": "read", "path": "/etc/shadow"}),
        json!({"op": "list", "path": "/root"}),
        // Not /tmp: a native server has a private /tmp of its own to write.
        json!({"op": "write", "path": "/var/tmp/moat-overreach"}),
        json!({"op": "connect", "addr": addr}),
        // A variable of Moat's own environment: nothing of it reaches a
        // server that was not given it. (HOME, PATH, LANG and TMPDIR are
        // the native base's own values, never Moat's: see
        // `native_launch.rs`.)
        json!({"op": "env", "name": ours}),
    ];
    let tries = async {
        let mut refused = Vec::new();
        for attempt in &attempts {
            let result = session
                .call_tool("attack", args(attempt.clone()))
                .await
                .unwrap();
            let report: serde_json::Value = serde_json::from_str(&text(&result)).unwrap();
            assert_eq!(report["ok"], false, "{attempt} was allowed: {report}");
            refused.push(report["error"].as_str().unwrap_or_default().to_owned());
        }
        refused
    };
    let refused = with_a_neighbour(launcher, tries).await;
    // Files: natively, Landlock's EACCES for /etc/shadow (its own root
    // holds /etc) and ENOENT for what its root does not hold (/root,
    // /var/tmp); under wasm no preopen can even name the path. Sockets:
    // EACCES on both. The environment is exact.
    let (held, absent) = match launcher {
        Launcher::Native => (
            "Permission denied (os error 13)",
            "No such file or directory (os error 2)",
        ),
        Launcher::Wasm => (
            "No such file or directory (os error 44)",
            "No such file or directory (os error 44)",
        ),
    };
    let socket = match launcher {
        Launcher::Native => "Permission denied (os error 13)",
        Launcher::Wasm => "Permission denied (os error 2)",
    };
    assert_eq!(
        refused,
        [
            held,
            absent,
            absent,
            socket,
            "environment variable not found"
        ]
    );
    assert!(!std::path::Path::new("/var/tmp/moat-overreach").exists());
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "a connection got through");
    session.close().await.unwrap();
}

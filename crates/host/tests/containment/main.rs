//! Containment of native servers, tried by a hostile server (`breakout`)
//! while a well-behaved neighbour keeps answering: it cannot signal Moat or
//! an unrelated process, holds no privilege even when Moat is root, inherits
//! no descriptor, cannot leave a process behind or make close wait, and with
//! no `net` grant reaches no socket of the host (TCP, UDP, pathname or
//! abstract Unix), reaches none of the host's SysV shared memory or message
//! queues, opens sockets in the allowed families only, and sees no host name
//! outside its own root (no stat, no inotify watch, no host pid in /proc).
//! Each refusal is asserted by its errno.
//!
//! Tests by topic: `processes`, `sockets`, `filesystem` and `ipc`; this file
//! keeps the hostile server, its neighbour and the helpers they share.
#![cfg(target_os = "linux")]

#[path = "../common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{args, host, running, text};
use moat_host::{ServerSpec, Session};
use moat_test_guests as guests;
use serde_json::{Value, json};

mod filesystem;
mod ipc;
mod processes;
mod sockets;

fn breakout() -> ServerSpec {
    let mut spec = ServerSpec::native("breakout", guests::BREAKOUT_NATIVE);
    spec.allow_unmeasured = true;
    spec
}

/// A native `everything` that must keep answering whatever its neighbour
/// does.
struct Neighbour(Session);

impl Neighbour {
    async fn start() -> Self {
        let mut spec = ServerSpec::native("neighbour", guests::EVERYTHING_NATIVE);
        spec.allow_unmeasured = true;
        let neighbour = Self(host().connect(&spec).await.expect("neighbour"));
        neighbour.answers().await;
        neighbour
    }

    async fn answers(&self) {
        let result = self
            .0
            .call_tool("add", args(json!({"a": 2, "b": 40})))
            .await
            .expect("the neighbour answers");
        assert_eq!(text(&result), "42");
    }

    async fn close(self) {
        self.answers().await;
        self.0.close().await.expect("the neighbour closes");
    }
}

async fn attack(session: &Session, arguments: Value) -> Value {
    let result = session
        .call_tool("attack", args(arguments))
        .await
        .expect("the breakout server answers");
    serde_json::from_str(&text(&result)).expect("a JSON report")
}

/// Asserts that the attack failed with `errno`.
#[track_caller]
fn refused(report: &Value, errno: i32, what: &str) {
    assert_eq!(report["ok"], json!(false), "{what} succeeded: {report}");
    assert_eq!(report["errno"], json!(errno), "{what}: {report}");
}

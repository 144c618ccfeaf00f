//! Capabilities, in pairs on both launchers: the grant works, the denial
//! fails. Directories (ro, rw, and every way out: `../`, absolute paths, a
//! link to /etc, a sibling sharing the prefix), network destinations, and
//! the evidence of what the sandbox enforced.
//!
//! Tests by topic: `dirs`, `network`, `grant_checks` and `egress`; this file
//! keeps the helpers they share.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};

use common::{Launcher, args, spec, text};
use moat_host::config::{DirGrant, DirMode, NetGrant, Sandbox};
use moat_host::grants::GrantError;
use moat_host::lock::{LOCK_VERSION, Lock};
use moat_host::native::NativeError;
use moat_host::wasm::WasmError;
use moat_host::{ConnectError, Host, LaunchError, ServerSpec, Session};
use moat_test_guests as guests;
use serde_json::json;

mod dirs;
mod egress;
mod grant_checks;
mod network;

fn cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache")
}

/// A tree with `data/` (granted), `data_evil/` (a sibling sharing the
/// prefix), `secret.txt` beside them, and `data/link` pointing at /etc.
struct Tree {
    root: tempfile::TempDir,
}

impl Tree {
    fn new() -> Self {
        Self::in_dir("/var/tmp")
    }

    fn in_dir(base: &str) -> Self {
        // By default outside /tmp (where a checkout may live too): a native server has
        // a private /tmp of its own, where a way out of the grant would find
        // nothing to deny.
        let root = tempfile::tempdir_in(base).unwrap();
        let data = root.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("hello.txt"), "hello from data").unwrap();
        std::fs::create_dir(root.path().join("data_evil")).unwrap();
        std::fs::write(root.path().join("data_evil/x.txt"), "evil").unwrap();
        std::fs::write(root.path().join("secret.txt"), "secret").unwrap();
        std::os::unix::fs::symlink("/etc", data.join("link")).unwrap();
        Self { root }
    }

    fn host(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    /// What the server opens for `relative` under the grant: the guest path
    /// for wasm, the host path for native.
    fn inside(&self, launcher: Launcher, relative: &str) -> String {
        match launcher {
            Launcher::Wasm => format!("/data/{relative}"),
            Launcher::Native => self.host("data").join(relative).display().to_string(),
        }
    }
}

fn probe(launcher: Launcher, tree: &Tree, mode: DirMode) -> ServerSpec {
    let mut spec = spec(launcher, guests::PROBE);
    spec.dirs = vec![DirGrant {
        host: tree.host("data"),
        guest: "/data".into(),
        mode,
        inode: None,
    }];
    spec
}

async fn connect(spec: &ServerSpec) -> Session {
    Host::new(Some(cache()))
        .unwrap()
        .connect(spec)
        .await
        .unwrap()
}

/// Runs one probe operation: Ok(data) or Err(error text).
async fn attempt(session: &Session, arguments: serde_json::Value) -> Result<String, String> {
    let result = session.call_tool("attack", args(arguments)).await.unwrap();
    let report: serde_json::Value = serde_json::from_str(&text(&result)).unwrap();
    if report["ok"] == true {
        Ok(report["data"].as_str().unwrap_or_default().to_owned())
    } else {
        Err(report["error"].as_str().unwrap_or_default().to_owned())
    }
}

/// How each denial surfaces inside the server. Native: a path outside its
/// own root does not exist (ENOENT), a read-only grant is a read-only mount
/// (EROFS), and Landlock answers EACCES for what the root holds but the
/// grants do not (a link out to /etc/shadow) and for sockets. Wasi answers
/// ENOTCAPABLE-style EPERM inside a preopen, ENOENT outside every preopen
/// (nothing is there to name), and EACCES for sockets.
#[derive(Clone, Copy)]
enum Denial {
    /// A file operation under a granted directory.
    InsideGrant,
    /// A write in a read-only granted directory.
    ReadOnly,
    /// `..` out of a granted directory.
    UpAndOut,
    /// A path outside every granted directory.
    OutsideGrants,
    /// A socket operation.
    Network,
}

fn expected_error(launcher: Launcher, denial: Denial) -> &'static str {
    match (launcher, denial) {
        (Launcher::Native, Denial::ReadOnly) => "Read-only file system (os error 30)",
        (Launcher::Native, Denial::UpAndOut | Denial::OutsideGrants) => {
            "No such file or directory (os error 2)"
        }
        (Launcher::Native, _) => "Permission denied (os error 13)",
        (Launcher::Wasm, Denial::InsideGrant | Denial::ReadOnly | Denial::UpAndOut) => {
            "Operation not permitted (os error 63)"
        }
        (Launcher::Wasm, Denial::OutsideGrants) => "No such file or directory (os error 44)",
        (Launcher::Wasm, Denial::Network) => "Permission denied (os error 2)",
    }
}

fn assert_denied(launcher: Launcher, denial: Denial, outcome: Result<String, String>, what: &str) {
    match outcome {
        Err(error) => assert_eq!(error, expected_error(launcher, denial), "{what}"),
        Ok(data) => panic!("{what} must be denied, but it worked: {data:?}"),
    }
}

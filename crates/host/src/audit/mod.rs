//! Audit: a tamper-evident log. One JSON line per event, each carrying the
//! sha256 of the line before it (`prev`) and an HMAC-SHA256 of itself
//! (`mac`) under a per-user key that servers cannot reach (see
//! [`crate::keys`]). After every line an anchor beside the log
//! (`LOG.anchor`: the line count and the last line's digest, under the same
//! key) is replaced. `verify` then tells apart:
//! - an edited line: its MAC fails, and the line is named, even when the
//!   chain after it was recomputed (that needs the key);
//! - a line removed, inserted or reordered: the chain breaks at the next one;
//! - lines cut from the end: fewer lines than the anchor records, named.
//!
//! Records hold identities, digests, sizes, durations, fuel and outcomes:
//! never arguments, results, stderr text or secrets. What a server wrote that
//! explains a fault (its stderr tail, a line that was not JSON-RPC) is kept as
//! a digest and a length.
//!
//! What it cannot detect: someone holding the key, or one who saved an old
//! anchor and puts it back together with the log cut to match (a rollback);
//! an anchor kept off the machine closes that.
//!
//! One writer: [`AuditLog`] holds an exclusive lock on the log for its life
//! (an open-file-description lock on byte 0, which no other descriptor of
//! the process can drop, and a classic POSIX lock on byte 1 that tells a
//! second writer the holder's pid), so two `moat serve` on one log are
//! refused rather than interleaving two chains. Only the holder writes the
//! anchor, so the lock covers it too. [`verify`] reads without a lock.
//!
//! Fails closed: once a line or the anchor cannot be written (ENOSPC, EFBIG,
//! EIO, anything), a partial line is cut back off, the log is poisoned and
//! writes nothing more, and every later [`AuditLog::record`] fails with
//! [`AuditError::Unwritable`]; the gateway then admits no calls (see
//! [`AuditLog::failure`]).
//!
//! What an event is: [`event`]. The line MACs and the anchor: [`anchor`].
//! The one writer: [`writer`], under the lock of [`lock`]. The check:
//! [`verify`].

mod anchor;
mod event;
mod lock;
mod verify;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::keys::Key;

pub use event::{Event, Outcome};
pub use verify::verify;
pub use writer::{AuditLog, Head};

/// The `prev` of the first line.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// The audit key's file name in the state directory.
pub const KEY_FILE: &str = "audit.key";

/// Errors writing or verifying an audit log.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit log {path}: {operation}: {source}")]
    Io {
        path: PathBuf,
        operation: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("audit log {path}: line {line} is not a JSON object with `prev` and `mac`: {detail}")]
    Malformed {
        path: PathBuf,
        line: usize,
        detail: String,
    },
    #[error(
        "audit log {path}: the chain breaks at line {line}: its prev is {found}, but the line before it hashes to {expected} (a line was altered, removed or inserted)"
    )]
    Broken {
        path: PathBuf,
        line: usize,
        expected: String,
        found: String,
    },
    #[error(
        "audit log {path}: line {line} was altered: its MAC does not match its content (edited, or written without Moat's audit key)"
    )]
    Altered { path: PathBuf, line: usize },
    #[error(
        "audit log {path}: truncated: its anchor records {anchored} lines but the log has {found}; lines {first_missing} to {anchored} are missing"
    )]
    Truncated {
        path: PathBuf,
        anchored: usize,
        found: usize,
        first_missing: usize,
    },
    #[error(
        "audit log {path}: line {line} is not the line the anchor records (its digest differs): the log was rewritten from there"
    )]
    HeadMismatch { path: PathBuf, line: usize },
    #[error("audit log {path}: anchor {anchor}: {detail}")]
    Anchor {
        path: PathBuf,
        anchor: PathBuf,
        detail: String,
    },
    #[error(
        "audit log {path} is being written by another Moat ({}); two writers would break its chain: give each `moat serve` its own --audit file",
        .pid.map_or_else(|| "pid unknown".to_owned(), |pid| format!("pid {pid}"))
    )]
    Locked { path: PathBuf, pid: Option<u32> },
    #[error(
        "audit log {path} cannot be written ({}{source}): Moat admits no calls until it can record them; free space (or fix the error) and restart Moat",
        .file.as_ref().map_or_else(String::new, |f| format!("{}: ", f.display()))
    )]
    Unwritable {
        path: PathBuf,
        /// The file that failed when it is not the log: its anchor.
        file: Option<PathBuf>,
        #[source]
        source: Arc<std::io::Error>,
    },
}

/// What `verify` found in an intact log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// Lines in the log.
    pub lines: usize,
    /// Lines after the last anchor: written by Moat (their MACs hold), but
    /// Moat stopped before it could anchor them.
    pub unanchored: usize,
}

/// The anchor's path for the log at `path`: `LOG.anchor`.
pub fn anchor_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".anchor");
    PathBuf::from(name)
}

/// The default directory of the audit key (see [`crate::dirs::state`]).
pub fn default_key_dir() -> Option<PathBuf> {
    crate::dirs::state()
}

/// Milliseconds since the Unix epoch now (0 on a clock before it): the
/// time every audit line and claim carries.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The audit key in `dir`, made there when `create` and there is none.
pub fn key_in(dir: &Path, create: bool) -> Result<Key, AuditError> {
    let key = if create {
        crate::keys::user_key(dir, KEY_FILE)
    } else {
        crate::keys::existing_key(dir, KEY_FILE)
    };
    key.map_err(|source| AuditError::Io {
        path: dir.join(KEY_FILE),
        operation: "reading the audit key",
        source,
    })
}

#[cfg(test)]
mod tests;

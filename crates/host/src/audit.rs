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

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use serde::Serialize;

use crate::identity::Digest;
use crate::keys::Key;

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

/// One audited event. Field names are stable: tools read them.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    SessionOpen {
        session: String,
    },
    SessionClose {
        session: String,
        outcome: String,
    },
    ServerLaunch {
        session: String,
        server: String,
        identity: String,
        sha256: Option<String>,
        evidence: String,
    },
    ServerExit {
        session: String,
        server: String,
        /// The execution identity of the child that exited.
        identity: String,
        /// Its evidence class.
        evidence: String,
        #[serde(flatten)]
        outcome: Outcome,
    },
    /// A server could not start: its tools are left out of the listings
    /// until a later try (the `attempts`-th failure in a row) succeeds.
    ServerStartFailed {
        session: String,
        server: String,
        attempts: u32,
        #[serde(flatten)]
        outcome: Outcome,
    },
    /// A native server's egress was refused by Moat: a name its DNS was
    /// asked that no `net` entry lists, a proxy request outside the
    /// grants, or an entry whose name had no usable address at launch.
    EgressRefused {
        server: String,
        /// `host:port`, or the name asked.
        destination: String,
        reason: String,
    },
    /// A native server's own words (its stderr at a failed start, a tool's
    /// error) showed the sandbox refusing it something: Moat cannot see
    /// a Landlock denial itself, so this is what the server reported,
    /// placed against its grants.
    SandboxRefused {
        session: String,
        server: String,
        /// `start`, or `tools/call TOOL`.
        during: String,
        /// `network` or `filesystem`.
        kind: String,
        /// The hosts, or the paths and the grant each falls under.
        subject: String,
    },
    /// `moat serve --http` turned a connection or request away at a limit.
    HttpRefused {
        /// `max-sessions`, `max-connections`, `header-timeout`,
        /// `body-too-large`, `unauthorized`, `audit-unwritable`.
        reason: String,
        status: u16,
    },
    /// A revocation came into force while serving (moat.lock re-read), or
    /// was lifted (`lifted`).
    Revoke {
        target: String,
        by: String,
        at: String,
        reason: String,
        /// What made the gateway read it: `SIGHUP`, say.
        source: String,
        lifted: bool,
    },
    /// `moat serve` read its config and lock again (SIGHUP, `--watch`):
    /// `generation` serves new sessions from then on, or, when `error` is
    /// set, the reload was refused and nothing changed.
    Reload {
        source: String,
        generation: u64,
        outcome: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    ToolCall {
        session: String,
        server: String,
        tool: String,
        arguments_sha256: String,
        arguments_bytes: usize,
        result_sha256: Option<String>,
        result_bytes: usize,
        duration_ms: u64,
        fuel: u64,
        #[serde(flatten)]
        outcome: Outcome,
    },
}

/// How something ended, in Moat's words only. Text the server chose (its
/// stderr tail, a line that was not JSON-RPC, an error message) may carry
/// anything, secrets included: only its digest and length are kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_text_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_text_bytes: Option<usize>,
}

impl Outcome {
    /// An outcome with no text of the server's.
    pub fn plain(outcome: impl Into<String>) -> Self {
        Self {
            outcome: outcome.into(),
            server_text_sha256: None,
            server_text_bytes: None,
        }
    }

    /// `outcome`, with the digest and length of `server_text` when there is
    /// any.
    pub fn with_server_text(outcome: impl Into<String>, server_text: Option<&str>) -> Self {
        let server_text = server_text.filter(|t| !t.is_empty());
        Self {
            outcome: outcome.into(),
            server_text_sha256: server_text.map(|t| Digest::of(t.as_bytes()).to_string()),
            server_text_bytes: server_text.map(str::len),
        }
    }

    /// A fault: what Moat saw, and the digest of what the server wrote.
    pub fn of_fault(fault: &crate::transport::Fault) -> Self {
        Self::with_server_text(format!("fault: {}", fault.summary()), fault.server_text())
    }
}

/// An append-only audit log, written by this process alone while it is
/// open (see the module's doc).
pub struct AuditLog {
    path: PathBuf,
    anchor: PathBuf,
    key: Key,
    state: Mutex<Writer>,
    /// The first write that failed: from then on nothing is written.
    failed: OnceLock<Failure>,
}

/// Where the log stands: its locked file, the last line's digest, the
/// number of lines and the bytes of the whole lines.
struct Writer {
    file: std::fs::File,
    head: String,
    lines: usize,
    len: u64,
}

/// A write that failed: the anchor's path (`None` for the log), and why.
struct Failure {
    file: Option<PathBuf>,
    source: Arc<std::io::Error>,
}

/// The anchor file: how many lines the log had and the digest of the last.
#[derive(serde::Deserialize, Serialize)]
struct Anchor {
    lines: usize,
    head: String,
    mac: String,
}

impl Anchor {
    fn signed(key: &Key, lines: usize, head: &str) -> Self {
        Self {
            lines,
            head: head.to_owned(),
            mac: key.mac_hex(&[
                b"moat-audit-anchor\n",
                lines.to_string().as_bytes(),
                b"\n",
                head.as_bytes(),
            ]),
        }
    }

    fn holds(&self, key: &Key) -> bool {
        key.verify_hex(
            &[
                b"moat-audit-anchor\n",
                self.lines.to_string().as_bytes(),
                b"\n",
                self.head.as_bytes(),
            ],
            &self.mac,
        )
    }
}

impl AuditLog {
    /// Opens (or creates) the log at `path`, continuing its chain, with
    /// `key` for the line MACs and the anchor. The log is locked first
    /// (another writer holding it is refused with [`AuditError::Locked`]),
    /// then must verify: appending to a damaged log would hide the damage.
    /// An empty log with no anchor is a new one.
    pub fn open(path: &Path, key: Key) -> Result<Self, AuditError> {
        let io_error = |operation: &'static str| {
            move |source: std::io::Error| AuditError::Io {
                path: path.to_owned(),
                operation,
                source,
            }
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io_error("open for append"))?;
        lock::exclusive(&file, path)?;
        let anchor = anchor_path(path);
        let len = file.metadata().map_err(io_error("fstat"))?.len();
        let anchorless = match std::fs::symlink_metadata(&anchor) {
            Ok(_) => false,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => true,
            Err(source) => {
                return Err(AuditError::Io {
                    path: anchor,
                    operation: "stat",
                    source,
                });
            }
        };
        let (lines, head) = if len == 0 && anchorless {
            (0, GENESIS.to_owned())
        } else {
            // One read: the check, and the head the chain continues from.
            let (verified, head) = verify_to_head(path, &key)?;
            (verified.lines, head)
        };
        // After the read: closing any descriptor of the log (verify's) drops
        // the process's POSIX locks, and this one only tells the pid.
        lock::name_holder(&file, path);
        let log = Self {
            path: path.to_owned(),
            anchor,
            key,
            state: Mutex::new(Writer {
                file,
                head: head.clone(),
                lines,
                len,
            }),
            failed: OnceLock::new(),
        };
        log.write_anchor(lines, &head)
            .map_err(|source| AuditError::Io {
                path: log.anchor.clone(),
                operation: "writing the anchor",
                source,
            })?;
        Ok(log)
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why the log can no longer be written, once a write failed: then
    /// nothing more is recorded, and nothing should be done that must be.
    pub fn failure(&self) -> Option<AuditError> {
        self.failed.get().map(|failure| self.unwritable(failure))
    }

    fn unwritable(&self, failure: &Failure) -> AuditError {
        AuditError::Unwritable {
            path: self.path.clone(),
            file: failure.file.clone(),
            source: failure.source.clone(),
        }
    }

    /// Poisons the log with `source` (the failure of `file`, `None` for
    /// the log) and says so once.
    fn fail(&self, file: Option<PathBuf>, source: std::io::Error) -> AuditError {
        let failure = Failure {
            file,
            source: Arc::new(source),
        };
        let error = self.unwritable(&failure);
        if self.failed.set(failure).is_ok() {
            tracing::error!("{error}");
        }
        error
    }

    /// Appends `event`, chained to the line before it and MACed, flushes
    /// it, then moves the anchor to it. When either write fails, a partial
    /// line is cut back off, the log is poisoned (nothing more is written)
    /// and this and every later record fail with [`AuditError::Unwritable`].
    pub fn record(&self, event: &Event) -> Result<(), AuditError> {
        let mut value = serde_json::to_value(event).unwrap_or_default();
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(failure) = self.failed.get() {
            return Err(self.unwritable(failure));
        }
        let writer = &mut *guard;
        let Some(object) = value.as_object_mut() else {
            return Ok(());
        };
        object.insert("prev".into(), writer.head.clone().into());
        object.insert("unix_ms".into(), unix_ms.into());
        let unsigned = crate::lock::canonical_json(&value);
        let mac = self.key.mac_hex(&[unsigned.as_bytes()]);
        if let Some(object) = value.as_object_mut() {
            object.insert("mac".into(), mac.into());
        }
        let line = crate::lock::canonical_json(&value) + "\n";
        if let Err(source) = writer
            .file
            .write_all(line.as_bytes())
            .and_then(|()| writer.file.flush())
        {
            // Whatever part of the line got in goes: the log keeps ending
            // with a whole line, the one the anchor names.
            if let Err(cut) = writer.file.set_len(writer.len) {
                tracing::error!(path = %self.path.display(), %cut, "audit log: cutting a partial line back off failed");
            }
            return Err(self.fail(None, source));
        }
        writer.head = Digest::of(line.trim_end_matches('\n').as_bytes()).to_string();
        writer.lines += 1;
        writer.len += line.len() as u64;
        self.write_anchor(writer.lines, &writer.head)
            .map_err(|source| self.fail(Some(self.anchor.clone()), source))
    }

    fn write_anchor(&self, lines: usize, head: &str) -> std::io::Result<()> {
        let anchor = Anchor::signed(&self.key, lines, head);
        let text = serde_json::to_string(&anchor).unwrap_or_default();
        let mut tmp = self.anchor.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &self.anchor))
    }
}

/// The writer's lock on a log (see the module's doc).
mod lock {
    use std::os::fd::AsRawFd;
    use std::path::Path;

    use super::AuditError;

    /// Byte 0: the open-file-description lock that keeps other writers out.
    const WRITER: i64 = 0;
    /// Byte 1: the POSIX lock whose holder's pid `F_GETLK` reports.
    const PID: i64 = 1;

    fn one_byte(at: i64, kind: libc::c_int) -> libc::flock {
        // SAFETY: `flock` is plain integers; all zeroes is a valid value
        // (and `l_pid` must be 0 for an open-file-description lock).
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = kind as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = at;
        lock.l_len = 1;
        lock
    }

    fn fcntl(
        file: &std::fs::File,
        command: libc::c_int,
        lock: &mut libc::flock,
    ) -> std::io::Result<()> {
        // SAFETY: the descriptor is borrowed from `file`, open for the call;
        // `lock` is a valid `flock` that the kernel may write back to.
        let done = unsafe { libc::fcntl(file.as_raw_fd(), command, std::ptr::from_mut(lock)) };
        if done == -1 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Takes the writer's lock on `file` (the log at `path`), held until
    /// the file is closed; refused with the holder's pid when another
    /// writer has it.
    pub(super) fn exclusive(file: &std::fs::File, path: &Path) -> Result<(), AuditError> {
        let mut lock = one_byte(WRITER, libc::F_WRLCK);
        match fcntl(file, libc::F_OFD_SETLK, &mut lock) {
            Ok(()) => Ok(()),
            Err(error) if matches!(error.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => {
                Err(AuditError::Locked {
                    path: path.to_owned(),
                    pid: holder(file),
                })
            }
            Err(source) => Err(AuditError::Io {
                path: path.to_owned(),
                operation: "locking it for writing (F_OFD_SETLK)",
                source,
            }),
        }
    }

    /// The pid holding byte 1, if another process does.
    fn holder(file: &std::fs::File) -> Option<u32> {
        let mut lock = one_byte(PID, libc::F_WRLCK);
        fcntl(file, libc::F_GETLK, &mut lock).ok()?;
        (lock.l_type != libc::F_UNLCK as libc::c_short && lock.l_pid > 0)
            .then_some(lock.l_pid as u32)
    }

    /// Takes byte 1 with a POSIX lock, so that a second writer learns this
    /// process's pid. Best effort: the writer's lock is byte 0's.
    pub(super) fn name_holder(file: &std::fs::File, path: &Path) {
        let mut lock = one_byte(PID, libc::F_WRLCK);
        if let Err(error) = fcntl(file, libc::F_SETLK, &mut lock) {
            tracing::warn!(path = %path.display(), %error, "audit log: the pid lock (F_SETLK) failed; a second writer will not be told this pid");
        }
    }
}

/// Checks the log at `path` with `key`: every line's MAC, the chain, and
/// the anchor. Names the first line that fails, or what is missing.
pub fn verify(path: &Path, key: &Key) -> Result<Verified, AuditError> {
    verify_to_head(path, key).map(|(verified, _)| verified)
}

/// [`verify`], and the digest of the last line (the next line's `prev`).
fn verify_to_head(path: &Path, key: &Key) -> Result<(Verified, String), AuditError> {
    // The anchor is read first so that its head can be picked out on the
    // way through the log; its errors are reported after the lines', which
    // name where a log was damaged more precisely.
    let anchor_file = anchor_path(path);
    let anchor_error = |detail: String| AuditError::Anchor {
        path: path.to_owned(),
        anchor: anchor_file.clone(),
        detail,
    };
    let anchor = std::fs::read_to_string(&anchor_file)
        .map_err(|e| {
            anchor_error(format!(
                "{e}: without it, lines cut from the end cannot be told"
            ))
        })
        .and_then(|text| {
            serde_json::from_str::<Anchor>(&text)
                .map_err(|e| anchor_error(format!("not an anchor: {e}")))
        })
        .and_then(|anchor| {
            if anchor.holds(key) {
                Ok(anchor)
            } else {
                Err(anchor_error(
                    "its MAC does not match (edited, or written without Moat's audit key)".into(),
                ))
            }
        });
    let anchored_lines = anchor.as_ref().map_or(0, |a| a.lines);
    let file = std::fs::File::open(path).map_err(|source| AuditError::Io {
        path: path.to_owned(),
        operation: "open",
        source,
    })?;
    let malformed = |line, detail: &str| AuditError::Malformed {
        path: path.to_owned(),
        line,
        detail: detail.to_owned(),
    };
    let mut expected = GENESIS.to_owned();
    // The digest after the line the anchor names, to compare with its head.
    let mut anchored_head = (anchored_lines == 0).then(|| GENESIS.to_owned());
    let mut lines = 0;
    for (index, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| AuditError::Io {
            path: path.to_owned(),
            operation: "read",
            source,
        })?;
        let number = index + 1;
        let mut value: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| malformed(number, &e.to_string()))?;
        let object = value
            .as_object_mut()
            .ok_or_else(|| malformed(number, "not an object"))?;
        let mac = match object.remove("mac") {
            Some(serde_json::Value::String(mac)) => mac,
            _ => return Err(malformed(number, "no `mac`")),
        };
        let found = object
            .get("prev")
            .and_then(|p| p.as_str())
            .ok_or_else(|| malformed(number, "no `prev`"))?
            .to_owned();
        if !key.verify_hex(&[crate::lock::canonical_json(&value).as_bytes()], &mac) {
            return Err(AuditError::Altered {
                path: path.to_owned(),
                line: number,
            });
        }
        if found != expected {
            return Err(AuditError::Broken {
                path: path.to_owned(),
                line: number,
                expected,
                found,
            });
        }
        expected = Digest::of(line.as_bytes()).to_string();
        lines = number;
        if number == anchored_lines {
            anchored_head = Some(expected.clone());
        }
    }
    let anchor = anchor?;
    if anchor.lines > lines {
        return Err(AuditError::Truncated {
            path: path.to_owned(),
            anchored: anchor.lines,
            found: lines,
            first_missing: lines + 1,
        });
    }
    if anchored_head.as_deref() != Some(anchor.head.as_str()) {
        return Err(AuditError::HeadMismatch {
            path: path.to_owned(),
            line: anchor.lines,
        });
    }
    Ok((
        Verified {
            lines,
            unanchored: lines - anchor.lines,
        },
        expected,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(tool: &str) -> Event {
        Event::ToolCall {
            session: "s1".into(),
            server: "everything".into(),
            tool: tool.into(),
            arguments_sha256: Digest::of(b"{}").to_string(),
            arguments_bytes: 2,
            result_sha256: None,
            result_bytes: 0,
            duration_ms: 1,
            fuel: 0,
            outcome: Outcome::plain("ok"),
        }
    }

    fn key() -> Key {
        let dir = tempfile::tempdir().unwrap();
        key_in(dir.path(), true).unwrap()
    }

    fn lines_of(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(String::from)
            .collect()
    }

    fn write_lines(path: &Path, lines: &[String]) {
        std::fs::write(
            path,
            lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
        )
        .unwrap();
    }

    /// A log of four calls, a to d.
    fn four(dir: &Path, key: Key) -> PathBuf {
        let path = dir.join("audit.jsonl");
        let log = AuditLog::open(&path, key).unwrap();
        for tool in ["a", "b", "c", "d"] {
            log.record(&call(tool)).unwrap();
        }
        path
    }

    #[test]
    fn a_chain_verifies_and_continues_across_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let key = key();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, key).unwrap();
        log.record(&Event::SessionOpen {
            session: "s1".into(),
        })
        .unwrap();
        log.record(&call("add")).unwrap();
        drop(log);
        let log = AuditLog::open(&path, key).unwrap();
        log.record(&call("echo")).unwrap();
        assert_eq!(
            verify(&path, &key).unwrap(),
            Verified {
                lines: 3,
                unanchored: 0
            }
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.lines().next().unwrap().contains(GENESIS));
        assert!(!text.contains("arguments\""), "no arguments are recorded");
        // Another user's key (or none of Moat's) verifies nothing.
        assert!(matches!(
            verify(&path, &super::tests::key()),
            Err(AuditError::Altered { line: 1, .. })
        ));
    }

    #[test]
    fn an_edited_line_is_named_even_with_the_chain_recomputed() {
        let dir = tempfile::tempdir().unwrap();
        let key = key();
        let path = four(dir.path(), key);
        let mut lines = lines_of(&path);
        lines[1] = lines[1].replace("\"tool\":\"b\"", "\"tool\":\"x\"");
        write_lines(&path, &lines);
        let error = verify(&path, &key).unwrap_err();
        assert!(
            matches!(error, AuditError::Altered { line: 2, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("line 2 was altered"), "{error}");

        // The chain after it recomputed, as one would without the key.
        let mut prev = Digest::of(lines[0].as_bytes()).to_string();
        for line in lines.iter_mut().skip(1) {
            let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
            value["prev"] = prev.clone().into();
            *line = crate::lock::canonical_json(&value);
            prev = Digest::of(line.as_bytes()).to_string();
        }
        write_lines(&path, &lines);
        assert!(matches!(
            verify(&path, &key),
            Err(AuditError::Altered { line: 2, .. })
        ));
    }

    #[test]
    fn a_removed_line_breaks_the_chain_where_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let key = key();
        let path = four(dir.path(), key);
        let lines = lines_of(&path);
        write_lines(
            &path,
            &[lines[0].clone(), lines[2].clone(), lines[3].clone()],
        );
        match verify(&path, &key) {
            Err(AuditError::Broken { line, .. }) => assert_eq!(line, 2),
            other => panic!("{other:?}"),
        }
        std::fs::write(&path, "not json\n").unwrap();
        assert!(matches!(
            verify(&path, &key),
            Err(AuditError::Malformed { line: 1, .. })
        ));
    }

    #[test]
    fn lines_cut_from_the_end_are_named_and_an_edited_anchor_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = key();
        let path = four(dir.path(), key);
        let lines = lines_of(&path);
        write_lines(&path, &lines[..2]);
        let error = verify(&path, &key).unwrap_err();
        assert!(
            matches!(
                error,
                AuditError::Truncated {
                    anchored: 4,
                    found: 2,
                    first_missing: 3,
                    ..
                }
            ),
            "{error}"
        );
        assert!(
            error.to_string().contains("lines 3 to 4 are missing"),
            "{error}"
        );
        // Appending to a damaged log would hide the damage.
        assert!(AuditLog::open(&path, key).is_err());

        // The anchor moved back to match: its MAC fails.
        let anchor = anchor_path(&path);
        let mut value: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&anchor).unwrap()).unwrap();
        value["lines"] = 2.into();
        value["head"] = Digest::of(lines[1].as_bytes()).to_string().into();
        std::fs::write(&anchor, value.to_string()).unwrap();
        assert!(matches!(
            verify(&path, &key),
            Err(AuditError::Anchor { .. })
        ));
        // No anchor at all: refused, not trusted.
        std::fs::remove_file(&anchor).unwrap();
        assert!(matches!(
            verify(&path, &key),
            Err(AuditError::Anchor { .. })
        ));
    }

    #[test]
    fn a_second_writer_is_refused_while_the_first_holds_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let key = key();
        let path = dir.path().join("audit.jsonl");
        let first = AuditLog::open(&path, key).unwrap();
        first.record(&call("a")).unwrap();
        // Another open file description of the same log: its OFD lock
        // conflicts even within one process. (The holder's pid comes from
        // a POSIX lock, which a process never conflicts with: another
        // process is told it, see tests/serve.rs.)
        let Err(error) = AuditLog::open(&path, key) else {
            panic!("a second writer was let in");
        };
        assert!(
            matches!(&error, AuditError::Locked { path: p, .. } if *p == path),
            "{error}"
        );
        assert!(
            error.to_string().starts_with(&format!(
                "audit log {} is being written by another Moat (pid",
                path.display()
            )),
            "{error}"
        );
        assert!(
            error.to_string().ends_with(
                "two writers would break its chain: give each `moat serve` its own --audit file"
            ),
            "{error}"
        );
        // The refused writer wrote nothing, not even the anchor; the first
        // goes on, and a reader needs no lock.
        first.record(&call("b")).unwrap();
        assert_eq!(verify(&path, &key).unwrap().lines, 2);
        drop(first);
        // The lock goes with the writer.
        let next = AuditLog::open(&path, key).unwrap();
        next.record(&call("c")).unwrap();
        assert_eq!(verify(&path, &key).unwrap().lines, 3);
    }

    #[test]
    fn a_log_that_cannot_be_written_is_poisoned_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let key = key();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, key).unwrap();
        log.record(&call("a")).unwrap();
        assert!(log.failure().is_none());
        // The anchor cannot be replaced (its temporary name is taken by a
        // directory): the line is in, the anchor stays one behind.
        let tmp = dir.path().join("audit.jsonl.anchor.tmp");
        std::fs::create_dir(&tmp).unwrap();
        let error = log.record(&call("b")).unwrap_err();
        let expected = format!(
            "audit log {} cannot be written ({}: Is a directory (os error 21)): Moat admits no calls until it can record them",
            path.display(),
            anchor_path(&path).display()
        );
        assert!(error.to_string().starts_with(&expected), "{error}");
        assert!(matches!(error, AuditError::Unwritable { .. }), "{error}");
        // Poisoned: even once the anchor could be written again, nothing
        // more is, and every record says why.
        std::fs::remove_dir(&tmp).unwrap();
        let again = log.record(&call("c")).unwrap_err();
        assert!(again.to_string().starts_with(&expected), "{again}");
        assert_eq!(log.failure().unwrap().to_string(), again.to_string());
        assert_eq!(lines_of(&path).len(), 2);
        assert_eq!(
            verify(&path, &key).unwrap(),
            Verified {
                lines: 2,
                unanchored: 1
            }
        );
    }

    #[test]
    fn a_fault_is_recorded_without_the_servers_text() {
        let dir = tempfile::tempdir().unwrap();
        let key = key();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, key).unwrap();
        let fault = crate::transport::Fault::Exited {
            server: "s".into(),
            code: 1,
            stderr_tail: "AWS_SECRET_ACCESS_KEY=hunter2".into(),
        };
        log.record(&Event::ServerExit {
            session: "s1".into(),
            server: "s".into(),
            identity: String::new(),
            evidence: "native-measured".into(),
            outcome: Outcome::of_fault(&fault),
        })
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        let value: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(
            value["outcome"],
            "fault: server `s` exited with code 1 before closing"
        );
        assert_eq!(
            value["server_text_sha256"],
            Digest::of(b"AWS_SECRET_ACCESS_KEY=hunter2").to_string()
        );
        assert_eq!(value["server_text_bytes"], 29);
    }
}

//! The one writer of a log: it opens (locked, verified) and appends events,
//! each chained to the line before it and MACed, then moves the anchor;
//! the first write that fails poisons it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use super::anchor::Anchor;
use super::verify::verify_to_head;
use super::{AuditError, Event, GENESIS, anchor_path, lock};
use crate::identity::Digest;
use crate::keys::Key;

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

/// Where a log stands after a line: how many lines it holds, and the
/// digest (sha256 of the line without its newline) of the last.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Head {
    pub lines: usize,
    pub head: String,
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
        self.record_line(event).map(drop)
    }

    /// [`Self::record`], returning where the log stands after the line:
    /// its count and the digest of the line just written (the chain head a
    /// claim names).
    pub fn record_line(&self, event: &Event) -> Result<Head, AuditError> {
        let mut value = serde_json::to_value(event).unwrap_or_default();
        let unix_ms = super::now_unix_ms();
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(failure) = self.failed.get() {
            return Err(self.unwritable(failure));
        }
        let writer = &mut *guard;
        let Some(object) = value.as_object_mut() else {
            return Ok(Head {
                lines: writer.lines,
                head: writer.head.clone(),
            });
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
            .map_err(|source| self.fail(Some(self.anchor.clone()), source))?;
        Ok(Head {
            lines: writer.lines,
            head: writer.head.clone(),
        })
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

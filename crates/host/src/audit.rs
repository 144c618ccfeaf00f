//! Audit: a tamper-evident log. One JSON line per event, each carrying the
//! sha256 of the line before it (`prev`), so any edit, removal or reordering
//! breaks the chain at the next line. Records hold identities, digests,
//! sizes, durations, fuel and outcomes: never arguments, results, stderr
//! text or secrets.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;

use crate::identity::Digest;

/// The `prev` of the first line.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

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
    #[error("audit log {path}: line {line} is not a JSON object with a `prev` digest: {detail}")]
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
        outcome: String,
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
        outcome: String,
    },
}

/// An append-only audit log.
pub struct AuditLog {
    path: PathBuf,
    state: Mutex<(std::fs::File, String)>,
}

impl AuditLog {
    /// Opens (or creates) the log at `path`, continuing its chain.
    pub fn open(path: &Path) -> Result<Self, AuditError> {
        let io = |operation| {
            move |source| AuditError::Io {
                path: path.to_owned(),
                operation,
                source,
            }
        };
        let prev = match std::fs::File::open(path) {
            Ok(file) => {
                let mut last = None;
                for line in std::io::BufReader::new(file).lines() {
                    last = Some(line.map_err(io("read"))?);
                }
                last.map_or_else(
                    || GENESIS.to_owned(),
                    |l| Digest::of(l.as_bytes()).to_string(),
                )
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => GENESIS.to_owned(),
            Err(error) => return Err(io("open")(error)),
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io("open for append"))?;
        Ok(Self {
            path: path.to_owned(),
            state: Mutex::new((file, prev)),
        })
    }

    /// Appends `event`, chained to the line before it, and flushes it.
    pub fn record(&self, event: &Event) -> Result<(), AuditError> {
        let mut value = serde_json::to_value(event).unwrap_or_default();
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (file, prev) = &mut *guard;
        if let Some(object) = value.as_object_mut() {
            object.insert("prev".into(), prev.clone().into());
            object.insert("unix_ms".into(), unix_ms.into());
        }
        let line = crate::lock::canonical_json(&value);
        file.write_all(format!("{line}\n").as_bytes())
            .and_then(|()| file.flush())
            .map_err(|source| AuditError::Io {
                path: self.path.clone(),
                operation: "append",
                source,
            })?;
        *prev = Digest::of(line.as_bytes()).to_string();
        Ok(())
    }
}

/// Checks the chain of the log at `path`; returns the number of lines, or
/// the first line where the chain breaks.
pub fn verify(path: &Path) -> Result<usize, AuditError> {
    let file = std::fs::File::open(path).map_err(|source| AuditError::Io {
        path: path.to_owned(),
        operation: "open",
        source,
    })?;
    let mut expected = GENESIS.to_owned();
    let mut count = 0;
    for (index, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| AuditError::Io {
            path: path.to_owned(),
            operation: "read",
            source,
        })?;
        let number = index + 1;
        let value: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| AuditError::Malformed {
                path: path.to_owned(),
                line: number,
                detail: e.to_string(),
            })?;
        let found =
            value
                .get("prev")
                .and_then(|p| p.as_str())
                .ok_or_else(|| AuditError::Malformed {
                    path: path.to_owned(),
                    line: number,
                    detail: "no `prev`".into(),
                })?;
        if found != expected {
            return Err(AuditError::Broken {
                path: path.to_owned(),
                line: number,
                expected,
                found: found.to_owned(),
            });
        }
        expected = Digest::of(line.as_bytes()).to_string();
        count = number;
    }
    Ok(count)
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
            outcome: "ok".into(),
        }
    }

    #[test]
    fn a_chain_verifies_and_continues_across_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
        log.record(&Event::SessionOpen {
            session: "s1".into(),
        })
        .unwrap();
        log.record(&call("add")).unwrap();
        drop(log);
        let log = AuditLog::open(&path).unwrap();
        log.record(&call("echo")).unwrap();
        assert_eq!(verify(&path).unwrap(), 3);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.lines().next().unwrap().contains(GENESIS));
        assert!(!text.contains("arguments\""), "no arguments are recorded");
    }

    #[test]
    fn an_altered_or_removed_line_breaks_the_chain_where_it_shows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
        for tool in ["a", "b", "c", "d"] {
            log.record(&call(tool)).unwrap();
        }
        let lines: Vec<String> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        let altered = lines[1].replace("\"tool\":\"b\"", "\"tool\":\"x\"");
        std::fs::write(
            &path,
            [&lines[0], &altered, &lines[2], &lines[3]]
                .map(|l| format!("{l}\n"))
                .concat(),
        )
        .unwrap();
        match verify(&path) {
            Err(AuditError::Broken { line, .. }) => assert_eq!(line, 3),
            other => panic!("{other:?}"),
        }
        std::fs::write(
            &path,
            [&lines[0], &lines[2], &lines[3]]
                .map(|l| format!("{l}\n"))
                .concat(),
        )
        .unwrap();
        match verify(&path) {
            Err(AuditError::Broken { line, .. }) => assert_eq!(line, 2),
            other => panic!("{other:?}"),
        }
        std::fs::write(&path, "not json\n").unwrap();
        assert!(matches!(
            verify(&path),
            Err(AuditError::Malformed { line: 1, .. })
        ));
    }
}

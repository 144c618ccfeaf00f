//! Checking a log: every line's MAC, the chain, and the anchor; the first
//! line that fails, or what is missing, is named.

use std::io::BufRead;
use std::path::Path;

use super::anchor::Anchor;
use super::{AuditError, GENESIS, Verified, anchor_path};
use crate::identity::Digest;
use crate::keys::Key;

/// Checks the log at `path` with `key`: every line's MAC, the chain, and
/// the anchor. Names the first line that fails, or what is missing.
pub fn verify(path: &Path, key: &Key) -> Result<Verified, AuditError> {
    verify_to_head(path, key).map(|(verified, _)| verified)
}

/// [`verify`], and the digest of the last line (the next line's `prev`).
pub(super) fn verify_to_head(path: &Path, key: &Key) -> Result<(Verified, String), AuditError> {
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

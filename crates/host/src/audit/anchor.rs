//! The anchor beside the log: the line count and the last line's digest,
//! under the audit key, so that lines cut from the end are told.

use serde::Serialize;

use crate::keys::Key;

/// The anchor file: how many lines the log had and the digest of the last.
#[derive(serde::Deserialize, Serialize)]
pub(super) struct Anchor {
    pub(super) lines: usize,
    pub(super) head: String,
    mac: String,
}

impl Anchor {
    pub(super) fn signed(key: &Key, lines: usize, head: &str) -> Self {
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

    pub(super) fn holds(&self, key: &Key) -> bool {
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

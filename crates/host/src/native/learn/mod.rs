//! `moat learn`: one run of a native server with every file readable and
//! its network open, watched, to find the `dirs` and `net` entries it needs.
//!
//! This module owns the watched run and what is made of it. The server is
//! started as every native server is (namespaces, a private /tmp, no
//! capabilities, the seccomp deny-list), without a network namespace, and
//! under a Landlock ruleset of its own ([`crate::sandbox::learn_plan`]): it
//! may read and execute everything, and write only its private /tmp,
//! `/dev/null`, its config's `rw` dirs and the directories the user names
//! with `--write`. Nothing else of the host is changed, even when Moat is
//! root. A second seccomp filter stops it at each system call that names a
//! file or an address (`open*`, `creat`, `exec*`, `mkdir*`, `mknod*`,
//! `unlink*`, `rmdir`, `rename*`, `link*`, `symlink*`, `truncate`,
//! `connect`) for a tracer thread of Moat's, which reads the path or address
//! from the server's memory and records it. A call that would change a file
//! is also stopped at its return: a refusal (EACCES, EPERM, EROFS, EXDEV) is
//! recorded as a write that was wanted and denied; a file opened for writing
//! is compared, after the run, with its state before the open, so a write
//! that wrote nothing is not taken for one.
//!
//! [`propose`] then turns what was recorded into grants: paths already
//! granted by default are left out, files are grouped under their package
//! directory (`node_modules`, `site-packages`, a `PYTHONPATH` or `NODE_PATH`
//! entry) or their own directory. A grant is `rw` only where something was
//! written; a denied write, or an open for writing that wrote nothing, is a
//! suggestion to confirm, never a grant. Some grants are never proposed
//! (see [`refusal`]): `rw` in a system directory, any grant of `/`, of the
//! home directory or what holds it, or of a system directory itself, and
//! anything overlapping Moat's own files; the proposal says which and why.
//!
//! Here: the run and what it records. The tracer is [`tracer`]'s, reading
//! what a stopped call names [`decode`]'s, the proposal [`propose`]'s.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

mod decode;
mod propose;
#[cfg(test)]
mod tests;
mod tracer;

pub use propose::{Granted, Proposal, SYSTEM_TREES, TOO_BROAD, propose, refusal};
pub use tracer::{Exit, start, watch_filter};

/// Why a learn run was refused before it started.
#[derive(Debug, thiserror::Error)]
pub enum LearnError {
    #[error(
        "moat learn --write {path}: refused: {why}; name a directory of the server's own (its data or output directory)"
    )]
    Refused { path: PathBuf, why: &'static str },
    #[error("moat learn --write {path}: {source}")]
    Writable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One learn run: where it records, and the directories the user let it
/// write (`--write`), canonical.
#[derive(Clone, Debug, Default)]
pub struct Run {
    pub observed: Arc<Mutex<Observed>>,
    pub writable: Vec<PathBuf>,
}

/// How a watched run used one path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Use {
    /// Opened to read, executed, or named by a call that changed nothing.
    pub read: bool,
    /// Changed: made, removed or renamed, or opened for writing and found
    /// changed (contents, size or times) after the run.
    pub written: bool,
    /// A change refused (EACCES, EPERM, EROFS, EXDEV): by the learn run's
    /// Landlock ruleset, or by the file's own permissions.
    pub denied: bool,
    /// Opened for writing, and found unchanged after the run.
    pub unwritten: bool,
}

impl Use {
    /// Whether it tried to change the path, whatever came of it.
    pub fn wants_write(self) -> bool {
        self.written || self.denied || self.unwritten
    }

    fn merge(&mut self, other: Use) {
        self.read |= other.read;
        self.written |= other.written;
        self.denied |= other.denied;
        self.unwritten |= other.unwritten;
    }

    /// Whether a grant made for `self` would also cover `inner`.
    fn covers(self, inner: Use) -> bool {
        self.written
            || ((!inner.read || self.read)
                && (!inner.denied || self.denied)
                && (!inner.unwritten || self.unwritten)
                && !inner.written)
    }
}

/// What a file was before a watched open for writing: compared after the
/// run to tell whether anything was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// What a watched run saw: every file it named, with how it used it, and
/// every address it connected to.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Files and directories the server opened, executed or changed
    /// (resolved on the host; names that did not exist are left out).
    pub files: BTreeMap<PathBuf, Use>,
    /// `host:port` of every IPv4 and IPv6 connect.
    pub connects: BTreeSet<String>,
    /// Paths of Unix sockets it tried to reach.
    pub unix: BTreeSet<PathBuf>,
    /// Files opened for writing, with what they were before the first such
    /// open (`None`: not there yet), until [`Observed::settle`].
    pub opened_for_writing: BTreeMap<PathBuf, Option<Stamp>>,
}

impl Observed {
    /// After the run: each file opened for writing is `written` if it was
    /// made or changed since, `unwritten` otherwise.
    pub fn settle(&mut self) {
        for (path, before) in std::mem::take(&mut self.opened_for_writing) {
            let changed = before.is_none() || Stamp::of(&path) != before;
            let seen = self.files.entry(path).or_default();
            if changed {
                seen.written = true;
            } else {
                seen.unwritten = true;
            }
        }
    }

    fn note(&mut self, path: PathBuf, how: Use) {
        self.files.entry(path).or_default().merge(how);
    }
}

//! What no grant may overlap. Grants that overlap what Moat itself must
//! keep from servers (the compiled-component cache and its key, the config,
//! the lock, the audit log) are refused: a server that could write there
//! could make Moat load foreign native code or rewrite what was approved.
//!
//! So are `rw` grants over what another server (or the same one) runs: its
//! executable, its `#!` interpreter, its `measure` paths. Those are hashed
//! at launch and read again afterwards (an interpreter maps its libraries,
//! `node` loads the modules of a measured package lazily), so a server that
//! could write them could change what another runs after it was measured.

use std::path::{Component, Path, PathBuf};

use super::{DirGrant, GrantError, Writer};

/// Something of Moat's that no grant may overlap.
#[derive(Clone, Debug)]
pub struct Protected {
    /// What it is, for the error: "compiled-component cache", "config", ...
    pub what: &'static str,
    pub path: PathBuf,
}

/// The name under which the compiled-component cache (and its key) is
/// protected.
pub const CACHE: &str = "compiled-component cache";
/// The name under which the audit key's directory is protected.
pub const AUDIT_KEY: &str = "audit key";
/// The name under which the claim signing key's directory is protected
/// (the audit key's, by default).
pub const CLAIM_KEY: &str = "claim signing key";
/// The name under which the directory claims are written to is protected.
pub const CLAIMS: &str = "claims directory";
/// Moat's state directory (where the audit key is made by default).
pub const STATE_DIR: &str = "state directory (the audit key)";
/// Moat's data directory (the package and component store).
pub const DATA_DIR: &str = "data directory (the package store)";
/// Moat's configuration directory.
pub const CONFIG_DIR: &str = "configuration directory";

impl Protected {
    /// Whether it holds one of Moat's keys (the cache's or the audit log's).
    fn holds_a_key(&self) -> bool {
        self.what == CACHE
            || self.what == AUDIT_KEY
            || self.what == CLAIM_KEY
            || self.what == STATE_DIR
    }

    /// Whether it is one of Moat's own directories.
    fn is_a_dir(&self) -> bool {
        self.what == DATA_DIR || self.what == CONFIG_DIR
    }
}

/// What a grant Moat makes without the user listing it (an executable's
/// installation root, an interpreter's, the executable and interpreter
/// files themselves) must keep clear of: whatever holds a key (the cache,
/// the audit key), Moat's own state, data, cache and configuration
/// directories, and the home directory and `$HOME/.local` as wholes. Such a root may lie inside the
/// data directory (an install in the store), never around it, and never
/// inside anything that holds a key.
#[derive(Clone, Debug, Default)]
pub struct Kept {
    items: Vec<Protected>,
    home: Option<PathBuf>,
}

impl Kept {
    /// `protected` and `home` alone (what the tests choose).
    pub fn new(protected: &[Protected], home: Option<PathBuf>) -> Self {
        Self {
            items: protected.to_vec(),
            home,
        }
    }

    /// `protected`, Moat's own directories as this process finds them
    /// ([`crate::dirs`]), and `$HOME`.
    pub fn from_env(protected: &[Protected]) -> Self {
        let mut kept = Self::new(
            protected,
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(PathBuf::from),
        );
        let own = [
            (STATE_DIR, crate::dirs::state()),
            (CACHE, crate::dirs::cache()),
            (DATA_DIR, crate::dirs::data()),
            (CONFIG_DIR, crate::dirs::config()),
        ];
        for (what, path) in own {
            if let Some(path) = path {
                kept.items.push(Protected { what, path });
            }
        }
        kept
    }

    /// Why `path` may not be granted implicitly, or `None` when it may.
    pub fn refusal(&self, path: &Path) -> Option<String> {
        let real_path = real(path);
        if real_path.parent().is_none() {
            return Some("it is the root directory".to_owned());
        }
        if let Some(home) = &self.home {
            let home = real(home);
            if real_path == home {
                return Some(format!("it is the home directory {}", home.display()));
            }
            if real_path == home.join(".local") {
                return Some(format!(
                    "it is {} as a whole, where Moat and other programs keep their state",
                    home.join(".local").display()
                ));
            }
        }
        // Implicit grants are read-only: reading the config, lock or log
        // does no harm (as for `measure` paths); reading a key, or
        // anything of Moat's directories, is refused.
        for item in self
            .items
            .iter()
            .filter(|p| p.holds_a_key() || p.is_a_dir())
        {
            let kept = real(&item.path);
            if kept.starts_with(&real_path) {
                return Some(format!(
                    "it holds Moat's {} at {}",
                    item.what,
                    item.path.display()
                ));
            }
            if item.holds_a_key() && real_path.starts_with(&kept) {
                return Some(format!(
                    "it lies inside Moat's {} at {}",
                    item.what,
                    item.path.display()
                ));
            }
        }
        None
    }

    /// Refuses an implicit file grant (an executable, an interpreter) of
    /// `server` that lies inside, or is, something holding a key.
    pub fn check_file(&self, server: &str, path: &Path) -> Result<(), GrantError> {
        let real_path = real(path);
        for item in self.items.iter().filter(|p| p.holds_a_key()) {
            let kept = real(&item.path);
            if real_path.starts_with(&kept) || kept.starts_with(&real_path) {
                return Err(GrantError::Protected {
                    server: server.to_owned(),
                    path: path.to_owned(),
                    what: item.what,
                    protected: item.path.clone(),
                });
            }
        }
        Ok(())
    }
}

/// `path` with `.` and `..` taken out lexically, then resolved through
/// whatever part of it exists (so a file not made yet is still compared by
/// its real directory).
fn real(path: &Path) -> PathBuf {
    let mut lexical = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                lexical.pop();
            }
            Component::CurDir => {}
            other => lexical.push(other),
        }
    }
    let mut missing = Vec::new();
    let mut existing = lexical.as_path();
    loop {
        if let Ok(found) = std::fs::canonicalize(existing) {
            let mut out = found;
            out.extend(missing.iter().rev());
            return out;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name.to_owned());
                existing = parent;
            }
            _ => return lexical,
        }
    }
}

/// Refuses any grant of `server` that overlaps a protected path: the same
/// path, one inside the other either way. `readable` are the other paths
/// the server is given to read (a native server's `measure` paths): they
/// may not overlap what holds a key, since a key read is a key stolen.
pub fn check_protected(
    server: &str,
    dirs: &[DirGrant],
    readable: &[PathBuf],
    protected: &[Protected],
) -> Result<(), GrantError> {
    let granted = dirs
        .iter()
        .map(|d| (&d.host, true))
        .chain(readable.iter().map(|p| (p, false)));
    for (path, is_grant) in granted {
        let real_path = real(path);
        // Reading the config, lock or log does no harm; reading a key does.
        for item in protected.iter().filter(|p| is_grant || p.holds_a_key()) {
            let kept = real(&item.path);
            if real_path.starts_with(&kept) || kept.starts_with(&real_path) {
                return Err(GrantError::Protected {
                    server: server.to_owned(),
                    path: path.clone(),
                    what: item.what,
                    protected: item.path.clone(),
                });
            }
        }
    }
    Ok(())
}

/// What a server runs or measures, which no `rw` grant may overlap.
#[derive(Clone, Debug)]
pub struct Runs<'a> {
    /// The server's name.
    pub server: &'a str,
    /// Its resolved executable (none when it does not resolve yet).
    pub executable: Option<&'a Path>,
    /// Its `#!` interpreter, when the executable is a script.
    pub interpreter: Option<&'a Path>,
    /// Its `measure` paths.
    pub measure: &'a [PathBuf],
}

/// Refuses any of `writable` (server, `rw` grant) that overlaps what
/// `runs` names: the same path, or one inside the other either way, after
/// `.`, `..` and links are resolved as far as the paths exist. The error
/// names both servers and both paths.
pub fn check_runs(runs: &Runs<'_>, writable: &[Writer]) -> Result<(), GrantError> {
    let files = runs
        .executable
        .map(|e| ("executable", e))
        .into_iter()
        .chain(runs.interpreter.map(|i| ("#! interpreter", i)))
        .chain(runs.measure.iter().map(|m| ("measure path", m.as_path())));
    for (what, path) in files {
        let real_path = real(path);
        for writer in writable {
            let grant = real(&writer.grant);
            if real_path.starts_with(&grant) || grant.starts_with(&real_path) {
                return Err(GrantError::OverRun {
                    writer: writer.server.clone(),
                    grant: writer.grant.clone(),
                    server: runs.server.to_owned(),
                    what,
                    path: path.to_owned(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grants::DirMode;

    fn grant(host: PathBuf) -> DirGrant {
        DirGrant {
            host,
            guest: "/data".into(),
            mode: DirMode::Ro,
            inode: None,
        }
    }

    #[test]
    fn overlap_is_refused_either_way_and_through_dot_dot() {
        let root = tempfile::tempdir().unwrap();
        let cache = root.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        let protected = [Protected {
            what: "compiled-component cache",
            path: cache.clone(),
        }];
        for host in [
            root.path().to_owned(),
            cache.clone(),
            cache.join("inner"),
            root.path().join("other/../cache"),
        ] {
            let error = check_protected("s", &[grant(host.clone())], &[], &protected).unwrap_err();
            assert!(
                matches!(
                    &error,
                    GrantError::Protected {
                        what: "compiled-component cache",
                        ..
                    }
                ),
                "{host:?}: {error}"
            );
        }
        std::fs::create_dir(root.path().join("cached")).unwrap();
        check_protected("s", &[grant(root.path().join("cached"))], &[], &protected)
            .expect("a sibling whose name shares a prefix is not inside");
        assert!(
            check_protected("s", &[], &[root.path().to_owned()], &protected).is_err(),
            "a measure path over the cache is refused too"
        );
    }
}

//! `dirs` grants: a directory (or file) of the host, read-only or
//! read-write. Opened once per launch, without following a link anywhere in
//! its path, and that descriptor is what the sandbox rule (native) or the
//! preopen (wasm) is made from. A server with write access somewhere cannot
//! swap a granted path for a link to somewhere else: the open refuses the
//! link. The inode that was opened is what `moat lock` records, and under
//! the lock a grant whose inode changed is refused before the server starts.

#[cfg(unix)]
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[cfg(unix)]
use super::GrantError;

/// One `[[servers.NAME.dirs]]` grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirGrant {
    /// The directory on the host (absolute).
    pub host: PathBuf,
    /// Where a wasm guest sees it (native servers see `host`).
    pub guest: String,
    /// Read-only or read-write.
    pub mode: DirMode,
    /// The inode `moat lock` saw at `host`; set from the lock when one is
    /// enforced, and a grant opened to another inode is refused.
    pub inode: Option<u64>,
}

/// Access to a granted directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DirMode {
    /// Read files and list directories.
    Ro,
    /// Also create, write, rename and remove.
    Rw,
}

impl DirMode {
    /// Whether the server may create, write, rename and remove there.
    pub fn writable(self) -> bool {
        self == Self::Rw
    }

    /// `rw` when `write`, else `ro`.
    pub fn of(write: bool) -> Self {
        if write { Self::Rw } else { Self::Ro }
    }
}

/// `ro` or `rw`, as `moat.toml` spells it.
impl std::fmt::Display for DirMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Ro => "ro",
            Self::Rw => "rw",
        })
    }
}

impl DirGrant {
    /// A native server's read-write grant of `host`, seen where it is (a
    /// `moat learn` run's writable directories).
    pub fn native_rw(host: &Path) -> Self {
        Self {
            host: host.to_owned(),
            guest: host.display().to_string(),
            mode: DirMode::Rw,
            inode: None,
        }
    }

    /// One `[[servers.NAME.dirs]]` entry of `server` as written, its
    /// `host` resolved against `base`: a wasm server must say where it
    /// sees the directory (`guest`); a native one sees it where it is.
    pub fn from_entry(
        server: &str,
        base: &Path,
        host: &str,
        guest: Option<String>,
        mode: DirMode,
        wasm: bool,
    ) -> Result<Self, String> {
        let guest = match (guest, wasm) {
            (Some(guest), _) => guest,
            (None, false) => host.to_owned(),
            (None, true) => {
                return Err(format!(
                    "server `{server}`: dirs: a wasm server needs `guest`, the path it sees"
                ));
            }
        };
        if !guest.starts_with('/') {
            return Err(format!(
                "server `{server}`: dirs: guest {guest:?} must be an absolute path"
            ));
        }
        Ok(Self {
            host: base.join(host),
            guest,
            mode,
            inode: None,
        })
    }

    /// How `moat inspect` and the sandbox report name it: `HOST (ro)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.host.display(), self.mode)
    }
}

/// Pins each of `dirs` to the inode `moat lock` recorded for its host
/// path (`locked`, by path as written in the lock), so that opening one
/// that was replaced since is refused. The first grant the lock does not
/// know is the error.
pub fn pin(
    dirs: &mut [DirGrant],
    locked: &std::collections::BTreeMap<String, u64>,
) -> Result<(), PathBuf> {
    for dir in dirs {
        let inode = locked
            .get(&dir.host.display().to_string())
            .ok_or_else(|| dir.host.clone())?;
        dir.inode = Some(*inode);
    }
    Ok(())
}

/// The package a file belongs to: the nearest directory above it holding
/// `package.json`, `pyproject.toml` or `setup.py`, else its directory:
/// what a grant covering that file should open.
pub fn package_root(file: &Path) -> PathBuf {
    file.ancestors()
        .skip(1)
        .find(|dir| {
            ["package.json", "pyproject.toml", "setup.py"]
                .iter()
                .any(|marker| dir.join(marker).is_file())
        })
        .or_else(|| file.parent())
        .unwrap_or(file)
        .to_owned()
}

/// One `rw` grant of a server, as [`crate::config::ServerSpec::writers`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Writer {
    /// The server it is granted to.
    pub server: String,
    /// The granted path.
    pub grant: PathBuf,
}

#[cfg(unix)]
/// A grant opened for one launch.
#[derive(Debug)]
pub struct OpenedGrant {
    pub grant: DirGrant,
    /// An `O_PATH` descriptor of what was granted.
    pub fd: OwnedFd,
    /// The inode behind `fd`.
    pub inode: u64,
    /// Whether it is a directory.
    pub dir: bool,
}

#[cfg(unix)]
impl OpenedGrant {
    /// A path that reaches exactly the opened inode, whatever happens to
    /// the granted path afterwards (for APIs that take a path).
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

#[cfg(unix)]
/// Opens every grant of `server` once, refusing links and, where the lock
/// pinned an inode, a grant whose inode changed.
pub fn open_all(server: &str, dirs: &[DirGrant]) -> Result<Vec<OpenedGrant>, GrantError> {
    dirs.iter().map(|dir| open(server, dir)).collect()
}

#[cfg(unix)]
/// Opens one grant: `O_PATH`, no link followed in any component.
pub fn open(server: &str, grant: &DirGrant) -> Result<OpenedGrant, GrantError> {
    let path = &grant.host;
    let error = |syscall, source| GrantError::Open {
        server: server.to_owned(),
        path: path.clone(),
        syscall,
        source,
    };
    let fd = open_no_links(path).map_err(|errno| {
        if errno == rustix::io::Errno::LOOP
            && let Some((link, target)) = first_link(path)
        {
            return GrantError::Link {
                server: server.to_owned(),
                path: path.clone(),
                link,
                target,
                real: std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()),
            };
        }
        error("openat2(RESOLVE_NO_SYMLINKS)", errno.into())
    })?;
    let stat = rustix::fs::fstat(&fd).map_err(|errno| error("fstat", errno.into()))?;
    let inode = stat.st_ino;
    if let Some(locked) = grant.inode
        && locked != inode
    {
        return Err(GrantError::Changed {
            server: server.to_owned(),
            path: path.clone(),
            locked,
            now: inode,
        });
    }
    Ok(OpenedGrant {
        grant: grant.clone(),
        fd,
        inode,
        dir: rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Directory,
    })
}

#[cfg(target_os = "linux")]
fn open_no_links(path: &Path) -> rustix::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
}

#[cfg(not(target_os = "linux"))]
fn open_no_links(path: &Path) -> rustix::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    if first_link(path).is_some() {
        return Err(rustix::io::Errno::LOOP);
    }
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

#[cfg(unix)]
/// The first component of `path` that is a link, and its text.
fn first_link(path: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut walked = PathBuf::new();
    for part in path.components() {
        walked.push(part);
        if let Ok(target) = std::fs::read_link(&walked) {
            return Some((walked, target));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(host: PathBuf) -> DirGrant {
        DirGrant {
            host,
            guest: "/data".into(),
            mode: DirMode::Ro,
            inode: None,
        }
    }

    #[test]
    fn a_link_anywhere_in_the_path_is_refused_and_named() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("real/docs")).unwrap();
        std::os::unix::fs::symlink(root.path().join("real"), root.path().join("work")).unwrap();
        let error = open("s", &grant(root.path().join("work/docs"))).unwrap_err();
        match error {
            GrantError::Link { link, real, .. } => {
                assert_eq!(link, root.path().join("work"));
                assert_eq!(
                    real,
                    std::fs::canonicalize(root.path().join("real/docs")).unwrap()
                );
            }
            other => panic!("{other}"),
        }
        let opened = open("s", &grant(root.path().join("real/docs"))).unwrap();
        assert!(opened.dir);
        let mut pinned = grant(root.path().join("real/docs"));
        pinned.inode = Some(opened.inode + 1);
        assert!(matches!(
            open("s", &pinned).unwrap_err(),
            GrantError::Changed { .. }
        ));
    }
}

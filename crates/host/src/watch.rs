//! Watching the config and its lock for `moat serve --watch`: this module
//! owns the inotify object and the thread that reads it. Editors and
//! `moat lock` replace a file by rename as often as they write it in place,
//! so the directories are watched and each event is matched by file name.
//! A Kubernetes ConfigMap or Secret volume changes every file at once by
//! renaming its `..data` link (the kubelet's atomic writer): that rename
//! counts as a change of every watched file in the directory.

use std::path::{Path, PathBuf};

use tokio::sync::mpsc;

/// Why watching could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("--watch: {syscall}({path}): {source}")]
    Syscall {
        syscall: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--watch: {0} names no file")]
    NoFileName(String),
    #[error("--watch needs inotify, which only Linux has; send SIGHUP to reload instead")]
    Unsupported,
}

/// The link a Kubernetes volume's files resolve through, renamed over to
/// change them all at once.
const ATOMIC_WRITER_LINK: &[u8] = b"..data";

/// The directory `file` is in (`.` for a bare name).
fn directory_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Starts watching `files`: each time one of them is written and closed,
/// renamed into place, renamed away or removed, its path is sent. The
/// watching thread lives as long as the process, and stops sending once
/// the receiver is gone.
#[cfg(target_os = "linux")]
pub fn watch(files: &[PathBuf]) -> Result<mpsc::UnboundedReceiver<PathBuf>, WatchError> {
    use std::os::unix::ffi::OsStrExt;

    use rustix::fs::inotify::{self, WatchFlags};

    let fd = inotify::init(inotify::CreateFlags::CLOEXEC).map_err(|e| WatchError::Syscall {
        syscall: "inotify_init1",
        path: String::new(),
        source: e.into(),
    })?;
    let mut watched = Vec::new();
    for file in files {
        let dir = directory_of(file);
        let name = file
            .file_name()
            .ok_or_else(|| WatchError::NoFileName(file.display().to_string()))?
            .as_bytes()
            .to_vec();
        let wd = inotify::add_watch(
            &fd,
            &dir,
            WatchFlags::CLOSE_WRITE
                | WatchFlags::MOVED_TO
                | WatchFlags::MOVED_FROM
                | WatchFlags::DELETE
                | WatchFlags::ONLYDIR,
        )
        .map_err(|e| WatchError::Syscall {
            syscall: "inotify_add_watch",
            path: dir.display().to_string(),
            source: e.into(),
        })?;
        watched.push((wd, name, file.clone()));
    }
    let (changes, received) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("moat-watch".into())
        .spawn(move || {
            let mut buffer = [std::mem::MaybeUninit::uninit(); 4096];
            let mut events = inotify::Reader::new(&fd, &mut buffer);
            loop {
                let event = match events.next() {
                    Ok(event) => event,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(error) => {
                        tracing::error!(%error, "--watch: read(inotify) failed; no longer watching");
                        return;
                    }
                };
                let Some(name) = event.file_name() else {
                    continue;
                };
                let swapped = name.to_bytes() == ATOMIC_WRITER_LINK;
                for (wd, watched_name, path) in &watched {
                    if *wd == event.wd()
                        && (swapped || name.to_bytes() == watched_name.as_slice())
                        && changes.send(path.clone()).is_err()
                    {
                        return;
                    }
                }
            }
        })
        .map_err(|source| WatchError::Syscall {
            syscall: "clone (spawning the watch thread)",
            path: String::new(),
            source,
        })?;
    Ok(received)
}

/// Starts watching `files` (not built on this system).
#[cfg(not(target_os = "linux"))]
pub fn watch(files: &[PathBuf]) -> Result<mpsc::UnboundedReceiver<PathBuf>, WatchError> {
    let _ = files.iter().map(|f| directory_of(f));
    Err(WatchError::Unsupported)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A write in place and a rename into place are both seen, and a
    /// neighbour in the same directory is not.
    #[tokio::test]
    async fn writes_and_renames_of_the_watched_files_are_sent_and_others_not() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("moat.toml");
        let lock = dir.path().join("moat.lock");
        std::fs::write(&config, "").unwrap();
        let mut changes = watch(&[config.clone(), lock.clone()]).unwrap();
        std::fs::write(dir.path().join("neighbour"), "x").unwrap();
        std::fs::write(&config, "[servers]").unwrap();
        assert_eq!(changes.recv().await.unwrap(), config);
        let staged = dir.path().join(".moat.lock.new");
        std::fs::write(&staged, "version = 1").unwrap();
        std::fs::rename(&staged, &lock).unwrap();
        assert_eq!(changes.recv().await.unwrap(), lock);
        std::fs::remove_file(&config).unwrap();
        assert_eq!(changes.recv().await.unwrap(), config);
        assert!(changes.try_recv().is_err(), "nothing else was sent");
    }

    /// A ConfigMap volume as the kubelet writes it: each file a link
    /// through `..data` to a timestamped directory; an update makes a new
    /// directory and renames a new `..data` link over the old one.
    #[tokio::test]
    async fn a_kubernetes_volume_update_is_a_change_of_every_watched_file() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("..2026_12_06_01");
        std::fs::create_dir(&first).unwrap();
        std::fs::write(first.join("moat.lock"), "version = 1").unwrap();
        symlink("..2026_12_06_01", dir.path().join("..data")).unwrap();
        let lock = dir.path().join("moat.lock");
        symlink("..data/moat.lock", &lock).unwrap();
        let mut changes = watch(std::slice::from_ref(&lock)).unwrap();
        let second = dir.path().join("..2026_12_06_02");
        std::fs::create_dir(&second).unwrap();
        std::fs::write(second.join("moat.lock"), "version = 2").unwrap();
        assert!(changes.try_recv().is_err(), "nothing changed yet");
        symlink("..2026_12_06_02", dir.path().join("..data_tmp")).unwrap();
        std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
        let seen = tokio::time::timeout(std::time::Duration::from_secs(10), changes.recv())
            .await
            .expect("the swap of ..data was seen as a change of moat.lock");
        assert_eq!(seen.unwrap(), lock);
        assert_eq!(std::fs::read_to_string(&lock).unwrap(), "version = 2");
    }

    #[test]
    fn a_missing_directory_is_named_with_the_syscall() {
        let error = watch(&["/nonexistent-moat-dir/moat.toml".into()]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--watch: inotify_add_watch(/nonexistent-moat-dir): No such file or directory (os error 2)"
        );
    }
}

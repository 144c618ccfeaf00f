//! Moat's per-user secret keys: the compiled-component cache's MAC key, the
//! audit log's, and the claim signing key's seed. Each is 32 random bytes in
//! a file of its own, made once with `O_EXCL` and mode 0600 in a directory
//! of mode 0700, read only if it is a regular file owned by this user that
//! no other user can read or write (no link followed). Servers cannot
//! reach them: a grant that overlaps the directory holding one is refused.

use std::io::{Read, Write};
use std::path::Path;

use hmac::Mac;
use sha2::Sha256;

/// Bytes in a key (and in an HMAC-SHA256).
pub const KEY_BYTES: usize = 32;

/// A secret key.
#[derive(Clone, Copy)]
pub struct Key([u8; KEY_BYTES]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// The key's bytes (the claim signing key's Ed25519 seed).
    pub fn secret_bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }

    /// A fresh HMAC-SHA256 under this key.
    pub fn mac(&self) -> hmac::Hmac<Sha256> {
        <hmac::Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .expect("HMAC-SHA256 takes a key of any length")
    }

    /// HMAC-SHA256 of `parts`, in order, as lowercase hex.
    pub fn mac_hex(&self, parts: &[&[u8]]) -> String {
        let mut mac = self.mac();
        for part in parts {
            mac.update(part);
        }
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether `expected_hex` is the MAC of `parts`, compared in constant
    /// time.
    pub fn verify_hex(&self, parts: &[&[u8]], expected_hex: &str) -> bool {
        let Ok(expected) = hex::decode(expected_hex) else {
            return false;
        };
        let mut mac = self.mac();
        for part in parts {
            mac.update(part);
        }
        mac.verify_slice(&expected).is_ok()
    }
}

/// Opens `path` for reading without following a link, refusing a file
/// that is not regular or that another user owns.
pub fn open_private(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        options.custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32);
        let file = options.open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() || meta.uid() != rustix::process::geteuid().as_raw() {
            return Err(std::io::Error::other(
                "not a regular file owned by this user",
            ));
        }
        Ok(file)
    }
    #[cfg(not(unix))]
    options.open(path)
}

/// Reads `path` whole through [`open_private`].
pub fn read_private(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_private(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Writes `bytes` to `path` through a file beside it (mode 0600, no link
/// followed) renamed into place, so a reader sees the old file or the new
/// one, never half of one.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let (tmp, mut file) = create_beside(path)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A new file (mode 0600, made with `O_EXCL`, no link followed) beside
/// `path`, under a name no other writer in this process or another uses at
/// the same time: the process id and a counter of this process's own. Two
/// threads of one process that shared a name would truncate, link or remove
/// each other's half-written file.
fn create_beside(path: &Path) -> std::io::Result<(std::path::PathBuf, std::fs::File)> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".{}.{n}.tmp", std::process::id()));
        let tmp = std::path::PathBuf::from(tmp);
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options
                .mode(0o600)
                .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32);
        }
        match options.open(&tmp) {
            // Left by a process of the same id that died mid-write.
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
            opened => return opened.map(|file| (tmp, file)),
        }
    }
}

/// The key `name` in `dir`: read, or made there (with `dir`, mode 0700)
/// when there is none. Two processes making it at once agree on one.
pub fn user_key(dir: &Path, name: &str) -> std::io::Result<Key> {
    std::fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let path = dir.join(name);
    loop {
        match read_key(&path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            found => return found,
        }
        let mut key = [0u8; KEY_BYTES];
        getrandom::fill(&mut key).map_err(|e| std::io::Error::other(e.to_string()))?;
        // Written whole under a name of this writer's own, then linked
        // into place: a reader never sees half a key, and of two writers
        // (processes or threads) making one at once, the second link fails
        // and reads the first.
        let (tmp, mut file) = create_beside(&path)?;
        let written = file.write_all(&key).and_then(|()| file.sync_all());
        let linked = written.and_then(|()| std::fs::hard_link(&tmp, &path));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => return Ok(Key(key)),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
        }
    }
}

/// Reads the key `name` in `dir`, never making one (for checking what was
/// made with it).
pub fn existing_key(dir: &Path, name: &str) -> std::io::Result<Key> {
    read_key(&dir.join(name))
}

/// The key in the file at `path` (see [`open_private`]), which no other
/// user may read or write: a key another could read signs or MACs for
/// whoever read it.
fn read_key(path: &Path) -> std::io::Result<Key> {
    let mut file = open_private(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = file.metadata()?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{} has mode {mode:04o}: a key must be readable by its owner only (chmod 600 it, or remove it to make a new one)",
                    path.display()
                ),
            ));
        }
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    <[u8; KEY_BYTES]>::try_from(bytes.as_slice())
        .map(Key)
        .map_err(|_| {
            std::io::Error::other(format!("{} is not a {KEY_BYTES}-byte key", path.display()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads of one process making the same key at once all get it, and
    /// all get the same one (the audit log and the cache are opened from
    /// many tasks; a temp name shared by the threads made one of them fail
    /// with "No such file or directory").
    #[test]
    fn threads_making_one_key_at_once_agree_on_it() {
        const THREADS: usize = 16;
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let dir = dir.path().join(format!("keys{round}"));
            let start = std::sync::Barrier::new(THREADS);
            let keys: Vec<Key> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..THREADS)
                    .map(|_| {
                        scope.spawn(|| {
                            start.wait();
                            user_key(&dir, "k")
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap().unwrap())
                    .collect()
            });
            assert!(keys.iter().all(|k| k.0 == keys[0].0), "round {round}");
            let left: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(left, ["k"], "round {round}: only the key is left");
        }
    }

    /// A key file other users could read is refused, not used.
    #[cfg(unix)]
    #[test]
    fn a_key_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        user_key(dir.path(), "k").unwrap();
        let path = dir.path().join("k");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = user_key(dir.path(), "k").unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::PermissionDenied);
        assert_eq!(
            error.to_string(),
            format!(
                "{} has mode 0644: a key must be readable by its owner only (chmod 600 it, or remove it to make a new one)",
                path.display()
            )
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        user_key(dir.path(), "k").unwrap();
    }

    /// Threads writing one private file at once each replace it whole.
    #[test]
    fn threads_writing_one_file_at_once_leave_one_whole_copy() {
        const THREADS: usize = 16;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let start = std::sync::Barrier::new(THREADS);
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (start, path) = (&start, &path);
                scope.spawn(move || {
                    start.wait();
                    write_private(path, &[t as u8; 4096]).unwrap();
                });
            }
        });
        let bytes = read_private(&path).unwrap();
        assert_eq!(bytes.len(), 4096);
        assert!(bytes.iter().all(|b| *b == bytes[0]));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}

//! Moat's per-user secret keys: the compiled-component cache's MAC key and
//! the audit log's. Each is 32 random bytes in a file of its own, made once
//! with `O_EXCL` and mode 0600 in a directory of mode 0700, read only if it
//! is a regular file owned by this user (no link followed). Servers cannot
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
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32);
    }
    {
        use std::io::Write;
        options.open(&tmp)?.write_all(bytes)?;
    }
    std::fs::rename(&tmp, path)
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
        // Written whole under a name of this process's, then linked into
        // place: a reader never sees half a key, and of two processes
        // making one at once, the second link fails and reads the first.
        let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let written = options.open(&tmp).and_then(|mut file| {
            file.write_all(&key)?;
            file.sync_all()
        });
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

/// The key in the file at `path` (see [`read_private`]).
fn read_key(path: &Path) -> std::io::Result<Key> {
    let bytes = read_private(path)?;
    <[u8; KEY_BYTES]>::try_from(bytes.as_slice())
        .map(Key)
        .map_err(|_| {
            std::io::Error::other(format!("{} is not a {KEY_BYTES}-byte key", path.display()))
        })
}

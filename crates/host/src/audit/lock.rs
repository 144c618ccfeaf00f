//! The writer's lock on a log (see the module's doc).

use std::os::fd::AsRawFd;
use std::path::Path;

use super::AuditError;

/// Byte 0: the open-file-description lock that keeps other writers out.
const WRITER: i64 = 0;
/// Byte 1: the POSIX lock whose holder's pid `F_GETLK` reports.
const PID: i64 = 1;

fn one_byte(at: i64, kind: libc::c_int) -> libc::flock {
    // SAFETY: `flock` is plain integers; all zeroes is a valid value
    // (and `l_pid` must be 0 for an open-file-description lock).
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = at;
    lock.l_len = 1;
    lock
}

fn fcntl(
    file: &std::fs::File,
    command: libc::c_int,
    lock: &mut libc::flock,
) -> std::io::Result<()> {
    // SAFETY: the descriptor is borrowed from `file`, open for the call;
    // `lock` is a valid `flock` that the kernel may write back to.
    let done = unsafe { libc::fcntl(file.as_raw_fd(), command, std::ptr::from_mut(lock)) };
    if done == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Takes the writer's lock on `file` (the log at `path`), held until
/// the file is closed; refused with the holder's pid when another
/// writer has it.
pub(super) fn exclusive(file: &std::fs::File, path: &Path) -> Result<(), AuditError> {
    let mut lock = one_byte(WRITER, libc::F_WRLCK);
    match fcntl(file, libc::F_OFD_SETLK, &mut lock) {
        Ok(()) => Ok(()),
        Err(error) if matches!(error.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => {
            Err(AuditError::Locked {
                path: path.to_owned(),
                pid: holder(file),
            })
        }
        Err(source) => Err(AuditError::Io {
            path: path.to_owned(),
            operation: "locking it for writing (F_OFD_SETLK)",
            source,
        }),
    }
}

/// The pid holding byte 1, if another process does.
fn holder(file: &std::fs::File) -> Option<u32> {
    let mut lock = one_byte(PID, libc::F_WRLCK);
    fcntl(file, libc::F_GETLK, &mut lock).ok()?;
    (lock.l_type != libc::F_UNLCK as libc::c_short && lock.l_pid > 0).then_some(lock.l_pid as u32)
}

/// Takes byte 1 with a POSIX lock, so that a second writer learns this
/// process's pid. Best effort: the writer's lock is byte 0's.
pub(super) fn name_holder(file: &std::fs::File, path: &Path) {
    let mut lock = one_byte(PID, libc::F_WRLCK);
    if let Err(error) = fcntl(file, libc::F_SETLK, &mut lock) {
        tracing::warn!(path = %path.display(), %error, "audit log: the pid lock (F_SETLK) failed; a second writer will not be told this pid");
    }
}

//! What a stopped call names: its arguments read from the kernel's
//! `ptrace_syscall_info`, paths and addresses read from the server's
//! memory and made absolute, recorded as uses, and the names it may change
//! returned to settle when it returns.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{Observed, Stamp, Use};

/// The kernel's `struct ptrace_syscall_info` for a seccomp stop.
#[repr(C)]
#[derive(Default)]
struct SyscallInfo {
    op: u8,
    pad: [u8; 3],
    arch: u32,
    instruction_pointer: u64,
    stack_pointer: u64,
    nr: u64,
    args: [u64; 6],
    ret_data: u32,
    reserved: u32,
}

/// A name that a watched call may change, until the call returns.
pub(super) struct Change {
    pub(super) path: PathBuf,
    pub(super) kind: ChangeKind,
}

pub(super) enum ChangeKind {
    /// Opened for writing: what it was before, for [`Observed::settle`].
    Open(Option<Stamp>),
    /// Made, removed, renamed, linked or truncated: changed if the call
    /// succeeds.
    Direct,
}

/// Reads up to `len` bytes at `address` in `pid`'s memory, page by page,
/// stopping early at a NUL when `string`.
fn read_memory(pid: i32, address: u64, len: usize, string: bool) -> Vec<u8> {
    const PAGE: u64 = 4096;
    let mut out = Vec::new();
    let mut at = address;
    while out.len() < len {
        let room = (PAGE - at % PAGE).min((len - out.len()) as u64) as usize;
        let mut buf = vec![0u8; room];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: room,
        };
        let remote = libc::iovec {
            iov_base: at as *mut libc::c_void,
            iov_len: room,
        };
        // SAFETY: copies from the tracee into `buf`, which has `room` bytes.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            break;
        }
        let n = n as usize;
        if string && let Some(end) = buf[..n].iter().position(|b| *b == 0) {
            out.extend_from_slice(&buf[..end]);
            return out;
        }
        out.extend_from_slice(&buf[..n]);
        at += n as u64;
    }
    out
}

fn read_path(pid: i32, address: u64) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let bytes = read_memory(pid, address, 4096, true);
    (!bytes.is_empty()).then(|| PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

/// `path` as the process `pid` names it relative to `dirfd`, absolute.
fn absolute(pid: i32, dirfd: i64, path: PathBuf) -> Option<PathBuf> {
    if path.is_absolute() {
        return Some(path);
    }
    let base = if dirfd == libc::AT_FDCWD as i64 {
        std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?
    } else {
        std::fs::read_link(format!("/proc/{pid}/fd/{dirfd}")).ok()?
    };
    Some(base.join(path))
}

/// The host's name for what `path` reaches: canonical when it exists; for
/// a name being made, its canonical directory joined with the name.
fn on_host(path: &Path, making: bool) -> Option<PathBuf> {
    if let Ok(real) = std::fs::canonicalize(path) {
        return Some(real);
    }
    if making {
        let parent = std::fs::canonicalize(path.parent()?).ok()?;
        return Some(parent.join(path.file_name()?));
    }
    None
}

/// How a watched call uses one name.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Naming {
    Read,
    /// Opened for writing (write access, `O_CREAT` or `O_TRUNC`).
    Open,
    /// Made, removed, renamed, linked or truncated by name.
    Change,
}

/// Records the names the call `pid` is stopped in uses; returns those it
/// may change, to settle when it returns.
pub(super) fn record(pid: i32, observed: &Mutex<Observed>) -> Vec<Change> {
    let mut info = SyscallInfo::default();
    // SAFETY: the kernel writes at most `size_of::<SyscallInfo>()` bytes
    // into `info`.
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_GET_SYSCALL_INFO,
            pid,
            std::mem::size_of::<SyscallInfo>() as *mut libc::c_void,
            &mut info as *mut SyscallInfo as *mut libc::c_void,
        )
    };
    if rc <= 0 {
        return Vec::new();
    }
    let nr = info.nr as libc::c_long;
    let a = info.args;
    let at_cwd = libc::AT_FDCWD as i64;
    let opens = |flags: u64| {
        let flags = flags as i32;
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & (libc::O_CREAT | libc::O_TRUNC) != 0
        {
            Naming::Open
        } else {
            Naming::Read
        }
    };
    use Naming::{Change as Changes, Read};
    // (dirfd, path address, how)
    let named: Vec<(i64, u64, Naming)> = match nr {
        libc::SYS_open => vec![(at_cwd, a[0], opens(a[1]))],
        libc::SYS_openat => vec![(a[0] as i64, a[1], opens(a[2]))],
        libc::SYS_openat2 => {
            // struct open_how { u64 flags; u64 mode; u64 resolve; }
            let how = read_memory(pid, a[2], 8, false);
            let flags = how
                .get(..8)
                .map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])));
            vec![(a[0] as i64, a[1], opens(flags))]
        }
        libc::SYS_creat => vec![(at_cwd, a[0], Naming::Open)],
        libc::SYS_execve => vec![(at_cwd, a[0], Read)],
        libc::SYS_execveat => vec![(a[0] as i64, a[1], Read)],
        libc::SYS_mkdir | libc::SYS_mknod | libc::SYS_unlink | libc::SYS_rmdir => {
            vec![(at_cwd, a[0], Changes)]
        }
        libc::SYS_truncate => vec![(at_cwd, a[0], Changes)],
        libc::SYS_mkdirat | libc::SYS_mknodat | libc::SYS_unlinkat => {
            vec![(a[0] as i64, a[1], Changes)]
        }
        libc::SYS_rename | libc::SYS_link => {
            vec![(at_cwd, a[0], Changes), (at_cwd, a[1], Changes)]
        }
        // The link is made; what it points to is only text.
        libc::SYS_symlink => vec![(at_cwd, a[1], Changes)],
        libc::SYS_symlinkat => vec![(a[1] as i64, a[2], Changes)],
        libc::SYS_renameat | libc::SYS_renameat2 => {
            vec![(a[0] as i64, a[1], Changes), (a[2] as i64, a[3], Changes)]
        }
        // linkat(olddirfd, oldpath, newdirfd, newpath): the old name is
        // only read.
        libc::SYS_linkat => vec![(a[0] as i64, a[1], Read), (a[2] as i64, a[3], Changes)],
        libc::SYS_connect => {
            record_connect(pid, a[1], a[2], observed);
            Vec::new()
        }
        _ => Vec::new(),
    };
    let mut changes = Vec::new();
    for (dirfd, address, how) in named {
        let Some(path) = read_path(pid, address).and_then(|p| absolute(pid, dirfd, p)) else {
            continue;
        };
        let Some(real) = on_host(&path, how != Read) else {
            continue;
        };
        match how {
            Read => {
                let mut seen = observed.lock().unwrap_or_else(|e| e.into_inner());
                seen.note(
                    real,
                    Use {
                        read: true,
                        ..Use::default()
                    },
                );
            }
            Naming::Open => {
                let before = Stamp::of(&real);
                changes.push(Change {
                    path: real,
                    kind: ChangeKind::Open(before),
                });
            }
            Changes => changes.push(Change {
                path: real,
                kind: ChangeKind::Direct,
            }),
        }
    }
    changes
}

fn record_connect(pid: i32, address: u64, len: u64, observed: &Mutex<Observed>) {
    let bytes = read_memory(pid, address, (len as usize).min(128), false);
    if bytes.len() < 2 {
        return;
    }
    let family = u16::from_ne_bytes([bytes[0], bytes[1]]) as i32;
    let port = |b: &[u8]| u16::from_be_bytes([b[2], b[3]]);
    let mut seen = observed.lock().unwrap_or_else(|e| e.into_inner());
    match family {
        libc::AF_INET if bytes.len() >= 8 => {
            let ip = std::net::Ipv4Addr::new(bytes[4], bytes[5], bytes[6], bytes[7]);
            seen.connects.insert(format!("{ip}:{}", port(&bytes)));
        }
        libc::AF_INET6 if bytes.len() >= 24 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&bytes[8..24]);
            let ip = std::net::Ipv6Addr::from(octets);
            seen.connects.insert(format!("[{ip}]:{}", port(&bytes)));
        }
        libc::AF_UNIX if bytes.len() > 2 && bytes[2] != 0 => {
            use std::os::unix::ffi::OsStrExt;
            let end = bytes[2..]
                .iter()
                .position(|b| *b == 0)
                .map_or(bytes.len(), |e| e + 2);
            let path = Path::new(std::ffi::OsStr::from_bytes(&bytes[2..end]));
            seen.unix.insert(path.to_owned());
        }
        _ => {}
    }
}

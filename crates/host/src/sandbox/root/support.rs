//! Whether this kernel lets a server have a root of its own, found once per
//! process by building a small one in a trial child.

use std::os::fd::AsRawFd;
use std::sync::OnceLock;

use super::build::errno;

/// Why this kernel cannot give a server a root of its own: the system call,
/// the path and the errno of the first step that failed in a trial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    pub syscall: &'static str,
    pub path: &'static str,
    pub errno: i32,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.syscall,
            self.path,
            std::io::Error::from_raw_os_error(self.errno)
        )
    }
}

/// The trial's steps: (system call, path).
const TRIAL: [(&str, &str); 8] = [
    ("write", "/proc/self/uid_map"),
    ("mount(MS_REC|MS_PRIVATE)", "/"),
    ("mount(tmpfs)", "/tmp"),
    ("mkdir", "/tmp/proc"),
    ("mount(proc)", "/tmp/proc"),
    ("pivot_root", "/tmp"),
    ("umount2(MNT_DETACH)", "the host's root"),
    ("clone", "(new user, mount and PID namespaces)"),
];

/// Whether a server can have a root of its own here, found once per process
/// by building a small one in a child (in a user namespace when `user`).
pub fn support(user: bool) -> Result<(), Unsupported> {
    static SUPPORT: OnceLock<Result<(), Unsupported>> = OnceLock::new();
    SUPPORT.get_or_init(|| trial(user)).clone()
}

fn trial(user: bool) -> Result<(), Unsupported> {
    let failed = |step: usize, errno: i32| Unsupported {
        syscall: TRIAL[step].0,
        path: TRIAL[step].1,
        errno,
    };
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let uid_map = format!("{uid} {uid} 1\n");
    let gid_map = format!("{gid} {gid} 1\n");
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| failed(7, e.raw_os_error()))?;
    let mut flags = libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::SIGCHLD;
    if user {
        flags |= libc::CLONE_NEWUSER;
    }
    let write_fd = write.as_raw_fd();
    // SAFETY: a fork-like clone (no CLONE_VM): the child has its own copy of
    // memory, runs only raw system calls on memory prepared above and
    // leaves with `_exit`.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        // SAFETY: the freshly cloned child; see above.
        unsafe {
            let report = |step: u32| -> ! {
                let mut buf = [0u8; 8];
                buf[..4].copy_from_slice(&step.to_le_bytes());
                buf[4..].copy_from_slice(&errno().to_le_bytes());
                libc::write(write_fd, buf.as_ptr().cast(), 8);
                libc::_exit(1)
            };
            let write_file = |path: &std::ffi::CStr, bytes: &[u8]| {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, bytes.as_ptr().cast(), bytes.len()) < 0 {
                    report(0);
                }
                libc::close(fd);
            };
            if user {
                write_file(c"/proc/self/setgroups", b"deny");
                write_file(c"/proc/self/uid_map", uid_map.as_bytes());
                write_file(c"/proc/self/gid_map", gid_map.as_bytes());
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                report(1);
            }
            if libc::mount(
                c"tmpfs".as_ptr(),
                c"/tmp".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=0755,size=65536".as_ptr().cast(),
            ) != 0
            {
                report(2);
            }
            if libc::mkdir(c"/tmp/proc".as_ptr(), 0o555) != 0 {
                report(3);
            }
            if libc::mount(
                c"proc".as_ptr(),
                c"/tmp/proc".as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ) != 0
            {
                report(4);
            }
            if libc::chdir(c"/tmp".as_ptr()) != 0
                || libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) != 0
            {
                report(5);
            }
            if libc::umount2(c".".as_ptr(), libc::MNT_DETACH) != 0 {
                report(6);
            }
            libc::_exit(0)
        }
    }
    if pid < 0 {
        return Err(failed(7, errno()));
    }
    drop(write);
    let mut buf = [0u8; 8];
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::io::read(&read, &mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child just made; `status` is a valid pointer.
    unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::__WALL) };
    if filled < buf.len() {
        return Ok(());
    }
    let step = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let errno = i32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    Err(failed(step.min(TRIAL.len() - 1), errno))
}

//! The child's side of a server's own root: [`build`] makes what the plan
//! lists on a fresh tmpfs and pivots into it; [`seal`] makes it read-only.
//! Raw system calls on memory prepared before the clone, no allocation.

use super::{Entry, MAX_SOURCES, RootPlan, RootStep, Source};

/// A failed step of [`build`]: the step, the entry it was at (if any) and
/// the errno.
pub type Failure = (RootStep, Option<usize>, i32);

pub(super) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The flags of a mount (`stat` from statvfs) that a read-only remount of
/// a bind must keep: the kernel refuses a remount that would drop a
/// locked nosuid, nodev, noexec or atime flag.
pub(crate) fn kept_mount_flags(stat: &libc::statvfs) -> libc::c_ulong {
    [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ]
    .iter()
    .filter(|(st, _)| stat.f_flag & st != 0)
    .fold(0, |flags, (_, ms)| flags | ms)
}

/// `/proc/self/fd/N` for `fd`, written into `buf` with its NUL, without
/// allocating (it runs between clone and exec).
pub(crate) fn fd_path(fd: i32, buf: &mut [u8; 32]) -> *const libc::c_char {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 12];
    let mut n = fd.unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[PREFIX.len() + i] = digits[len - 1 - i];
    }
    buf[PREFIX.len() + len] = 0;
    buf.as_ptr().cast()
}

/// Remounts the mount at `target` read-only, keeping the flags the kernel
/// locked on it (nosuid, nodev, noexec, atime).
///
/// # Safety
///
/// Only in the cloned child, in its own mount namespace.
unsafe fn remount_read_only(target: &std::ffi::CStr) -> bool {
    // SAFETY: raw system calls on a NUL-terminated path and a stack struct.
    unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(target.as_ptr(), &mut stat) != 0 {
            return false;
        }
        let kept = kept_mount_flags(&stat);
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | kept,
            std::ptr::null(),
        ) == 0
    }
}

/// Builds `plan` and pivots into it; the host's root is detached. The
/// caller then covers what it must (resolv.conf) and calls [`seal`].
///
/// # Safety
///
/// Only in the freshly cloned child, in its own mount namespace (made
/// private), with its own PID namespace: raw system calls on memory
/// prepared before the clone, no allocation.
pub(crate) unsafe fn build(plan: &RootPlan) -> Result<(), Failure> {
    // SAFETY: every call is a raw system call on NUL-terminated strings and
    // stack memory prepared before the clone; see the contract.
    unsafe {
        let at = |step: RootStep, index: usize| (step, Some(index), errno());
        // Every source is opened while the host's /tmp is still visible.
        let mut fds = [-1i32; MAX_SOURCES];
        let mut opened = 0;
        for (index, entry) in plan.entries.iter().enumerate() {
            let Entry::Bind { source, .. } = entry else {
                continue;
            };
            let fd = match source {
                Source::Path(path) => libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC),
                Source::Checked { path, dev, ino } => {
                    /// struct open_how of openat2(2).
                    #[repr(C)]
                    struct OpenHow {
                        flags: u64,
                        mode: u64,
                        resolve: u64,
                    }
                    const RESOLVE_NO_SYMLINKS: u64 = 0x04;
                    let how = OpenHow {
                        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
                        mode: 0,
                        resolve: RESOLVE_NO_SYMLINKS,
                    };
                    let fd = libc::syscall(
                        libc::SYS_openat2,
                        libc::AT_FDCWD,
                        path.as_ptr(),
                        &how as *const OpenHow,
                        std::mem::size_of::<OpenHow>(),
                    ) as libc::c_int;
                    let mut stat: libc::stat = std::mem::zeroed();
                    if fd >= 0
                        && (libc::fstat(fd, &mut stat) != 0
                            || stat.st_dev != *dev
                            || stat.st_ino != *ino)
                    {
                        // Not what was granted: refused, as ESTALE.
                        return Err((RootStep::Source, Some(index), libc::ESTALE));
                    }
                    fd
                }
            };
            if fd < 0 || opened == MAX_SOURCES {
                return Err(at(RootStep::Source, index));
            }
            fds[opened] = fd;
            opened += 1;
        }
        if libc::mount(
            c"tmpfs".as_ptr(),
            plan.base.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            c"mode=0755,size=1048576".as_ptr().cast(),
        ) != 0
        {
            return Err((RootStep::Mount, None, errno()));
        }
        let mut next = 0;
        for (index, entry) in plan.entries.iter().enumerate() {
            let made = |result: libc::c_int| result == 0 || errno() == libc::EEXIST;
            match entry {
                Entry::Dir(target) => {
                    if !made(libc::mkdir(target.as_ptr(), 0o755)) {
                        return Err(at(RootStep::Place, index));
                    }
                }
                Entry::File(target) => {
                    if !made(make_file(target)) {
                        return Err(at(RootStep::Place, index));
                    }
                }
                Entry::Symlink { link, target } => {
                    if !made(libc::symlink(target.as_ptr(), link.as_ptr())) {
                        return Err(at(RootStep::Place, index));
                    }
                }
                Entry::Tmpfs {
                    target,
                    options,
                    flags,
                } => {
                    if !made(libc::mkdir(target.as_ptr(), 0o755)) {
                        return Err(at(RootStep::Place, index));
                    }
                    if libc::mount(
                        c"tmpfs".as_ptr(),
                        target.as_ptr(),
                        c"tmpfs".as_ptr(),
                        *flags,
                        options.as_ptr().cast(),
                    ) != 0
                    {
                        return Err(at(RootStep::Mount, index));
                    }
                }
                Entry::Proc(target) => {
                    if !made(libc::mkdir(target.as_ptr(), 0o555)) {
                        return Err(at(RootStep::Place, index));
                    }
                    if libc::mount(
                        c"proc".as_ptr(),
                        target.as_ptr(),
                        c"proc".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(at(RootStep::Proc, index));
                    }
                }
                Entry::Bind {
                    target,
                    dir,
                    writable,
                    ..
                } => {
                    next += 1;
                    let fd = fds[next - 1];
                    let result = if *dir {
                        libc::mkdir(target.as_ptr(), 0o755)
                    } else {
                        make_file(target)
                    };
                    if !made(result) {
                        return Err(at(RootStep::Place, index));
                    }
                    let mut path = [0u8; 32];
                    if libc::mount(
                        fd_path(fd, &mut path),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(at(RootStep::Bind, index));
                    }
                    libc::close(fd);
                    if !*writable && !remount_read_only(target) {
                        return Err(at(RootStep::ReadOnly, index));
                    }
                }
            }
        }
        // The new root becomes / and the host's is stacked beneath it, then
        // detached (pivot_root(".", ".")).
        if libc::chdir(plan.base.as_ptr()) != 0
            || libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) != 0
        {
            return Err((RootStep::Pivot, None, errno()));
        }
        if libc::umount2(c".".as_ptr(), libc::MNT_DETACH) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
            return Err((RootStep::Detach, None, errno()));
        }
        Ok(())
    }
}

/// After [`build`] (and whatever the caller mounts in the new root): makes
/// `/dev` and `/` read-only and enters the working directory.
///
/// # Safety
///
/// As [`build`], after it.
pub(crate) unsafe fn seal(plan: &RootPlan) -> Result<(), Failure> {
    // SAFETY: raw system calls on NUL-terminated strings; see the contract.
    unsafe {
        for target in &plan.read_only {
            if !remount_read_only(target) {
                return Err((RootStep::ReadOnly, None, errno()));
            }
        }
        if libc::chdir(plan.cwd.as_ptr()) != 0 {
            return Err((RootStep::Place, None, errno()));
        }
        Ok(())
    }
}

/// An empty file at `target` (0 or -1 with errno).
///
/// # Safety
///
/// Only in the cloned child.
unsafe fn make_file(target: &std::ffi::CStr) -> libc::c_int {
    // SAFETY: a NUL-terminated path; the descriptor is closed at once.
    unsafe {
        let fd = libc::open(
            target.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        );
        if fd >= 0 {
            libc::close(fd);
        }
        fd.min(0)
    }
}

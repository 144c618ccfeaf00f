//! Mounts the child makes over what the host shows it: Moat's resolv.conf
//! and a script's sealed copy, each bound read-only.

use std::ffi::c_char;
use std::os::fd::RawFd;

use crate::native::contain::namespaces::ScriptBind;

use super::{Step, errno, fail};

/// What a server behind the egress proxy finds in /etc/resolv.conf.
const RESOLV_CONF: &[u8] = b"# Moat answers DNS here, for the names in this server's `net` only.\nnameserver 127.0.0.1\noptions attempts:1 timeout:2\n";

/// `/proc/self/fd/N` for `fd`, written into `buf` with its NUL, without
/// allocating.
pub(super) fn fd_path(fd: i32, buf: &mut [u8; 32]) -> *const c_char {
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

/// Covers /etc/resolv.conf with [`RESOLV_CONF`], read-only, through a file
/// in the private /tmp that is unlinked once bound.
///
/// # Safety
///
/// Only in the cloned child, in its own mount namespace, after the private
/// /tmp is mounted.
pub(super) unsafe fn bind_resolv_conf(report: RawFd) {
    // SAFETY: raw system calls on static strings; see the contract.
    unsafe {
        let check = |ok: bool| {
            if !ok {
                fail(report, Step::Resolv, errno());
            }
        };
        let source = c"/tmp/.moat-resolv.conf";
        let file = libc::open(
            source.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
            0o444,
        );
        check(file >= 0);
        let written = libc::write(file, RESOLV_CONF.as_ptr().cast(), RESOLV_CONF.len());
        check(written == RESOLV_CONF.len() as isize);
        libc::close(file);
        let target = c"/etc/resolv.conf";
        check(
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) == 0,
        );
        check(
            libc::mount(
                std::ptr::null(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT
                    | libc::MS_BIND
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV,
                std::ptr::null(),
            ) == 0,
        );
        check(libc::unlink(source.as_ptr()) == 0);
    }
}

/// Copies the sealed script `bind.copy` into a file of the private /tmp,
/// binds it read-only over `bind.target` and unlinks it.
///
/// # Safety
///
/// Only in the cloned child, in its own mount namespace, after the private
/// /tmp is mounted.
pub(super) unsafe fn bind_script(bind: &ScriptBind, report: RawFd) {
    // SAFETY: raw system calls on a static string, the prepared target and
    // stack memory; see the contract.
    unsafe {
        let check = |ok: bool| {
            if !ok {
                fail(report, Step::BindScript, errno());
            }
        };
        let source = c"/tmp/.moat-script";
        let file = libc::open(
            source.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
            0o444,
        );
        check(file >= 0);
        let mut offset: libc::off_t = 0;
        loop {
            let sent = libc::sendfile(file, bind.copy, &mut offset, 1 << 20);
            if sent < 0 && errno() == libc::EINTR {
                continue;
            }
            check(sent >= 0);
            if sent == 0 {
                break;
            }
        }
        libc::close(file);
        check(
            libc::mount(
                source.as_ptr(),
                bind.target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) == 0,
        );
        check(
            libc::mount(
                std::ptr::null(),
                bind.target.as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT
                    | libc::MS_BIND
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV,
                std::ptr::null(),
            ) == 0,
        );
        check(libc::unlink(source.as_ptr()) == 0);
    }
}

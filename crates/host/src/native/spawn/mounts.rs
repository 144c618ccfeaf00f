//! Mounts the child makes over what the host shows it: Moat's resolv.conf
//! and a script's sealed copy, each bound read-only.

use std::os::fd::RawFd;

use crate::native::contain::namespaces::ScriptBind;

use super::{Step, errno, fail};

/// What a server behind the egress proxy finds in /etc/resolv.conf.
const RESOLV_CONF: &[u8] = b"# Moat answers DNS here, for the names in this server's `net` only.\nnameserver 127.0.0.1\noptions attempts:1 timeout:2\n";

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
        check(bind_read_only(source.as_ptr(), target.as_ptr()));
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
        check(bind_read_only(source.as_ptr(), bind.target.as_ptr()));
        check(libc::unlink(source.as_ptr()) == 0);
    }
}

/// Binds `source` over `target` and remounts the bind read-only, nosuid and
/// nodev; false if either call failed (errno says why).
///
/// # Safety
///
/// Only in the cloned child, in its own mount namespace; both are
/// NUL-terminated paths.
unsafe fn bind_read_only(source: *const libc::c_char, target: *const libc::c_char) -> bool {
    // SAFETY: two mount(2) calls on the caller's paths; see the contract.
    unsafe {
        libc::mount(
            source,
            target,
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        ) == 0
            && libc::mount(
                std::ptr::null(),
                target,
                std::ptr::null(),
                libc::MS_REMOUNT
                    | libc::MS_BIND
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV,
                std::ptr::null(),
            ) == 0
    }
}

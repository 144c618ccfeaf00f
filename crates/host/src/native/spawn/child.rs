//! The child, between clone and exec: every containment step in a fixed
//! order, raw system calls only.

use std::ffi::c_char;

use crate::native::contain::namespaces::MAX_BINDS;

use super::mounts::{bind_resolv_conf, bind_script};
use super::sockets::hand_over_listener;
use super::{ChildFds, ChildPlan, Step, close_range, errno, fail, fail_at, write_proc};
use crate::sandbox::root::fd_path;

/// The child, between clone and exec. Never returns.
///
/// # Safety
///
/// Only in the freshly cloned child: raw system calls on memory prepared
/// before the clone, no allocation, no locks.
pub(super) unsafe fn child(
    plan: &ChildPlan,
    fds: &ChildFds,
    argv: &[*const c_char],
    envp: &[*const c_char],
) -> ! {
    let report = fds.report;
    // SAFETY: every call below is a raw system call on this process, with
    // pointers into memory prepared before the clone; see the function's
    // contract.
    unsafe {
        let check = |ok: bool, step: Step| {
            if !ok {
                fail(report, step, errno());
            }
        };
        for (from, to) in [(fds.stdin, 0), (fds.stdout, 1), (fds.stderr, 2)] {
            check(libc::dup2(from, to) == to, Step::Stdio);
        }
        libc::close(fds.life_write);
        if let Some(gate_write) = fds.gate_write {
            libc::close(gate_write);
        }
        check(
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) == 0,
            Step::DeathSignal,
        );
        // Moat holds the other end until this child has exec'd; a hang-up
        // means Moat died before the death signal was armed.
        let mut poll = libc::pollfd {
            fd: fds.life,
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut poll, 1, 0) > 0 && poll.revents & libc::POLLHUP != 0 {
            fail(report, Step::ParentGone, libc::ESRCH);
        }
        // The working directory is entered before /tmp is replaced, so a
        // working directory under the host's /tmp stays reachable.
        check(libc::chdir(plan.cwd.as_ptr()) == 0, Step::Chdir);
        if let Some(ns) = &plan.namespaces {
            if let Some((uid_map, gid_map)) = &ns.user {
                write_proc(c"/proc/self/setgroups", b"deny", report, Step::Setgroups);
                write_proc(c"/proc/self/uid_map", uid_map, report, Step::UidMap);
                write_proc(c"/proc/self/gid_map", gid_map, report, Step::GidMap);
            }
            if let Some(proxy) = &plan.proxy {
                hand_over_listener(proxy, report);
            }
            check(
                libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) == 0,
                Step::MountPrivate,
            );
            if let Some(root) = &ns.root {
                let failed = |(step, entry, errno): crate::sandbox::root::Failure| {
                    fail_at(
                        report,
                        Step::of_root(step),
                        errno,
                        entry.map_or(u32::MAX, |e| e as u32),
                    )
                };
                if let Err(failure) = crate::sandbox::root::build(root) {
                    failed(failure);
                }
                if ns.resolv {
                    bind_resolv_conf(report);
                }
                // The script's sealed copy over its path in the new root,
                // through the root's private /tmp, before / is sealed.
                if let Some(script) = &ns.script {
                    bind_script(script, report);
                }
                if let Err(failure) = crate::sandbox::root::seal(root) {
                    failed(failure);
                }
            } else if let Some(options) = &ns.tmp {
                // Open every granted path under /tmp while it is still
                // visible, in this mount namespace.
                let mut bound = [-1i32; MAX_BINDS];
                for (slot, bind) in bound.iter_mut().zip(&ns.binds) {
                    *slot = libc::open(bind.target.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                    check(*slot >= 0, Step::BindGrant);
                }
                check(
                    libc::mount(
                        c"tmpfs".as_ptr(),
                        c"/tmp".as_ptr(),
                        c"tmpfs".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV,
                        options.as_ptr().cast(),
                    ) == 0,
                    Step::MountTmp,
                );
                for (fd, bind) in bound.iter().zip(&ns.binds) {
                    for parent in &bind.parents {
                        let made = libc::mkdir(parent.as_ptr(), 0o755);
                        check(made == 0 || errno() == libc::EEXIST, Step::BindGrant);
                    }
                    let made = if bind.dir {
                        libc::mkdir(bind.target.as_ptr(), 0o755)
                    } else {
                        let file = libc::open(
                            bind.target.as_ptr(),
                            // EEXIST when an outer bind (read-only, maybe)
                            // already shows the file.
                            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                            0o644,
                        );
                        if file >= 0 {
                            libc::close(file);
                        }
                        file.min(0)
                    };
                    check(made == 0 || errno() == libc::EEXIST, Step::BindGrant);
                    let mut source = [0u8; 32];
                    check(
                        libc::mount(
                            fd_path(*fd, &mut source),
                            bind.target.as_ptr(),
                            std::ptr::null(),
                            libc::MS_BIND | libc::MS_REC,
                            std::ptr::null(),
                        ) == 0,
                        Step::BindGrant,
                    );
                    libc::close(*fd);
                    if !bind.writable {
                        // A remount must keep the flags the kernel locked
                        // on the source mount (nosuid, nodev, noexec, atime).
                        let mut stat: libc::statvfs = std::mem::zeroed();
                        check(
                            libc::statvfs(bind.target.as_ptr(), &mut stat) == 0,
                            Step::BindReadOnly,
                        );
                        let kept = crate::sandbox::root::kept_mount_flags(&stat);
                        check(
                            libc::mount(
                                std::ptr::null(),
                                bind.target.as_ptr(),
                                std::ptr::null(),
                                libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | kept,
                                std::ptr::null(),
                            ) == 0,
                            Step::BindReadOnly,
                        );
                    }
                }
                if ns.resolv {
                    bind_resolv_conf(report);
                }
                if let Some(script) = &ns.script {
                    bind_script(script, report);
                }
            }
        }
        check(libc::setpgid(0, 0) == 0, Step::ProcessGroup);
        for (resource, limit) in &plan.rlimits {
            check(
                rustix::process::setrlimit(*resource, *limit).is_ok(),
                Step::Rlimit,
            );
        }
        check(
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0,
            Step::NoNewPrivs,
        );
        if let Some((ruleset, proc_self, tmp)) = plan.landlock {
            let tmp = plan
                .namespaces
                .as_ref()
                .and_then(|ns| ns.tmp.as_ref())
                .map(|_| tmp);
            let resolv = plan.namespaces.as_ref().is_some_and(|ns| ns.resolv);
            let script = plan
                .namespaces
                .as_ref()
                .filter(|ns| ns.tmp.is_some())
                .and_then(|ns| ns.script.as_ref())
                .map(|script| script.target.as_c_str());
            // In a root of its own, /proc is the server's PID namespace's.
            let proc = if plan.namespaces.as_ref().is_some_and(|ns| ns.root.is_some()) {
                c"/proc"
            } else {
                c"/proc/self"
            };
            if let Err(error) =
                crate::sandbox::restrict_child(ruleset, proc, proc_self, tmp, resolv, script)
            {
                fail(report, Step::Landlock, error.raw_os_error().unwrap_or(0));
            }
        }
        // The measured descriptor (a script's sealed copy) stays open
        // across exec, so a script's interpreter can read it through
        // /proc/self/fd/N where it is not bound over the script's path.
        check(
            libc::fcntl(plan.executable, libc::F_SETFD, 0) == 0,
            Step::CloseDescriptors,
        );
        // Nothing but 0, 1, 2 and the measured executable survives exec (the
        // report pipe is close-on-exec and goes at exec).
        let mut keep = [
            plan.executable as u32,
            plan.interpreter.map_or(u32::MAX, |i| i as u32),
            report as u32,
            fds.gate.map_or(u32::MAX, |g| g as u32),
        ];
        keep.sort_unstable();
        let mut from = 3u32;
        for fd in keep.into_iter().filter(|fd| *fd != u32::MAX) {
            check(
                close_range(from, fd.saturating_sub(1)),
                Step::CloseDescriptors,
            );
            from = fd + 1;
        }
        check(close_range(from, u32::MAX), Step::CloseDescriptors);
        if plan.drop_bounding {
            let mut cap = 0;
            while libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) >= 0 {
                check(
                    libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) == 0,
                    Step::BoundingSet,
                );
                cap += 1;
            }
            // SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP and SECBIT_KEEP_CAPS off,
            // each locked: uid 0 never regains capabilities at exec.
            const SECUREBITS: libc::c_ulong = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 3) | (1 << 5);
            check(
                libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0) == 0,
                Step::Securebits,
            );
        }
        check(
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            ) == 0,
            Step::AmbientSet,
        );
        #[repr(C)]
        struct CapHeader {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        struct CapData {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let header = CapHeader {
            version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
            pid: 0,
        };
        let data = [
            CapData {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            },
            CapData {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            },
        ];
        check(
            libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) == 0,
            Step::Capset,
        );
        if let Some(gate) = fds.gate {
            // Wait for Moat (the learn run's tracer) before going on. The
            // gate was kept through the descriptor sweep above: close it now.
            let mut byte = 0u8;
            if libc::read(gate, (&mut byte as *mut u8).cast(), 1) != 1 {
                fail(report, Step::ParentGone, libc::ESRCH);
            }
            libc::close(gate);
        }
        for program in &plan.seccomp {
            if let Err(error) = crate::sandbox::seccomp::install(program) {
                fail(report, Step::Seccomp, error.raw_os_error().unwrap_or(0));
            }
        }
        libc::execve(plan.path.as_ptr(), argv.as_ptr(), envp.as_ptr());
        fail(report, Step::Execve, errno())
    }
}

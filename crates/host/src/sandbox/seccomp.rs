//! The seccomp deny-list of a native server: system calls an MCP server
//! never needs, in the spirit of the container runtimes' default profiles.
//!
//! Built in the parent with `seccompiler` (Firecracker's compiler, no
//! hand-assembled BPF); the child installs the programs between fork and exec
//! with [`install`], which makes raw system calls only. Everything not listed
//! is allowed: this is a deny-list that closes the kernel surfaces a hostile
//! server would use to break out (tracing, kernel programs, keyrings, mounts,
//! new namespaces, raw sockets), not an allow-list of what a runtime may do.
//!
//! Socket families are the exception: an allow-list. `socket` opens only
//! AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK with NETLINK_ROUTE (which
//! glibc's `getifaddrs`, `if_nameindex` and `getaddrinfo`'s AI_ADDRCONFIG,
//! libuv and Go read interfaces through), and `socketpair` only AF_UNIX;
//! any other family, present or future (AF_VSOCK, AF_ALG, AF_PACKET,
//! AF_BLUETOOTH, AF_XDP, AF_KEY, AF_TIPC, AF_CAN, AF_RDS, other netlink
//! protocols, ...), is answered EAFNOSUPPORT, what a kernel built without
//! that family answers, so software that probes for one takes the path it
//! already has for its absence. Those rules are a filter of their own, since
//! a filter has one errno; the two filters never match the same call.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Why the filter could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp: no filter for this architecture ({arch}): {detail}")]
    Arch { arch: &'static str, detail: String },
    #[error("seccomp: building the {filter} filter: {detail}")]
    Build {
        filter: &'static str,
        detail: String,
    },
}

/// System calls refused with EPERM, whatever their arguments.
const DENIED: &[(&str, libc::c_long)] = &[
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("open_tree", libc::SYS_open_tree),
    ("move_mount", libc::SYS_move_mount),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("syslog", libc::SYS_syslog),
    ("acct", libc::SYS_acct),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("quotactl", libc::SYS_quotactl),
    // io_uring runs operations that seccomp never sees; runtimes that try it
    // (libuv) fall back to plain system calls when it is refused.
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
];

/// `clone` flags that make a new namespace: refused, so a server cannot
/// build itself a user namespace with capabilities in it.
const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    0x80, // CLONE_NEWTIME
];

/// The address families `socket` may open (AF_NETLINK only with
/// [`NETLINK_PROTOCOLS`]); any other is refused with EAFNOSUPPORT.
const FAMILIES: &[(&str, i32)] = &[
    ("AF_UNIX", libc::AF_UNIX),
    ("AF_INET", libc::AF_INET),
    ("AF_INET6", libc::AF_INET6),
    ("AF_NETLINK", libc::AF_NETLINK),
];

/// The netlink protocols `socket(AF_NETLINK, ...)` may open: the routing
/// family, to read interfaces and addresses (of the server's own network
/// namespace when it has one; without capabilities, it changes nothing).
const NETLINK_PROTOCOLS: &[(&str, i32)] = &[("NETLINK_ROUTE", libc::NETLINK_ROUTE)];

/// The socket types AF_INET and AF_INET6 may open; any other (SOCK_RAW, and
/// SOCK_PACKET, which the kernel turns into an AF_PACKET socket) is refused
/// with EPERM. The type's low bits, past SOCK_NONBLOCK and SOCK_CLOEXEC.
const INET_TYPES: &[i32] = &[libc::SOCK_STREAM, libc::SOCK_DGRAM];

/// The filters to install, in order, and the lines that describe them.
#[derive(Clone, Debug)]
pub struct Filters {
    /// BPF programs, installed one after the other.
    pub programs: Vec<BpfProgram>,
    /// What they deny, for the evidence.
    pub summary: String,
}

fn arch() -> Result<TargetArch, SeccompError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|error: seccompiler::BackendError| SeccompError::Arch {
            arch: std::env::consts::ARCH,
            detail: error.to_string(),
        })
}

fn condition(arg: u8, op: SeccompCmpOp, value: u64) -> SeccompCondition {
    // Arguments 0..=5 and these operators are always valid.
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
        .unwrap_or_else(|_| unreachable!("seccomp argument {arg} is in range"))
}

fn rule(conditions: Vec<SeccompCondition>) -> SeccompRule {
    SeccompRule::new(conditions).unwrap_or_else(|_| unreachable!("a rule has conditions"))
}

/// The deny-list and the socket-family allow-list for a native server.
/// `deny_unix_sockets`: also refuse
/// `socket(AF_UNIX, ...)` (pathname and abstract sockets both; `socketpair`
/// stays allowed, since it reaches nothing outside the server).
pub fn filters(deny_unix_sockets: bool) -> Result<Filters, SeccompError> {
    let arch = arch()?;
    let build = |filter: &'static str| {
        move |error: seccompiler::BackendError| SeccompError::Build {
            filter,
            detail: error.to_string(),
        }
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED
        .iter()
        .map(|(_, number)| (*number, Vec::new()))
        .collect();
    rules.insert(
        libc::SYS_clone,
        NAMESPACE_FLAGS
            .iter()
            .map(|flag| rule(vec![condition(0, SeccompCmpOp::MaskedEq(*flag), *flag)]))
            .collect(),
    );
    // In AF_INET and AF_INET6, each type (the low four bits) not listed:
    // seccomp compares a masked argument only for equality.
    let mut sockets: Vec<SeccompRule> = [libc::AF_INET, libc::AF_INET6]
        .into_iter()
        .flat_map(|family| {
            (0..=0xf)
                .filter(|kind| !INET_TYPES.contains(kind))
                .map(move |kind| {
                    rule(vec![
                        condition(0, SeccompCmpOp::Eq, family as u64),
                        condition(1, SeccompCmpOp::MaskedEq(0xf), kind as u64),
                    ])
                })
        })
        .collect();
    if deny_unix_sockets {
        sockets.push(rule(vec![condition(
            0,
            SeccompCmpOp::Eq,
            libc::AF_UNIX as u64,
        )]));
    }
    rules.insert(libc::SYS_socket, sockets);
    let deny = SeccompFilter::new(
        with_x32(rules),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(build("deny-list"))?;
    // clone3 passes its flags in memory that seccomp cannot read: it is
    // answered "not implemented", so C libraries fall back to clone, whose
    // flags the filter above checks.
    let clone3 = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(build("clone3"))?;
    let families = SeccompFilter::new(
        with_x32(family_rules()),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EAFNOSUPPORT as u32),
        arch,
    )
    .map_err(build("socket families"))?;
    let programs = vec![
        BpfProgram::try_from(deny).map_err(build("deny-list"))?,
        BpfProgram::try_from(clone3).map_err(build("clone3"))?,
        BpfProgram::try_from(families).map_err(build("socket families"))?,
    ];
    let names: Vec<&str> = DENIED.iter().map(|(name, _)| *name).collect();
    let families: Vec<&str> = FAMILIES.iter().map(|(name, _)| *name).collect();
    let netlink: Vec<&str> = NETLINK_PROTOCOLS.iter().map(|(name, _)| *name).collect();
    let summary = format!(
        "seccomp: EPERM for {}, clone with namespace flags, socket({}AF_INET or AF_INET6 of a type but SOCK_STREAM and SOCK_DGRAM: raw and packet sockets); EAFNOSUPPORT for socket in any family but {} (netlink: {} only) and socketpair in any but AF_UNIX (AF_VSOCK, AF_ALG, AF_PACKET, AF_BLUETOOTH, AF_XDP, ... and families yet to come); clone3 answers ENOSYS",
        names.join(", "),
        if deny_unix_sockets { "AF_UNIX; " } else { "" },
        families.join(", "),
        netlink.join(", "),
    );
    Ok(Filters { programs, summary })
}

/// The socket-family allow-list, as rules that match what it refuses.
fn family_rules() -> BTreeMap<i64, Vec<SeccompRule>> {
    // A family not listed: one rule, "not this one" for each listed.
    let other_family = rule(
        FAMILIES
            .iter()
            .map(|(_, family)| condition(0, SeccompCmpOp::Ne, *family as u64))
            .collect(),
    );
    // Netlink with a protocol not listed.
    let mut netlink = vec![condition(0, SeccompCmpOp::Eq, libc::AF_NETLINK as u64)];
    netlink.extend(
        NETLINK_PROTOCOLS
            .iter()
            .map(|(_, protocol)| condition(2, SeccompCmpOp::Ne, *protocol as u64)),
    );
    [
        (libc::SYS_socket, vec![other_family, rule(netlink)]),
        (
            libc::SYS_socketpair,
            vec![rule(vec![condition(
                0,
                SeccompCmpOp::Ne,
                libc::AF_UNIX as u64,
            )])],
        ),
    ]
    .into()
}

/// `rules`, and on x86_64 the same rules for the x32 ABI's numbers: the
/// same calls are reachable there (the number with bit 30 set, under the
/// same audit architecture) where a kernel has it.
fn with_x32(rules: BTreeMap<i64, Vec<SeccompRule>>) -> BTreeMap<i64, Vec<SeccompRule>> {
    #[cfg(target_arch = "x86_64")]
    let rules = {
        const X32: i64 = 0x4000_0000;
        let mut rules = rules;
        let x32: Vec<(i64, Vec<SeccompRule>)> = rules
            .iter()
            .map(|(number, chain)| (number | X32, chain.clone()))
            .collect();
        rules.extend(x32);
        rules
    };
    rules
}

/// Installs `program` on the calling thread. Raw system calls on memory
/// prepared before the fork: safe between fork and exec. no_new_privs must
/// already be set.
pub fn install(program: &BpfProgram) -> std::io::Result<()> {
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const seccompiler::sock_filter,
    }
    let prog = SockFprog {
        len: u16::try_from(program.len()).unwrap_or(u16::MAX),
        filter: program.as_ptr(),
    };
    // SAFETY: `prog` points at `program`, which outlives the call; the
    // kernel copies the filter and keeps no pointer into our memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0u32,
            &prog as *const SockFprog,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_build_for_this_machine_and_name_what_they_deny() {
        let filters = filters(true).unwrap();
        assert_eq!(filters.programs.len(), 3);
        assert!(filters.programs.iter().all(|p| !p.is_empty()));
        for name in ["ptrace", "bpf", "syslog", "unshare", "mount", "keyctl"] {
            assert!(filters.summary.contains(name), "{}", filters.summary);
        }
        assert!(filters.summary.contains("socket(AF_UNIX; "));
        assert!(
            filters
                .summary
                .contains("EAFNOSUPPORT for socket in any family but AF_UNIX, AF_INET, AF_INET6, AF_NETLINK (netlink: NETLINK_ROUTE only) and socketpair in any but AF_UNIX"),
            "{}",
            filters.summary
        );
        assert!(
            !super::filters(false)
                .unwrap()
                .summary
                .contains("socket(AF_UNIX")
        );
    }

    /// Runs each of `calls` (socket or socketpair: number, family, type,
    /// protocol) in a child that has installed `filters`; their errnos (0
    /// for success).
    fn errnos_under(filters: &Filters, calls: &[(libc::c_long, i32, i32, i32)]) -> Vec<i32> {
        let mut pipe = [-1i32; 2];
        // SAFETY: a pipe into a two-int array.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        // SAFETY: the child makes raw system calls only, on memory prepared
        // before the fork, and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: in the child, see above.
            unsafe {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    libc::_exit(2);
                }
                for program in &filters.programs {
                    if install(program).is_err() {
                        libc::_exit(3);
                    }
                }
                for (number, family, kind, protocol) in calls {
                    let mut pair = [-1i32; 2];
                    let rc = libc::syscall(*number, *family, *kind, *protocol, pair.as_mut_ptr());
                    let errno = if rc < 0 { *libc::__errno_location() } else { 0 };
                    libc::write(pipe[1], (&errno as *const i32).cast(), 4);
                }
                libc::_exit(0);
            }
        }
        // SAFETY: the parent's copy of the write end is ours to close.
        unsafe { libc::close(pipe[1]) };
        let mut status = 0;
        // SAFETY: waits for the child just made.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(status, 0, "the child failed to install the filters");
        let mut bytes = Vec::new();
        use std::io::Read;
        // SAFETY: the read end is ours.
        let mut read = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(pipe[0]) };
        read.read_to_end(&mut bytes).unwrap();
        bytes
            .chunks(4)
            .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn sockets_open_only_in_the_listed_families() {
        const AF_VSOCK: i32 = 40;
        const AF_ALG: i32 = 38;
        const AF_XDP: i32 = 44;
        // Obsolete (libc deprecates it), but the kernel still takes it.
        const SOCK_PACKET: i32 = 10;
        const SOCKET: libc::c_long = libc::SYS_socket;
        const PAIR: libc::c_long = libc::SYS_socketpair;
        let filters = filters(true).unwrap();
        let nonblock = libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
        let refused = [
            (SOCKET, AF_VSOCK, libc::SOCK_STREAM, 0, libc::EAFNOSUPPORT),
            (SOCKET, AF_ALG, libc::SOCK_SEQPACKET, 0, libc::EAFNOSUPPORT),
            (SOCKET, AF_XDP, libc::SOCK_RAW, 0, libc::EAFNOSUPPORT),
            (
                SOCKET,
                libc::AF_PACKET,
                libc::SOCK_RAW,
                0x0300,
                libc::EAFNOSUPPORT,
            ),
            (
                SOCKET,
                libc::AF_BLUETOOTH,
                libc::SOCK_STREAM,
                0,
                libc::EAFNOSUPPORT,
            ),
            (SOCKET, libc::AF_KEY, libc::SOCK_RAW, 2, libc::EAFNOSUPPORT),
            (SOCKET, 1000, libc::SOCK_STREAM, 0, libc::EAFNOSUPPORT),
            (
                SOCKET,
                libc::AF_NETLINK,
                libc::SOCK_RAW,
                libc::NETLINK_AUDIT,
                libc::EAFNOSUPPORT,
            ),
            (
                SOCKET,
                libc::AF_NETLINK,
                nonblock,
                libc::NETLINK_KOBJECT_UEVENT,
                libc::EAFNOSUPPORT,
            ),
            (
                SOCKET,
                libc::AF_NETLINK,
                libc::SOCK_DGRAM,
                libc::NETLINK_SOCK_DIAG,
                libc::EAFNOSUPPORT,
            ),
            (PAIR, AF_VSOCK, libc::SOCK_STREAM, 0, libc::EAFNOSUPPORT),
            (
                PAIR,
                libc::AF_INET,
                libc::SOCK_STREAM,
                0,
                libc::EAFNOSUPPORT,
            ),
            (
                PAIR,
                libc::AF_TIPC,
                libc::SOCK_STREAM,
                0,
                libc::EAFNOSUPPORT,
            ),
            (
                SOCKET,
                libc::AF_INET,
                libc::SOCK_RAW,
                libc::IPPROTO_TCP,
                libc::EPERM,
            ),
            (
                SOCKET,
                libc::AF_INET6,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                58,
                libc::EPERM,
            ),
            (SOCKET, libc::AF_INET, SOCK_PACKET, 0x0300, libc::EPERM),
            (SOCKET, libc::AF_UNIX, libc::SOCK_STREAM, 0, libc::EPERM),
        ];
        let calls: Vec<_> = refused.iter().map(|c| (c.0, c.1, c.2, c.3)).collect();
        let want: Vec<i32> = refused.iter().map(|c| c.4).collect();
        assert_eq!(errnos_under(&filters, &calls), want, "{refused:?}");
        // What stays open: the same answer as without the filters (AF_INET6
        // may be missing from this kernel).
        let open = [
            (
                SOCKET,
                libc::AF_INET,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
            ),
            (SOCKET, libc::AF_INET, nonblock, 0),
            (SOCKET, libc::AF_INET6, libc::SOCK_STREAM, 0),
            (SOCKET, libc::AF_INET6, libc::SOCK_DGRAM, 0),
            (
                SOCKET,
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            ),
            (
                SOCKET,
                libc::AF_NETLINK,
                libc::SOCK_DGRAM,
                libc::NETLINK_ROUTE,
            ),
            (PAIR, libc::AF_UNIX, libc::SOCK_STREAM, 0),
            (PAIR, libc::AF_UNIX, libc::SOCK_DGRAM, 0),
        ];
        let none = Filters {
            programs: Vec::new(),
            summary: String::new(),
        };
        assert_eq!(errnos_under(&filters, &open), errnos_under(&none, &open));
        assert_eq!(errnos_under(&none, &open)[..2], [0, 0]);
    }
}

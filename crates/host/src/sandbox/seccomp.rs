//! The seccomp deny-list of a native server: system calls an MCP server
//! never needs, in the spirit of the container runtimes' default profiles.
//!
//! Built in the parent with `seccompiler` (Firecracker's compiler, no
//! hand-assembled BPF); the child installs the programs between fork and exec
//! with [`install`], which makes raw system calls only. Everything not listed
//! is allowed: this is a deny-list that closes the kernel surfaces a hostile
//! server would use to break out (tracing, kernel programs, keyrings, mounts,
//! new namespaces, packet and raw sockets), not an allow-list of what a
//! runtime may do.

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

/// The deny-list for a native server. `deny_unix_sockets`: also refuse
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
    let mut sockets = vec![
        rule(vec![condition(0, SeccompCmpOp::Eq, libc::AF_PACKET as u64)]),
        // SOCK_RAW in any family; the type's low bits, past the flags.
        rule(vec![condition(
            1,
            SeccompCmpOp::MaskedEq(0xf),
            libc::SOCK_RAW as u64,
        )]),
    ];
    if deny_unix_sockets {
        sockets.push(rule(vec![condition(
            0,
            SeccompCmpOp::Eq,
            libc::AF_UNIX as u64,
        )]));
    }
    rules.insert(libc::SYS_socket, sockets);
    // On x86_64 the same calls are reachable through the x32 ABI (the number
    // with bit 30 set, under the same audit architecture) where a kernel has
    // it: deny those numbers the same way.
    #[cfg(target_arch = "x86_64")]
    {
        const X32: i64 = 0x4000_0000;
        let x32: Vec<(i64, Vec<SeccompRule>)> = rules
            .iter()
            .map(|(number, chain)| (number | X32, chain.clone()))
            .collect();
        rules.extend(x32);
    }
    let deny = SeccompFilter::new(
        rules,
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
    let programs = vec![
        BpfProgram::try_from(deny).map_err(build("deny-list"))?,
        BpfProgram::try_from(clone3).map_err(build("clone3"))?,
    ];
    let names: Vec<&str> = DENIED.iter().map(|(name, _)| *name).collect();
    let summary = format!(
        "seccomp: EPERM for {}, clone with namespace flags, socket({}AF_PACKET, SOCK_RAW); clone3 answers ENOSYS",
        names.join(", "),
        if deny_unix_sockets { "AF_UNIX, " } else { "" }
    );
    Ok(Filters { programs, summary })
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
        assert_eq!(filters.programs.len(), 2);
        assert!(filters.programs.iter().all(|p| !p.is_empty()));
        for name in ["ptrace", "bpf", "syslog", "unshare", "mount", "keyctl"] {
            assert!(filters.summary.contains(name), "{}", filters.summary);
        }
        assert!(filters.summary.contains("AF_UNIX"));
        assert!(!super::filters(false).unwrap().summary.contains("AF_UNIX"));
    }
}

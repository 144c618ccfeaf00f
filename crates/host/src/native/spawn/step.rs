//! The steps of the child, in the order it takes them, and the system call
//! each names in a launch error.

/// The steps of the child, in order. Their names appear in launch errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Step {
    Stdio = 1,
    DeathSignal,
    ParentGone,
    Setgroups,
    UidMap,
    GidMap,
    MountPrivate,
    MountTmp,
    BindGrant,
    Chdir,
    ProcessGroup,
    Rlimit,
    NoNewPrivs,
    Landlock,
    CloseDescriptors,
    BoundingSet,
    Securebits,
    AmbientSet,
    Capset,
    Seccomp,
    Execve,
    ProxyLoopback,
    ProxyListen,
    ProxyHandOver,
    BindReadOnly,
    DnsListen,
    ProxyAlias,
    RelayListen,
    Resolv,
    BindScript,
    RootSource,
    RootMount,
    RootPlace,
    RootBind,
    RootReadOnly,
    RootProc,
    PivotRoot,
    DetachOldRoot,
}

impl Step {
    const ALL: [Step; 38] = [
        Step::Stdio,
        Step::DeathSignal,
        Step::ParentGone,
        Step::Setgroups,
        Step::UidMap,
        Step::GidMap,
        Step::MountPrivate,
        Step::MountTmp,
        Step::BindGrant,
        Step::Chdir,
        Step::ProcessGroup,
        Step::Rlimit,
        Step::NoNewPrivs,
        Step::Landlock,
        Step::CloseDescriptors,
        Step::BoundingSet,
        Step::Securebits,
        Step::AmbientSet,
        Step::Capset,
        Step::Seccomp,
        Step::Execve,
        Step::ProxyLoopback,
        Step::ProxyListen,
        Step::ProxyHandOver,
        Step::BindReadOnly,
        Step::DnsListen,
        Step::ProxyAlias,
        Step::RelayListen,
        Step::Resolv,
        Step::BindScript,
        Step::RootSource,
        Step::RootMount,
        Step::RootPlace,
        Step::RootBind,
        Step::RootReadOnly,
        Step::RootProc,
        Step::PivotRoot,
        Step::DetachOldRoot,
    ];

    /// The system call and what it was for.
    pub fn describe(self) -> &'static str {
        match self {
            Step::Stdio => "dup2 of the stdio pipes",
            Step::DeathSignal => "prctl(PR_SET_PDEATHSIG)",
            Step::ParentGone => "poll of the launch pipe (Moat exited during the launch)",
            Step::Setgroups => "write /proc/self/setgroups (deny)",
            Step::UidMap => "write /proc/self/uid_map",
            Step::GidMap => "write /proc/self/gid_map",
            Step::MountPrivate => "mount(/, MS_REC|MS_PRIVATE)",
            Step::MountTmp => "mount(tmpfs, /tmp)",
            Step::BindGrant => "mount(MS_BIND) of a granted path under /tmp",
            Step::DnsListen => "bind UDP 127.0.0.1:53 for Moat's DNS answers",
            Step::ProxyAlias => {
                "ioctl(SIOCSIFADDR, SIOCSIFNETMASK) making a granted address an alias of lo"
            }
            Step::RelayListen => "bind and listen at a granted address for Moat's egress relay",
            Step::Resolv => "mount(MS_BIND) of Moat's resolv.conf over /etc/resolv.conf",
            Step::BindScript => {
                "mount(MS_BIND) of the script's sealed copy, read-only, over the script's path"
            }
            Step::BindReadOnly => {
                "mount(MS_REMOUNT|MS_BIND|MS_RDONLY) of a read-only path under /tmp"
            }
            Step::Chdir => "chdir to the working directory",
            Step::ProcessGroup => "setpgid",
            Step::Rlimit => "setrlimit",
            Step::NoNewPrivs => "prctl(PR_SET_NO_NEW_PRIVS)",
            Step::Landlock => "landlock_restrict_self",
            Step::CloseDescriptors => "close_range",
            Step::BoundingSet => "prctl(PR_CAPBSET_DROP)",
            Step::Securebits => "prctl(PR_SET_SECUREBITS)",
            Step::AmbientSet => "prctl(PR_CAP_AMBIENT_CLEAR_ALL)",
            Step::Capset => "capset (all sets empty)",
            Step::Seccomp => "seccomp(SECCOMP_SET_MODE_FILTER)",
            Step::Execve => "execve of the measured descriptor",
            Step::ProxyLoopback => "ioctl(SIOCSIFFLAGS) bringing up lo for the egress proxy",
            Step::ProxyListen => "bind and listen on 127.0.0.1 for the egress proxy",
            Step::ProxyHandOver => "sendmsg(SCM_RIGHTS) of the egress listener to Moat",
            Step::RootSource => "open(O_PATH) of a path to place in the server's own root",
            Step::RootMount => "mount(tmpfs) in the server's own root",
            Step::RootPlace => "mkdir, creat, symlink or chdir in the server's own root",
            Step::RootBind => "mount(MS_BIND|MS_REC) into the server's own root",
            Step::RootReadOnly => "mount(MS_REMOUNT|MS_BIND|MS_RDONLY) in the server's own root",
            Step::RootProc => "mount(proc) of the server's PID namespace in its own root",
            Step::PivotRoot => "pivot_root into the server's own root (built on /tmp)",
            Step::DetachOldRoot => "umount2(MNT_DETACH) of the host's root",
        }
    }

    pub(super) fn from_raw(raw: u32) -> Option<Step> {
        Step::ALL.into_iter().find(|s| *s as u32 == raw)
    }
}

impl Step {
    pub(super) fn of_root(step: crate::sandbox::root::RootStep) -> Step {
        use crate::sandbox::root::RootStep;
        match step {
            RootStep::Source => Step::RootSource,
            RootStep::Mount => Step::RootMount,
            RootStep::Place => Step::RootPlace,
            RootStep::Bind => Step::RootBind,
            RootStep::ReadOnly => Step::RootReadOnly,
            RootStep::Proc => Step::RootProc,
            RootStep::Pivot => Step::PivotRoot,
            RootStep::Detach => Step::DetachOldRoot,
        }
    }
}

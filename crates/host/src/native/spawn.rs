//! How a native server's process is made: one `clone` into fresh user, PID,
//! mount, IPC, UTS, cgroup and (without `net`) network namespaces, then, in
//! the child and before exec, every containment step in a fixed order.
//!
//! This module owns the child side of the native launch: the namespaces, the
//! uid and gid maps, the server's own root (built by `sandbox::root`, which
//! holds its private `/tmp`; without one, a private `/tmp` over the host's
//! root), rlimits, no_new_privs, Landlock, the
//! descriptor sweep, the capability drop and the seccomp filters. The
//! standard library's `Command` cannot start a process in a new PID
//! namespace, so the process is made here with a raw `clone` (no `CLONE_VM`:
//! the child has its own copy of memory, as after `fork`), and the server is
//! PID 1 of its namespace. When PID 1 exits, the kernel kills every other
//! process of the namespace and reaps them before PID 1's own exit can be
//! waited for: once [`Child::wait`] returns, nothing the server started is
//! left, whatever it did with sessions or process groups.
//!
//! Between `clone` and `execve` the child runs only raw system calls on
//! memory prepared before the clone; it allocates nothing and takes no lock.
//! A step that fails is reported through a close-on-exec pipe as (step,
//! errno), and the launch fails naming that step: nothing is retried with
//! less containment.

use std::ffi::{CString, c_char};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use rustix::process::{Resource, Rlimit};

/// Which namespaces this kernel lets Moat make for a server, found once by
/// trying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceSupport {
    /// Namespaces can be made at all (PID, mount, IPC, UTS, cgroup,
    /// network).
    pub available: bool,
    /// They are made inside a new user namespace (always, where the kernel
    /// allows it; required when Moat is not root).
    pub user: bool,
    /// Why not, when they cannot: the errno of the trial `clone`.
    pub errno: i32,
}

/// The namespaces every namespaced server gets: PID, mount, and its own
/// SysV IPC (shared memory, message queues and semaphores of the host are
/// out of reach, by key or id), UTS (hostname) and cgroup (its cgroup is
/// its root) namespaces. The network namespace is added without `net`.
const SERVER_NAMESPACES: i32 = libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP;

const BASE_NAMESPACES: i32 = SERVER_NAMESPACES | libc::CLONE_NEWNET;

/// Tries `clone` with the namespace flags once per process: with a user
/// namespace first, then, for root only, without one.
pub fn namespace_support() -> NamespaceSupport {
    static SUPPORT: OnceLock<NamespaceSupport> = OnceLock::new();
    *SUPPORT.get_or_init(|| {
        let with_user = trial_clone(BASE_NAMESPACES | libc::CLONE_NEWUSER);
        if with_user == 0 {
            return NamespaceSupport {
                available: true,
                user: true,
                errno: 0,
            };
        }
        if rustix::process::geteuid().is_root() && trial_clone(BASE_NAMESPACES) == 0 {
            return NamespaceSupport {
                available: true,
                user: false,
                errno: 0,
            };
        }
        NamespaceSupport {
            available: false,
            user: false,
            errno: with_user,
        }
    })
}

/// Makes a child in new namespaces that exits at once; 0 or the errno.
fn trial_clone(flags: i32) -> i32 {
    // SAFETY: a fork-like clone (no CLONE_VM, no new stack): the child has its
    // own copy of memory and only calls `_exit`.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    }
    if pid == 0 {
        // SAFETY: the child leaves at once, running no destructors.
        unsafe { libc::_exit(0) }
    }
    let mut status = 0;
    // SAFETY: waits for the child just made; `status` is a valid pointer.
    unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::__WALL) };
    0
}

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

    fn from_raw(raw: u32) -> Option<Step> {
        Step::ALL.into_iter().find(|s| *s as u32 == raw)
    }
}

/// The namespaces to make for one server.
pub struct Namespaces {
    /// In a new user namespace: the uid and gid map lines to write.
    pub user: Option<(Vec<u8>, Vec<u8>)>,
    /// A new network namespace (no `net` grant): nothing leaves the server.
    pub net: bool,
    /// tmpfs mount options for the private /tmp (`size=...,mode=1777`), when
    /// the host has a /tmp to mount over.
    pub tmp: Option<CString>,
    /// Granted paths under /tmp, bound into the private /tmp at the same
    /// place so the grant still reaches them.
    pub binds: Vec<Bind>,
    /// Behind the egress proxy, with a private /tmp: `/etc/resolv.conf` is
    /// covered (read-only) by one naming 127.0.0.1, where Moat answers DNS
    /// for the listed names.
    pub resolv: bool,
    /// A `#!` script, with a private /tmp: its sealed copy is bound
    /// read-only over its path, where its interpreter reads it.
    pub script: Option<ScriptBind>,
    /// The server's own root (with its private /tmp, its binds, /proc and
    /// /dev): `tmp` and `binds` are then not used.
    pub root: Option<crate::sandbox::root::RootPlan>,
}

/// A script's sealed copy and the path it is shown at. A memfd cannot be a
/// bind mount's source (its mount is the kernel's own), so the child copies
/// it into a file of its private /tmp, binds that read-only over the
/// script's path and unlinks it: only the child could write it, and only
/// before the bind.
pub struct ScriptBind {
    /// The sealed memfd (see `native::sealed_copy`).
    pub copy: RawFd,
    /// The script's path, as its interpreter is given it.
    pub target: CString,
}

impl Step {
    fn of_root(step: crate::sandbox::root::RootStep) -> Step {
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

/// What a server behind the egress proxy finds in /etc/resolv.conf.
const RESOLV_CONF: &[u8] = b"# Moat answers DNS here, for the names in this server's `net` only.\nnameserver 127.0.0.1\noptions attempts:1 timeout:2\n";

/// Most granted paths under /tmp one server may have bound.
pub const MAX_BINDS: usize = 64;

/// One granted path under /tmp. The child opens it before /tmp is replaced
/// (in its own mount namespace: a bind's source must be a mount of that
/// namespace) and binds it back at the same place afterwards.
pub struct Bind {
    /// Each directory to make on the way, outermost first.
    pub parents: Vec<CString>,
    /// The path, on the host and in the private /tmp alike.
    pub target: CString,
    /// Whether it is a directory (else a file is made to bind over).
    pub dir: bool,
    /// Whether the server may write there (an `rw` grant, or inside one).
    /// Anything else is bound read-only: Landlock's rules follow a bound
    /// path up through its mount point into the private /tmp, which is
    /// writable, so the mount itself must refuse the writes.
    pub writable: bool,
}

impl Bind {
    /// Prepares `path` (which must lie under /tmp) for binding.
    pub fn new(path: &std::path::Path, writable: bool) -> std::io::Result<Self> {
        use std::os::unix::ffi::OsStrExt;
        let dir = std::fs::metadata(path)?.is_dir();
        let cstring = |p: &std::path::Path| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| std::io::Error::other("a NUL byte in a path"))
        };
        let mut ancestors: Vec<&std::path::Path> = path
            .ancestors()
            .skip(1)
            .take_while(|a| *a != std::path::Path::new("/tmp"))
            .collect();
        ancestors.reverse();
        Ok(Self {
            parents: ancestors
                .into_iter()
                .map(cstring)
                .collect::<Result<_, _>>()?,
            target: cstring(path)?,
            dir,
            writable,
        })
    }
}

/// `/proc/self/fd/N` for `fd`, written into `buf` with its NUL, without
/// allocating.
fn fd_path(fd: i32, buf: &mut [u8; 32]) -> *const c_char {
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

/// Everything the child does, prepared in the parent.
pub struct ChildPlan {
    pub path: CString,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    pub cwd: CString,
    pub executable: RawFd,
    /// A script's interpreter, which `path` names: kept through the
    /// descriptor sweep, closed by exec itself.
    pub interpreter: Option<RawFd>,
    pub rlimits: Vec<(Resource, Rlimit)>,
    pub namespaces: Option<Namespaces>,
    /// The Landlock ruleset, with the rights for the child's /proc/self and
    /// its private /tmp.
    pub landlock: Option<(RawFd, u64, u64)>,
    /// Whether the bounding set and securebits can be changed (the child
    /// holds CAP_SETPCAP: root, or in its own user namespace).
    pub drop_bounding: bool,
    pub seccomp: Vec<seccompiler::BpfProgram>,
    /// In a network namespace with `net` grants: the child brings its
    /// loopback up, listens on 127.0.0.1:`port` (the proxy), binds UDP
    /// 127.0.0.1:53 (DNS) and listens at each relay address, and hands
    /// them all to Moat over `channel`, in that order.
    pub proxy: Option<ProxyPlan>,
}

/// Where the child's egress sockets go, and what it makes.
pub struct ProxyPlan {
    /// The child's end of a Unix socket pair.
    pub channel: RawFd,
    pub port: u16,
    /// IPv4 addresses to add to `lo` (as `lo:1`, `lo:2`, ...).
    pub aliases: Vec<[u8; 4]>,
    /// The relay listeners' addresses, in the order they are handed over.
    pub relays: Vec<std::net::SocketAddr>,
}

/// A Unix socket pair for handing the egress listener over: (Moat's end,
/// the child's end), both close-on-exec and above 2.
pub fn proxy_channel() -> Result<(OwnedFd, OwnedFd), SpawnFailure> {
    let mut ends = [-1i32; 2];
    // SAFETY: socketpair writes two descriptors into `ends`, which we then
    // own.
    let (moat, child) = unsafe {
        if libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            ends.as_mut_ptr(),
        ) != 0
        {
            return Err(SpawnFailure::Parent(
                "socketpair",
                std::io::Error::last_os_error(),
            ));
        }
        (
            <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(ends[0]),
            <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(ends[1]),
        )
    };
    let high = |fd: OwnedFd| {
        rustix::io::fcntl_dupfd_cloexec(&fd, 3)
            .map_err(|e| SpawnFailure::Parent("fcntl(F_DUPFD_CLOEXEC)", e.into()))
    };
    Ok((high(moat)?, high(child)?))
}

/// Space for one descriptor's control message, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct OneFdControl([u8; 32]);

/// Receives the egress listener the child sent on `moat` (it was sent
/// before exec, so it is waiting).
pub fn receive_listener(moat: &OwnedFd) -> std::io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = OneFdControl([0; 32]);
    // SAFETY: recvmsg fills `byte` and `control`, both live for the call;
    // the control message is read through libc's CMSG accessors within the
    // buffer's bounds, and the descriptor it carries is then ours.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = control.0.len() as _;
        if libc::recvmsg(
            moat.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        ) != 1
        {
            return Err(std::io::Error::last_os_error());
        }
        let header = libc::CMSG_FIRSTHDR(&msg);
        if header.is_null()
            || (*header).cmsg_level != libc::SOL_SOCKET
            || (*header).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(std::io::Error::other("no descriptor in the message"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<i32>());
        Ok(<OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd))
    }
}

/// Covers /etc/resolv.conf with [`RESOLV_CONF`], read-only, through a file
/// in the private /tmp that is unlinked once bound.
///
/// # Safety
///
/// Only in the cloned child, in its own mount namespace, after the private
/// /tmp is mounted.
unsafe fn bind_resolv_conf(report: RawFd) {
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
unsafe fn bind_script(bind: &ScriptBind, report: RawFd) {
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

/// Sends `fd` over `channel` with one byte, as SCM_RIGHTS.
///
/// # Safety
///
/// Only in the cloned child; `fd` and `channel` are open descriptors.
unsafe fn send_fd(channel: RawFd, fd: RawFd, report: RawFd) {
    // SAFETY: sendmsg reads stack memory that lives for the call; the
    // control message is written through libc's CMSG accessors within the
    // buffer's bounds.
    unsafe {
        let mut byte = [b'l'];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut control = OneFdControl([0; 32]);
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) as _;
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<i32>(), fd);
        if libc::sendmsg(channel, &msg, 0) != 1 {
            fail(report, Step::ProxyHandOver, errno());
        }
        libc::close(fd);
    }
}

/// Makes the egress listener and the DNS socket in the child and hands
/// them to Moat, in that order.
///
/// # Safety
///
/// Only in the cloned child, in its own network namespace, while it still
/// holds CAP_NET_ADMIN there.
unsafe fn hand_over_listener(proxy: &ProxyPlan, report: RawFd) {
    // SAFETY: raw system calls on stack memory; see the contract.
    unsafe {
        let check = |ok: bool, step: Step| {
            if !ok {
                fail(report, step, errno());
            }
        };
        let control_socket = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        check(control_socket >= 0, Step::ProxyLoopback);
        let mut request: libc::ifreq = std::mem::zeroed();
        request.ifr_name[0] = b'l' as libc::c_char;
        request.ifr_name[1] = b'o' as libc::c_char;
        request.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        check(
            libc::ioctl(control_socket, libc::SIOCSIFFLAGS, &request) == 0,
            Step::ProxyLoopback,
        );
        libc::close(control_socket);
        // A socket of `kind` bound to 127.0.0.1:`port` of the namespace.
        let bound = |kind: i32, port: u16, step: Step| {
            let fd = libc::socket(libc::AF_INET, kind | libc::SOCK_CLOEXEC, 0);
            check(fd >= 0, step);
            let mut address: libc::sockaddr_in = std::mem::zeroed();
            address.sin_family = libc::AF_INET as libc::sa_family_t;
            address.sin_port = port.to_be();
            address.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
            check(
                libc::bind(
                    fd,
                    (&address as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                ) == 0,
                step,
            );
            fd
        };
        let listener = bound(libc::SOCK_STREAM, proxy.port, Step::ProxyListen);
        check(libc::listen(listener, 128) == 0, Step::ProxyListen);
        // The DNS socket: 127.0.0.1:53 of the namespace, where its
        // resolv.conf points.
        let dns = bound(libc::SOCK_DGRAM, crate::egress::DNS_PORT, Step::DnsListen);
        send_fd(proxy.channel, listener, report);
        send_fd(proxy.channel, dns, report);
        // Granted addresses outside 127.0.0.0/8 become lo's own (a /32
        // each), so a connection to one stays inside, at Moat's relay.
        for (index, octets) in proxy.aliases.iter().enumerate() {
            let control = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
            check(control >= 0, Step::ProxyAlias);
            let mut request: libc::ifreq = std::mem::zeroed();
            // "lo:N", N = index + 1 (at most 5 digits: IFNAMSIZ is 16).
            let label = index + 1;
            let mut digits = [0u8; 5];
            let mut count = 0;
            let mut rest = label;
            loop {
                digits[count] = b'0' + (rest % 10) as u8;
                count += 1;
                rest /= 10;
                if rest == 0 || count == digits.len() {
                    break;
                }
            }
            for (at, byte) in b"lo:".iter().enumerate() {
                request.ifr_name[at] = *byte as libc::c_char;
            }
            for at in 0..count {
                request.ifr_name[3 + at] = digits[count - 1 - at] as libc::c_char;
            }
            let set = |request: &mut libc::ifreq, address: [u8; 4], call: libc::c_ulong| {
                let mut sin: libc::sockaddr_in = std::mem::zeroed();
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_addr.s_addr = u32::from_be_bytes(address).to_be();
                std::ptr::write_unaligned(
                    std::ptr::addr_of_mut!(request.ifr_ifru.ifru_addr).cast::<libc::sockaddr_in>(),
                    sin,
                );
                check(
                    libc::ioctl(control, call as _, request as *mut libc::ifreq) == 0,
                    Step::ProxyAlias,
                );
            };
            set(&mut request, *octets, libc::SIOCSIFADDR);
            set(&mut request, [255, 255, 255, 255], libc::SIOCSIFNETMASK);
            libc::close(control);
        }
        for address in &proxy.relays {
            let fd = match address {
                std::net::SocketAddr::V4(v4) => {
                    let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                    check(fd >= 0, Step::RelayListen);
                    let mut sin: libc::sockaddr_in = std::mem::zeroed();
                    sin.sin_family = libc::AF_INET as libc::sa_family_t;
                    sin.sin_port = v4.port().to_be();
                    sin.sin_addr.s_addr = u32::from_be_bytes(v4.ip().octets()).to_be();
                    check(
                        libc::bind(
                            fd,
                            (&sin as *const libc::sockaddr_in).cast(),
                            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                        ) == 0,
                        Step::RelayListen,
                    );
                    fd
                }
                std::net::SocketAddr::V6(v6) => {
                    let fd =
                        libc::socket(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                    check(fd >= 0, Step::RelayListen);
                    let mut sin6: libc::sockaddr_in6 = std::mem::zeroed();
                    sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                    sin6.sin6_port = v6.port().to_be();
                    sin6.sin6_addr.s6_addr = v6.ip().octets();
                    check(
                        libc::bind(
                            fd,
                            (&sin6 as *const libc::sockaddr_in6).cast(),
                            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                        ) == 0,
                        Step::RelayListen,
                    );
                    fd
                }
            };
            check(libc::listen(fd, 128) == 0, Step::RelayListen);
            send_fd(proxy.channel, fd, report);
        }
        libc::close(proxy.channel);
    }
}

/// A started child: its pidfd and the parent's ends of its stdio.
pub struct Child {
    pub pidfd: OwnedFd,
    pub pid: i32,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// Why a child could not be started.
#[derive(Debug)]
pub enum SpawnFailure {
    /// In the parent: the system call named, and its error.
    Parent(&'static str, std::io::Error),
    /// In the child, before exec: the step, and its errno.
    Child(Step, std::io::Error),
    /// In the child, before exec: the step, the host path it was placing in
    /// the server's own root, and its errno.
    ChildAt(Step, std::path::PathBuf, std::io::Error),
}

impl std::fmt::Display for SpawnFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpawnFailure::Parent(call, error) => write!(f, "{call}: {error}"),
            SpawnFailure::Child(step, error) => {
                write!(f, "in the child, {}: {error}", step.describe())
            }
            SpawnFailure::ChildAt(step, path, error) => {
                write!(
                    f,
                    "in the child, {} of {}: {error}",
                    step.describe(),
                    path.display()
                )
            }
        }
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), SpawnFailure> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SpawnFailure::Parent("pipe2", e.into()))?;
    // The child moves its ends onto 0, 1 and 2: keep every end above them, so
    // no move overwrites another end (Moat may run with 0..2 closed).
    let high = |fd: OwnedFd| {
        rustix::io::fcntl_dupfd_cloexec(&fd, 3)
            .map_err(|e| SpawnFailure::Parent("fcntl(F_DUPFD_CLOEXEC)", e.into()))
    };
    Ok((high(read)?, high(write)?))
}

/// Starts the child described by `plan`, in namespaces when it has them.
pub fn spawn(plan: &ChildPlan) -> Result<Child, SpawnFailure> {
    let (child, pending) = spawn_inner(plan, None::<fn(i32) -> std::io::Result<()>>)?;
    match pending {
        Some(pending) => pending.finish().map(|()| child),
        None => Ok(child),
    }
}

/// Like [`spawn`], but the child waits, once contained and just before its
/// seccomp filters and exec, until `before_exec` has run on its pid (the
/// learn run attaches its tracer there). The launch's outcome is read with
/// [`Pending::finish`], on another thread than a tracer's, which must be
/// free to let the child reach its exec.
pub fn spawn_gated(
    plan: &ChildPlan,
    before_exec: impl FnOnce(i32) -> std::io::Result<()>,
) -> Result<(Child, Pending), SpawnFailure> {
    let (child, pending) = spawn_inner(plan, Some(before_exec))?;
    let pending = pending
        .ok_or_else(|| SpawnFailure::Parent("spawn", std::io::Error::other("no launch pipe")))?;
    Ok((child, pending))
}

/// A gated launch whose outcome is yet to be read.
pub struct Pending {
    report: OwnedFd,
    life: OwnedFd,
    /// The host paths of the root's entries, to name one in an error.
    subjects: Vec<std::path::PathBuf>,
}

impl Pending {
    /// Blocks until the child has exec'd (`Ok`) or failed a step.
    pub fn finish(self) -> Result<(), SpawnFailure> {
        let report = read_report(&self.report, &self.subjects);
        drop(self.life);
        report.map_or(Ok(()), Err)
    }
}

fn spawn_inner(
    plan: &ChildPlan,
    before_exec: Option<impl FnOnce(i32) -> std::io::Result<()>>,
) -> Result<(Child, Option<Pending>), SpawnFailure> {
    let gated = before_exec.is_some();
    let gate = gated.then(pipe).transpose()?;
    let (stdin_read, stdin_write) = pipe()?;
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let (report_read, report_write) = pipe()?;
    // Held open by Moat until the child has exec'd: a child that finds it
    // closed knows its parent died before the death signal was armed.
    let (life_read, life_write) = pipe()?;
    let argv: Vec<*const c_char> = plan
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const c_char> = plan
        .env
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let mut flags = libc::CLONE_PIDFD | libc::SIGCHLD;
    if let Some(ns) = &plan.namespaces {
        flags |= SERVER_NAMESPACES;
        if ns.user.is_some() {
            flags |= libc::CLONE_NEWUSER;
        }
        if ns.net {
            flags |= libc::CLONE_NEWNET;
        }
    }
    let fds = ChildFds {
        stdin: stdin_read.as_raw_fd(),
        stdout: stdout_write.as_raw_fd(),
        stderr: stderr_write.as_raw_fd(),
        report: report_write.as_raw_fd(),
        life: life_read.as_raw_fd(),
        life_write: life_write.as_raw_fd(),
        gate: gate.as_ref().map(|(read, _)| read.as_raw_fd()),
        gate_write: gate.as_ref().map(|(_, write)| write.as_raw_fd()),
    };
    let mut pidfd: libc::c_int = -1;
    // SAFETY: a fork-like clone: no CLONE_VM and no new stack, so the child
    // runs on its own copy of this thread's stack and memory. It runs only
    // `child`, which never returns, makes raw system calls on memory
    // prepared above and allocates nothing. CLONE_PIDFD writes the pidfd
    // through the parent_tid argument, which points at `pidfd`.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags as libc::c_ulong,
            0usize,
            &mut pidfd as *mut libc::c_int,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        // SAFETY: we are the freshly cloned child (see above).
        unsafe { child(plan, &fds, &argv, &envp) }
    }
    if pid < 0 {
        return Err(SpawnFailure::Parent(
            "clone",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: CLONE_PIDFD succeeded, so `pidfd` is a descriptor we now own.
    let pidfd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) };
    drop((
        stdin_read,
        stdout_write,
        stderr_write,
        report_write,
        life_read,
    ));
    if let (Some(before_exec), Some((gate_read, gate_write))) = (before_exec, gate) {
        drop(gate_read);
        let opened = before_exec(pid as i32);
        // The child goes on when the gate opens (a byte) or closes (Moat
        // failed: the child then stops, reporting a lost parent).
        if let Err(error) = opened {
            drop(gate_write);
            drop(life_write);
            let _ = rustix::process::waitid(
                rustix::process::WaitId::PidFd(pidfd.as_fd()),
                rustix::process::WaitIdOptions::EXITED,
            );
            return Err(SpawnFailure::Parent("attaching to the child", error));
        }
        let _ = rustix::io::write(&gate_write, b"g");
    }
    let child = Child {
        pidfd,
        pid: pid as i32,
        stdin: stdin_write,
        stdout: stdout_read,
        stderr: stderr_read,
    };
    let pending = Pending {
        report: report_read,
        life: life_write,
        subjects: plan
            .namespaces
            .as_ref()
            .and_then(|ns| ns.root.as_ref())
            .map(|root| root.subjects().to_vec())
            .unwrap_or_default(),
    };
    if gated {
        // A tracer reaps the child; the caller reads the outcome.
        return Ok((child, Some(pending)));
    }
    if let Err(failure) = pending.finish() {
        // The child has left with `_exit`; reap it.
        let _ = rustix::process::waitid(
            rustix::process::WaitId::PidFd(child.pidfd.as_fd()),
            rustix::process::WaitIdOptions::EXITED,
        );
        return Err(failure);
    }
    Ok((child, None))
}

/// Reads the child's report: nothing (EOF at exec) or (step, errno,
/// subject): the subject, an entry of the server's root, is named by its
/// host path.
fn read_report(fd: &OwnedFd, subjects: &[std::path::PathBuf]) -> Option<SpawnFailure> {
    let mut buf = [0u8; 12];
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::io::read(fd, &mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(errno) => {
                return Some(SpawnFailure::Parent(
                    "read of the launch pipe",
                    errno.into(),
                ));
            }
        }
    }
    if filled == 0 {
        return None;
    }
    let step = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let errno = i32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let subject = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
    let step = Step::from_raw(step).unwrap_or(Step::Execve);
    let error = std::io::Error::from_raw_os_error(errno);
    match subjects.get(subject as usize) {
        Some(path) => Some(SpawnFailure::ChildAt(step, path.to_owned(), error)),
        None => Some(SpawnFailure::Child(step, error)),
    }
}

struct ChildFds {
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    report: RawFd,
    life: RawFd,
    life_write: RawFd,
    gate: Option<RawFd>,
    gate_write: Option<RawFd>,
}

/// Reports `step` failing with the current errno, and leaves.
///
/// # Safety
///
/// Only in the cloned child.
unsafe fn fail(report: RawFd, step: Step, errno: i32) -> ! {
    // SAFETY: see the contract.
    unsafe { fail_at(report, step, errno, u32::MAX) }
}

/// Reports `step` failing with `errno` at entry `subject` of the server's
/// root (`u32::MAX`: none), and leaves.
///
/// # Safety
///
/// Only in the cloned child.
unsafe fn fail_at(report: RawFd, step: Step, errno: i32, subject: u32) -> ! {
    let mut buf = [0u8; 12];
    buf[..4].copy_from_slice(&(step as u32).to_le_bytes());
    buf[4..8].copy_from_slice(&errno.to_le_bytes());
    buf[8..].copy_from_slice(&subject.to_le_bytes());
    // SAFETY: writes 12 bytes from the stack, then leaves without running
    // destructors (the parent's state is not ours to tear down).
    unsafe {
        libc::write(report, buf.as_ptr().cast(), buf.len());
        libc::_exit(127)
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Writes `bytes` to the file at `path` (a /proc file), or fails `step`.
///
/// # Safety
///
/// Only in the cloned child.
unsafe fn write_proc(path: &std::ffi::CStr, bytes: &[u8], report: RawFd, step: Step) {
    // SAFETY: a static path; the descriptor is closed before returning.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            fail(report, step, errno());
        }
        if libc::write(fd, bytes.as_ptr().cast(), bytes.len()) != bytes.len() as isize {
            fail(report, step, errno());
        }
        libc::close(fd);
    }
}

/// Closes every descriptor from `from` to `to` inclusive.
///
/// # Safety
///
/// Only in the cloned child.
unsafe fn close_range(from: u32, to: u32) -> bool {
    if from > to {
        return true;
    }
    // SAFETY: closes descriptors of this (child) process only.
    unsafe { libc::syscall(libc::SYS_close_range, from, to, 0u32) == 0 }
}

/// The child, between clone and exec. Never returns.
///
/// # Safety
///
/// Only in the freshly cloned child: raw system calls on memory prepared
/// before the clone, no allocation, no locks.
unsafe fn child(
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
                        let kept = [
                            (libc::ST_NOSUID, libc::MS_NOSUID),
                            (libc::ST_NODEV, libc::MS_NODEV),
                            (libc::ST_NOEXEC, libc::MS_NOEXEC),
                            (libc::ST_NOATIME, libc::MS_NOATIME),
                            (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
                            (libc::ST_RELATIME, libc::MS_RELATIME),
                        ]
                        .iter()
                        .filter(|(st, _)| stat.f_flag & st != 0)
                        .fold(0, |flags, (_, ms)| flags | ms);
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

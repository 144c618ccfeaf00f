//! The namespaces of a native server, planned: what this kernel allows
//! ([`namespace_support`]), the user, PID, mount, IPC, UTS, cgroup and
//! network namespaces, the private /tmp and the granted paths bound into it,
//! DNS through Moat (resolv.conf), whether the server gets a root of its
//! own, and the lines that say so. The child makes them (`spawn`).

use std::ffi::CString;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::native::{NativeError, NativeLaunch};

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
pub(in crate::native) const SERVER_NAMESPACES: i32 = libc::CLONE_NEWPID
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
    /// The sealed memfd (see `native::measure`).
    pub copy: RawFd,
    /// The script's path, as its interpreter is given it.
    pub target: CString,
}

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

/// Whether `launch` goes out through the egress proxy: it has `net` grants,
/// is not a learn run, and can have a network namespace of its own.
pub(super) fn proxied(launch: &NativeLaunch) -> bool {
    !launch.spec.net.is_empty() && launch.learn.is_none() && namespace_support().available
}

/// Whether the kernel has IPv6 (a namespace's `lo` then has `::1`).
pub(in crate::native) fn ipv6() -> bool {
    Path::new("/proc/net/if_inet6").exists()
}
/// The namespaces of `launch` on this kernel (`None` without them), and
/// whether the server gets a root of its own (planned once its grants are
/// open), with their lines in `enforced` and `not_enforced`.
pub(super) fn plan(
    launch: &NativeLaunch,
    roots: &crate::sandbox::ImplicitRoots,
    support: NamespaceSupport,
    enforced: &mut Vec<String>,
    not_enforced: &mut Vec<String>,
) -> Result<(Option<Namespaces>, bool), NativeError> {
    let mut own_root = false;
    let namespaces = if support.available {
        let user = support.user.then(|| {
            let uid = rustix::process::geteuid().as_raw();
            let gid = rustix::process::getegid().as_raw();
            (
                format!("{uid} {uid} 1\n").into_bytes(),
                format!("{gid} {gid} 1\n").into_bytes(),
            )
        });
        // A learn run has its private /tmp too: it is where it may write.
        let tmp = Path::new("/tmp").is_dir().then(|| {
            std::ffi::CString::new(format!("size={},mode=1777", launch.spec.limits.tmp_bytes))
                .unwrap_or_default()
        });
        enforced.push(format!(
            "PID namespace{}: the server is PID 1 of its own namespace; every process it starts dies with it",
            if support.user {
                " (in a user namespace of its own)"
            } else {
                ""
            }
        ));
        enforced.push(
            "IPC, UTS and cgroup namespaces: the host's SysV shared memory, message queues and semaphores are out of reach (no key or id of the host's exists there); the hostname and the cgroup root are the server's own"
                .to_owned(),
        );
        match &tmp {
            Some(_) => enforced.push(format!(
                "mount namespace: a private, empty /tmp (tmpfs, {} bytes), gone when the server stops",
                launch.spec.limits.tmp_bytes
            )),
            None => not_enforced.push("a private /tmp (the host has no /tmp)".to_owned()),
        }
        // A learn run keeps the host's network, to see where it connects.
        let net = launch.learn.is_none();
        if net && launch.spec.net.is_empty() {
            enforced.push(
                "network namespace: no network at all (TCP, UDP, raw sockets and abstract Unix sockets reach nothing outside the server)"
                    .to_owned(),
            );
        } else if net {
            let layout = crate::egress::Layout::of(&launch.spec.net, ipv6());
            let relays: Vec<String> = layout
                .relays
                .iter()
                .map(|relay| {
                    let entry = crate::grants::NetGrant {
                        host: relay.host.clone(),
                        port: relay.port,
                    };
                    if relay.inside.ip().to_string() == relay.host {
                        entry.to_string()
                    } else {
                        format!("{entry} at {}", relay.inside)
                    }
                })
                .collect();
            enforced.push(format!(
                "network namespace: out only through Moat, to {} at the addresses resolved at launch: relayed transparently ({}), and through the proxy at 127.0.0.1:{} (HTTP_PROXY and HTTPS_PROXY set); no other address is routed",
                crate::grants::net_line(&launch.spec.net),
                if relays.is_empty() { "none".to_owned() } else { relays.join(", ") },
                crate::egress::PROXY_PORT,
            ));
            if !layout.proxy_only.is_empty() {
                not_enforced.push(format!(
                    "a transparent relay for {} (reached through the proxy only)",
                    crate::grants::net_line(&layout.proxy_only)
                ));
            }
        }
        // Behind Moat, names resolve through Moat: listed ones only.
        let resolv = net
            && !launch.spec.net.is_empty()
            && tmp.is_some()
            && Path::new("/etc/resolv.conf").exists();
        if net && !launch.spec.net.is_empty() {
            let names = crate::egress::listed_names(&launch.spec.net);
            if resolv || !Path::new("/etc/resolv.conf").exists() {
                enforced.push(format!(
                    "DNS: answered by Moat at 127.0.0.1:{} (resolv.conf{}), for {} only (each with its relay address); any other name is NXDOMAIN",
                    crate::egress::DNS_PORT,
                    if resolv { " covered, read-only" } else { " absent: the default" },
                    if names.is_empty() { "no name".to_owned() } else { names.join(", ") }
                ));
            } else {
                not_enforced.push(
                    "DNS through Moat (no private /tmp to hold its resolv.conf): names do not resolve inside the namespace".to_owned(),
                );
            }
        }
        // A root of the server's own, built on the private /tmp's place:
        // not for a learn run, which is to see what the host holds.
        if launch.learn.is_none() {
            let why = match (&tmp, crate::sandbox::root::support(support.user)) {
                (Some(_), Ok(())) => None,
                (Some(_), Err(unsupported)) => Some(unsupported.to_string()),
                (None, _) => Some("the host has no /tmp to build it on".to_owned()),
            };
            match why {
                None => own_root = true,
                Some(why) => crate::sandbox::enforce_or_report(
                    launch.spec.sandbox,
                    &format!(
                        "a root of the server's own, hiding every host path outside its grants ({why})"
                    ),
                    not_enforced,
                )?,
            }
        }
        // Granted paths under /tmp stay where they were: each is bound into
        // the private /tmp (used only without a root of the server's own).
        let mut binds = Vec::new();
        if tmp.is_some() && !own_root {
            // Everything the server is granted or runs from (the
            // executable, its installation root, dirs, measure paths) keeps
            // its place; a path inside another is bound with it.
            let mut granted: Vec<PathBuf> = launch
                .spec
                .dirs
                .iter()
                .map(|d| d.host.clone())
                .chain(launch.measure().iter().cloned())
                .chain([launch.resolved.target.clone()])
                .chain(roots.granted.iter().cloned())
                .filter(|p| p.starts_with("/tmp") && p != Path::new("/tmp"))
                .collect();
            granted.sort();
            granted.dedup();
            // Parents before what lies inside them, each bound with its own
            // mode: an rw grant inside a read-only package stays writable.
            for path in &granted {
                if binds.len() == MAX_BINDS {
                    return Err(NativeError::Io {
                        syscall: "binding granted paths into the private /tmp",
                        path: path.clone(),
                        source: std::io::Error::other(format!(
                            "more than {} granted paths under /tmp",
                            MAX_BINDS
                        )),
                    });
                }
                let writable = launch
                    .spec
                    .dirs
                    .iter()
                    .any(|d| d.mode == crate::grants::DirMode::Rw && path.starts_with(&d.host));
                binds.push(Bind::new(path, writable).map_err(|source| NativeError::Io {
                    syscall: "stat of a granted path under /tmp",
                    path: path.clone(),
                    source,
                })?);
            }
        }
        Some(Namespaces {
            user,
            net,
            tmp,
            binds,
            resolv,
            script: None,
            root: None,
        })
    } else {
        let why = std::io::Error::from_raw_os_error(support.errno);
        crate::sandbox::enforce_or_report(
            launch.spec.sandbox,
            &format!(
                "PID, mount, IPC, UTS, cgroup and network namespaces (clone with CLONE_NEWUSER: {why}; unprivileged user namespaces may be disabled)"
            ),
            not_enforced,
        )?;
        None
    };
    Ok((namespaces, own_root))
}

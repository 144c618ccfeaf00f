//! The Landlock ruleset of a native server: what it may read, write and
//! execute, and which TCP ports it may connect to, built in the parent from
//! its grants ([`plan`]); and the child's last rules and
//! `landlock_restrict_self` ([`restrict_child`]), between fork and exec.
//! What every server may read to start is [`super::start`]'s.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};

use super::start::{DEVICES_RO, ETC_SECRETS, ImplicitRoots, SYSTEM_DIRS, etc_grants};
use super::{Plan, SandboxError};
use crate::config::Sandbox;
use crate::grants::{DirMode, NetGrant};

/// The kernel's Landlock ABI version, or 0.
pub fn kernel_abi() -> i32 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    // only returns the ABI version (or -1 with errno); it reads no memory.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    i32::try_from(version).unwrap_or(0).max(0)
}

/// What a native launch grants.
pub struct Grants<'a> {
    /// The measured executable's descriptor: the rule follows the bytes that
    /// will run, not whatever the path names now.
    pub executable: BorrowedFd<'a>,
    pub executable_path: &'a Path,
    /// A script's interpreter: its descriptor (read and execute) and path.
    pub interpreter: Option<(BorrowedFd<'a>, &'a Path)>,
    /// The installation roots granted read-only without listing (see
    /// [`implicit_roots`]), and those held back.
    pub roots: &'a ImplicitRoots,
    pub measure: &'a [PathBuf],
    pub dirs: &'a [crate::grants::OpenedGrant],
    pub net: &'a [NetGrant],
    /// Behind Moat's egress proxy (a network namespace whose only way out
    /// is the proxy at this port): TCP connects go to that port only, and
    /// `net` is enforced per host by the proxy.
    pub proxy_port: Option<u16>,
    pub sandbox: Sandbox,
}

fn unsupported(sandbox: Sandbox, feature: &str, plan: &mut Plan) -> Result<(), SandboxError> {
    super::enforce_or_report(sandbox, feature, &mut plan.not_enforced)
}

/// The rights that apply to a file (directory-only rights do not).
pub(super) fn file_only() -> BitFlags<AccessFs> {
    AccessFs::ReadFile | AccessFs::Execute | AccessFs::WriteFile | AccessFs::Truncate
}

/// The error of a ruleset `operation`.
pub(super) fn ruleset_error(
    operation: &'static str,
) -> impl Fn(landlock::RulesetError) -> SandboxError {
    move |error| SandboxError::Ruleset {
        operation,
        detail: error.to_string(),
    }
}

/// A ruleset for ABI `version` (1 or more) that handles every filesystem
/// access, and from ABI 6 scopes signals and abstract Unix sockets to the
/// server (said in `plan`'s evidence).
pub(super) fn fs_ruleset(version: i32, plan: &mut Plan) -> Result<(ABI, Ruleset), SandboxError> {
    let abi = ABI::from(version);
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(ruleset_error("handle filesystem access"))?;
    if version >= 6 {
        ruleset = ruleset
            .scope(Scope::from_all(abi))
            .map_err(ruleset_error("scope signals and abstract sockets"))?;
        plan.enforced.push(
            "Landlock scopes (ABI 6+): no signal to, and no abstract Unix socket of, any process outside the server"
                .to_owned(),
        );
    }
    Ok((abi, ruleset))
}

/// Builds the Landlock ruleset for `grants` on this kernel.
pub fn plan(grants: &Grants<'_>) -> Result<Plan, SandboxError> {
    plan_for_abi(grants, kernel_abi())
}

/// Builds the Landlock ruleset for `grants` as if the kernel offered ABI
/// `version` (0: no Landlock).
pub fn plan_for_abi(grants: &Grants<'_>, version: i32) -> Result<Plan, SandboxError> {
    let mut plan = Plan::default();
    if version == 0 {
        unsupported(
            grants.sandbox,
            "Landlock (Linux 5.13+ with landlock among the enabled LSMs) for filesystem and network rules",
            &mut plan,
        )?;
        return Ok(plan);
    }
    let (abi, mut ruleset) = fs_ruleset(version, &mut plan)?;
    if version < 6 {
        plan.not_enforced.push(
            "Landlock scopes for signals and abstract Unix sockets (ABI 6, Linux 6.12)".to_owned(),
        );
    }
    let net_rules = version >= 4;
    if net_rules {
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(ruleset_error("handle network access"))?;
    } else {
        unsupported(
            grants.sandbox,
            "Landlock ABI 4 (Linux 6.7) for TCP rules",
            &mut plan,
        )?;
    }
    if !grants.net.is_empty() && grants.proxy_port.is_none() {
        unsupported(
            grants.sandbox,
            "per-host network rules (Landlock restricts TCP ports, not hosts)",
            &mut plan,
        )?;
    }
    let mut created = ruleset.create().map_err(ruleset_error("create ruleset"))?;

    let read = AccessFs::from_read(abi);
    let file_read = read & (AccessFs::ReadFile | AccessFs::Execute);
    let all = AccessFs::from_all(abi);
    // (path, access, optional, shown): optional paths may be absent on this
    // system; `shown` ones are listed one by one in the evidence.
    let mut rules: Vec<(PathBuf, BitFlags<AccessFs>, bool, bool)> = Vec::new();
    for dir in SYSTEM_DIRS {
        rules.push((PathBuf::from(dir), read, true, true));
    }
    let mut etc = Vec::new();
    etc_grants(Path::new("/etc"), "", &mut etc);
    rules.extend(etc.into_iter().map(|path| (path, read, true, false)));
    for device in DEVICES_RO {
        rules.push((PathBuf::from(device), file_read, true, true));
    }
    rules.push((
        PathBuf::from("/dev/null"),
        AccessFs::ReadFile | AccessFs::WriteFile,
        true,
        true,
    ));
    let mut starting: Vec<String> = Vec::new();
    let executable =
        grants
            .executable
            .try_clone_to_owned()
            .map_err(|error| SandboxError::Rule {
                operation: "dup",
                path: grants.executable_path.to_owned(),
                detail: error.to_string(),
            })?;
    created = created
        .add_rule(PathBeneath::new(executable, file_read))
        .map_err(|error| SandboxError::Rule {
            operation: "add rule for",
            path: grants.executable_path.to_owned(),
            detail: error.to_string(),
        })?;
    for path in grants.measure {
        rules.push((path.clone(), read, false, false));
    }
    for root in &grants.roots.granted {
        rules.push((root.clone(), read, true, true));
    }
    if let Some((fd, path)) = grants.interpreter {
        let fd = fd
            .try_clone_to_owned()
            .map_err(|error| SandboxError::Rule {
                operation: "dup",
                path: path.to_owned(),
                detail: error.to_string(),
            })?;
        created = created
            .add_rule(PathBeneath::new(fd, file_read))
            .map_err(|error| SandboxError::Rule {
                operation: "add rule for",
                path: path.to_owned(),
                detail: error.to_string(),
            })?;
        starting.push(format!("the #! interpreter {}", path.display()));
    }
    // Grants: the descriptors opened once, without following links, by
    // `grants::open_all`; the rule is bound to the inode that was checked.
    for dir in grants.dirs {
        let access = match dir.grant.mode {
            DirMode::Ro => read,
            DirMode::Rw => all,
        };
        let access = if dir.dir {
            access
        } else {
            access & file_only()
        };
        let fd = dir.fd.try_clone().map_err(|error| SandboxError::Rule {
            operation: "dup",
            path: dir.grant.host.clone(),
            detail: error.to_string(),
        })?;
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|error| SandboxError::Rule {
                operation: "add rule for",
                path: dir.grant.host.clone(),
                detail: error.to_string(),
            })?;
    }
    for (path, access, optional, shown) in rules {
        let fd = match PathFd::new(&path) {
            Ok(fd) => fd,
            Err(_) if optional => continue,
            Err(error) => {
                return Err(SandboxError::Rule {
                    operation: "open",
                    path,
                    detail: error.to_string(),
                });
            }
        };
        // Directory-only rights do not apply to a file.
        let access = if path.is_dir() {
            access
        } else {
            access & file_only()
        };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|error| SandboxError::Rule {
                operation: "add rule for",
                path: path.clone(),
                detail: error.to_string(),
            })?;
        if shown {
            starting.push(path.display().to_string());
        }
    }
    // Behind Moat's egress, the proxy's port and every granted port (each
    // has Moat's relay inside); without it, the granted ports.
    let mut ports: Vec<u16> = grants
        .proxy_port
        .into_iter()
        .chain(grants.net.iter().map(|g| g.port))
        .collect();
    ports.sort_unstable();
    ports.dedup();
    if net_rules {
        for port in &ports {
            created = created
                .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
                .map_err(|error| SandboxError::Ruleset {
                    operation: "add TCP port rule",
                    detail: error.to_string(),
                })?;
        }
    }
    plan.enforced.push(format!(
        "filesystem (Landlock ABI {version}): nothing but what is listed here; writes only to rw dirs (and /dev/null)"
    ));
    plan.enforced.push(format!(
        "read-only to start: the executable {}, /proc/self, {}, /etc less {}",
        grants.executable_path.display(),
        starting.join(", "),
        ETC_SECRETS.join(", ")
    ));
    plan.enforced.extend(grants.roots.held_back.iter().cloned());
    if !grants.measure.is_empty() {
        plan.enforced.push(format!(
            "read-only (measure): {}",
            grants
                .measure
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for dir in grants.dirs {
        plan.enforced.push(format!("dir {}", dir.grant.describe()));
    }
    if net_rules {
        plan.enforced.push(if ports.is_empty() {
            "network (Landlock): no TCP connect or bind".to_owned()
        } else {
            format!(
                "network (Landlock): TCP connect only to ports {}",
                ports
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
    }
    plan.proc_self_access = read.bits();
    plan.tmp_access = all.bits();
    plan.ruleset = created.into();
    Ok(plan)
}

/// In the child, between fork and exec: allow reading its own /proc/self
/// (and, with `tmp`, everything in its private /tmp, mounted after the
/// ruleset was built), Moat's `/etc/resolv.conf` when `resolv_conf`, then
/// restrict itself with `ruleset`.
/// Async-signal-safe: raw system calls on values prepared before the fork;
/// no allocation.
///
/// # Safety
///
/// Call only in a freshly forked child, after no_new_privs is set;
/// `ruleset` must be a Landlock ruleset descriptor.
pub unsafe fn restrict_child(
    ruleset: RawFd,
    proc: &std::ffi::CStr,
    proc_self_access: u64,
    tmp_access: Option<u64>,
    resolv_conf: bool,
    script: Option<&std::ffi::CStr>,
) -> std::io::Result<()> {
    /// LANDLOCK_ACCESS_FS_READ_FILE.
    const READ_FILE: u64 = 1 << 2;
    #[repr(C, packed)]
    struct PathBeneathAttr {
        allowed_access: u64,
        parent_fd: i32,
    }
    const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
    let add = |path: &std::ffi::CStr, access: u64| -> std::io::Result<()> {
        let directory = if access == READ_FILE {
            0
        } else {
            libc::O_DIRECTORY
        };
        // SAFETY: a static NUL-terminated path; O_PATH opens without reading.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | directory) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let attr = PathBeneathAttr {
            allowed_access: access,
            parent_fd: fd,
        };
        // SAFETY: `attr` lives on this stack frame for the call; the kernel
        // copies it.
        let result = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                ruleset,
                LANDLOCK_RULE_PATH_BENEATH,
                &attr as *const PathBeneathAttr,
                0u32,
            )
        };
        let error = std::io::Error::last_os_error();
        // SAFETY: closes the descriptor opened above.
        unsafe { libc::close(fd) };
        if result != 0 {
            return Err(error);
        }
        Ok(())
    };
    // `proc`: `/proc/self`, or, in a root of the server's own (whose /proc
    // is its PID namespace's: its own processes only), `/proc` whole, so a
    // process the server starts reads its own /proc/self too (a Go binary
    // behind a node launcher reads /proc/self/cgroup as it starts). A
    // failure here only means it stays unreadable.
    let _ = add(proc, proc_self_access);
    if let Some(access) = tmp_access {
        add(c"/tmp", access)?;
    }
    // Moat's resolv.conf, bound over the host's in this mount namespace:
    // Landlock skips a mount point on its way up, so the rule the parent
    // made for the host's file does not cover it.
    if resolv_conf {
        add(c"/etc/resolv.conf", READ_FILE)?;
    }
    // A script's sealed copy, bound over the script's path: likewise.
    if let Some(script) = script {
        add(script, READ_FILE)?;
    }
    // SAFETY: restricts only the calling (child) thread, which is about to exec.
    let result = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The descriptor of a planned ruleset, for the child.
pub fn ruleset_fd(plan: &Plan) -> Option<RawFd> {
    plan.ruleset.as_ref().map(AsRawFd::as_raw_fd)
}

//! The native sandbox: Landlock rules for a child process, with the same
//! meaning as the wasm grants wherever the kernel allows.
//!
//! The ruleset is built in the parent (allocation is fine there); the child
//! only adds a rule for its own `/proc/self` and calls
//! `landlock_restrict_self` between fork and exec, with raw system calls.
//!
//! Granted read-only without listing: what starting needs (the executable,
//! the system's read-only locations `/usr`, `/lib*`, `/bin`, `/sbin`, `/etc`
//! less its secrets, a few devices, the process's own `/proc/self`) and the
//! `measure` paths. Writes: only `rw` dirs (and `/dev/null`). Network: TCP
//! connect only to the listed ports (Landlock ABI 4+); Landlock cannot tell
//! hosts apart, so per-host rules are reported as not enforced (and refused
//! when the sandbox is required).

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};

pub mod root;
pub mod seccomp;

use crate::config::Sandbox;
use crate::grants::{DirMode, NetGrant};

/// Why a required sandbox could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "the sandbox is required but the kernel lacks {feature}; set `sandbox = \"best-effort\"` to run without it (the evidence will say what was not enforced)"
    )]
    Unsupported { feature: String },
    #[error("landlock: {operation} {path}: {detail}")]
    Rule {
        operation: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("landlock: {operation}: {detail}")]
    Ruleset {
        operation: &'static str,
        detail: String,
    },
}

/// What will be enforced, and what could not be.
#[derive(Debug, Default)]
pub struct Plan {
    /// The ruleset to apply in the child, if any.
    pub ruleset: Option<OwnedFd>,
    /// Read and execute rights for the child's own /proc/self.
    pub proc_self_access: u64,
    /// Every right, for the child's private /tmp.
    pub tmp_access: u64,
    /// One line per enforced rule family.
    pub enforced: Vec<String>,
    /// One line per rule the kernel could not enforce.
    pub not_enforced: Vec<String>,
}

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

/// Secrets under /etc that the system grant leaves out (paths relative to
/// /etc; a directory holding one is granted entry by entry).
const ETC_SECRETS: &[&str] = &[
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "sudoers",
    "sudoers.d",
    "ssh",
    "ssl/private",
    "security/opasswd",
    "credstore",
    "credstore.encrypted",
];

/// Every path under `dir` (relative `prefix` to /etc) except the secrets,
/// as few rules as possible: whole entries unless they hold a secret.
fn etc_grants(dir: &Path, prefix: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let relative = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        if ETC_SECRETS.contains(&relative.as_str()) {
            continue;
        }
        let holds_secret = ETC_SECRETS
            .iter()
            .any(|s| s.starts_with(&format!("{relative}/")));
        if holds_secret && entry.file_type().is_ok_and(|t| t.is_dir()) {
            etc_grants(&entry.path(), &relative, out);
        } else {
            out.push(entry.path());
        }
    }
}
const SYSTEM_DIRS: &[&str] = &["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt"];
const DEVICES_RO: &[&str] = &["/dev/zero", "/dev/urandom", "/dev/random"];

/// The installation root of an interpreter or runtime outside the system
/// directories (pyenv, uv, conda, nvm, asdf, a virtualenv): the prefix that
/// holds the executable's `bin/` and a `lib/`, so its standard library is
/// readable. `None` for an executable that is not in a `bin/` beside a
/// `lib/`, or under the system directories (granted anyway). Whether it
/// may be granted is [`implicit_roots`]' question.
fn install_root(executable: &Path) -> Option<PathBuf> {
    let bin = executable.parent()?;
    if bin.file_name()? != "bin" {
        return None;
    }
    let root = bin.parent()?;
    if SYSTEM_DIRS.iter().any(|dir| root.starts_with(dir)) {
        return None;
    }
    ["lib", "lib64"]
        .iter()
        .any(|lib| root.join(lib).is_dir())
        .then(|| root.to_owned())
}

/// The read-only roots a launch is granted without the user listing them,
/// and the ones held back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImplicitRoots {
    /// Granted read-only.
    pub granted: Vec<PathBuf>,
    /// One line per installation root not granted: which, why, and what was
    /// granted instead.
    pub held_back: Vec<String>,
}

/// The Python version directory name an executable or interpreter named
/// `name` reads its libraries from: `python3.12` for `python3.12`; `None`
/// (any `python3.*`) for `python3` or `python`; no match at all for a name
/// that is not Python's.
fn python_version(name: &str) -> Option<Option<&str>> {
    let version = name.strip_prefix("python")?;
    if version.is_empty() || version == "3" {
        return Some(None);
    }
    let mut parts = version.split('.');
    let numeric =
        |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    (numeric(parts.next()) && numeric(parts.next()) && parts.next().is_none()).then_some(Some(name))
}

/// The installation roots to grant read-only for `executable` and its
/// `#!` interpreter (both with every link resolved). Each goes through
/// `kept` ([`crate::grants::Kept::refusal`]): a root that is `/`, the home
/// directory, `$HOME/.local` as a whole, or holds Moat's state, data, cache
/// or configuration (or lies inside what holds a key) is not granted.
/// For such a root, the narrowest part Python needs is granted instead
/// when the program is Python's (a `pip --user` console script in
/// `~/.local/bin` reads `~/.local/lib/pythonX.Y`, X.Y its interpreter's),
/// and nothing otherwise; each held-back root is said, for the evidence.
pub fn implicit_roots(
    executable: &Path,
    interpreter: Option<&Path>,
    kept: &crate::grants::Kept,
) -> ImplicitRoots {
    let mut roots = ImplicitRoots::default();
    let name = |path: &Path| {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    // Whose libraries each root's programs read: the interpreter's, for a
    // script.
    let runs = name(interpreter.unwrap_or(executable));
    let programs = std::iter::once((executable, runs.clone()))
        .chain(interpreter.map(|path| (path, name(path))));
    for (program, runs) in programs {
        let Some(root) = install_root(program) else {
            continue;
        };
        if roots.granted.contains(&root) {
            continue;
        }
        let Some(why) = kept.refusal(&root) else {
            roots.granted.push(root);
            continue;
        };
        let mut instead = Vec::new();
        if let Some(version) = python_version(&runs) {
            for lib in ["lib", "lib64"] {
                let Ok(entries) = std::fs::read_dir(root.join(lib)) else {
                    continue;
                };
                let mut found: Vec<PathBuf> = entries
                    .flatten()
                    .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
                    .filter(|entry| {
                        let dir = entry.file_name().to_string_lossy().into_owned();
                        match version {
                            Some(exact) => dir == exact,
                            None => python_version(&dir).is_some_and(|v| v.is_some()),
                        }
                    })
                    .map(|entry| entry.path())
                    .filter(|dir| kept.refusal(dir).is_none())
                    .collect();
                found.sort();
                instead.append(&mut found);
            }
        }
        roots.held_back.push(format!(
            "not granted: the installation root {} of {} ({why}); {}; grant what the server needs there with a `dirs` entry",
            root.display(),
            program.display(),
            if instead.is_empty() {
                "nothing granted instead".to_owned()
            } else {
                format!(
                    "granted instead, read-only: {}",
                    instead
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ));
        for dir in instead {
            if !roots.granted.contains(&dir) {
                roots.granted.push(dir);
            }
        }
    }
    roots
}

/// Whether `path` is readable by every native server without a grant: what
/// starting needs (the system directories, /etc less its secrets, the
/// devices, the executable and the installation `roots` granted for it).
pub fn granted_to_start(path: &Path, executable: &Path, roots: &[PathBuf]) -> bool {
    if SYSTEM_DIRS.iter().any(|dir| path.starts_with(dir))
        || DEVICES_RO.iter().any(|dev| path == Path::new(dev))
        || path == Path::new("/dev/null")
        || path == executable
        || roots.iter().any(|root| path.starts_with(root))
    {
        return true;
    }
    match path.strip_prefix("/etc") {
        Ok(relative) => !ETC_SECRETS
            .iter()
            .any(|secret| relative.starts_with(secret)),
        Err(_) => false,
    }
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
    match sandbox {
        Sandbox::Required => Err(SandboxError::Unsupported {
            feature: feature.to_owned(),
        }),
        Sandbox::BestEffort => {
            plan.not_enforced.push(feature.to_owned());
            Ok(())
        }
    }
}

/// The rights that apply to a file (directory-only rights do not).
fn file_only() -> BitFlags<AccessFs> {
    AccessFs::ReadFile | AccessFs::Execute | AccessFs::WriteFile | AccessFs::Truncate
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
    let abi = ABI::from(version);
    let ruleset_error = |operation: &'static str| {
        move |error: landlock::RulesetError| SandboxError::Ruleset {
            operation,
            detail: error.to_string(),
        }
    };
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
    } else {
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

/// What a `moat learn` run may write: its config's `rw` dirs, the
/// directories the user named with `--write` (each opened by
/// `grants::open_all`), and, without a private /tmp, a scratch directory of
/// its own.
pub struct LearnGrants<'a> {
    /// The config's grants: the `rw` ones are writable.
    pub dirs: &'a [crate::grants::OpenedGrant],
    pub writable: &'a [crate::grants::OpenedGrant],
    pub scratch: Option<&'a Path>,
    pub sandbox: Sandbox,
}

/// The Landlock ruleset of a `moat learn` run: read and execute everything
/// beneath `/`, write only what `grants` lists, `/dev/null` and (added in
/// the child) the private /tmp. What it tries to write elsewhere fails with
/// EACCES, and the run records that it wanted to. No network rule: a learn
/// run keeps the host's network, to record where it connects.
pub fn learn_plan(grants: &LearnGrants<'_>) -> Result<Plan, SandboxError> {
    learn_plan_for_abi(grants, kernel_abi())
}

/// [`learn_plan`] as if the kernel offered ABI `version` (0: no Landlock).
pub fn learn_plan_for_abi(grants: &LearnGrants<'_>, version: i32) -> Result<Plan, SandboxError> {
    let mut plan = Plan::default();
    if version == 0 {
        unsupported(
            grants.sandbox,
            "Landlock (Linux 5.13+ with landlock among the enabled LSMs): without it a `moat learn` run could write wherever Moat's user can",
            &mut plan,
        )?;
        return Ok(plan);
    }
    let abi = ABI::from(version);
    let ruleset_error = |operation: &'static str| {
        move |error: landlock::RulesetError| SandboxError::Ruleset {
            operation,
            detail: error.to_string(),
        }
    };
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
    if version < 3 {
        plan.not_enforced.push(
            "truncate(2) by name (Landlock ABI 3, Linux 6.2): a learn run may shorten a file it can only read"
                .to_owned(),
        );
    }
    let mut created = ruleset.create().map_err(ruleset_error("create ruleset"))?;
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let rule =
        |created: landlock::RulesetCreated, fd: PathFd, path: &Path, access: BitFlags<AccessFs>| {
            created
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|error| SandboxError::Rule {
                    operation: "add rule for",
                    path: path.to_owned(),
                    detail: error.to_string(),
                })
        };
    let open = |path: &Path| {
        PathFd::new(path).map_err(|error| SandboxError::Rule {
            operation: "open",
            path: path.to_owned(),
            detail: error.to_string(),
        })
    };
    created = rule(created, open(Path::new("/"))?, Path::new("/"), read)?;
    if let Ok(null) = PathFd::new("/dev/null") {
        created = rule(
            created,
            null,
            Path::new("/dev/null"),
            AccessFs::ReadFile | AccessFs::WriteFile,
        )?;
    }
    let mut writable: Vec<String> = vec!["its private /tmp".to_owned(), "/dev/null".to_owned()];
    let config_rw = grants.dirs.iter().filter(|d| d.grant.mode == DirMode::Rw);
    for dir in config_rw.chain(grants.writable) {
        let access = if dir.dir { all } else { all & file_only() };
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
        writable.push(dir.grant.host.display().to_string());
    }
    if let Some(scratch) = grants.scratch {
        created = rule(created, open(scratch)?, scratch, all)?;
        writable[0] = format!("its scratch directory {} (TMPDIR)", scratch.display());
    }
    plan.enforced.push(format!(
        "filesystem (Landlock ABI {version}), for `moat learn`: reads and executes anything; writes only {}: a write anywhere else fails with EACCES and is recorded, not done",
        writable.join(", ")
    ));
    plan.not_enforced.push(
        "file metadata (chmod, chown, utimes, extended attributes): Landlock does not govern it, so a server may change it on files its user owns".to_owned(),
    );
    plan.not_enforced.push(
        "network rules: a `moat learn` run keeps the host's network, to record where it connects"
            .to_owned(),
    );
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

#[cfg(test)]
mod tests {
    use super::*;

    fn grants<'a>(fd: BorrowedFd<'a>, net: &'a [NetGrant], sandbox: Sandbox) -> Grants<'a> {
        static ROOTS: ImplicitRoots = ImplicitRoots {
            granted: Vec::new(),
            held_back: Vec::new(),
        };
        Grants {
            executable: fd,
            executable_path: Path::new("/bin/sh"),
            interpreter: None,
            roots: &ROOTS,
            proxy_port: None,
            measure: &[],
            dirs: &[],
            net,
            sandbox,
        }
    }

    #[test]
    fn a_required_sandbox_names_the_missing_kernel_feature() {
        let file = std::fs::File::open("/bin/sh").unwrap();
        let fd = std::os::fd::AsFd::as_fd(&file);
        match plan_for_abi(&grants(fd, &[], Sandbox::Required), 0) {
            Err(SandboxError::Unsupported { feature }) => {
                assert!(feature.starts_with("Landlock (Linux 5.13+"), "{feature}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        match plan_for_abi(&grants(fd, &[], Sandbox::Required), 3) {
            Err(SandboxError::Unsupported { feature }) => {
                assert_eq!(feature, "Landlock ABI 4 (Linux 6.7) for TCP rules")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn best_effort_records_what_was_not_enforced() {
        let file = std::fs::File::open("/bin/sh").unwrap();
        let fd = std::os::fd::AsFd::as_fd(&file);
        let plan = plan_for_abi(&grants(fd, &[], Sandbox::BestEffort), 0).unwrap();
        assert!(plan.ruleset.is_none());
        assert!(plan.enforced.is_empty());
        assert_eq!(plan.not_enforced.len(), 1);
        assert!(plan.not_enforced[0].starts_with("Landlock (Linux 5.13+"));
    }

    #[test]
    fn a_required_learn_run_needs_landlock_and_says_what_it_may_write() {
        let learn = |sandbox| LearnGrants {
            dirs: &[],
            writable: &[],
            scratch: None,
            sandbox,
        };
        match learn_plan_for_abi(&learn(Sandbox::Required), 0) {
            Err(SandboxError::Unsupported { feature }) => {
                assert!(
                    feature.contains("`moat learn` run could write"),
                    "{feature}"
                )
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        if kernel_abi() >= 1 {
            let plan = learn_plan(&learn(Sandbox::Required)).unwrap();
            assert!(plan.ruleset.is_some());
            assert!(
                plan.enforced.iter().any(|line| line.ends_with(
                    "reads and executes anything; writes only its private /tmp, /dev/null: a write anywhere else fails with EACCES and is recorded, not done"
                )),
                "{:?}",
                plan.enforced
            );
        }
    }

    #[test]
    fn etc_grants_leave_the_secrets_out() {
        let mut paths = Vec::new();
        etc_grants(Path::new("/etc"), "", &mut paths);
        assert!(!paths.iter().any(|p| p == Path::new("/etc/shadow")));
        assert!(!paths.iter().any(|p| p.starts_with("/etc/ssl/private")));
        if Path::new("/etc/ssl/openssl.cnf").exists() {
            assert!(paths.iter().any(|p| p == Path::new("/etc/ssl/openssl.cnf")));
        }
    }

    /// Issue 32, item 1: the root a `~/.local/bin` console script would
    /// have brought (`~/.local`, holding Moat's state and data) is never
    /// granted; the interpreter's own site directory is, and nothing of
    /// Moat's. A pipx venv is granted whole; `$HOME` and a root holding a
    /// protected path never are.
    #[test]
    fn implicit_roots_keep_clear_of_home_local_and_moats_directories() {
        let home = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(home.path()).unwrap();
        let local = home.join(".local");
        for dir in [
            "bin",
            "lib/python3.12/site-packages",
            "lib/python3.11/site-packages",
            "lib/other",
            "share/moat/store",
            "state/moat",
            "share/pipx/venvs/tool/bin",
            "share/pipx/venvs/tool/lib/python3.12/site-packages",
        ] {
            std::fs::create_dir_all(local.join(dir)).unwrap();
        }
        std::fs::write(local.join("state/moat/audit.key"), "k").unwrap();
        let state = local.join("state/moat");
        let kept = crate::grants::Kept::new(
            &[
                crate::grants::Protected {
                    what: crate::grants::STATE_DIR,
                    path: state.clone(),
                },
                crate::grants::Protected {
                    what: crate::grants::DATA_DIR,
                    path: local.join("share/moat"),
                },
            ],
            Some(home.clone()),
        );
        let script = local.join("bin/server");
        // A pip --user script run by python3.12: its own site directory.
        let roots = implicit_roots(&script, Some(Path::new("/usr/bin/python3.12")), &kept);
        assert_eq!(roots.granted, [local.join("lib/python3.12")]);
        assert_eq!(roots.held_back.len(), 1, "{roots:?}");
        assert!(
            roots.held_back[0].starts_with(&format!(
                "not granted: the installation root {} of {}",
                local.display(),
                script.display()
            )) && roots.held_back[0].contains("as a whole"),
            "{}",
            roots.held_back[0]
        );
        // Run by an unversioned python3: every version's, nothing else.
        let roots = implicit_roots(&script, Some(Path::new("/usr/bin/python3")), &kept);
        assert_eq!(
            roots.granted,
            [local.join("lib/python3.11"), local.join("lib/python3.12")]
        );
        // A binary that is not Python's: nothing instead, and said.
        let roots = implicit_roots(&script, None, &kept);
        assert!(roots.granted.is_empty(), "{roots:?}");
        assert!(roots.held_back[0].contains("nothing granted instead"));
        // A pipx venv is granted whole.
        let venv = local.join("share/pipx/venvs/tool");
        let roots = implicit_roots(
            &venv.join("bin/tool"),
            Some(&venv.join("bin/python")),
            &kept,
        );
        assert_eq!(roots.granted, [venv]);
        assert!(roots.held_back.is_empty());
        // The home directory itself, and a root holding Moat's state.
        std::fs::create_dir_all(home.join("bin")).unwrap();
        std::fs::create_dir_all(home.join("lib")).unwrap();
        let roots = implicit_roots(&home.join("bin/x"), None, &kept);
        assert!(roots.granted.is_empty());
        assert!(
            roots.held_back[0].contains("it is the home directory"),
            "{roots:?}"
        );
        let other = crate::grants::Kept::new(
            &[crate::grants::Protected {
                what: crate::grants::STATE_DIR,
                path: state,
            }],
            None,
        );
        let roots = implicit_roots(&script, None, &other);
        assert!(roots.granted.is_empty());
        assert!(
            roots.held_back[0].contains("it holds Moat's state directory (the audit key)"),
            "{roots:?}"
        );
        // Inside what holds a key: refused too.
        assert!(
            other
                .refusal(&local.join("state/moat/sub"))
                .is_some_and(|why| why.contains("lies inside"))
        );
        // Inside the store (not a key): a package's venv may be granted.
        assert_eq!(kept.refusal(&local.join("share/moat/store/x")), None);
    }
}

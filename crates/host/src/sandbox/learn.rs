//! The Landlock ruleset of a `moat learn` run: everything readable, writes
//! only where the run may write.

use std::path::Path;

use landlock::{Access, AccessFs, BitFlags, PathBeneath, PathFd, RulesetCreatedAttr};

use super::landlock::{file_only, fs_ruleset, kernel_abi, ruleset_error};
use super::{Plan, SandboxError, enforce_or_report};
use crate::config::Sandbox;
use crate::grants::DirMode;

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
        enforce_or_report(
            grants.sandbox,
            "Landlock (Linux 5.13+ with landlock among the enabled LSMs): without it a `moat learn` run could write wherever Moat's user can",
            &mut plan.not_enforced,
        )?;
        return Ok(plan);
    }
    let (abi, ruleset) = fs_ruleset(version, &mut plan)?;
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

//! The native sandbox's kernel mechanisms, each planned in the parent and
//! applied in the child: Landlock rules ([`landlock`], and the ruleset of a
//! `moat learn` run, [`learn`]), what every server may read to start
//! ([`start`]), a root of the server's own ([`root`]) and the seccomp
//! filters ([`seccomp`]). Which of them one native launch gets, and the
//! lines that say so, are `native::contain`'s.
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

use std::os::fd::OwnedFd;
use std::path::PathBuf;

mod landlock;
mod learn;
pub mod root;
pub mod seccomp;
mod start;
#[cfg(test)]
mod tests;

pub use self::landlock::{Grants, plan, restrict_child, ruleset_fd};
pub use self::learn::{LearnGrants, learn_plan};
pub use self::start::{ImplicitRoots, granted_to_start, implicit_roots};

use crate::config::Sandbox;

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

/// Required or best-effort, decided in one place for every mechanism: a
/// `feature` the kernel cannot enforce refuses the launch under
/// `sandbox = "required"`, and is recorded in `not_enforced` otherwise.
pub(crate) fn enforce_or_report(
    sandbox: Sandbox,
    feature: &str,
    not_enforced: &mut Vec<String>,
) -> Result<(), SandboxError> {
    match sandbox {
        Sandbox::Required => Err(SandboxError::Unsupported {
            feature: feature.to_owned(),
        }),
        Sandbox::BestEffort => {
            not_enforced.push(feature.to_owned());
            Ok(())
        }
    }
}

//! The seccomp filters of a native server: the deny-list and socket-family
//! filters (`crate::sandbox::seccomp`), compiled once per process, and a
//! learn run's watch filter.

use crate::native::NativeError;
use crate::sandbox::SandboxError;

/// The programs to install in the child, with the filters' line in
/// `enforced`.
pub(super) fn programs(
    learn: bool,
    enforced: &mut Vec<String>,
) -> Result<Vec<seccompiler::BpfProgram>, NativeError> {
    // Pathname Unix sockets are reached through the filesystem, where
    // neither the network namespace nor Landlock (before ABI 9) applies:
    // socket(AF_UNIX) is refused instead.
    // The same for every launch: compiled once per process.
    static FILTERS: std::sync::OnceLock<Result<crate::sandbox::seccomp::Filters, String>> =
        std::sync::OnceLock::new();
    let filters = FILTERS
        .get_or_init(|| crate::sandbox::seccomp::filters(true).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|detail| {
            NativeError::Sandbox(SandboxError::Ruleset {
                operation: "seccomp",
                detail: detail.clone(),
            })
        })?;
    enforced.push(filters.summary.clone());
    let mut seccomp = filters.programs.clone();
    if learn {
        seccomp.push(crate::native::learn::watch_filter().map_err(|detail| {
            NativeError::Sandbox(SandboxError::Ruleset {
                operation: "seccomp (learn)",
                detail,
            })
        })?);
    }
    Ok(seccomp)
}

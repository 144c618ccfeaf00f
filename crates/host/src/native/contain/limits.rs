//! The child's rlimits, and the capabilities it keeps (none) with the line
//! that says so.

use rustix::process::{Resource, Rlimit};

use super::namespaces::NamespaceSupport;
use crate::limits::Limits;

pub(in crate::native) fn rlimits(limits: &Limits) -> Vec<(Resource, Rlimit)> {
    let both = |value: u64| Rlimit {
        current: Some(value),
        maximum: Some(value),
    };
    vec![
        // SIGXCPU at the soft limit, SIGKILL a second later.
        (
            Resource::Cpu,
            Rlimit {
                current: Some(limits.cpu_seconds),
                maximum: Some(limits.cpu_seconds.saturating_add(1)),
            },
        ),
        (Resource::Data, both(limits.data_bytes)),
        // u64::MAX is RLIM_INFINITY: no bound (the default).
        (Resource::As, both(limits.address_space_bytes)),
        (Resource::Nofile, both(limits.open_files)),
        (Resource::Nproc, both(limits.processes)),
        (Resource::Fsize, both(limits.file_size_bytes)),
        (Resource::Core, both(0)),
    ]
}

/// Whether the bounding set and securebits can be changed (the child holds
/// CAP_SETPCAP: root, or in its own user namespace), with the capability
/// line in `enforced`.
pub(super) fn capabilities(
    support: NamespaceSupport,
    root: bool,
    enforced: &mut Vec<String>,
) -> bool {
    let drop_bounding = support.available && support.user || root;
    enforced.push(if drop_bounding {
        "capabilities: none (bounding, permitted, effective, inheritable and ambient sets empty, securebits locked), no_new_privs".to_owned()
    } else {
        "capabilities: none (permitted, effective, inheritable and ambient sets empty), no_new_privs".to_owned()
    });
    drop_bounding
}

//! What a server's own words say of the sandbox: a failed start, a death
//! mid-call or a tool's error whose text shows a denial or an unreachable
//! network is told as a refusal, naming what was refused (the hosts, the
//! paths placed against the grants) and what to change; otherwise the
//! sandbox is not blamed.

use std::path::{Path, PathBuf};

use super::error::SessionError;
use crate::transport::Fault;

/// A server that died during the handshake under the sandbox: when its
/// stderr shows a denial (`Permission denied`, `EACCES`, `Operation not
/// permitted`, `Read-only file system`, a missing module), the error says
/// the sandbox may be why, with the paths its stderr names beside it.
/// Without a denial the sandbox is not blamed: the error is the server's
/// own exit, with its stderr.
pub(crate) fn sandbox_hint(
    server: String,
    operation: &str,
    fault: Fault,
    granted: &[(PathBuf, bool)],
) -> SessionError {
    let operation = operation.to_owned();
    let (Fault::Exited { stderr_tail, .. } | Fault::Crashed { stderr_tail, .. }) = &fault else {
        return SessionError::Fault {
            server,
            operation,
            fault,
        };
    };
    if stderr_tail.lines().any(is_network_failure) {
        let hosts = hosts_in(stderr_tail);
        return SessionError::NetworkRefused {
            server,
            operation,
            fault,
            hosts: if hosts.is_empty() {
                "a host its stderr does not name".to_owned()
            } else {
                hosts.join(", ")
            },
        };
    }
    if !stderr_tail.lines().any(is_denial) {
        return SessionError::Fault {
            server,
            operation,
            fault,
        };
    }
    let denied = denied_paths(stderr_tail);
    // Each path: under a read-only grant (to write it, that grant wants
    // `rw`), under the server's private /tmp, or outside every grant.
    let mut read_only: Vec<&PathBuf> = Vec::new();
    let mut private_tmp: Vec<&str> = Vec::new();
    let mut outside: Vec<String> = Vec::new();
    for path in &denied {
        let under = granted
            .iter()
            .filter(|(dir, _)| Path::new(path).starts_with(dir))
            .max_by_key(|(dir, _)| dir.as_os_str().len());
        match under {
            Some((dir, false)) => {
                if !read_only.contains(&dir) {
                    read_only.push(dir);
                }
            }
            Some((_, true)) => {}
            None if Path::new(path).starts_with("/tmp") => private_tmp.push(path),
            None => outside.push(path.clone()),
        }
    }
    let grants = probable_grants(&outside);
    let mut said = match (denied.is_empty(), grants.is_empty()) {
        (true, _) => String::new(),
        (false, true) => format!("; its stderr names {} beside a denial", denied.join(", ")),
        (false, false) => format!(
            "; its stderr names {} beside a denial, so the grant probably missing is {}",
            denied.join(", "),
            grants
                .iter()
                .map(|g| crate::grants::toml::dir_entry_inline(
                    &server,
                    Path::new(g),
                    crate::grants::DirMode::Ro
                ))
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    };
    for dir in read_only {
        said.push_str(&format!(
            "; {} is granted read-only: if the server is to write there, change that entry to `{}`",
            dir.display(),
            crate::grants::toml::dir_entry_inline(&server, dir, crate::grants::DirMode::Rw)
        ));
    }
    if !private_tmp.is_empty() {
        said.push_str(&format!(
            "; {} is under /tmp, which is the server's own (private and empty): a host path there is seen only when granted",
            private_tmp.join(", ")
        ));
    }
    SessionError::Sandboxed {
        denied: said,
        server,
        operation,
        fault,
    }
}

/// A refusal by the native sandbox, as the server's own words showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeenRefusal {
    /// `network` (a name that did not resolve, a network unreachable) or
    /// `filesystem` (a path named beside a denial).
    pub kind: &'static str,
    /// What was refused: the hosts, or the paths placed against the grants.
    pub subject: String,
}

impl SeenRefusal {
    /// What a failed start showed: `None` unless `error` is the sandbox's.
    pub(crate) fn of(error: &SessionError) -> Option<Self> {
        match error {
            SessionError::NetworkRefused { hosts, .. } => Some(Self {
                kind: "network",
                subject: hosts.clone(),
            }),
            SessionError::Sandboxed { denied, .. } if !denied.is_empty() => Some(Self {
                kind: "filesystem",
                subject: denied.trim_start_matches("; ").to_owned(),
            }),
            _ => None,
        }
    }

    /// The one line Moat adds to a tool's error that shows this refusal.
    pub(crate) fn line(&self, server: &str) -> String {
        match self.kind {
            "network" => format!(
                "moat: the server tried to reach the network ({}), which the native sandbox refuses to what `net` does not list: a server that downloads code or data at run time (an `npm install` or `pip install` at first use) needs it installed ahead of time (`moat add`), or the host granted in `net`; `moat learn {server} --call TOOL ARGS` shows where a call connects",
                self.subject
            ),
            _ => format!(
                "moat: the native sandbox may be the cause: the server may read only what `moat inspect {server}` lists; {}; `moat learn {server} --call TOOL ARGS` shows what a call uses",
                self.subject
            ),
        }
    }
}

/// What a tool's error text shows the native sandbox refusing: the
/// network it reached for (the hosts named), or paths named beside a
/// denial (placed against `granted` as at start). `None` when the text
/// shows neither, or names no path beside a denial.
pub(crate) fn refusal_seen(
    server: &str,
    text: &str,
    granted: &[(PathBuf, bool)],
) -> Option<SeenRefusal> {
    let fault = Fault::Exited {
        server: server.to_owned(),
        code: 0,
        stderr_tail: text.to_owned(),
    };
    SeenRefusal::of(&sandbox_hint(
        server.to_owned(),
        "tools/call",
        fault,
        granted,
    ))
}

/// The grants that would open `denied` paths: the package an existing file
/// belongs to (the nearest directory with `package.json`,
/// `pyproject.toml` or `setup.py`), else its directory; an existing
/// directory itself. Paths that do not exist suggest nothing.
pub(crate) fn probable_grants(denied: &[String]) -> Vec<String> {
    let mut grants: Vec<String> = Vec::new();
    for path in denied {
        let path = Path::new(path);
        let grant = if path.is_dir() {
            path.to_owned()
        } else if path.is_file() {
            crate::grants::fs::package_root(path)
        } else {
            continue;
        };
        let grant = grant.display().to_string();
        if !grants.contains(&grant) {
            grants.push(grant);
        }
    }
    grants
}

/// Absolute paths on stderr lines that report a denial, at most eight.
/// What a line of stderr says when the sandbox may have refused something.
pub(crate) const DENIALS: [&str; 9] = [
    "Permission denied",
    "permission denied",
    "EACCES",
    "Operation not permitted",
    "EPERM",
    "Read-only file system",
    "EROFS",
    "No module named",
    "Cannot find module",
];

/// What a line of stderr says when a name did not resolve or a network
/// was unreachable: inside the sandbox, the server reached for the network
/// beyond its grants.
pub(crate) const NETWORK_FAILURES: [&str; 10] = [
    "EAI_AGAIN",
    "ENOTFOUND",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Could not resolve host",
    "getaddrinfo failed",
    "ENETUNREACH",
    "Network is unreachable",
    "nodename nor servname",
    "NameResolutionError",
];

pub(crate) fn is_network_failure(line: &str) -> bool {
    NETWORK_FAILURES.iter().any(|d| line.contains(d))
}

/// The host names on stderr lines that report a network failure: in a
/// URL, or right after `ENOTFOUND`, `EAI_AGAIN` or `host:`; at most four.
pub(crate) fn hosts_in(stderr: &str) -> Vec<String> {
    let mut hosts: Vec<String> = Vec::new();
    for line in stderr.lines().filter(|l| is_network_failure(l)) {
        let words: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || "'\"`,;()[]<>".contains(c))
            .filter(|w| !w.is_empty())
            .collect();
        for (at, word) in words.iter().enumerate() {
            let candidate = if let Some((_, rest)) = word.split_once("://") {
                rest
            } else if at > 0 && ["ENOTFOUND", "EAI_AGAIN", "host:"].contains(&words[at - 1]) {
                word
            } else {
                continue;
            };
            let authority = candidate.split(['/', '?', '#']).next().unwrap_or_default();
            let host = authority
                .rsplit_once(':')
                .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
                .map_or(authority, |(host, _)| host)
                .trim_end_matches(['.', ':'])
                .to_ascii_lowercase();
            let valid = !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
            if valid && !hosts.contains(&host) {
                hosts.push(host);
            }
        }
    }
    hosts.truncate(4);
    hosts
}

/// A missing file: a denial when the path it names exists on the host (in
/// a root of its own, a server does not see what it was not granted).
pub(crate) const MISSING: [&str; 2] = ["No such file or directory", "ENOENT"];

/// The absolute paths a line of stderr names.
pub(crate) fn paths_in(line: &str) -> impl Iterator<Item = &str> {
    line.split(|c: char| c.is_whitespace() || "'\"`,;()[]".contains(c))
        .map(|word| word.trim_end_matches([':', '.']))
        .filter(|path| path.starts_with('/') && path.len() > 1)
}

/// Whether a line of stderr shows something the sandbox may have refused.
pub(crate) fn is_denial(line: &str) -> bool {
    DENIALS.iter().any(|d| line.contains(d))
        || (MISSING.iter().any(|m| line.contains(m))
            && paths_in(line).any(|path| Path::new(path).exists()))
}

pub(crate) fn denied_paths(stderr: &str) -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    for line in stderr.lines().filter(|l| is_denial(l)) {
        for path in paths_in(line) {
            if !paths.iter().any(|p| p == path) {
                paths.push(path.to_owned());
            }
        }
    }
    paths.truncate(8);
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn a_start_that_reached_for_the_network_is_told_so_naming_the_host() {
        let fault = |stderr: &str| Fault::Exited {
            server: "s".into(),
            code: 1,
            stderr_tail: stderr.to_owned(),
        };
        let npm = "npm error code EAI_AGAIN\nnpm error request to https://registry.npmjs.org/turndown failed, reason: getaddrinfo EAI_AGAIN registry.npmjs.org\n";
        let error = sandbox_hint("fetch".into(), "handshake", fault(npm), &[]).to_string();
        assert!(
            error.contains("It tried to reach the network (registry.npmjs.org), which the native sandbox refuses")
                && error.contains("needs it installed ahead of time (`moat add`)")
                && error.contains("`moat learn fetch`"),
            "{error}"
        );
        let python = "httpx.ConnectError: [Errno -3] Temporary failure in name resolution\n  while fetching https://huggingface.co:443/api/models from /opt/app/main.py\n";
        let error = sandbox_hint("models".into(), "handshake", fault(python), &[]).to_string();
        assert!(
            error.contains("(a host its stderr does not name)"),
            "{error}"
        );
        let both =
            "Could not resolve host: files.example.com while reading /srv/data/config.json\n";
        assert_eq!(hosts_in(both), ["files.example.com"]);
        // No network failure, no denial: the server's own exit.
        let own = sandbox_hint(
            "x".into(),
            "handshake",
            fault("error: API_KEY is not set\n"),
            &[],
        );
        assert!(matches!(own, SessionError::Fault { .. }), "{own}");
    }

    #[test]
    pub(crate) fn a_refusal_says_whether_the_path_was_read_only_private_or_outside_every_grant() {
        let fault = Fault::Exited {
            server: "s".into(),
            code: 1,
            stderr_tail: "OSError: [Errno 30] Read-only file system: '/srv/vault/.obsidian/new.md'\nPermissionError: [Errno 13] Permission denied: '/tmp/host-cache/x'\n".into(),
        };
        let granted = [
            (PathBuf::from("/srv"), true),
            (PathBuf::from("/srv/vault"), false),
        ];
        let error = sandbox_hint("notes".into(), "tools/call", fault, &granted).to_string();
        assert!(
            error.contains("; /srv/vault is granted read-only: if the server is to write there, change that entry to `[[servers.notes.dirs]] host = \"/srv/vault\" mode = \"rw\"`"),
            "{error}"
        );
        assert!(
            error.contains(
                "; /tmp/host-cache/x is under /tmp, which is the server's own (private and empty)"
            ),
            "{error}"
        );
        assert!(!error.contains("grant probably missing"), "{error}");
    }
}

//! The kill switch's vocabulary: what a `[[revoked]]` entry of moat.lock
//! names (a server, one of its tools, or a digest), and the set of
//! revocations the gateway checks on every call and every launch. This
//! module only parses and matches; [`crate::lock`] reads and writes the
//! entries, and [`crate::gateway`] enforces them (refuses, drains, stops
//! children) and reloads a changed lock.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::identity::{Digest, DigestParseError};

/// One `[[revoked]]` entry of moat.lock: what was revoked, by whom, when
/// and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Revocation {
    /// `SERVER`, `SERVER__TOOL` or `sha256:DIGEST` (see [`Target`]).
    pub target: String,
    /// Who revoked it: the user `moat revoke` ran as.
    pub by: String,
    /// When, in RFC 3339 UTC.
    pub at: String,
    /// Why, as given to `moat revoke --reason`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// What one revocation names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// `SERVER`: every tool of the configured server of that name.
    Server(String),
    /// `SERVER__TOOL`: one tool of one server.
    Tool { server: String, tool: String },
    /// `sha256:DIGEST`: any server whose component or executable has that
    /// digest (or, for a pulled component, whose manifest has it),
    /// whatever its name.
    Digest(Digest),
}

/// Why a string is not a revocation target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("`{target}`: {source}")]
    Digest {
        target: String,
        #[source]
        source: DigestParseError,
    },
    #[error(
        "`{target}` is not SERVER, SERVER__TOOL or sha256:DIGEST (a server's name as moat.toml has it)"
    )]
    Name { target: String },
}

/// Within what the gateway can expose at all: 1 to 64 bytes of
/// `[A-Za-z0-9_-]`.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl FromStr for Target {
    type Err = TargetError;

    fn from_str(target: &str) -> Result<Self, Self::Err> {
        if let Some(hex) = target.strip_prefix("sha256:") {
            return hex
                .parse()
                .map(Self::Digest)
                .map_err(|source| TargetError::Digest {
                    target: target.to_owned(),
                    source,
                });
        }
        let name = || TargetError::Name {
            target: target.to_owned(),
        };
        if !valid_name(target) {
            return Err(name());
        }
        let server_name = crate::config::valid_server_name;
        Ok(match target.split_once(crate::config::SEPARATOR) {
            Some((server, tool)) if server_name(server) && !tool.is_empty() => Self::Tool {
                server: server.to_owned(),
                tool: tool.to_owned(),
            },
            None if server_name(target) => Self::Server(target.to_owned()),
            _ => return Err(name()),
        })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Server(server) => f.write_str(server),
            Self::Tool { server, tool } => {
                write!(f, "{server}{}{tool}", crate::config::SEPARATOR)
            }
            Self::Digest(digest) => write!(f, "sha256:{digest}"),
        }
    }
}

/// A new revocation of `target`, by the user this process runs as, now.
pub fn revocation(target: &Target, reason: &str) -> Revocation {
    Revocation {
        target: target.to_string(),
        by: who(),
        at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        reason: reason.to_owned(),
    }
}

/// The user this process runs as: `$USER` (when set) and the real uid.
pub fn who() -> String {
    #[cfg(unix)]
    let uid = rustix::process::getuid().as_raw();
    #[cfg(not(unix))]
    let uid = "?";
    match std::env::var("USER").ok().filter(|u| !u.is_empty()) {
        Some(user) => format!("{user} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

/// The revocations in force, each with what it targets.
#[derive(Clone, Debug, Default)]
pub struct Revoked {
    entries: Vec<(Target, Revocation)>,
}

impl Revoked {
    /// The revocations of `entries` (a lock's `[[revoked]]`, whose targets
    /// were checked when it was parsed; one that does not parse is left out).
    pub fn of(entries: &[Revocation]) -> Self {
        Self {
            entries: entries
                .iter()
                .filter_map(|r| Some((r.target.parse().ok()?, r.clone())))
                .collect(),
        }
    }

    /// Whether nothing is revoked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every revocation, in order.
    pub fn iter(&self) -> impl Iterator<Item = &(Target, Revocation)> {
        self.entries.iter()
    }

    /// `self` with every revocation of `other` whose target is not here yet.
    /// Returns the union and what was added.
    pub fn with(&self, other: &Self) -> (Self, Vec<(Target, Revocation)>) {
        let added: Vec<_> = other
            .entries
            .iter()
            .filter(|(target, _)| !self.entries.iter().any(|(t, _)| t == target))
            .cloned()
            .collect();
        let mut union = self.clone();
        union.entries.extend(added.iter().cloned());
        (union, added)
    }

    /// The revocation that forbids calling `tool` on `server` (by name),
    /// if any: the server's, or the tool's.
    pub fn of_name(&self, server: &str, tool: Option<&str>) -> Option<&Revocation> {
        self.entries.iter().find_map(|(target, revocation)| {
            let hit = match target {
                Target::Server(s) => s == server,
                Target::Tool { server: s, tool: t } => s == server && Some(t.as_str()) == tool,
                Target::Digest(_) => false,
            };
            hit.then_some(revocation)
        })
    }

    /// The revocation of any of `digests` (what a launched instance runs),
    /// if any.
    pub fn of_digests<'d>(
        &self,
        digests: impl IntoIterator<Item = &'d Digest> + Clone,
    ) -> Option<&Revocation> {
        self.entries
            .iter()
            .find_map(|(target, revocation)| match target {
                Target::Digest(d) => digests
                    .clone()
                    .into_iter()
                    .any(|x| x == d)
                    .then_some(revocation),
                _ => None,
            })
    }
}

/// How a refusal names a revocation: the target, who, when and why.
pub fn describe(revocation: &Revocation) -> String {
    let mut text = format!(
        "`{}` was revoked by {} at {}",
        revocation.target, revocation.by, revocation.at
    );
    if !revocation.reason.is_empty() {
        text.push_str(": ");
        text.push_str(&revocation.reason);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn revoked(targets: &[&str]) -> Revoked {
        let entries: Vec<Revocation> = targets
            .iter()
            .map(|t| revocation(&t.parse().unwrap(), ""))
            .collect();
        Revoked::of(&entries)
    }

    #[test]
    fn targets_parse_and_print_back() {
        let digest = "sha256:".to_owned() + &"ab".repeat(32);
        for text in ["files", "files__read_file", digest.as_str()] {
            assert_eq!(text.parse::<Target>().unwrap().to_string(), text);
        }
        assert_eq!(
            "files__read__x".parse::<Target>().unwrap(),
            Target::Tool {
                server: "files".into(),
                tool: "read__x".into()
            },
            "a server name has no `__`: the first one splits"
        );
        for bad in ["", "__x", "x__", "_x", "a b", "files/x", &"x".repeat(33)] {
            assert_eq!(
                bad.parse::<Target>().unwrap_err(),
                TargetError::Name { target: bad.into() },
                "{bad:?}"
            );
        }
        assert!(matches!(
            "sha256:12".parse::<Target>().unwrap_err(),
            TargetError::Digest { .. }
        ));
    }

    #[test]
    fn names_and_digests_match_only_what_they_name() {
        let digest = Digest::of(b"component");
        let revoked = revoked(&["files", "web__fetch", &format!("sha256:{digest}")]);
        assert!(revoked.of_name("files", Some("anything")).is_some());
        assert!(revoked.of_name("files", None).is_some());
        assert!(revoked.of_name("web", Some("fetch")).is_some());
        assert!(revoked.of_name("web", Some("search")).is_none());
        assert!(
            revoked.of_name("web", None).is_none(),
            "one tool, not the server"
        );
        assert!(revoked.of_name("filesx", None).is_none());
        assert!(revoked.of_digests([&digest]).is_some());
        assert!(revoked.of_digests([&Digest::of(b"other")]).is_none());
    }

    #[test]
    fn with_adds_only_new_targets() {
        let first = revoked(&["a"]);
        let (union, added) = first.with(&revoked(&["a", "b"]));
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].0, Target::Server("b".into()));
        assert_eq!(union.iter().count(), 2);
    }
}

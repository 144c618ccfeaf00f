//! A replica's name, and the ids that carry it.
//!
//! Beside other `moat serve --replica NAME` processes behind one load
//! balancer, every id a replica hands out that names state only it holds
//! ends in `.NAME`: a 2025 session's `Mcp-Session-Id`, a task's id, the
//! `requestState` of a call parked at the gateway. The balancer reads the
//! last `.`-separated field of the header or of the JSON body and sends the
//! request to the server of that name (`deploy/haproxy/haproxy.cfg`), so no
//! replica forwards for another and nothing is shared to route.
//!
//! A replica that is handed an id of another (its owner died, or the
//! balancer routed wrong) says so by name instead of answering: see
//! [`Replica::foreign`].

use std::sync::Arc;

/// The longest name: a DNS label, as a pod's or a balancer's server name.
pub const MAX_NAME: usize = 63;

/// How much of a foreign id an answer repeats.
pub const SHOWN: usize = 96;

/// What marks the replica in an id.
pub const SEPARATOR: char = '.';

/// Why a replica name was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReplicaError {
    #[error(
        "--replica {name:?}: a replica name is 1 to {MAX_NAME} characters of a-z, 0-9 and `-`, beginning and ending with a letter or digit (a DNS label, as a pod's name): it ends the ids this replica hands out, where the load balancer reads it"
    )]
    Name { name: String },
}

/// The name of this replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica(Arc<str>);

impl Replica {
    /// `name`, if it is a DNS label.
    pub fn new(name: &str) -> Result<Self, ReplicaError> {
        let label = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        let ok = !name.is_empty()
            && name.len() <= MAX_NAME
            && name.chars().all(|c| label(c) || c == '-')
            && name.starts_with(label)
            && name.ends_with(label);
        if ok {
            Ok(Self(name.into()))
        } else {
            Err(ReplicaError::Name {
                name: name.to_owned(),
            })
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// `id`, marked as this replica's.
    pub fn tag(&self, id: &str) -> String {
        format!("{id}{SEPARATOR}{}", self.0)
    }

    /// The replica an id names, when it is not this one: `id` ends in
    /// `.OTHER`, a replica name. Unmarked ids (from a gateway without
    /// `--replica`, or made up) are nobody's.
    pub fn foreign<'a>(&self, id: &'a str) -> Option<&'a str> {
        let (_, owner) = id.rsplit_once(SEPARATOR)?;
        (owner != self.name() && Self::new(owner).is_ok()).then_some(owner)
    }

    /// What a request naming `id` (a `what`: session, task, parked call)
    /// that another replica issued is told. The id is quoted, and cut at
    /// [`SHOWN`] characters: it is the requester's text.
    pub fn misrouted(&self, what: &str, id: &str) -> Option<String> {
        let owner = self.foreign(id)?;
        let shown: String = match id.char_indices().nth(SHOWN) {
            Some((at, _)) => format!("{:?}…", &id[..at]),
            None => format!("{id:?}"),
        };
        Some(format!(
            "{what} {shown} is held by replica `{owner}`, not this one (`{me}`): `{owner}` is gone, or the load balancer did not route this request by the id's last field; nothing of it is known here: start again",
            me = self.name()
        ))
    }
}

impl std::fmt::Display for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_a_dns_label() {
        for good in ["r1", "moat-front-0", "a", &"x".repeat(MAX_NAME)] {
            assert_eq!(Replica::new(good).unwrap().name(), good);
        }
        for bad in [
            "",
            "R1",
            "-a",
            "a-",
            "a.b",
            "a_b",
            "a b",
            &"x".repeat(MAX_NAME + 1),
        ] {
            assert_eq!(
                Replica::new(bad),
                Err(ReplicaError::Name {
                    name: bad.to_owned()
                }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn an_id_of_another_replica_is_named_and_ones_own_or_unmarked_are_not() {
        let me = Replica::new("r1").unwrap();
        let mine = me.tag("files__0123");
        assert_eq!(mine, "files__0123.r1");
        assert_eq!(me.foreign(&mine), None);
        assert_eq!(me.foreign("files__0123.r2"), Some("r2"));
        assert_eq!(me.foreign("moat-parked:ab"), None);
        assert_eq!(me.foreign("a.B_"), None, "not a replica name");
        let told = me.misrouted("task", "files__0123.r2").unwrap();
        assert!(
            told.starts_with(
                "task \"files__0123.r2\" is held by replica `r2`, not this one (`r1`): `r2` is gone"
            ),
            "{told}"
        );
        assert_eq!(me.misrouted("task", &mine), None);
        // The requester's text is quoted and cut.
        let long = format!("{}`\n.r2", "A".repeat(100_000));
        let told = me.misrouted("session", &long).unwrap();
        assert!(told.len() < 400, "{told}");
        assert!(
            told.starts_with(&format!(
                "session \"{}\"… is held by replica `r2`",
                "A".repeat(SHOWN)
            )),
            "{told}"
        );
    }
}

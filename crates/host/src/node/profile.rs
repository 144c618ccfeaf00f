//! A profile's revision, and a launch request resolved against the node's
//! own config and lock. The revision is the sha256 of one canonical JSON
//! document holding everything the node would run the profile with: its
//! lock entry (kind, digests, execution identity, measured files, grant
//! inodes, tool, prompt and resource pins, package, registry artifact) and
//! its config's grants (`dirs` with modes, `net`, `http`, the environment:
//! `env` names and values, `env_passthrough` names), limits, sandbox and,
//! for a typed component, its instances. A front that expects one revision never gets
//! another: any change to what runs, or how, is a new revision.

use super::LaunchRequest;
use super::NodeError;
use crate::config::{Config, ServerSpec};
use crate::identity::Digest;
use crate::lock::{Lock, LockedServer, canonical_json};

/// The `format` of the document a revision is the digest of.
pub const FORMAT: &str = "moat-profile/1";

/// The revision of `spec` as `locked` pins it.
pub fn revision(spec: &ServerSpec, locked: &LockedServer) -> Digest {
    // A path as its exact bytes: two paths that print alike (not UTF-8)
    // are still two revisions.
    let path = |p: &std::path::Path| match p.to_str() {
        Some(text) => text.to_owned(),
        None => format!("bytes:{}", hex::encode(p.as_os_str().as_encoded_bytes())),
    };
    let dirs: Vec<serde_json::Value> = spec
        .dirs
        .iter()
        .map(|d| {
            serde_json::json!({
                "host": path(&d.host),
                "guest": d.guest,
                "mode": d.mode.to_string(),
            })
        })
        .collect();
    let document = serde_json::json!({
        "format": FORMAT,
        "profile": spec.name,
        "locked": locked,
        "dirs": dirs,
        "net": spec.net.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "http": spec.http().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "env": spec.env.values,
        "env_passthrough": spec.env.passthrough,
        "instances": match &spec.kind {
            crate::config::ServerKind::Wasm { instances, .. } => format!("{instances:?}"),
            _ => String::new(),
        },
        "limits": spec.limits,
        "sandbox": spec.sandbox.to_string(),
    });
    Digest::of(canonical_json(&document).as_bytes())
}

/// The profile `request` names, from the node's `config` and `lock`, with
/// its revision: refused when the config has no such server, the lock no
/// entry for it, or the revision held is not the one expected.
pub fn resolve<'a>(
    config: &'a Config,
    lock: &Lock,
    request: &LaunchRequest,
) -> Result<(&'a ServerSpec, Digest), NodeError> {
    let Some(spec) = config.servers.get(&request.profile) else {
        return Err(NodeError::UnknownProfile {
            profile: request.profile.clone(),
            known: config
                .servers
                .keys()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", "),
        });
    };
    let Some(locked) = lock.servers.get(&request.profile) else {
        return Err(NodeError::NotLocked {
            profile: request.profile.clone(),
        });
    };
    let held = revision(spec, locked);
    if held != request.revision {
        return Err(NodeError::Stale {
            profile: request.profile.clone(),
            expected: request.revision,
            held,
        });
    }
    Ok((spec, held))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(extra: &str) -> Config {
        Config::parse(
            Path::new("/srv/node/moat.toml"),
            &format!(
                "[servers.time]\ncommand = \"/usr/bin/python3\"\nargs = [\"-m\", \"mcp_server_time\"]\nsha256 = \"sha256:{}\"\n{extra}[servers.other]\nwasm = \"o.wasm\"\nallow_unmeasured = true\n",
                "ab".repeat(32)
            ),
        )
        .unwrap()
    }

    fn locked(identity: &str) -> LockedServer {
        LockedServer {
            kind: "native".into(),
            evidence: "native-measured".into(),
            sha256: format!("sha256:{}", "ab".repeat(32)),
            identity: identity.into(),
            measured: Default::default(),
            grants: Default::default(),
            tools: Vec::new(),
            prompts: Vec::new(),
            resources: Vec::new(),
            package: None,
            oci: None,
        }
    }

    fn lock(identity: &str) -> Lock {
        Lock {
            version: crate::lock::LOCK_VERSION,
            servers: [("time".to_owned(), locked(identity))].into(),
            revoked: Vec::new(),
        }
    }

    /// What runs and how it runs are each part of the revision: a grant,
    /// a mode, a limit, the sandbox, the environment's names, the pinned
    /// identity.
    #[test]
    fn a_revision_changes_with_anything_the_profile_runs_with() {
        let base = config("");
        let spec = base.server("time").unwrap();
        let held = revision(spec, &locked("sha256:1"));
        assert_eq!(held, revision(spec, &locked("sha256:1")), "stable");
        assert_ne!(held, revision(spec, &locked("sha256:2")), "identity");
        for extra in [
            "[[servers.time.dirs]]\nhost = \"/srv\"\nmode = \"ro\"\n",
            "net = [\"example.com:443\"]\n",
            "env_passthrough = [\"TZ\"]\n",
            "env = { NODE_OPTIONS = \"--require /tmp/x.js\" }\n",
            "sandbox = \"best-effort\"\n",
            "[servers.time.limits]\nrequest_timeout_ms = 1000\n",
        ] {
            let changed = config(extra);
            assert_ne!(
                held,
                revision(changed.server("time").unwrap(), &locked("sha256:1")),
                "{extra}"
            );
        }
        let ro = config("[[servers.time.dirs]]\nhost = \"/srv\"\nmode = \"ro\"\n");
        let rw = config("[[servers.time.dirs]]\nhost = \"/srv\"\nmode = \"rw\"\n");
        assert_ne!(
            revision(ro.server("time").unwrap(), &locked("sha256:1")),
            revision(rw.server("time").unwrap(), &locked("sha256:1")),
            "a mode"
        );
    }

    #[test]
    fn a_request_resolves_only_to_the_profile_and_revision_the_node_holds() {
        let config = config("");
        let lock = lock("sha256:1");
        let held = revision(config.server("time").unwrap(), &lock.servers["time"]);
        let ask = |profile: &str, revision: Digest| LaunchRequest {
            profile: profile.into(),
            revision,
        };
        let (spec, revision) = resolve(&config, &lock, &ask("time", held)).unwrap();
        assert_eq!((spec.name.as_str(), revision), ("time", held));

        let stale = Digest::of(b"an older lock");
        assert_eq!(
            resolve(&config, &lock, &ask("time", stale))
                .unwrap_err()
                .to_string(),
            format!(
                "profile `time`: stale revision: the front expects {stale}, this node holds {held} (update the front's `revision`, or the node's moat.lock, so that they agree)"
            )
        );
        assert_eq!(
            resolve(&config, &lock, &ask("gpu", held))
                .unwrap_err()
                .to_string(),
            "profile `gpu`: this node has no such profile (its config names: other, time)"
        );
        assert_eq!(
            resolve(&config, &lock, &ask("other", held))
                .unwrap_err()
                .to_string(),
            "profile `other`: this node holds no lock entry for it: run `moat lock` on the node"
        );
    }
}

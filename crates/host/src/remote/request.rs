//! A launch request: exactly `{"profile": NAME, "revision": "sha256:..."}`.
//! Every other field is refused by name, so a front can never hand the node
//! a command, a grant, a limit or a policy of its own.

use crate::identity::Digest;

/// Why a launch request is refused before anything is resolved.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("launch request: {detail}")]
    Bad { detail: String },
    #[error(
        "launch request: field `{field}` is not accepted: a front names a profile and its revision only; grants, limits, commands and policy are the node's own"
    )]
    FieldRefused { field: String },
}

/// The fields a launch request has.
pub const FIELDS: [&str; 2] = ["profile", "revision"];

/// What a front asks a node to launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchRequest {
    /// A server name in the node's config.
    pub profile: String,
    /// The digest of that profile the front expects
    /// (`moat_host::node::profile::revision`).
    pub revision: Digest,
}

impl LaunchRequest {
    /// The request as JSON (what a front sends).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"profile": self.profile, "revision": self.revision.to_string()})
    }

    /// Parses a request body: a JSON object with exactly [`FIELDS`].
    pub fn parse(body: &[u8]) -> Result<Self, RequestError> {
        let bad = |detail: String| RequestError::Bad { detail };
        let value: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| bad(format!("not JSON: {e}")))?;
        let Some(object) = value.as_object() else {
            return Err(bad("not a JSON object".into()));
        };
        if let Some(field) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(RequestError::FieldRefused {
                field: crate::text::printable(field),
            });
        }
        let text = |field: &str| {
            object
                .get(field)
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| bad(format!("`{field}` must be a string")))
        };
        let profile = text("profile")?.to_owned();
        if !crate::config::valid_server_name(&profile) {
            return Err(bad(format!(
                "profile {:?} is not a server name",
                crate::text::printable(&profile)
            )));
        }
        let revision = text("revision")?
            .parse()
            .map_err(|e| bad(format!("revision: {e}")))?;
        Ok(Self { profile, revision })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REVISION: &str =
        "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    #[test]
    fn a_request_names_a_profile_and_a_revision_and_nothing_else() {
        let body = format!(r#"{{"profile": "time", "revision": "{REVISION}"}}"#);
        let request = LaunchRequest::parse(body.as_bytes()).unwrap();
        assert_eq!(request.profile, "time");
        assert_eq!(
            request.revision.to_string(),
            REVISION.trim_start_matches("sha256:")
        );
        assert_eq!(
            LaunchRequest::parse(request.to_json().to_string().as_bytes()).unwrap(),
            request
        );
    }

    /// Every field a node's config would accept for a server, and the
    /// compiled policy, is refused by name, whatever its value.
    #[test]
    fn every_field_beyond_profile_and_revision_is_refused_by_name() {
        for field in [
            "command",
            "args",
            "cwd",
            "env",
            "env_passthrough",
            "wasm",
            "url",
            "bearer_token_env",
            "sha256",
            "allow_unmeasured",
            "measure",
            "dirs",
            "net",
            "http",
            "limits",
            "sandbox",
            "package",
            "instances",
            "policy",
            "landlock",
            "seccomp",
        ] {
            let body = format!(
                r#"{{"profile": "time", "revision": "{REVISION}", "{field}": ["/bin/sh"]}}"#
            );
            let error = LaunchRequest::parse(body.as_bytes()).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!(
                    "launch request: field `{field}` is not accepted: a front names a profile and its revision only; grants, limits, commands and policy are the node's own"
                )
            );
        }
    }

    #[test]
    fn a_malformed_request_is_named() {
        for (body, detail) in [
            ("[]", "not a JSON object"),
            (
                r#"{"profile": 1, "revision": "x"}"#,
                "`profile` must be a string",
            ),
            (r#"{"revision": "x"}"#, "`profile` must be a string"),
            (
                r#"{"profile": "../etc", "revision": "x"}"#,
                "profile \"../etc\" is not a server name",
            ),
        ] {
            let error = LaunchRequest::parse(body.as_bytes()).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!("launch request: {detail}"),
                "{body}"
            );
        }
        let error = LaunchRequest::parse(br#"{"profile": "a", "revision": "md5:1"}"#).unwrap_err();
        assert!(
            error.to_string().starts_with("launch request: revision: "),
            "{error}"
        );
    }
}

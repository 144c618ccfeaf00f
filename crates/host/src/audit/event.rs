//! What is recorded: one [`Event`] per line, and an [`Outcome`] in Moat's
//! words, with only the digest and length of any text the server chose.

use serde::Serialize;

use crate::identity::Digest;

/// One audited event. Field names are stable: tools read them.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    SessionOpen {
        session: String,
    },
    SessionClose {
        session: String,
        outcome: String,
    },
    ServerLaunch {
        session: String,
        server: String,
        identity: String,
        sha256: Option<String>,
        /// For a component started from a snapshot of its initialised
        /// state: the snapshot's digest (what runs; `sha256` is the
        /// measured source it was made from).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        snapshot: Option<String>,
        evidence: String,
    },
    ServerExit {
        session: String,
        server: String,
        /// The execution identity of the child that exited.
        identity: String,
        /// Its evidence class.
        evidence: String,
        #[serde(flatten)]
        outcome: Outcome,
    },
    /// A server could not start: its tools are left out of the listings
    /// until a later try (the `attempts`-th failure in a row) succeeds.
    ServerStartFailed {
        session: String,
        server: String,
        attempts: u32,
        #[serde(flatten)]
        outcome: Outcome,
    },
    /// A native server's egress was refused by Moat: a name its DNS was
    /// asked that no `net` entry lists, a proxy request outside the
    /// grants, or an entry whose name had no usable address at launch.
    EgressRefused {
        server: String,
        /// `host:port`, or the name asked.
        destination: String,
        reason: String,
    },
    /// A native server's own words (its stderr at a failed start, a tool's
    /// error) showed the sandbox refusing it something: Moat cannot see
    /// a Landlock denial itself, so this is what the server reported,
    /// placed against its grants.
    SandboxRefused {
        session: String,
        server: String,
        /// `start`, or `tools/call TOOL`.
        during: String,
        /// `network` or `filesystem`.
        kind: String,
        /// The hosts, or the paths and the grant each falls under.
        subject: String,
    },
    /// `moat serve --http` turned a connection or request away at a limit.
    HttpRefused {
        /// `max-sessions`, `max-connections`, `header-timeout`,
        /// `body-too-large`, `unauthorized`, `audit-unwritable`.
        reason: String,
        status: u16,
    },
    /// A revocation came into force while serving (moat.lock re-read), or
    /// was lifted (`lifted`).
    Revoke {
        target: String,
        by: String,
        at: String,
        reason: String,
        /// What made the gateway read it: `SIGHUP`, say.
        source: String,
        lifted: bool,
    },
    /// `moat serve` read its config and lock again (SIGHUP, `--watch`):
    /// `generation` serves new sessions from then on, or, when `error` is
    /// set, the reload was refused and nothing changed.
    Reload {
        source: String,
        generation: u64,
        outcome: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A session's claim, when claims go into the audit log (see
    /// [`crate::claim`]): the signed document, after the session's close.
    Claim {
        session: String,
        claim: serde_json::Value,
    },
    ToolCall {
        session: String,
        server: String,
        tool: String,
        arguments_sha256: String,
        arguments_bytes: usize,
        result_sha256: Option<String>,
        result_bytes: usize,
        duration_ms: u64,
        fuel: u64,
        #[serde(flatten)]
        outcome: Outcome,
    },
}

/// How something ended, in Moat's words only. Text the server chose (its
/// stderr tail, a line that was not JSON-RPC, an error message) may carry
/// anything, secrets included: only its digest and length are kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_text_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_text_bytes: Option<usize>,
}

impl Outcome {
    /// An outcome with no text of the server's.
    pub fn plain(outcome: impl Into<String>) -> Self {
        Self {
            outcome: outcome.into(),
            server_text_sha256: None,
            server_text_bytes: None,
        }
    }

    /// `outcome`, with the digest and length of `server_text` when there is
    /// any.
    pub fn with_server_text(outcome: impl Into<String>, server_text: Option<&str>) -> Self {
        let server_text = server_text.filter(|t| !t.is_empty());
        Self {
            outcome: outcome.into(),
            server_text_sha256: server_text.map(|t| Digest::of(t.as_bytes()).to_string()),
            server_text_bytes: server_text.map(str::len),
        }
    }

    /// A fault: what Moat saw, and the digest of what the server wrote.
    pub fn of_fault(fault: &crate::transport::Fault) -> Self {
        Self::with_server_text(format!("fault: {}", fault.summary()), fault.server_text())
    }
}

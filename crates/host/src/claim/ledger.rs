//! What one session's audited events add up to, kept as they are recorded
//! and turned into its [`Claim`] when it ends. The ledger sees exactly the
//! events the session writes to the audit log (and learns of a write that
//! failed), so a claim can be checked against the log line by line.

use std::collections::BTreeMap;

use super::{AuditPoint, Claim, FORMAT, MAX_REFUSALS, MAX_TEXT_BYTES, Refusal, ServerRan};
use crate::audit::{AuditError, Event, Head};

/// One session's record, as its events come.
#[derive(Debug)]
pub struct Ledger {
    session: String,
    started_unix_ms: u64,
    servers: Vec<ServerRan>,
    calls: BTreeMap<String, u64>,
    refusals: Vec<Refusal>,
    refusals_omitted: u64,
    opened: Option<String>,
    last: Option<Head>,
    incomplete: Vec<String>,
    /// Set by the session's `session_close`: what comes after it is not in
    /// the record the claim's head closes.
    closed: bool,
}

impl Ledger {
    /// The ledger of session `session`, begun now.
    pub fn new(session: &str) -> Self {
        Self {
            session: session.to_owned(),
            started_unix_ms: crate::audit::now_unix_ms(),
            servers: Vec::new(),
            calls: BTreeMap::new(),
            refusals: Vec::new(),
            refusals_omitted: 0,
            opened: None,
            last: None,
            incomplete: Vec::new(),
            closed: false,
        }
    }

    /// Server `server` was launched with execution identity `identity`,
    /// measured as `measured`, reached at `endpoint` when remote.
    pub fn launched(
        &mut self,
        server: &str,
        identity: &str,
        measured: &crate::instance::Identity,
        endpoint: Option<&str>,
    ) {
        if self.closed {
            self.incomplete(format!(
                "server `{server}` was launched after the session's close"
            ));
            return;
        }
        if let Some(ran) = self
            .servers
            .iter_mut()
            .find(|s| s.name == server && s.identity == identity)
        {
            ran.launches += 1;
            return;
        }
        self.servers.push(ServerRan {
            name: server.to_owned(),
            identity: identity.to_owned(),
            sha256: measured.digest.map(|d| d.to_string()),
            evidence: measured.evidence.to_string(),
            endpoint: endpoint.map(str::to_owned),
            sandbox: measured.sandbox.lines(),
            launches: 1,
        });
    }

    /// The record is incomplete for `reason` (a child that could not be
    /// closed, say): the claim will say so and not be signed.
    pub fn incomplete(&mut self, reason: String) {
        if !self.incomplete.contains(&reason) {
            self.incomplete.push(reason);
        }
    }

    /// `event` was recorded for the session: `written` is where the log
    /// stood after it (`None` without a log), or why it could not be.
    pub fn observe(&mut self, event: &Event, written: &Result<Option<Head>, AuditError>) {
        if self.closed {
            let kind = serde_json::to_value(event)
                .ok()
                .and_then(|v| v["event"].as_str().map(str::to_owned))
                .unwrap_or_default();
            self.incomplete(format!(
                "a `{kind}` event was recorded after the session's close"
            ));
            return;
        }
        if matches!(event, Event::SessionClose { .. }) {
            self.closed = true;
        }
        match written {
            Ok(Some(head)) => {
                if matches!(event, Event::SessionOpen { .. }) {
                    self.opened = Some(head.head.clone());
                }
                self.last = Some(head.clone());
            }
            Ok(None) => {}
            Err(error) => self.incomplete(format!("an audit write failed: {error}")),
        }
        match event {
            Event::ToolCall {
                server,
                tool,
                outcome,
                ..
            } => {
                let class = crate::metrics::outcome_class(&outcome.outcome);
                *self.calls.entry(class.to_owned()).or_default() += 1;
                if matches!(class, "refused" | "revoked" | "stale") {
                    self.refused(server, format!("tools/call {tool}"), &outcome.outcome);
                }
            }
            Event::ServerStartFailed {
                server, outcome, ..
            } => self.refused(server, "start".to_owned(), &outcome.outcome),
            Event::SandboxRefused {
                server,
                during,
                kind,
                subject,
                ..
            } => self.refused(
                server,
                during.clone(),
                &format!("the sandbox refused {kind}: {subject}"),
            ),
            _ => {}
        }
    }

    fn refused(&mut self, server: &str, during: String, reason: &str) {
        if self.refusals.len() < MAX_REFUSALS {
            self.refusals.push(Refusal {
                server: server.to_owned(),
                during: bounded(&during),
                reason: bounded(reason),
            });
        } else {
            self.refusals_omitted += 1;
        }
    }

    /// The claim of the session, ended now (after its `session_close` was
    /// recorded: the log's head is that line).
    pub fn finish(self) -> Claim {
        Claim {
            format: FORMAT.to_owned(),
            session: self.session,
            successor: None,
            started_unix_ms: self.started_unix_ms,
            ended_unix_ms: crate::audit::now_unix_ms(),
            moat: env!("CARGO_PKG_VERSION").to_owned(),
            servers: self.servers,
            calls: self.calls,
            refusals: self.refusals,
            refusals_omitted: self.refusals_omitted,
            audit: self.last.map(|last| AuditPoint {
                opened: self.opened,
                head: last.head,
                lines: last.lines,
            }),
            incomplete: self.incomplete,
        }
    }
}

/// `text` cut to [`MAX_TEXT_BYTES`] (at a character boundary), saying how
/// long it was: part of a refusal can be text a server chose (the paths its
/// error named), and no server may make a claim grow without bound.
fn bounded(text: &str) -> String {
    if text.len() <= MAX_TEXT_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... (cut: {} bytes in all)", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Outcome;

    fn call(outcome: &str) -> Event {
        Event::ToolCall {
            session: "s1".into(),
            server: "a".into(),
            tool: "t".into(),
            arguments_sha256: String::new(),
            arguments_bytes: 0,
            result_sha256: None,
            result_bytes: 0,
            duration_ms: 0,
            fuel: 0,
            outcome: Outcome::plain(outcome),
        }
    }

    /// A flood of refused calls is counted in full, listed only up to
    /// [`MAX_REFUSALS`].
    #[test]
    fn refusals_past_the_bound_are_counted_not_listed() {
        let mut ledger = Ledger::new("s1");
        for _ in 0..MAX_REFUSALS + 44 {
            ledger.observe(&call("server `a` is revoked: refusing"), &Ok(None));
        }
        ledger.observe(&call("ok"), &Ok(None));
        let claim = ledger.finish();
        assert_eq!(claim.refusals.len(), MAX_REFUSALS);
        assert_eq!(claim.refusals_omitted, 44);
        assert_eq!(
            claim.calls,
            [
                ("ok".to_owned(), 1),
                ("refused".to_owned(), MAX_REFUSALS as u64 + 44)
            ]
            .into()
        );
        assert_eq!(claim.refusals[0].during, "tools/call t");
        assert!(claim.audit.is_none(), "no log, no point in one");
    }

    /// A server's words in a refusal (the paths its error named) are cut,
    /// so a claim stays small whatever the server writes.
    #[test]
    fn a_refusals_text_is_bounded() {
        let mut ledger = Ledger::new("s1");
        let subject = format!("/{}", "\u{e9}".repeat(100_000));
        ledger.observe(
            &Event::SandboxRefused {
                session: "s1".into(),
                server: "a".into(),
                during: "tools/call t".into(),
                kind: "filesystem".into(),
                subject: subject.clone(),
            },
            &Ok(None),
        );
        let claim = ledger.finish();
        let reason = &claim.refusals[0].reason;
        assert!(reason.len() < MAX_TEXT_BYTES + 64, "{}", reason.len());
        assert!(
            reason.ends_with(&format!("... (cut: {} bytes in all)", subject.len() + 32)),
            "{}",
            &reason[reason.len() - 60..]
        );
    }

    /// What is recorded after the session's close is not in the record its
    /// head closes: the claim says so, and is not signed.
    #[test]
    fn events_after_the_close_make_the_claim_incomplete() {
        let mut ledger = Ledger::new("s1");
        let close = Event::SessionClose {
            session: "s1".into(),
            outcome: "closed".into(),
        };
        ledger.observe(&close, &Ok(None));
        ledger.observe(&call("ok"), &Ok(None));
        let claim = ledger.finish();
        assert_eq!(
            claim.incomplete,
            ["a `tool_call` event was recorded after the session's close"]
        );
        assert!(claim.calls.is_empty());
    }
}

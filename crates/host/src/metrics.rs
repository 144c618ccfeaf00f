//! The gateway's metrics, served as Prometheus/OpenMetrics text on
//! `/metrics` by `moat serve --http` (prometheus-client).
//!
//! Each metric is counted at the very place the gateway writes the matching
//! audit event (session open and close, server launch and exit, tool call,
//! HTTP refusal), whether or not an audit log is kept, so the counts of a
//! run and its audit log agree exactly. Labels are bounded: server and tool
//! names come from the config and the pins, and an outcome is one of a
//! fixed set of classes ([`outcome_class`]), never the text of an error.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    server: String,
    tool: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExitLabels {
    server: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    server: String,
    limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

fn latency_histogram() -> Histogram {
    // 100 µs to about 52 s, doubling.
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

/// What `moat serve` counts.
pub struct Metrics {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    latency: Family<ServerLabels, Histogram, fn() -> Histogram>,
    fuel: Family<ServerLabels, Counter>,
    limit_hits: Family<LimitLabels, Counter>,
    sessions_open: Gauge,
    sessions: Counter,
    launches: Family<ServerLabels, Counter>,
    exits: Family<ExitLabels, Counter>,
    instances: Family<ServerLabels, Gauge>,
    refused: Family<ReasonLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Every metric at zero, registered under the `moat_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("moat");
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "tool_calls",
            "Tool calls by server, tool and outcome (ok, tool-error, invalid-params, unavailable, cancelled, invalid-output, fault, refused, error)",
            calls.clone(),
        );
        let latency = Family::<ServerLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        registry.register(
            "tool_call_duration_seconds",
            "Tool call latency at the gateway, by server",
            latency.clone(),
        );
        let fuel = Family::<ServerLabels, Counter>::default();
        registry.register(
            "fuel_consumed",
            "Wasm fuel used by tool calls, by server",
            fuel.clone(),
        );
        let limit_hits = Family::<LimitLabels, Counter>::default();
        registry.register(
            "limit_hits",
            "Calls stopped at a limit, by server and limit (fuel_per_request, memory_bytes, request_timeout_ms, ...)",
            limit_hits.clone(),
        );
        let sessions_open = Gauge::default();
        registry.register(
            "sessions_open",
            "Agent sessions open now",
            sessions_open.clone(),
        );
        let sessions = Counter::default();
        registry.register("sessions", "Agent sessions opened", sessions.clone());
        let launches = Family::<ServerLabels, Counter>::default();
        registry.register(
            "server_launches",
            "Server instances started for agent sessions (first starts and restarts), by server",
            launches.clone(),
        );
        let exits = Family::<ExitLabels, Counter>::default();
        registry.register(
            "server_exits",
            "Server instances that ended, by server and outcome",
            exits.clone(),
        );
        let instances = Family::<ServerLabels, Gauge>::default();
        registry.register(
            "server_instances",
            "Server instances running for agent sessions now, by server",
            instances.clone(),
        );
        let refused = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "http_refused",
            "HTTP requests and connections turned away at a limit, by reason",
            refused.clone(),
        );
        Self {
            registry,
            calls,
            latency,
            fuel,
            limit_hits,
            sessions_open,
            sessions,
            launches,
            exits,
            instances,
            refused,
        }
    }

    /// One tool call, as audited: its outcome (the audit's), how long it
    /// took, the fuel it used and the limit that stopped it, if one did.
    pub fn call(
        &self,
        server: &str,
        tool: &str,
        outcome: &str,
        elapsed: Duration,
        fuel: u64,
        limit: Option<&str>,
    ) {
        self.calls
            .get_or_create(&CallLabels {
                server: server.to_owned(),
                tool: tool.to_owned(),
                outcome: outcome_class(outcome).to_owned(),
            })
            .inc();
        let server_labels = ServerLabels {
            server: server.to_owned(),
        };
        self.latency
            .get_or_create(&server_labels)
            .observe(elapsed.as_secs_f64());
        if fuel > 0 {
            self.fuel.get_or_create(&server_labels).inc_by(fuel);
        }
        if let Some(limit) = limit {
            self.limit_hits
                .get_or_create(&LimitLabels {
                    server: server.to_owned(),
                    limit: limit.to_owned(),
                })
                .inc();
        }
    }

    /// An agent session opened.
    pub fn session_opened(&self) {
        self.sessions.inc();
        self.sessions_open.inc();
    }

    /// An agent session closed.
    pub fn session_closed(&self) {
        self.sessions_open.dec();
    }

    /// A server instance started for a session.
    pub fn launched(&self, server: &str) {
        let labels = ServerLabels {
            server: server.to_owned(),
        };
        self.launches.get_or_create(&labels).inc();
        self.instances.get_or_create(&labels).inc();
    }

    /// A server instance ended, with the audit's outcome.
    pub fn exited(&self, server: &str, outcome: &str) {
        self.exits
            .get_or_create(&ExitLabels {
                server: server.to_owned(),
                outcome: outcome_class(outcome).to_owned(),
            })
            .inc();
        self.instances
            .get_or_create(&ServerLabels {
                server: server.to_owned(),
            })
            .dec();
    }

    /// The HTTP front turned something away (`reason` as audited).
    pub fn refused(&self, reason: &str) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts an audited event: sessions, launches, exits and refusals.
    /// (A tool call is counted by [`Self::call`], which has its exact
    /// duration and the limit that stopped it.)
    pub fn observe(&self, event: &crate::audit::Event) {
        use crate::audit::Event;
        match event {
            Event::SessionOpen { .. } => self.session_opened(),
            Event::SessionClose { .. } => self.session_closed(),
            Event::ServerLaunch { server, .. } => self.launched(server),
            Event::ServerExit {
                server, outcome, ..
            } => self.exited(server, &outcome.outcome),
            Event::HttpRefused { reason, .. } => self.refused(reason),
            Event::ToolCall { .. }
            | Event::Claim { .. }
            | Event::ServerStartFailed { .. }
            | Event::EgressRefused { .. }
            | Event::SandboxRefused { .. }
            | Event::Revoke { .. }
            | Event::Reload { .. } => {}
        }
    }

    /// Everything, in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// The class of an audited outcome: the outcome itself when it is one of
/// the fixed words, `fault` for `fault: ...`, and for the rest (Moat's own
/// refusals, worded in full in the audit) `refused`, or `error`.
pub fn outcome_class(outcome: &str) -> &str {
    match outcome {
        "ok" | "tool-error" | "invalid-params" | "unavailable" | "cancelled" | "invalid-output"
        | "error" | "closed" | "stopped" | "revoked" | "stale" | "task" | "input-required"
        | "idle" => outcome,
        _ if outcome.starts_with("fault:") => "fault",
        _ => "refused",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_a_fixed_set_of_classes() {
        assert_eq!(outcome_class("ok"), "ok");
        assert_eq!(outcome_class("revoked"), "revoked");
        assert_eq!(outcome_class("stale"), "stale");
        // A server stopped for sitting idle (`idle_stop_ms`).
        assert_eq!(outcome_class("idle"), "idle");
        // A call answered with a task or a request for input (2026-07-28).
        assert_eq!(outcome_class("task"), "task");
        assert_eq!(outcome_class("input-required"), "input-required");
        assert_eq!(outcome_class("fault: server `a` hit its ..."), "fault");
        assert_eq!(
            outcome_class("server `a` has no sha256 pinned: refusing"),
            "refused"
        );
    }

    #[test]
    fn calls_are_counted_by_labels_and_encoded() {
        let metrics = Metrics::new();
        metrics.session_opened();
        metrics.launched("a");
        metrics.call("a", "echo", "ok", Duration::from_millis(3), 120, None);
        metrics.call(
            "a",
            "spin",
            "tool-error",
            Duration::from_millis(9),
            5,
            Some("fuel_per_request"),
        );
        metrics.exited("a", "closed");
        metrics.session_closed();
        let text = metrics.encode();
        for line in [
            "moat_tool_calls_total{server=\"a\",tool=\"echo\",outcome=\"ok\"} 1",
            "moat_tool_calls_total{server=\"a\",tool=\"spin\",outcome=\"tool-error\"} 1",
            "moat_fuel_consumed_total{server=\"a\"} 125",
            "moat_limit_hits_total{server=\"a\",limit=\"fuel_per_request\"} 1",
            "moat_tool_call_duration_seconds_count{server=\"a\"} 2",
            "moat_sessions_open 0",
            "moat_sessions_total 1",
            "moat_server_instances{server=\"a\"} 0",
            "moat_server_exits_total{server=\"a\",outcome=\"closed\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}

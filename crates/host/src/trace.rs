//! Trace context for tool calls: this module owns the span each call gets
//! (server, tool, session; outcome, duration, fuel and the limit hit
//! recorded when it ends), the W3C `traceparent` an agent sends in a
//! request's `_meta` (honoured as the span's parent), and the one passed
//! on to the server. Spans are `tracing` spans: `moat serve --otlp` exports
//! them over OTLP; without it they cost what a disabled span costs, and an
//! agent's `traceparent` is passed on unchanged.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The span of one tool call, a child of the agent's span `parent` (its
/// `traceparent`, [`parse`]d) when there is one.
pub(crate) fn call_span(
    session: &str,
    server: &str,
    tool: &str,
    parent: Option<&SpanContext>,
) -> tracing::Span {
    let span = tracing::info_span!(
        "tools/call",
        otel.name = %format!("tools/call {server}{}{tool}", crate::config::SEPARATOR),
        otel.kind = "server",
        mcp.session = %session,
        mcp.server = %server,
        mcp.tool = %tool,
        mcp.outcome = tracing::field::Empty,
        mcp.duration_ms = tracing::field::Empty,
        mcp.fuel = tracing::field::Empty,
        mcp.limit = tracing::field::Empty,
    );
    if let Some(parent) = parent {
        let context = opentelemetry::Context::new().with_remote_span_context(parent.clone());
        // Fails only when no OpenTelemetry layer is installed: nothing to
        // parent then.
        let _ = span.set_parent(context);
    }
    span
}

/// Records how the call ended on its span.
pub(crate) fn record_end(
    span: &tracing::Span,
    outcome: &str,
    duration: std::time::Duration,
    fuel: u64,
    limit: Option<&str>,
) {
    span.record("mcp.outcome", outcome);
    span.record("mcp.duration_ms", duration.as_millis() as u64);
    span.record("mcp.fuel", fuel);
    if let Some(limit) = limit {
        span.record("mcp.limit", limit);
    }
}

/// The `traceparent` passed on to the server: the call's own span when
/// spans are exported (so the server's spans nest under Moat's), else the
/// agent's `parent`, unchanged.
pub(crate) fn passed_on(span: &tracing::Span, parent: Option<&SpanContext>) -> Option<String> {
    let context = span.context();
    let own = context.span();
    if own.span_context().is_valid() {
        return Some(format(own.span_context()));
    }
    parent.map(format)
}

/// A W3C `traceparent` (version 00): `00-<32 hex>-<16 hex>-<2 hex>`, with
/// neither id all zeros. Anything else is ignored, as the spec says.
pub fn parse(traceparent: &str) -> Option<SpanContext> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if version != "00"
        || parts.next().is_some()
        || !hex(trace, 32)
        || !hex(span, 16)
        || !hex(flags, 2)
    {
        return None;
    }
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

/// `context` as a `traceparent`.
pub fn format(context: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_round_trips_and_bad_ones_are_ignored() {
        let good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert_eq!(format(&parse(good).unwrap()), good);
        for bad in [
            "",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-ff",
            "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
        ] {
            assert!(parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn without_an_exporter_the_agents_traceparent_is_passed_on_unchanged() {
        let good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let parent = parse(good);
        let span = call_span("s1", "a", "b", parent.as_ref());
        assert_eq!(passed_on(&span, parent.as_ref()).as_deref(), Some(good));
        assert_eq!(passed_on(&span, parse("garbage").as_ref()), None);
        assert_eq!(passed_on(&span, None), None);
    }
}

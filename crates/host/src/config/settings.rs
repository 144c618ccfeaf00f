//! `[serve]` and `[wasm]`: how `moat serve` runs agent sessions and how the
//! one wasm engine runs every wasm server, with their defaults.

use std::num::{NonZeroU64, NonZeroUsize};

use serde::Deserialize;

/// `[wasm]`: how the one wasm engine runs every wasm server.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WasmSettings {
    /// How guests' CPU is bounded.
    pub metering: CpuMetering,
    /// How instances are allocated.
    pub allocator: AllocatorSetting,
    /// With the pooling allocator: component instances alive at once over
    /// every server (each stdio session's instance, each typed call in
    /// flight). Slots are address space reserved at start, not memory.
    pub pool_instances: std::num::NonZeroU32,
}

impl Default for WasmSettings {
    fn default() -> Self {
        Self {
            metering: CpuMetering::default(),
            allocator: AllocatorSetting::default(),
            pool_instances: std::num::NonZeroU32::new(1000).expect("non-zero"),
        }
    }
}

/// `[wasm] allocator`: where instances' memories and tables come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllocatorSetting {
    /// Slots reserved once and reused, reset between instances.
    Pooling,
    /// Mapped per instance, unmapped when it ends.
    #[default]
    OnDemand,
}

/// `[wasm] metering`: how guests' CPU is bounded. Both let the per-request
/// deadline (`request_timeout_ms`) stop a guest that spins; they differ in
/// cost and in whether `fuel_per_request` holds, which
/// `cargo bench --bench transport` (`cpu_limits`) measures side by side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuMetering {
    /// Wasm operators are counted: `fuel_per_request` bounds the work of
    /// each request, deterministically, as well as its time.
    #[default]
    Fuel,
    /// A timer interrupts guests every few milliseconds to yield: time is
    /// bounded, work is not (`fuel_per_request` is reported not enforced).
    Epoch,
}

/// `[serve]`: how `moat serve` runs agent sessions.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeSettings {
    /// How long closing a session waits for its in-flight calls to finish
    /// before cancelling them (then its servers are stopped). Long enough
    /// for an ordinary tool call; short enough that a shutdown is prompt.
    pub drain_timeout_ms: u64,
    /// `--http`: agent sessions alive at once. Each may hold a child per
    /// server, so this bounds the children (and memory) agents can make; an
    /// `initialize` beyond it is answered 503.
    pub max_sessions: NonZeroUsize,
    /// `--http`: a session with no request for this long is closed, with its
    /// children. Agents that leave without ending their session are the
    /// common case, not an attack.
    pub session_idle_ms: NonZeroU64,
    /// `--http`: connections open at once. At the limit, the oldest
    /// connection that has not yet sent a request is closed to make room;
    /// if there is none, the new one is answered 503.
    pub max_connections: NonZeroUsize,
    /// `--http`: how long a connection may take to send a request's
    /// headers (and may stay idle between requests) before it gets 408 and
    /// is closed.
    pub header_timeout_ms: NonZeroU64,
    /// `--http`: how long a whole request (head and body, from its first
    /// byte) may take to arrive; one still arriving then gets 408 and its
    /// connection is closed, so a body sent a byte at a time cannot hold a
    /// connection. (At `max_connections`, a connection whose body is still
    /// arriving is also closed to make room, as an idle one is.)
    pub request_timeout_ms: NonZeroU64,
    /// Native servers' connections through Moat's egress proxy, open at
    /// once across the gateway (every session and server together): each
    /// costs Moat two descriptors. At most a quarter of Moat's descriptor
    /// limit is used, whatever this says. Beyond it, the proxy answers 503
    /// naming the limit. Read at start: a reload does not change it.
    pub egress_connections: NonZeroUsize,
    /// The same, per agent session (all its native servers together).
    pub egress_connections_per_session: NonZeroUsize,
    /// The same, per native server: with the defaults, two servers at
    /// their bound leave a session's other servers half its share. Read at
    /// start, as `egress_connections` is.
    pub egress_connections_per_server: NonZeroUsize,
    /// `--http`: the largest request body accepted; a larger one gets 413.
    /// MCP requests are small JSON; this bounds what one request can make
    /// Moat buffer.
    pub max_body_bytes: NonZeroUsize,
    /// A tool call of an agent that declared the tasks extension
    /// (2026-07-28) that is still running after this long is made a task of
    /// Moat's: the agent gets the task at once and follows it with
    /// `tasks/get`, whatever the server's revision. Unset (the default),
    /// a call is answered when its server answers, or with a task the
    /// server itself made.
    pub task_after_ms: Option<NonZeroU64>,
}

impl Default for ServeSettings {
    fn default() -> Self {
        let usize_ = |n: usize| NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN);
        let u64_ = |n: u64| NonZeroU64::new(n).unwrap_or(NonZeroU64::MIN);
        Self {
            drain_timeout_ms: 30_000,
            max_sessions: usize_(64),
            session_idle_ms: u64_(300_000),
            max_connections: usize_(1024),
            header_timeout_ms: u64_(10_000),
            request_timeout_ms: u64_(30_000),
            egress_connections: usize_(4096),
            egress_connections_per_session: usize_(512),
            egress_connections_per_server: usize_(128),
            max_body_bytes: usize_(4 * 1024 * 1024),
            task_after_ms: None,
        }
    }
}

//! Limits: what bounds one server, with the reason each limit exists and its
//! default. A limit that is hit surfaces as [`LimitHit`], naming the limit and
//! its configured value. Also Moat's own descriptor limit
//! ([`raise_open_files`]), which its proxies and listeners spend.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Every bound applied to one server. Each field is configurable in
/// `[servers.NAME.limits]` under the same name.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// CPU for wasm: fuel (about one unit per wasm operator) granted afresh
    /// each time a request is sent to the server, and for start-up. Stops a
    /// guest that computes forever. Default 2,000,000,000 (seconds of CPU).
    pub fuel_per_request: u64,
    /// How often, in fuel units, a running guest yields to the async runtime,
    /// so a busy guest never blocks other tasks. Default 1,000,000.
    pub fuel_yield_interval: u64,
    /// Largest size of any one linear memory, in bytes. Stops a guest that
    /// allocates without end. Default 256 MiB.
    pub memory_bytes: u64,
    /// Largest number of elements in any one table. Default 100,000.
    pub table_elements: u64,
    /// Most core instances a component may create. Default 64.
    pub instances: u64,
    /// Most tables a component may create. Default 64.
    pub tables: u64,
    /// Most linear memories a component may create. Default 16.
    pub memories: u64,
    /// Wall-clock deadline for each request, in milliseconds, including the
    /// handshake. When it passes, the request fails with a timeout error and
    /// the server is stopped. Default 30,000.
    pub request_timeout_ms: u64,
    /// Bytes a guest may pass to the host in one host call. Bounds host
    /// allocations made on a guest's behalf. Default 16 MiB.
    pub hostcall_fuel: u64,
    /// Most host resources (streams, pollables, handles) a guest may hold at
    /// once. Default 4,096.
    pub resource_table_capacity: u64,
    /// Most random bytes a guest may ask for in one call. Default 1 MiB.
    pub max_random_bytes: u64,
    /// Largest response body a wasm guest may receive through wasi:http, in
    /// bytes; a longer body is cut there and its stream ends in an error.
    /// The host buffers what a slow guest has not read yet, so this bounds
    /// host memory too. Default 16 MiB.
    pub max_http_response_bytes: u64,
    /// Longest stdout line (one JSON-RPC message) accepted, in bytes. Longer
    /// is a fatal framing error; host memory stays bounded. Default 16 MiB.
    pub max_line_bytes: u64,
    /// Size of the rolling stderr buffer kept for diagnostics. Default 64 KiB.
    pub stderr_buffer_bytes: u64,
    /// How long close waits after closing stdin before stopping the server.
    /// Close as a whole takes at most twice this: after the first period,
    /// SIGTERM (native) and three quarters of a second period, then SIGKILL
    /// and the rest of it for the server to be gone and its pipes drained;
    /// nothing is waited for past that. Default 2,000.
    pub close_grace_ms: u64,
    /// How long a server of `moat serve` may sit idle before it is stopped,
    /// in milliseconds; 0 (the default) keeps it for as long as its agent
    /// session lasts. Idle is nothing in flight either way (no request
    /// awaiting its answer, none of the server's own unanswered, no task
    /// of the session's on it, no call holding it) for that long. The next
    /// use starts it afresh, so set it only for a server that keeps nothing
    /// between calls that matters: its memory, open subscription streams
    /// included, go with it. An idle session then costs the host only its
    /// own state, not the server's instance (a wasm guest's memory, a
    /// native process). Left out of the serialised limits while 0, so
    /// that a profile's revision (`moat node`) is what it was before the
    /// key existed.
    #[serde(skip_serializing_if = "is_zero")]
    pub idle_stop_ms: u64,
    /// CPU for native servers: RLIMIT_CPU, seconds of CPU time over the
    /// process's life (SIGXCPU, then SIGKILL a second later). Default 300.
    pub cpu_seconds: u64,
    /// Memory for native servers: RLIMIT_DATA, bytes of writable private
    /// memory (the heap and anonymous writable mappings). It counts what a
    /// server maps to use, not what it reserves: V8's WebAssembly and heap
    /// reservations, Go's arenas and the JVM's heap are reserved without
    /// access and count only as they are committed. Default 4 GiB.
    pub data_bytes: u64,
    /// RLIMIT_AS, bytes of address space of a native server, reservations
    /// included: a second bound for those who want one. Off by default
    /// (`u64::MAX`): Node's `fetch` alone reserves more than 8 GiB for its
    /// WebAssembly memory, glibc reserves 64 MiB for each thread's malloc
    /// arena (a Rust server of 5 MB resident held 275 MB), and
    /// `data_bytes` bounds what is used.
    pub address_space_bytes: u64,
    /// RLIMIT_NOFILE: open files of a native server. Default 1,024.
    pub open_files: u64,
    /// RLIMIT_NPROC: processes of the user the native server runs as (the
    /// kernel counts per user and does not apply it to root). Default 4,096.
    pub processes: u64,
    /// RLIMIT_FSIZE: largest file a native server may write. Default 1 GiB.
    pub file_size_bytes: u64,
    /// Size of a native server's private /tmp (a tmpfs in its own mount
    /// namespace, gone when it stops). Many servers write temporary files;
    /// the bound keeps them from filling the host's memory. Default 64 MiB.
    pub tmp_bytes: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            fuel_per_request: 2_000_000_000,
            fuel_yield_interval: 1_000_000,
            memory_bytes: 256 << 20,
            table_elements: 100_000,
            instances: 64,
            tables: 64,
            memories: 16,
            request_timeout_ms: 30_000,
            hostcall_fuel: 16 << 20,
            resource_table_capacity: 4096,
            max_random_bytes: 1 << 20,
            max_http_response_bytes: 16 << 20,
            max_line_bytes: 16 << 20,
            stderr_buffer_bytes: 64 << 10,
            close_grace_ms: 2_000,
            idle_stop_ms: 0,
            cpu_seconds: 300,
            data_bytes: 4 << 30,
            address_space_bytes: u64::MAX,
            open_files: 1024,
            processes: 4096,
            file_size_bytes: 1 << 30,
            tmp_bytes: 64 << 20,
        }
    }
}

impl Limits {
    /// The per-request deadline.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// The grace period between closing stdin and stopping the server.
    pub fn close_grace(&self) -> Duration {
        Duration::from_millis(self.close_grace_ms)
    }

    /// How long the server may sit idle before it is stopped; `None`: for
    /// as long as its session lasts.
    pub fn idle_stop(&self) -> Option<Duration> {
        (self.idle_stop_ms > 0).then(|| Duration::from_millis(self.idle_stop_ms))
    }

    /// Checks values that would make a server unusable. Names the bad field.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("fuel_per_request", self.fuel_per_request),
            ("fuel_yield_interval", self.fuel_yield_interval),
            ("memory_bytes", self.memory_bytes),
            ("instances", self.instances),
            ("memories", self.memories),
            ("request_timeout_ms", self.request_timeout_ms),
            ("resource_table_capacity", self.resource_table_capacity),
            ("max_line_bytes", self.max_line_bytes),
            ("cpu_seconds", self.cpu_seconds),
            ("data_bytes", self.data_bytes),
            ("address_space_bytes", self.address_space_bytes),
            ("open_files", self.open_files),
            ("processes", self.processes),
            ("tmp_bytes", self.tmp_bytes),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(format!("limits.{name} must be greater than 0"));
            }
        }
        Ok(())
    }
}

/// Which limit was hit, with the value it was configured to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitHit {
    /// The guest used up `fuel_per_request`.
    Fuel { fuel_per_request: u64 },
    /// A linear memory tried to grow past `memory_bytes`.
    Memory { memory_bytes: u64 },
    /// A table tried to grow past `table_elements`.
    TableElements { table_elements: u64 },
    /// A request was not answered within `request_timeout_ms`.
    Deadline { request_timeout_ms: u64 },
    /// A stdout line exceeded `max_line_bytes`.
    LineLength { max_line_bytes: u64 },
    /// The guest held more than `resource_table_capacity` host resources.
    ResourceTable { resource_table_capacity: u64 },
    /// A native server used up `cpu_seconds` (RLIMIT_CPU).
    CpuSeconds { cpu_seconds: u64 },
    /// A native server ran out of writable memory (RLIMIT_DATA).
    Data { data_bytes: u64 },
    /// A native server ran out of address space (RLIMIT_AS).
    AddressSpace { address_space_bytes: u64 },
    /// A wasm guest asked for more than `max_random_bytes` in one call.
    RandomBytes { max_random_bytes: u64 },
}

impl LimitHit {
    /// Every limit's name, as configured.
    pub const NAMES: [&'static str; 10] = [
        "fuel_per_request",
        "memory_bytes",
        "table_elements",
        "request_timeout_ms",
        "max_line_bytes",
        "resource_table_capacity",
        "cpu_seconds",
        "data_bytes",
        "address_space_bytes",
        "max_random_bytes",
    ];

    /// The name of the limit that was hit, as configured.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Fuel { .. } => "fuel_per_request",
            Self::Memory { .. } => "memory_bytes",
            Self::TableElements { .. } => "table_elements",
            Self::Deadline { .. } => "request_timeout_ms",
            Self::LineLength { .. } => "max_line_bytes",
            Self::ResourceTable { .. } => "resource_table_capacity",
            Self::CpuSeconds { .. } => "cpu_seconds",
            Self::Data { .. } => "data_bytes",
            Self::AddressSpace { .. } => "address_space_bytes",
            Self::RandomBytes { .. } => "max_random_bytes",
        }
    }
}

impl fmt::Display for LimitHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fuel { fuel_per_request } => {
                write!(
                    f,
                    "CPU limit: fuel_per_request = {fuel_per_request} used up"
                )
            }
            Self::Memory { memory_bytes } => {
                write!(f, "memory limit: memory_bytes = {memory_bytes} exceeded")
            }
            Self::TableElements { table_elements } => {
                write!(f, "table limit: table_elements = {table_elements} exceeded")
            }
            Self::Deadline { request_timeout_ms } => write!(
                f,
                "deadline: request_timeout_ms = {request_timeout_ms} passed without an answer"
            ),
            Self::LineLength { max_line_bytes } => write!(
                f,
                "output limit: a stdout line exceeded max_line_bytes = {max_line_bytes}"
            ),
            Self::ResourceTable {
                resource_table_capacity,
            } => write!(
                f,
                "resource limit: resource_table_capacity = {resource_table_capacity} exceeded"
            ),
            Self::CpuSeconds { cpu_seconds } => {
                write!(
                    f,
                    "CPU limit: cpu_seconds = {cpu_seconds} used up (RLIMIT_CPU)"
                )
            }
            Self::Data { data_bytes } => write!(
                f,
                "memory limit: data_bytes = {data_bytes} exhausted (RLIMIT_DATA; raise it in [servers.NAME.limits])"
            ),
            Self::AddressSpace {
                address_space_bytes,
            } => write!(
                f,
                "memory limit: address_space_bytes = {address_space_bytes} exhausted (RLIMIT_AS)"
            ),
            Self::RandomBytes { max_random_bytes } => write!(
                f,
                "randomness limit: max_random_bytes = {max_random_bytes} in one call"
            ),
        }
    }
}

/// Moat's own RLIMIT_NOFILE, soft and hard, after [`raise_open_files`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit Moat started with.
    pub was: u64,
    /// The soft limit now (the hard limit, unless raising it failed).
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
}

/// Why Moat's descriptor limit could not be raised.
#[derive(Debug, thiserror::Error)]
pub enum OpenFilesError {
    #[error(
        "setrlimit(RLIMIT_NOFILE) raising the soft limit from {from} to the hard limit {to}: {source}"
    )]
    Raise {
        from: u64,
        to: u64,
        #[source]
        source: std::io::Error,
    },
}

/// Raises Moat's soft RLIMIT_NOFILE to its hard limit: every proxied
/// connection of a native server, every HTTP connection and every server's
/// pipes cost Moat descriptors, and the soft default (often 1,024) is
/// spent by a few busy servers. Servers do not inherit it: a native
/// server's RLIMIT_NOFILE is set to its own `open_files` (soft and hard)
/// before it runs.
#[cfg(unix)]
pub fn raise_open_files() -> Result<OpenFiles, OpenFilesError> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    // `None` is RLIM_INFINITY.
    let was = now.current.unwrap_or(u64::MAX);
    let hard = now.maximum.unwrap_or(u64::MAX);
    if now.current == now.maximum {
        return Ok(OpenFiles {
            was,
            soft: was,
            hard,
        });
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: now.maximum,
            maximum: now.maximum,
        },
    )
    .map_err(|errno| OpenFilesError::Raise {
        from: was,
        to: hard,
        source: errno.into(),
    })?;
    Ok(OpenFiles {
        was,
        soft: hard,
        hard,
    })
}

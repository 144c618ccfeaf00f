//! How the one wasm engine runs guests: CPU metering (fuel or epochs) and
//! the instance allocator (on demand, or a pool of slots reserved at start).

use super::*;

/// How often an epoch-metered engine's timer advances its epoch. It bounds
/// how late a deadline can stop a spinning guest: one tick after the guest
/// last yielded, at most.
pub const EPOCH_TICK: std::time::Duration = std::time::Duration::from_millis(2);

/// Ticks a guest runs between yields to the runtime under epoch metering.
/// At each yield the runtime may abort the instance (its deadline passed)
/// or run another task on the thread.
pub(super) const EPOCH_YIELD_TICKS: u64 = 1;

/// How an engine bounds the CPU its guests use.
///
/// Both bound wall clock: a running guest yields to the runtime at regular
/// points, where the per-request deadline (`request_timeout_ms`) can abort
/// it. They differ in cost and in what else they bound, which
/// `cargo bench --bench transport` (`cpu_limits`) measures side by side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Metering {
    /// Fuel: wasm operators are counted, each request gets
    /// `fuel_per_request` afresh, and the guest yields every
    /// `fuel_yield_interval` units. Deterministic; bounds work as well as
    /// time. The default.
    #[default]
    Fuel,
    /// Epoch interruption: a timer thread advances the engine's epoch every
    /// [`EPOCH_TICK`], and the guest yields at the next loop head or call
    /// after each tick. Cheaper per operator; bounds time only, so
    /// `fuel_per_request` is not enforced, and the sandbox report says so.
    Epoch,
    /// Neither: the baseline that the benches measure the other two
    /// against. A guest that spins holds its thread and no deadline can stop
    /// it, which the sandbox report says. Not reachable from a config;
    /// for measuring only.
    Unmetered,
}

/// How the engine allocates instances (memories, tables, instance state,
/// async stacks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Allocator {
    /// Each instance's memory is mapped when it is made and unmapped when
    /// it is dropped.
    #[default]
    OnDemand,
    /// Slots reserved once, at engine creation, and reused: an instance
    /// takes a slot whose mapping is already there, and gives it back
    /// reset (its pages discarded, a copy-on-write image mapped afresh).
    Pooling(Pool),
}

/// The pooling allocator's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool {
    /// Component instances alive at once, over every server: each stdio
    /// server's session instance and each typed call in flight takes one;
    /// one more is refused ("pool exhausted") until one ends.
    pub instances: u32,
    /// The largest linear memory any server may grow to: the largest
    /// `memory_bytes` configured. A slot is that large (reserved, not
    /// committed: pages are only used as the guest touches them).
    pub max_memory_bytes: u64,
}

impl Allocator {
    /// The allocator `config` asks for: a pooling allocator's slots are as
    /// large as the largest `memory_bytes` of any server.
    pub fn of(config: &crate::config::Config) -> Self {
        match config.wasm.allocator {
            crate::config::AllocatorSetting::OnDemand => Self::OnDemand,
            crate::config::AllocatorSetting::Pooling => Self::Pooling(Pool {
                instances: config.wasm.pool_instances.get(),
                max_memory_bytes: config
                    .servers
                    .values()
                    .map(|spec| spec.limits.memory_bytes)
                    .chain([Limits::default().memory_bytes])
                    .max()
                    .unwrap_or_default(),
            }),
        }
    }
}

impl Pool {
    /// Memories, tables and core instances per component instance, on
    /// average over the pool: a Rust wasip2 component has one core module
    /// with one memory and a few shims with tables; componentize-js and
    /// componentize-py components have a handful of each.
    pub(super) const MEMORIES_PER_INSTANCE: u32 = 2;
    pub(super) const TABLES_PER_INSTANCE: u32 = 4;
    pub(super) const CORE_INSTANCES_PER_INSTANCE: u32 = 8;
    /// Elements per table slot: an interpreter's function table (the
    /// largest seen, componentize-py's, has some tens of thousands).
    pub(super) const TABLE_ELEMENTS: usize = 100_000;

    pub(super) fn config(&self) -> wasmtime::PoolingAllocationConfig {
        let mut pool = wasmtime::PoolingAllocationConfig::new();
        let memory = usize::try_from(self.max_memory_bytes).unwrap_or(usize::MAX);
        pool.total_component_instances(self.instances)
            .total_core_instances(
                self.instances
                    .saturating_mul(Self::CORE_INSTANCES_PER_INSTANCE),
            )
            .total_memories(self.instances.saturating_mul(Self::MEMORIES_PER_INSTANCE))
            .total_tables(self.instances.saturating_mul(Self::TABLES_PER_INSTANCE))
            .total_stacks(self.instances)
            .max_memory_size(memory)
            .table_elements(Self::TABLE_ELEMENTS);
        pool
    }
}

impl From<crate::config::CpuMetering> for Metering {
    fn from(metering: crate::config::CpuMetering) -> Self {
        match metering {
            crate::config::CpuMetering::Fuel => Self::Fuel,
            crate::config::CpuMetering::Epoch => Self::Epoch,
        }
    }
}

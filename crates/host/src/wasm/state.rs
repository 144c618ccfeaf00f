//! What a guest's store holds: the WASI and wasi:http contexts, the
//! resource table, and the limiter that bounds memory, tables and
//! instances.

use super::*;

/// Per-instance host state.
pub struct HostState {
    pub(super) wasi: WasiCtx,
    pub(super) table: ResourceTable,
    pub(super) limiter: Limiter,
    pub(super) requests: Arc<AtomicU64>,
    pub(super) requests_seen: u64,
    pub(super) fuel_per_request: u64,
    pub(super) fuel_at_last_hook: u64,
    pub(super) metrics: Arc<Metrics>,
    /// The names the guest may look up.
    pub(super) names: crate::wasm::lookup::Names,
    pub(super) http: wasmtime_wasi_http::WasiHttpCtx,
    pub(super) http_hooks: http::Hooks,
}

impl HostState {
    pub(crate) fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }

    pub(crate) fn names(&self) -> &crate::wasm::lookup::Names {
        &self.names
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Memory, table and instance limits that remember which one was hit: a
/// memory-limit failure is not a `Trap` variant.
pub(super) struct Limiter {
    pub(super) memory_bytes: u64,
    pub(super) table_elements: u64,
    pub(super) instances: usize,
    pub(super) tables: usize,
    pub(super) memories: usize,
    pub(super) hit: Option<LimitHit>,
}

impl Limiter {
    pub(super) fn new(limits: &Limits) -> Self {
        let count = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        Self {
            memory_bytes: limits.memory_bytes,
            table_elements: limits.table_elements,
            instances: count(limits.instances),
            tables: count(limits.tables),
            memories: count(limits.memories),
            hit: None,
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.memory_bytes {
            self.hit = Some(LimitHit::Memory {
                memory_bytes: self.memory_bytes,
            });
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.table_elements {
            self.hit = Some(LimitHit::TableElements {
                table_elements: self.table_elements,
            });
            return Ok(false);
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn tables(&self) -> usize {
        self.tables
    }

    fn memories(&self) -> usize {
        self.memories
    }
}

impl wasmtime_wasi_http::WasiHttpView for HostState {
    fn http(&mut self) -> wasmtime_wasi_http::WasiHttpCtxView<'_> {
        wasmtime_wasi_http::WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

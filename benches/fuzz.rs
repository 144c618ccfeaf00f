//! The case rate of `moat fuzz`: the same generated cases (seed 1) against
//! the wasm and the native build of the `fuzzable` guest, side by side in
//! one run, one instance reused as `moat fuzz --jobs 1` does. Criterion
//! reports it as elements (cases) per second.
//!
//! `cargo bench --bench fuzz`

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use moat_host::fuzz::{Case, Generator, Runner};
use moat_host::{Host, ServerSpec};
use moat_test_guests as guests;

/// Cases per iteration.
const CASES: usize = 200;

fn specs() -> [(&'static str, ServerSpec); 2] {
    let mut wasm = ServerSpec::wasm("fuzzable", guests::FUZZABLE_WASM);
    wasm.allow_unmeasured = true;
    // As in tests/fuzz.rs: a 1 MB malformed request costs rmcp's wasm build
    // more than the default 2e9 fuel.
    wasm.limits.fuel_per_request = 20_000_000_000;
    let mut native = ServerSpec::native("fuzzable", guests::FUZZABLE_NATIVE);
    native.allow_unmeasured = true;
    [("wasm", wasm), ("native", native)]
}

fn case_rate(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("fuzz cases");
    group.throughput(Throughput::Elements(CASES as u64));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    for (label, spec) in specs() {
        let host = Host::new(None).unwrap();
        let mut runner = runtime
            .block_on(Runner::start(
                host,
                spec,
                false,
                Some(Duration::from_secs(5)),
            ))
            .unwrap();
        let mut generator = Generator::new(1, runner.tools().to_vec(), &[]);
        let cases: Vec<Case> = (0..CASES).map(|_| generator.next_case()).collect();
        group.bench_function(label, |b| {
            b.iter(|| {
                runtime.block_on(async {
                    for case in &cases {
                        let outcome = runner.run(case).await;
                        assert!(!outcome.class.is_finding(), "{case:?}: {outcome:?}");
                    }
                })
            })
        });
        runtime.block_on(runner.close());
    }
    group.finish();
}

criterion_group!(benches, case_rate);
criterion_main!(benches);

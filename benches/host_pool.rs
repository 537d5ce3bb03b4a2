//! Per-call latency of the host pool against cuMemAllocAsync (criterion).
//! Needs a GPU; prints a note and measures nothing without one. A failed
//! call stops the run with its error: failures are not timed as work.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use cuheap::bench::host::Async;
use cuheap::host::Resource;
use cuheap::host::{Pool, PoolConfig};

fn bench(c: &mut Criterion) {
    let gpu = match cuheap::open_gpu() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("host_pool bench skipped: {e}");
            return;
        }
    };
    let pool = Pool::new(gpu.context(), PoolConfig::new(8 << 30)).expect("pool");
    let s = gpu.context().new_stream().expect("stream");
    let mut g = c.benchmark_group("alloc_free_pair");
    for size in [256usize, 1 << 20, 64 << 20] {
        g.bench_with_input(BenchmarkId::new("cuheap_pool", size), &size, |b, &size| {
            b.iter(|| {
                let p = pool.alloc(size, &s).expect("alloc");
                pool.free(p, &s).expect("free");
            })
        });
        g.bench_with_input(
            BenchmarkId::new("cuMemAllocAsync", size),
            &size,
            |b, &size| {
                b.iter(|| {
                    let p = Async.allocate(size, &s).expect("cuMemAllocAsync");
                    Async.deallocate(p, &s).expect("cuMemFreeAsync");
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! The pool's own cost per call, on the CPU (criterion): the pool over
//! [`HostBackend`], whose streams and events are host objects, so what is
//! timed is the pool's bookkeeping, not a driver. `cuheap bench host`
//! times the same calls on a GPU beside the CUDA allocators.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use cuheap_host::{HostBackend, HostStream, Pool, PoolConfig};
use std::hint::black_box;

fn pool() -> Pool<HostBackend> {
    let backend = HostBackend::new(64 << 10, 1 << 30).without_contents();
    Pool::with_backend(backend, PoolConfig::new(1 << 30)).expect("pool")
}

fn bench(c: &mut Criterion) {
    let pool = pool();
    let s = HostStream::new();
    let mut g = c.benchmark_group("pool_pair");
    for size in [256usize, 64 << 10, 1 << 20] {
        g.bench_with_input(BenchmarkId::new("alloc_free", size), &size, |b, &size| {
            b.iter(|| {
                let p = pool.alloc(black_box(size), &s).expect("alloc");
                pool.free(p, &s).expect("free");
            })
        });
    }
    // 64 live blocks of 256 B..64 KiB, one freed and one allocated a call.
    g.bench_function("churn_64_live", |b| {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut live: Vec<u64> = (0..64)
            .map(|_| {
                pool.alloc(256 + (next() % (64 << 10)) as usize, &s)
                    .expect("alloc")
            })
            .collect();
        b.iter(|| {
            let i = next() as usize % live.len();
            pool.free(live[i], &s).expect("free");
            live[i] = pool
                .alloc(256 + (next() % (64 << 10)) as usize, &s)
                .expect("alloc");
        });
        for p in live {
            pool.free(p, &s).expect("free");
        }
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

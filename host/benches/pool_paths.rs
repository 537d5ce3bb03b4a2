//! The pool's own cost per call, on the CPU (criterion): the pool over
//! [`HostBackend`], whose streams and events are host objects, so what is
//! timed is the pool's bookkeeping, not a driver. `cuheap bench host`
//! times the same calls on a GPU beside the CUDA allocators.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use cuheap_host::{HostBackend, HostStream, Pool, PoolConfig};
use std::hint::black_box;

/// The next value of a xorshift generator (the benchmark's sizes).
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

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
        let mut next = move || xorshift(&mut rng);
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
    // `cuheap bench host`'s threaded case: threads with their own streams,
    // alloc/free pairs of 256 B..64 KiB with up to 64 live each; the time
    // per pair per thread (flat when threads scale).
    let mut g = c.benchmark_group("threads_own_stream");
    for threads in [1usize, 4, 8] {
        g.bench_with_input(
            BenchmarkId::new("pair", threads),
            &threads,
            |b, &threads| {
                b.iter_custom(|iters| {
                    let barrier = std::sync::Barrier::new(threads + 1);
                    let start = std::thread::scope(|sc| {
                        for t in 0..threads {
                            let (pool, barrier) = (&pool, &barrier);
                            sc.spawn(move || {
                                let s = HostStream::new();
                                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                                let mut live: Vec<u64> = Vec::with_capacity(64);
                                barrier.wait();
                                for _ in 0..iters {
                                    xorshift(&mut rng);
                                    let sz = 256 + (rng % (64 << 10)) as usize;
                                    live.push(pool.alloc(sz, &s).expect("alloc"));
                                    if live.len() >= 64 {
                                        let i = (rng >> 32) as usize % live.len();
                                        pool.free(live.swap_remove(i), &s).expect("free");
                                    }
                                }
                                for p in live {
                                    pool.free(p, &s).expect("free");
                                }
                            });
                        }
                        barrier.wait();
                        std::time::Instant::now()
                    });
                    start.elapsed()
                })
            },
        );
    }
    g.finish();
    // `cuheap bench host`'s mixed case: 10,000 live blocks of 256 B..1 MiB,
    // all allocated, then all freed (one round a sample).
    let mut rng = 0x1234_5678_9abc_def0u64;
    let sizes: Vec<usize> = (0..10_000)
        .map(|_| 256 + (xorshift(&mut rng) % (1 << 20)) as usize)
        .collect();
    let big = Pool::with_backend(
        HostBackend::new(64 << 10, 64 << 30).without_contents(),
        PoolConfig::new(64 << 30),
    )
    .expect("pool");
    c.bench_function("mixed_10000_live_round", |b| {
        let mut live = Vec::with_capacity(sizes.len());
        b.iter(|| {
            for &sz in &sizes {
                live.push(big.alloc(sz, &s).expect("alloc"));
            }
            for p in live.drain(..) {
                big.free(p, &s).expect("free");
            }
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);

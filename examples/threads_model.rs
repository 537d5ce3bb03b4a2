//! The host benchmark's threads case (each thread on its own stream,
//! 200,000 pairs of 256 B..64 KiB with 64 blocks live) on the pool over
//! host memory, no GPU needed: on a fresh pool warmed by single sizes
//! only (the C API pool's history in `cuheap bench host`), or on one that
//! ran the mixed case first (the Rust pool's).
//!
//!     cargo run --release --example threads_model -- fresh 8
//!     cargo run --release --example threads_model -- warm 8
//!     cargo run --release --example threads_model -- private 8
//!
//! `private` runs the same threads on thread-private lists with nothing
//! shared ([`PrivateLists`], the benchmark's ceiling row): how far this
//! machine's cores scale the loop itself.
//!
//! `CACHE_LIMIT_MIB`, `STREAM_CACHE_LIMIT_MIB` and `INITIAL_MIB` change
//! the pool's settings; `PAIRS` sets the pairs per thread. With
//! `PROFILE=DIR` the threads are sampled into
//! `DIR/model-<fresh|warm>-<threads>.txt` (`scripts/symbolize.py` names
//! the addresses).

use cuheap::bench::host::{cache_limits_from_env, env_mib, thread_pairs, xorshift, PrivateLists};
use cuheap::bench::sampler::Sampler;
use cuheap_host::{HostBackend, HostStream, Pool, PoolConfig, Resource};
use std::time::Instant;

/// `n` threads of `pairs` alloc-and-free pairs each, the benchmark's own
/// thread body: M pairs a second.
fn threads<R: Resource<Stream = HostStream>>(a: &R, n: usize, pairs: usize) -> f64 {
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        for t in 0..n {
            sc.spawn(move || {
                let (done, failed) = thread_pairs(a, &HostStream::new(), t, pairs);
                assert_eq!((done, failed), (pairs as u64, 0), "thread {t}");
            });
        }
    });
    (n * pairs) as f64 / t0.elapsed().as_secs_f64() / 1e6
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "fresh".into());
    let n: usize = std::env::args()
        .nth(2)
        .map_or(8, |s| s.parse().expect("a thread count"));
    let pairs = std::env::var("PAIRS").map_or(200_000, |v| v.parse().expect("a pair count"));
    if mode == "private" {
        let rate = threads(&PrivateLists::<HostStream>::default(), n, pairs);
        println!("private: {n} threads {rate:.2} M pairs/s");
        return;
    }
    // CACHE_LIMIT_MIB, STREAM_CACHE_LIMIT_MIB, INITIAL_MIB: other settings.
    let mut cfg = PoolConfig::new(16 << 30);
    cache_limits_from_env(&mut cfg);
    cfg.initial = env_mib("INITIAL_MIB").unwrap_or(cfg.initial);
    let pool = Pool::with_backend(HostBackend::new(64 << 10, usize::MAX), cfg).expect("pool");
    let s = HostStream::new();
    for size in [256usize, 64 << 10, 1 << 20] {
        for _ in 0..20_000 {
            let p = pool.alloc(size, &s).expect("alloc");
            pool.free(p, &s).expect("free");
        }
    }
    if mode == "warm" {
        let mut rng = 0x1234_5678_9abc_def0u64;
        for _ in 0..3 {
            let live: Vec<u64> = (0..10_000)
                .map(|_| {
                    let sz = 256 + (xorshift(&mut rng) % (1 << 20)) as usize;
                    pool.alloc(sz, &s).expect("alloc")
                })
                .collect();
            for p in live {
                pool.free(p, &s).expect("free");
            }
        }
    }
    let st = pool.stats();
    println!(
        "{mode}: before the threads: mapped {} MiB, grows {}, retires {}",
        st.reserved >> 20,
        st.grows,
        st.retires
    );
    let dir = std::env::var_os("PROFILE");
    let sampler = dir.as_ref().map(|_| Sampler::start(997).expect("sampler"));
    let rate = threads(&pool, n, pairs);
    if let (Some(smp), Some(dir)) = (sampler, dir) {
        let path = std::path::Path::new(&dir).join(format!("model-{mode}-{n}.txt"));
        smp.finish(&path, &mode).expect("profile");
    }
    let st = pool.stats();
    println!(
        "{mode}: {n} threads {rate:.2} M pairs/s; after: mapped {} MiB, grows {}, retires {}",
        st.reserved >> 20,
        st.grows,
        st.retires
    );
}

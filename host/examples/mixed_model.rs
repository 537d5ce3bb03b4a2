//! The host benchmark's mixed case (10,000 live blocks of 256 B..1 MiB,
//! allocate all then free all, three rounds) on the pool over host
//! memory: the pool's own time per call, without a GPU. `ROUNDS=N` runs
//! N rounds (for sampling the steady state).

use cuheap_host::{HostBackend, HostStream, Pool, PoolConfig};
use std::time::Instant;

fn main() {
    let reserve = 16usize << 30;
    let pool = Pool::with_backend(
        HostBackend::new(64 << 10, usize::MAX),
        PoolConfig::new(reserve),
    )
    .expect("pool");
    let s = HostStream::new();
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let sizes: Vec<usize> = (0..10_000)
        .map(|_| 256 + (next() % (1 << 20)) as usize)
        .collect();
    let rounds = std::env::var("ROUNDS").map_or(3, |v| v.parse().expect("a round count"));
    for round in 0..rounds {
        // Two functions for one round, so that a profiler can take the
        // steady state alone (`valgrind --tool=callgrind
        // --toggle-collect='*steady_round*'`).
        match round < 2 {
            true => warm_round(&pool, &s, &sizes, round),
            false => steady_round(&pool, &s, &sizes, round),
        }
    }
}

#[inline(never)]
fn warm_round(pool: &Pool<HostBackend>, s: &HostStream, sizes: &[usize], round: usize) {
    one_round(pool, s, sizes, round)
}

#[inline(never)]
fn steady_round(pool: &Pool<HostBackend>, s: &HostStream, sizes: &[usize], round: usize) {
    // Not the same code as `warm_round`, so that the linker keeps two
    // functions and the profiler's toggle takes this one alone.
    std::hint::black_box(round);
    one_round(pool, s, sizes, round)
}

/// Allocates every size (timing each call), then frees every block.
#[inline(always)]
fn one_round(pool: &Pool<HostBackend>, s: &HostStream, sizes: &[usize], round: usize) {
    let mut times: Vec<f64> = Vec::with_capacity(sizes.len());
    let live: Vec<u64> = sizes
        .iter()
        .map(|&sz| {
            let t = Instant::now();
            let p = pool.alloc(sz, s).expect("alloc");
            times.push(t.elapsed().as_secs_f64() * 1e6);
            p
        })
        .collect();
    let ta = times.iter().sum::<f64>() / times.len() as f64;
    times.sort_by(f64::total_cmp);
    let p50 = times[times.len() / 2];
    let mut frees: Vec<f64> = Vec::with_capacity(sizes.len());
    for p in live {
        let t = Instant::now();
        pool.free(p, s).expect("free");
        frees.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let tf = frees.iter().sum::<f64>() / frees.len() as f64;
    frees.sort_by(f64::total_cmp);
    let pct = |q: f64| frees[((frees.len() - 1) as f64 * q) as usize];
    let (f50, f99, f999) = (pct(0.5), pct(0.99), pct(0.999));
    let (st, c) = (pool.stats(), pool.backend().counts());
    println!(
        "round {round}: alloc {ta:.3} us (p50 {p50:.3}), free {tf:.3} us per call (p50 {f50:.3}, \
         p99 {f99:.3}, p99.9 {f999:.3}); so far {} grows, \
         {} retires; device calls: {} event records, {} stream waits, {} event queries, \
         {} host waits for events",
        st.grows, st.retires, c.records, c.waits, c.queries, c.event_syncs
    );
}

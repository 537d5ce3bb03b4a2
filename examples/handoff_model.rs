//! The host benchmark's hand-off case (eight threads with their own
//! streams allocate blocks of 256 B..4 MiB, log-uniform, and hand each to
//! the next thread, which frees it on its own stream; 20,000 blocks) on
//! the pool over host memory, no GPU needed: the benchmark's own loop
//! ([`handoff_threads`]), on a pool made as the benchmark makes its
//! (mapped in 2 MiB steps from 2 MiB), with no memory behind the blocks
//! (no fills or checks). Prints the memory the pool mapped over the peak
//! of requested bytes alive, for `RUNS` runs (default 8) of different
//! draws: the pool's placement studied without a GPU. `CACHE_LIMIT_MIB`
//! and `STREAM_CACHE_LIMIT_MIB` change the pool's cache bounds.
//!
//!     cargo run --release --example handoff_model

use cuheap::bench::host::{cache_limits_from_env, handoff_threads, HANDOFF_THREADS};
use cuheap_host::{HostBackend, HostStream, Pool, PoolConfig};

/// Mapped bytes over the peak of requested bytes alive, for one run.
fn run(seed: u64) -> f64 {
    let mut cfg = PoolConfig {
        initial: 2 << 20,
        chunk: 2 << 20,
        ..PoolConfig::new(16 << 30)
    };
    cache_limits_from_env(&mut cfg);
    let backend = HostBackend::new(2 << 20, usize::MAX).without_contents();
    let pool = Pool::with_backend(backend, cfg).expect("pool");
    let streams: Vec<HostStream> = (0..HANDOFF_THREADS).map(|_| HostStream::new()).collect();
    let ok = |_: &HostStream, _: u64, _: usize, _: u8| true;
    let (peak, failed) = handoff_threads(&pool, &streams, seed, || {}, ok, ok);
    assert_eq!(failed, 0, "failed calls");
    pool.stats().reserved as f64 / peak as f64
}

fn main() {
    let runs: u64 = std::env::var("RUNS").map_or(8, |v| v.parse().expect("a run count"));
    let mut held: Vec<f64> = (0..runs).map(|i| run(i * 7919)).collect();
    held.sort_by(f64::total_cmp);
    let shown: Vec<String> = held.iter().map(|h| format!("{h:.2}")).collect();
    let n = held.len();
    println!(
        "mapped / peak in use, {n} runs: [{}], median {:.2}",
        shown.join(", "),
        (held[(n - 1) / 2] + held[n / 2]) / 2.0
    );
}

//! The host benchmark's single-size loop (alloc + free pairs of one size
//! on one stream) on the pool over host memory: ns per call, no GPU.
//! `SIZE` (bytes, default 256) and `PAIRS` (default 20,000,000).

use cuheap_host::{HostBackend, HostStream, Pool, PoolConfig};
use std::time::Instant;

fn main() {
    let size = std::env::var("SIZE").map_or(256, |v| v.parse().expect("bytes"));
    let pairs: usize = std::env::var("PAIRS").map_or(20_000_000, |v| v.parse().expect("pairs"));
    let pool = Pool::with_backend(
        HostBackend::new(64 << 10, usize::MAX),
        PoolConfig::new(1 << 30),
    )
    .expect("pool");
    let s = HostStream::new();
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..pairs {
            let p = pool.alloc(size, &s).expect("alloc");
            pool.free(std::hint::black_box(p), &s).expect("free");
        }
        let ns = t.elapsed().as_secs_f64() * 1e9 / (2 * pairs) as f64;
        println!("{size} B: {ns:.1} ns a call");
    }
}

//! What the pool's CPU tests share.

use cuheap_host::{HostBackend, Pool, PoolConfig};
use std::sync::Arc;

pub const KIB: usize = 1 << 10;
pub const MIB: usize = 1 << 20;

/// A pool over host memory: `reserve` bytes of address space, mapped in
/// `chunk`-byte steps, with at most `capacity` bytes of physical memory.
pub fn pool(reserve: usize, chunk: usize, capacity: usize) -> Arc<Pool<HostBackend>> {
    let cfg = PoolConfig {
        initial: chunk,
        chunk,
        ..PoolConfig::new(reserve)
    };
    Arc::new(Pool::with_backend(HostBackend::new(64 * KIB, capacity), cfg).unwrap())
}

/// A pool over host memory (64 KiB pages, no cap on physical memory) with
/// the settings `cfg`.
pub fn host_pool(cfg: PoolConfig) -> Pool<HostBackend> {
    Pool::with_backend(HostBackend::new(64 * KIB, usize::MAX), cfg).unwrap()
}

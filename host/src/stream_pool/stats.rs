//! What a pool reports: bytes mapped, in use and cached, reuse counters.

use super::cache::{ALLOCS, CROSS, FREES, SAME};
use super::Pool;
use crate::backend::Backend;
use std::sync::atomic::Ordering;

/// A snapshot of a pool.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolStats {
    /// Bytes of physical memory mapped.
    pub reserved: usize,
    /// Bytes handed out and not freed (block sizes).
    pub in_use: usize,
    /// Largest `in_use` seen, sampled: each stream's cache adds its count
    /// of bytes in and out to the pool's every 64 calls and whenever that
    /// count moves further than 2 MiB (or twice the call's block) from
    /// zero, each thread's cache every 64 calls and when it spills blocks
    /// to its stream's, and every snapshot samples too. Each cache may
    /// lead or lag by about that much, summed over the caches.
    pub peak_in_use: usize,
    /// Bytes freed and cached, per stream (its id as an integer).
    pub cached_per_stream: Vec<(usize, usize)>,
    /// Bytes freed and retired: back to the heap once the device has
    /// finished their streams' work (and, for a block freed while one of
    /// those streams was being captured, once the capture has ended:
    /// [`Pool::free_after_capture`](super::Pool::free_after_capture)).
    pub retired: usize,
    /// 1 - largest free run / free bytes of the mapped heap (0 = none).
    pub fragmentation: f64,
    pub allocs: u64,
    pub frees: u64,
    /// Blocks reused on the stream that freed them.
    pub same_stream_reuse: u64,
    /// Blocks taken from another stream's cache (with an event wait).
    pub cross_stream_reuse: u64,
    pub grows: u64,
    /// Growths that moved whole free mappings from between blocks in use
    /// to the end, instead of mapping new memory for them.
    pub moves: u64,
    /// Times a cache gave blocks back: shed to the heap behind its
    /// stream's guard (a cache past its bound, a dropped stream, a pool
    /// short of memory), or retired to wait for an event
    /// ([`Pool::free_after`](super::Pool::free_after)).
    pub retires: u64,
    pub flushes: u64,
    pub bad_frees: u64,
    /// Physical memory mapped by the device heaps of the pool's
    /// reservation (0 unless it shares one, see
    /// [`Pool::in_reservation`](super::Pool::in_reservation)).
    pub device_heap_mapped: usize,
    /// Physical memory of the pool's reservation that the pool or a
    /// device heap gave back, kept for the next of them to grow.
    pub banked: usize,
}

impl PoolStats {
    /// Bytes freed and not yet back in the heap: cached on all streams,
    /// and retired.
    pub fn cached(&self) -> usize {
        self.cached_per_stream.iter().map(|c| c.1).sum::<usize>() + self.retired
    }
}

/// Pool-wide counters (`Pool::counts`): rare events.
pub(super) const GROWS: usize = 0;
pub(super) const FLUSHES: usize = 1;
pub(super) const BAD: usize = 2;
pub(super) const RETIRES: usize = 3;
pub(super) const MOVES: usize = 4;

impl<B: Backend> Pool<B> {
    /// Free bytes of the mapped heap and its largest free run, in one pass.
    ///
    /// # Time complexity
    ///
    /// O(mapped pages).
    pub(super) fn free_space(&self) -> (usize, usize) {
        let heap = self.heap();
        let (mut free, mut best, mut run) = (0usize, 0u32, 0u32);
        for p in 0..heap.limit() {
            if heap.any_in_use(p, p + 1) {
                run = 0;
            } else {
                free += 1;
                run += 1;
                best = best.max(run);
            }
        }
        let page = cuheap_core::PAGE_SIZE;
        (free * page, best as usize * page)
    }

    /// A snapshot of the pool's state (O(mapped pages + streams)).
    pub fn stats(&self) -> PoolStats {
        self.stats_and_largest().0
    }

    /// [`Pool::stats`] and the largest free run of the mapped heap, from
    /// one scan of the page map.
    pub(super) fn stats_and_largest(&self) -> (PoolStats, usize) {
        let mut cached_per_stream = Vec::new();
        let mut per_stream = [0u64; 4];
        let mut net = 0i64;
        // Before the walk: a cache that folds meanwhile is then missed by
        // this snapshot, not counted twice (see `peak_in_use` below).
        let folded = self.folded.load(Ordering::Relaxed);
        let mut exact = true;
        for (id, sc) in self.caches.read().unwrap_or_else(|p| p.into_inner()).iter() {
            // The threads' caches of the stream first (never under its lock),
            // again if blocks moved from them to the stream's cache meanwhile.
            for tries in 0.. {
                let seen = sc.moves.load(Ordering::Acquire);
                let (mut bytes, mut n, mut counts) = (0, 0i64, [0u64; 4]);
                sc.each_local(|_, m| {
                    bytes += m.bytes;
                    n += m.net;
                    for (t, v) in counts.iter_mut().zip(m.counts) {
                        *t += v;
                    }
                });
                let c = sc.lock();
                if sc.moves.load(Ordering::Acquire) != seen {
                    if tries < 8 {
                        continue;
                    }
                    exact = false; // blocks may be counted on both sides
                }
                cached_per_stream.push((*id, c.bytes + bytes));
                net += c.net + n;
                for (t, v) in per_stream.iter_mut().zip(c.counts) {
                    *t += v;
                }
                for (t, v) in per_stream.iter_mut().zip(counts) {
                    *t += v;
                }
                break;
            }
        }
        let (free_bytes, largest) = self.free_space();
        let c = |i: usize| self.counts[i].load(Ordering::Relaxed);
        let in_use = (folded + net).max(0) as usize;
        // Kept as the pool's peak only from a walk that counted nothing
        // twice, so a later snapshot never shows a lower peak and none
        // shows one that never was.
        let peak = if exact {
            self.peak.fetch_max(in_use, Ordering::Relaxed)
        } else {
            self.peak.load(Ordering::Relaxed)
        };
        let gone = *self
            .forgotten_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let shared = self.region.reservation().stats();
        let stats = PoolStats {
            reserved: self.region.mapped(),
            device_heap_mapped: shared.heap_mapped,
            banked: shared.banked,
            in_use,
            peak_in_use: peak.max(in_use),
            cached_per_stream,
            fragmentation: if free_bytes == 0 {
                0.0
            } else {
                1.0 - largest as f64 / free_bytes as f64
            },
            allocs: per_stream[ALLOCS] + gone[ALLOCS],
            frees: per_stream[FREES] + gone[FREES],
            same_stream_reuse: per_stream[SAME] + gone[SAME],
            cross_stream_reuse: per_stream[CROSS] + gone[CROSS],
            retired: self.retired_bytes.load(Ordering::Relaxed),
            grows: c(GROWS),
            moves: c(MOVES),
            retires: c(RETIRES),
            flushes: c(FLUSHES),
            bad_frees: c(BAD),
        };
        (stats, largest)
    }
}

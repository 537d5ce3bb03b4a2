//! `cuheap bench cpu`: `cuheap-core` on host threads, the part of the
//! benchmark that runs on any machine. Each thread repeatedly allocates a
//! batch of blocks, writes one word in each, and frees them; the system
//! allocator runs the same loop as a reference. Only completed pairs count
//! as work; null allocations and refused frees are counted as failures.

use super::workload::thread_size;
use cuheap_core::OwnedHeap;
use serde::Serialize;
use std::alloc::{alloc, dealloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Instant;

#[derive(Clone, Debug, Serialize)]
pub struct CpuRow {
    pub allocator: &'static str,
    pub threads: usize,
    /// 0 = mixed 16..=4096.
    pub size: u32,
    /// Completed alloc + free pairs per second, all threads together.
    pub pairs_per_s: f64,
    /// Allocations that returned null and frees that were refused: not
    /// work done, and a run with any fails (`cuheap bench` exits with an
    /// error).
    pub failures: u64,
}

const BATCH: usize = 64;

/// One allocator under test: alloc returns null on failure, free whether
/// the block was taken back.
trait Target: Sync {
    fn alloc(&self, size: usize, thread: u32) -> *mut u8;
    /// # Safety
    /// `p` came from `alloc` with `size` and is freed once.
    unsafe fn free(&self, p: *mut u8, size: usize, thread: u32) -> bool;
}

impl Target for OwnedHeap<u64> {
    fn alloc(&self, size: usize, thread: u32) -> *mut u8 {
        self.heap()
            .alloc(size, thread)
            .unwrap_or(std::ptr::null_mut())
    }
    unsafe fn free(&self, p: *mut u8, _size: usize, thread: u32) -> bool {
        self.heap().free(p, thread).is_ok()
    }
}

struct System;

impl Target for System {
    fn alloc(&self, size: usize, _thread: u32) -> *mut u8 {
        // SAFETY: size >= 16, align 16.
        unsafe { alloc(Layout::from_size_align(size, 16).expect("valid layout")) }
    }
    unsafe fn free(&self, p: *mut u8, size: usize, _thread: u32) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { dealloc(p, Layout::from_size_align(size, 16).expect("valid layout")) };
        true
    }
}

/// Completed pairs per second and failures of `threads` threads.
fn measure(target: &dyn Target, threads: usize, size: u32, pairs_per_thread: usize) -> (f64, u64) {
    let barrier = Barrier::new(threads + 1);
    let (done, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let start = std::thread::scope(|sc| {
        for t in 0..threads {
            let (barrier, done, failed) = (&barrier, &done, &failed);
            sc.spawn(move || {
                let mut ptrs = [(std::ptr::null_mut::<u8>(), 0usize); BATCH];
                let (mut pairs, mut failures) = (0u64, 0u64);
                barrier.wait();
                let mut i = 0u32;
                for _ in 0..pairs_per_thread / BATCH {
                    for slot in ptrs.iter_mut() {
                        let n = thread_size(i.wrapping_mul(31).wrapping_add(t as u32), size);
                        i = i.wrapping_add(1);
                        let p = target.alloc(n, t as u32);
                        if p.is_null() {
                            failures += 1;
                        } else {
                            // SAFETY: a fresh block of at least n >= 16 bytes.
                            unsafe { (p as *mut u64).write(i as u64) };
                        }
                        *slot = (p, n);
                    }
                    for &(p, n) in ptrs.iter() {
                        if p.is_null() {
                            continue;
                        }
                        // SAFETY: allocated above with n, freed once.
                        if unsafe { target.free(p, n, t as u32) } {
                            pairs += 1;
                        } else {
                            failures += 1;
                        }
                    }
                }
                done.fetch_add(pairs, Ordering::Relaxed);
                failed.fetch_add(failures, Ordering::Relaxed);
            });
        }
        barrier.wait();
        Instant::now()
    });
    let secs = start.elapsed().as_secs_f64();
    (done.into_inner() as f64 / secs, failed.into_inner())
}

/// Runs the CPU benchmark for 1, 2 and all threads.
pub fn run(pairs_per_thread: usize) -> Vec<CpuRow> {
    let all = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut counts = vec![1, 2, all];
    counts.sort_unstable();
    counts.dedup();
    let heap = OwnedHeap::<u64>::new(4096, all as u32).expect("a 256 MiB host heap");
    let mut rows = Vec::new();
    for &size in &[16u32, 256, 0] {
        for &t in &counts {
            let targets: [(&'static str, &dyn Target); 2] =
                [("cuheap-core", &heap), ("system malloc", &System)];
            for (allocator, target) in targets {
                let (pairs_per_s, failures) = measure(target, t, size, pairs_per_thread);
                rows.push(CpuRow {
                    allocator,
                    threads: t,
                    size,
                    pairs_per_s,
                    failures,
                });
            }
        }
    }
    rows
}

/// Failures over all rows (see [`CpuRow::failures`]).
pub fn failures(rows: &[CpuRow]) -> u64 {
    rows.iter().map(|r| r.failures).sum()
}

pub fn table(rows: &[CpuRow]) -> String {
    let mut s = String::from(
        "| allocator | threads | size | M pairs/s | failures |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {:.1} | {} |\n",
            r.allocator,
            r.threads,
            super::device::size_name(r.size),
            r.pairs_per_s / 1e6,
            r.failures
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The system allocator, refusing every other allocation.
    struct EveryOtherFails(AtomicU64);

    impl Target for EveryOtherFails {
        fn alloc(&self, size: usize, thread: u32) -> *mut u8 {
            if self.0.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
                return std::ptr::null_mut();
            }
            System.alloc(size, thread)
        }
        unsafe fn free(&self, p: *mut u8, size: usize, thread: u32) -> bool {
            // SAFETY: forwarded from the caller.
            unsafe { System.free(p, size, thread) }
        }
    }

    #[test]
    fn null_allocations_are_failures_not_pairs() {
        let (_, failures) = measure(&EveryOtherFails(AtomicU64::new(0)), 2, 64, 4 * BATCH);
        assert_eq!(failures, 4 * BATCH as u64);
        let rows = [("a", 0), ("b", 3)].map(|(allocator, failures)| CpuRow {
            allocator,
            threads: 1,
            size: 16,
            pairs_per_s: 1.0,
            failures,
        });
        assert_eq!(super::failures(&rows), 3);
        assert!(table(&rows).contains("| 0.0 | 3 |"));
    }

    #[test]
    fn a_heap_with_room_has_no_failures() {
        let heap = OwnedHeap::<u64>::new(1024, 2).expect("a 64 MiB host heap");
        assert_eq!(measure(&heap, 2, 0, 4 * BATCH).1, 0);
    }
}

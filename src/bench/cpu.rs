//! `cuheap bench cpu`: `cuheap-core` on host threads, the part of the
//! benchmark that runs on any machine. Each thread repeatedly allocates a
//! batch of blocks, writes one word in each, and frees them; the system
//! allocator runs the same loop as a reference.

use cuheap_core::workload::thread_size;
use cuheap_core::OwnedHeap;
use serde::Serialize;
use std::alloc::{alloc, dealloc, Layout};
use std::sync::Barrier;
use std::time::Instant;

#[derive(Clone, Debug, Serialize)]
pub struct CpuRow {
    pub allocator: &'static str,
    pub threads: usize,
    /// 0 = mixed 16..=4096.
    pub size: u32,
    /// Alloc + free pairs per second, all threads together.
    pub pairs_per_s: f64,
}

const BATCH: usize = 64;

/// One allocator under test: alloc returns null on failure.
trait Target: Sync {
    fn alloc(&self, size: usize, thread: u32) -> *mut u8;
    /// # Safety
    /// `p` came from `alloc` with `size` and is freed once.
    unsafe fn free(&self, p: *mut u8, size: usize, thread: u32);
}

impl Target for OwnedHeap<u64> {
    fn alloc(&self, size: usize, thread: u32) -> *mut u8 {
        self.heap()
            .alloc(size, thread)
            .unwrap_or(std::ptr::null_mut())
    }
    unsafe fn free(&self, p: *mut u8, _size: usize, thread: u32) {
        let _ = self.heap().free(p, thread);
    }
}

struct System;

impl Target for System {
    fn alloc(&self, size: usize, _thread: u32) -> *mut u8 {
        // SAFETY: size >= 16, align 16.
        unsafe { alloc(Layout::from_size_align(size, 16).expect("valid layout")) }
    }
    unsafe fn free(&self, p: *mut u8, size: usize, _thread: u32) {
        // SAFETY: forwarded from the caller.
        unsafe { dealloc(p, Layout::from_size_align(size, 16).expect("valid layout")) }
    }
}

fn measure(target: &dyn Target, threads: usize, size: u32, pairs_per_thread: usize) -> f64 {
    let barrier = Barrier::new(threads + 1);
    let start = std::thread::scope(|sc| {
        for t in 0..threads {
            let barrier = &barrier;
            sc.spawn(move || {
                let mut ptrs = [(std::ptr::null_mut::<u8>(), 0usize); BATCH];
                barrier.wait();
                let mut i = 0u32;
                for _ in 0..pairs_per_thread / BATCH {
                    for slot in ptrs.iter_mut() {
                        let n = thread_size(i.wrapping_mul(31).wrapping_add(t as u32), size);
                        i = i.wrapping_add(1);
                        let p = target.alloc(n, t as u32);
                        if !p.is_null() {
                            // SAFETY: a fresh block of at least n >= 16 bytes.
                            unsafe { (p as *mut u64).write(i as u64) };
                        }
                        *slot = (p, n);
                    }
                    for &(p, n) in ptrs.iter() {
                        if !p.is_null() {
                            // SAFETY: allocated above with n, freed once.
                            unsafe { target.free(p, n, t as u32) };
                        }
                    }
                }
            });
        }
        barrier.wait();
        Instant::now()
    });
    (threads * (pairs_per_thread / BATCH) * BATCH) as f64 / start.elapsed().as_secs_f64()
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
            rows.push(CpuRow {
                allocator: "cuheap-core",
                threads: t,
                size,
                pairs_per_s: measure(&heap, t, size, pairs_per_thread),
            });
            rows.push(CpuRow {
                allocator: "system malloc",
                threads: t,
                size,
                pairs_per_s: measure(&System, t, size, pairs_per_thread),
            });
        }
    }
    rows
}

pub fn table(rows: &[CpuRow]) -> String {
    let mut s = String::from("| allocator | threads | size | M pairs/s |\n|---|---|---|---|\n");
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {:.1} |\n",
            r.allocator,
            r.threads,
            super::device::size_name(r.size),
            r.pairs_per_s / 1e6
        );
    }
    s
}

//! Benchmark kernels, one thread one allocation, in the shapes the
//! published GPU allocators are measured with:
//!
//! - `pair`: allocate, write `min(size/4, 4)` words derived from the
//!   thread id, fence, read them back (a mismatch is an error), free;
//! - `alloc` then `free`, with the whole-block fill and check of
//!   [`crate::checks`] between them (untimed).
//!
//! Each exists for cuheap, CUDA's device `malloc`/`free`, and (alloc only)
//! a warp-aggregated bump pointer, the ceiling. Parameters and contracts
//! are in `signatures.rs`, which generates the entry points ([`crate::entry`]);
//! each body here has the contract of its line there.

use crate::arch::{activemask, fence_gpu, global_thread, globaltimer, laneid, shfl};
use crate::device_heap::{dev_alloc, dev_free};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[path = "../../src/bench/workload.rs"]
pub mod workload;
use cuheap_core::HeapHandle;
pub use workload::{churn_case, thread_size};

extern "C" {
    /// CUDA's device heap (linked by the driver).
    fn malloc(size: usize) -> *mut u8;
    fn free(ptr: *mut u8);
}

/// # Safety
///
/// `errors` points to two device `u32`s.
#[inline(always)]
pub(crate) unsafe fn count(errors: *mut u32, which: usize) {
    // SAFETY: forwarded from the caller; atomic access to device memory.
    unsafe { AtomicU32::from_ptr(errors.add(which)) }.fetch_add(1, Ordering::Relaxed);
}

/// Writes, fences and reads back the pair kernel's words.
///
/// # Safety
///
/// `p` is a live block of at least `size` bytes; `errors` as in [`count`].
#[inline(always)]
unsafe fn touch(p: *mut u8, size: usize, tid: u32, errors: *mut u32) {
    let n = (size / 4).clamp(1, 4);
    let w = p as *mut u32;
    for k in 0..n {
        // SAFETY: k < size / 4 words of a block of `size` bytes.
        unsafe {
            w.add(k)
                .write_volatile(tid ^ (k as u32).wrapping_mul(0x0101_0101))
        };
    }
    fence_gpu();
    for k in 0..n {
        // SAFETY: as above.
        if unsafe { w.add(k).read_volatile() } != tid ^ (k as u32).wrapping_mul(0x0101_0101) {
            // SAFETY: forwarded from the caller.
            unsafe { count(errors, 1) };
        }
    }
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn pair_cuheap(h: HeapHandle, n: u32, sz: u32, errors: *mut u32) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    let size = thread_size(tid, sz);
    // SAFETY: the caller passes a live heap.
    let p = unsafe { dev_alloc(&h, size) };
    if p.is_null() {
        // SAFETY: forwarded from the caller.
        unsafe { count(errors, 0) };
        return;
    }
    // SAFETY: `p` is a fresh block of `size` bytes.
    unsafe { touch(p, size, tid, errors) };
    // SAFETY: `p` came from this heap.
    unsafe { dev_free(&h, p) };
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn alloc_cuheap(h: HeapHandle, n: u32, sz: u32, ptrs: *mut *mut u8, errors: *mut u32) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    // SAFETY: the caller passes a live heap.
    let p = unsafe { dev_alloc(&h, thread_size(tid, sz)) };
    if p.is_null() {
        // SAFETY: forwarded from the caller.
        unsafe { count(errors, 0) };
    }
    // SAFETY: tid < n entries.
    unsafe { ptrs.add(tid as usize).write(p) };
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn alloc_cuheap_traced(
    h: HeapHandle,
    n: u32,
    sz: u32,
    ptrs: *mut *mut u8,
    errors: *mut u32,
    trace: *mut u64,
) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    let start = globaltimer();
    // SAFETY: forwarded from the caller.
    unsafe { alloc_cuheap(h, n, sz, ptrs, errors) };
    if laneid() == 0 {
        let at = (tid / 32) as usize * 2;
        // SAFETY: `trace` holds two words per warp of the `n` threads.
        unsafe {
            trace.add(at).write(start);
            trace.add(at + 1).write(globaltimer());
        }
    }
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn free_cuheap(h: HeapHandle, n: u32, ptrs: *mut *mut u8) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    // SAFETY: tid < n entries; each a block of this heap, null or a test's
    // deliberately bad pointer (refused and counted by `dev_free`).
    unsafe { dev_free(&h, ptrs.add(tid as usize).read()) };
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn pair_cuda(n: u32, sz: u32, errors: *mut u32) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    let size = thread_size(tid, sz);
    // SAFETY: CUDA's device malloc.
    let p = unsafe { malloc(size) };
    if p.is_null() {
        // SAFETY: forwarded from the caller.
        unsafe { count(errors, 0) };
        return;
    }
    // SAFETY: `p` is a fresh block of `size` bytes.
    unsafe { touch(p, size, tid, errors) };
    // SAFETY: `p` came from CUDA's malloc.
    unsafe { free(p) };
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn alloc_cuda(n: u32, sz: u32, ptrs: *mut *mut u8, errors: *mut u32) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    // SAFETY: CUDA's device malloc.
    let p = unsafe { malloc(thread_size(tid, sz)) };
    if p.is_null() {
        // SAFETY: forwarded from the caller.
        unsafe { count(errors, 0) };
    }
    // SAFETY: tid < n entries.
    unsafe { ptrs.add(tid as usize).write(p) };
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn free_cuda(n: u32, ptrs: *mut *mut u8) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    // SAFETY: tid < n entries; CUDA's free accepts null.
    unsafe { free(ptrs.add(tid as usize).read()) };
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn alloc_bump(
    base: *mut u8,
    cap: u64,
    cursor: *mut u64,
    n: u32,
    sz: u32,
    ptrs: *mut *mut u8,
    errors: *mut u32,
) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    let size = (thread_size(tid, sz) as u64).div_ceil(16) * 16;
    let mask = activemask();
    let lane = laneid();
    let leader = mask.trailing_zeros();
    // Exclusive prefix sum of sizes over the active lanes, by shuffles.
    let mut offset = 0u64;
    let mut total = 0u64;
    let mut m = mask;
    while m != 0 {
        let src = m.trailing_zeros();
        // SAFETY: `mask` is the lanes that were active at its read; they
        // all run this loop over the same `m`, and `src` is one of them.
        let lo = unsafe { shfl(mask, size as u32, src) } as u64;
        if src < lane {
            offset += lo;
        }
        total += lo;
        m &= m - 1;
    }
    let mut start = 0u64;
    if lane == leader {
        // SAFETY: forwarded from the caller.
        start = unsafe { AtomicU64::from_ptr(cursor) }.fetch_add(total, Ordering::Relaxed);
    }
    // SAFETY: as above; every lane of `mask` reaches both shuffles, and
    // `leader` is one of them.
    let (lo, hi) = unsafe {
        (
            shfl(mask, start as u32, leader),
            shfl(mask, (start >> 32) as u32, leader),
        )
    };
    let start = (lo as u64) | ((hi as u64) << 32);
    let at = start + offset;
    let p = if at + size <= cap {
        base.wrapping_add(at as usize)
    } else {
        core::ptr::null_mut()
    };
    if p.is_null() {
        // SAFETY: forwarded from the caller.
        unsafe { count(errors, 0) };
    }
    // SAFETY: tid < n entries.
    unsafe { ptrs.add(tid as usize).write(p) };
}

/// Words of a churn block checked at its free, at most (4 KiB).
const CHURN_WORDS: usize = 1024;

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn churn_cuheap(
    h: HeapHandle,
    n: u32,
    round: u32,
    ptrs: *mut *mut u8,
    errors: *mut u32,
) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    let last = round == u32::MAX;
    let (swap, size) = churn_case(tid, round);
    if !swap && !last {
        return;
    }
    // SAFETY: tid < n entries.
    let slot = unsafe { ptrs.add(tid as usize) };
    // SAFETY: as above.
    let old = unsafe { slot.read() };
    if !old.is_null() {
        let w = old as *const u32;
        // SAFETY: a live block of this thread's, written below when it
        // was allocated: word 0 the thread id, word 1 its size, the rest
        // the thread id; its size bounds the words read (a damaged size is
        // clamped to the largest block).
        unsafe {
            let words = (w.add(1).read() as usize / 4).min(CHURN_WORDS);
            let mut bad = w.read() != tid;
            for k in 2..words {
                bad |= w.add(k).read() != tid;
            }
            if bad {
                count(errors, 1);
            }
            dev_free(&h, old);
        }
    }
    if last {
        // SAFETY: as above.
        unsafe { slot.write(core::ptr::null_mut()) };
        return;
    }
    // SAFETY: the caller passes a live heap.
    let p = unsafe { dev_alloc(&h, size) };
    if p.is_null() {
        // SAFETY: forwarded from the caller.
        unsafe { count(errors, 0) };
    } else {
        let w = p as *mut u32;
        // SAFETY: a fresh block of `size` (16..=4096) bytes.
        unsafe {
            w.write(tid);
            w.add(1).write(size as u32);
            for k in 2..size / 4 {
                w.add(k).write(tid);
            }
        }
    }
    // SAFETY: as above.
    unsafe { slot.write(p) };
}

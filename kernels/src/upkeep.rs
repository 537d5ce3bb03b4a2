//! Kernels the host launches to look after a growable heap while other
//! kernels use it (`DeviceHeap::trim_on`), and a test kernel that holds
//! blocks across such work.
//!
//! - [`cuheap_fence_free`]: retires the empty pages that slots and lists
//!   hold (the core's scavenge, a block's threads over the slots), then
//!   fences each given range of pages, all or none of a range: a fenced
//!   range is free of blocks and no allocation can take its pages, so the
//!   host can unmap its memory while kernels still run.
//! - [`cuheap_unfence`]: gives fenced pages back to service once memory is
//!   mapped behind them again.
//!
//! Both are in the benchmark module (`cuheap::BENCH_PTX`, entry points
//! from `signatures.rs`) and in the device library (`cuheap::PTX`, entry
//! points below), which a host that has no other module of cuheap's (the
//! C API) loads for them: it holds no kernel that calls CUDA's own device
//! `malloc`, whose heap a module load would fix for the context.

use crate::arch::{block_threads, global_thread, sync_block, thread_in_block};
use cuheap_core::{Heap, HeapHandle};
#[cfg(feature = "bench")]
use {
    crate::arch::{globaltimer, nanosleep},
    crate::bench::count,
    crate::checks::{has_tag, tag_words},
    crate::device_heap::{dev_alloc, dev_free},
    core::sync::atomic::{AtomicU32, Ordering},
};

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn cuheap_fence_free(h: HeapHandle, ranges: *const u64, fenced: *mut u32, n: u32) {
    // SAFETY: the caller passes a live heap.
    let heap = unsafe { Heap::<u32>::from_handle(&h) };
    let (t, step) = (thread_in_block(), block_threads());
    let mut slot = t;
    while slot < h.slots {
        heap.scavenge_slots(slot, 1);
        slot += step;
    }
    // SAFETY: the launch is one block, and every thread reaches this line.
    unsafe { sync_block() };
    let mut i = t;
    while i < n {
        // SAFETY: `i < n` entries.
        let r = unsafe { ranges.add(i as usize).read() };
        let ok = heap.fence(r as u32, (r >> 32) as u32);
        // SAFETY: as above.
        unsafe { fenced.add(i as usize).write(ok as u32) };
        i += step;
    }
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn cuheap_unfence(h: HeapHandle, from: u32, to: u32) {
    if global_thread() != 0 {
        return;
    }
    // SAFETY: the caller passes a live heap and pages it fenced.
    unsafe { Heap::<u32>::from_handle(&h).unfence(from, to) };
}

/// How long [`hold_blocks`] waits for the host at most: a test that fails
/// before it lets the holders go must not hang the device.
#[cfg(feature = "bench")]
const HOLD_NS: u64 = 30_000_000_000;

/// Reads a word a host writes while the kernel runs until it is nonzero,
/// for at most [`HOLD_NS`].
///
/// # Safety
///
/// `p` is a live, aligned `u32` that others write only whole.
#[cfg(feature = "bench")]
#[inline(always)]
unsafe fn wait_for(p: *mut u32) {
    // SAFETY: forwarded from the caller.
    let word = unsafe { AtomicU32::from_ptr(p) };
    let start = globaltimer();
    while word.load(Ordering::Acquire) == 0 && globaltimer() - start < HOLD_NS {
        nanosleep(2_000);
    }
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[cfg(feature = "bench")]
#[inline(always)]
pub unsafe fn hold_blocks(h: HeapHandle, n: u32, sz: u32, state: *mut u32, errors: *mut u32) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    let len = sz as usize;
    // SAFETY: the caller passes a live heap.
    let first = unsafe { dev_alloc(&h, len) };
    if !first.is_null() {
        // SAFETY: a fresh block of `len` bytes (16-byte aligned).
        unsafe { tag_words(first, len, tid) };
    }
    // SAFETY: `state` holds two words; the first only counts.
    unsafe { AtomicU32::from_ptr(state) }.fetch_add(1, Ordering::Release);
    // SAFETY: the second is written by the host, whole.
    unsafe { wait_for(state.add(1)) };
    if first.is_null() {
        // SAFETY: `errors` holds two counters.
        unsafe { count(errors, 0) };
        return;
    }
    // SAFETY: this thread's block, untouched by others.
    if !unsafe { has_tag(first, len, tid) } {
        // SAFETY: as above.
        unsafe { count(errors, 1) };
    }
    // SAFETY: the caller passes a live heap.
    let second = unsafe { dev_alloc(&h, len) };
    if second.is_null() {
        // SAFETY: as above.
        unsafe { count(errors, 0) };
    } else {
        // SAFETY: a fresh block of `len` bytes.
        let ok = unsafe {
            tag_words(second, len, !tid);
            has_tag(second, len, !tid) && has_tag(first, len, tid)
        };
        if !ok {
            // SAFETY: as above.
            unsafe { count(errors, 1) };
        }
        // SAFETY: this thread's block.
        unsafe { dev_free(&h, second) };
    }
    // SAFETY: this thread's block.
    unsafe { dev_free(&h, first) };
}

/// The device library's entry points of the upkeep kernels (the benchmark
/// module's come from `signatures.rs`, whose lines give their contracts).
#[cfg(all(feature = "c-abi", not(feature = "bench")))]
mod entries {
    use cuheap_core::HeapHandle;

    /// # Safety
    ///
    /// The contract of `cuheap_fence_free`'s line in `signatures.rs`.
    #[no_mangle]
    pub unsafe extern "ptx-kernel" fn cuheap_fence_free(
        heap: HeapHandle,
        ranges: *const u64,
        fenced: *mut u32,
        n: u32,
    ) {
        // SAFETY: the launch upholds the contract, which is the body's.
        unsafe { super::cuheap_fence_free(heap, ranges, fenced, n) }
    }

    /// # Safety
    ///
    /// The contract of `cuheap_unfence`'s line in `signatures.rs`.
    #[no_mangle]
    pub unsafe extern "ptx-kernel" fn cuheap_unfence(heap: HeapHandle, from: u32, to: u32) {
        // SAFETY: as above.
        unsafe { super::cuheap_unfence(heap, from, to) }
    }
}

//! Kernels the GPU tests use: a launch smoke test, cross-target
//! conformance of `cuheap-core`, whole-block fill-and-check, a random
//! stress of the device heap, aligned allocation and realloc (through
//! `dev_alloc_aligned`/`dev_realloc` or Rust's global allocator).
//! Parameters and contracts are in `signatures.rs` ([`crate::entry`]);
//! each body here has the contract of its line there.

use crate::arch::global_thread;
use crate::bench::workload::{aligned_case, realloc_case, REALLOC_STEPS};
use crate::bench::{count, thread_size};
use crate::device_heap::{dev_alloc, dev_alloc_aligned, dev_free, dev_realloc};
use cuheap_core::size_class::{class_of, class_size};
use cuheap_core::{Heap, HeapHandle, Layout, Word};

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn alloc_missing(h: HeapHandle, n: u32, sz: u32, ptrs: *mut *mut u8) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    // SAFETY: tid < n entries.
    let slot = unsafe { ptrs.add(tid as usize) };
    // SAFETY: as above.
    if unsafe { slot.read() }.is_null() {
        // SAFETY: the caller passes a live heap; `slot` is this thread's.
        unsafe { slot.write(dev_alloc(&h, thread_size(tid, sz))) };
    }
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn smoke(x: *mut u32, n: u32) {
    let i = global_thread();
    if i < n {
        // SAFETY: i < n.
        unsafe { *x.add(i as usize) = *x.add(i as usize) * 2 + 1 };
    }
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn conformance_classes(class: *mut u32, size: *mut u32, max: u32) {
    let s = global_thread();
    if s > max {
        return;
    }
    let c = class_of(s as usize).unwrap_or(u32::MAX);
    // SAFETY: s <= max.
    unsafe {
        *class.add(s as usize) = c;
        *size.add(s as usize) = class_size(c);
    }
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn conformance_bits(words: *const u32, n: u32, out: *mut u32) {
    let i = global_thread();
    if i >= n {
        return;
    }
    // SAFETY: i < n.
    let w = unsafe { *words.add(i as usize) };
    for k in 0..=32u32 {
        let at = ((i * 33 + k) * 2) as usize;
        let nth = if k < w.count_ones() {
            w.nth_set(k)
        } else {
            u32::MAX
        };
        // SAFETY: at + 1 < n * 66.
        unsafe {
            *out.add(at) = w.lowest_set(k);
            *out.add(at + 1) = nth;
        }
    }
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn conformance_layout(pages: u32, slots: u32, out: *mut u64) {
    if global_thread() != 0 {
        return;
    }
    let l = Layout::new(pages, slots);
    let v = [
        l.counters,
        l.lists,
        l.cache,
        l.descs,
        l.page_map,
        l.bitmaps,
        l.meta_bytes,
        core::mem::size_of::<cuheap_core::page::PageDesc>(),
    ];
    for (i, x) in v.iter().enumerate() {
        // SAFETY: i < 8.
        unsafe { *out.add(i) = *x as u64 };
    }
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn fill_blocks(ptrs: *const *mut u8, n: u32, sz: u32) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    // SAFETY: tid < n.
    let p = unsafe { *ptrs.add(tid as usize) } as *mut u32;
    if p.is_null() {
        return;
    }
    for k in 0..thread_size(tid, sz) / 4 {
        // SAFETY: k < size / 4 words of the block.
        unsafe { p.add(k).write_volatile(tid) };
    }
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn check_blocks(ptrs: *const *mut u8, n: u32, sz: u32, natural: u32, errors: *mut u32) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    // SAFETY: tid < n.
    let p = unsafe { *ptrs.add(tid as usize) } as *mut u32;
    if p.is_null() {
        return;
    }
    let size = thread_size(tid, sz);
    let align = if natural != 0 && size.is_power_of_two() {
        size.clamp(16, 65536)
    } else {
        16
    };
    let mut bad = !(p as usize).is_multiple_of(align);
    for k in 0..size / 4 {
        // SAFETY: k < size / 4 words of the block.
        bad |= unsafe { p.add(k).read_volatile() } != tid;
    }
    if bad {
        // SAFETY: forwarded from the caller.
        unsafe { count(errors, 1) };
    }
}

fn mix(a: u32, b: u32) -> u32 {
    let mut x = a.wrapping_mul(0x9E37_79B9) ^ b.wrapping_mul(0x85EB_CA6B);
    x ^= x >> 16;
    x = x.wrapping_mul(0x7FEB_352D);
    x ^ (x >> 15)
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn stress_heap(h: HeapHandle, n: u32, rounds: u32, seed: u32, errors: *mut u32) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    for r in 0..rounds {
        let mut blocks = [(core::ptr::null_mut::<u32>(), 0usize); 2];
        for (j, b) in blocks.iter_mut().enumerate() {
            let x = mix(tid ^ seed, r * 2 + j as u32);
            let size = match x & 0xFFF {
                0 => 65_537 + (x >> 12) as usize % 150_000,
                1..=16 => 4097 + (x >> 12) as usize % 61_440,
                _ => 1 + (x >> 12) as usize % 4096,
            };
            // SAFETY: the caller passes a live heap.
            let p = unsafe { dev_alloc(&h, size) } as *mut u32;
            if p.is_null() {
                // SAFETY: forwarded from the caller.
                unsafe { count(errors, 0) };
                continue;
            }
            let words = size / 4;
            let tag = tid ^ (r << 24) ^ ((j as u32) << 31);
            for k in 0..words.min(16) {
                // SAFETY: k < size / 4.
                unsafe { p.add(k).write_volatile(tag) };
            }
            if words > 16 {
                // SAFETY: the block's last whole word.
                unsafe { p.add(words - 1).write_volatile(tag) };
            }
            *b = (p, size);
        }
        for (j, &(p, size)) in blocks.iter().enumerate() {
            if p.is_null() {
                continue;
            }
            let tag = tid ^ (r << 24) ^ ((j as u32) << 31);
            let words = size / 4;
            let mut bad = !(p as usize).is_multiple_of(16);
            for k in 0..words.min(16) {
                // SAFETY: as when written.
                bad |= unsafe { p.add(k).read_volatile() } != tag;
            }
            if words > 16 {
                // SAFETY: as when written.
                bad |= unsafe { p.add(words - 1).read_volatile() } != tag;
            }
            if bad {
                // SAFETY: forwarded from the caller.
                unsafe { count(errors, 1) };
            }
            // SAFETY: `p` came from this heap.
            unsafe { dev_free(&h, p as *mut u8) };
        }
    }
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn spin_fill(x: *mut u32, n: u32, value: u32, spin_ns: u64) {
    let start = crate::arch::globaltimer();
    while crate::arch::globaltimer().wrapping_sub(start) < spin_ns {}
    let mut i = global_thread();
    let stride = crate::arch::grid_threads();
    while i < n {
        // SAFETY: i < n.
        unsafe { x.add(i as usize).write_volatile(value) };
        i += stride;
    }
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn check_fill(x: *mut u32, n: u32, expect: u32, value: u32, errors: *mut u32) {
    let mut i = global_thread();
    let stride = crate::arch::grid_threads();
    while i < n {
        // SAFETY: i < n.
        let p = unsafe { x.add(i as usize) };
        // SAFETY: as above.
        if unsafe { p.read_volatile() } != expect {
            // SAFETY: forwarded from the caller.
            unsafe { count(errors, 0) };
        }
        // SAFETY: as above.
        unsafe { p.write_volatile(value) };
        i += stride;
    }
}

/// Writes `tag ^ k` to word `k` of the first `bytes / 4` words at `p`
/// (a word in the wrong place shows too).
///
/// # Safety
///
/// `p` is a 4-byte aligned block of at least `bytes` bytes this thread owns.
#[inline(always)]
pub(crate) unsafe fn tag_words(p: *mut u8, bytes: usize, tag: u32) {
    for k in 0..bytes / 4 {
        // SAFETY: word k is inside the block.
        unsafe { (p as *mut u32).add(k).write_volatile(tag ^ k as u32) };
    }
}

/// Whether the first `bytes / 4` words at `p` still hold what
/// [`tag_words`] wrote with `tag`.
///
/// # Safety
///
/// As for [`tag_words`].
#[inline(always)]
pub(crate) unsafe fn has_tag(p: *const u8, bytes: usize, tag: u32) -> bool {
    let mut ok = true;
    for k in 0..bytes / 4 {
        // SAFETY: word k is inside the block.
        ok &= unsafe { (p as *const u32).add(k).read_volatile() } == tag ^ k as u32;
    }
    ok
}

/// The layout of `size` bytes at `align` for the global allocator (the
/// workloads ask for sizes from 1 byte and power-of-two alignments).
fn layout(size: usize, align: usize) -> core::alloc::Layout {
    core::alloc::Layout::from_size_align(size, align).unwrap_or(core::alloc::Layout::new::<u8>())
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn alloc_aligned_cuheap(
    h: HeapHandle,
    n: u32,
    global: u32,
    ptrs: *mut *mut u8,
    errors: *mut u32,
) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    let (size, align) = aligned_case(tid);
    let p = if global != 0 {
        // SAFETY: a layout of nonzero size; the module heap is set.
        unsafe { alloc::alloc::alloc(layout(size, align)) }
    } else {
        // SAFETY: the caller passes a live heap.
        unsafe { dev_alloc_aligned(&h, size, align) }
    };
    if p.is_null() {
        // SAFETY: forwarded from the caller.
        unsafe { count(errors, 0) };
    } else {
        if !(p as usize).is_multiple_of(align) {
            // SAFETY: forwarded from the caller.
            unsafe { count(errors, 1) };
        }
        // SAFETY: a fresh block of `size` bytes, 16-byte aligned at least.
        unsafe { tag_words(p, size, tid) };
    }
    // SAFETY: tid < n entries.
    unsafe { ptrs.add(tid as usize).write(p) };
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn check_aligned(ptrs: *const *mut u8, n: u32, errors: *mut u32) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    // SAFETY: tid < n.
    let p = unsafe { *ptrs.add(tid as usize) };
    if p.is_null() {
        return;
    }
    let (size, align) = aligned_case(tid);
    // SAFETY: the block `alloc_aligned_cuheap` made for this thread.
    if !(p as usize).is_multiple_of(align) || !unsafe { has_tag(p, size, tid) } {
        // SAFETY: forwarded from the caller.
        unsafe { count(errors, 1) };
    }
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn realloc_chain(h: HeapHandle, n: u32, global: u32, errors: *mut u32) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    // The allocator's size of the block (what a global `realloc` is told)
    // and the bytes of it that hold the current tag.
    let (mut size, align) = realloc_case(tid, 0);
    let realloc = |p: *mut u8, size: usize, new: usize| {
        if global != 0 {
            // SAFETY: `p` is this thread's block of `size` bytes at `align`.
            unsafe { alloc::alloc::realloc(p, layout(size, align), new) }
        } else {
            // SAFETY: the caller passes a live heap; `p` is this thread's block.
            unsafe { dev_realloc(&h, p, size, new, align) }
        }
    };
    let mut p = if global != 0 {
        // SAFETY: a layout of nonzero size; the module heap is set.
        unsafe { alloc::alloc::alloc(layout(size, align)) }
    } else {
        // SAFETY: the caller passes a live heap.
        unsafe { dev_alloc_aligned(&h, size, align) }
    };
    if p.is_null() {
        // SAFETY: forwarded from the caller.
        unsafe { count(errors, 0) };
        return;
    }
    let mut filled = size;
    // SAFETY: a fresh block of `size` bytes.
    unsafe { tag_words(p, filled, tid) };
    // Growing a class block to its whole size stays in place.
    // SAFETY: the caller passes a live heap (the module's, when `global`).
    let heap = unsafe { Heap::<u32>::from_handle(&h) };
    if let Ok(info) = heap.live_block_at(p as usize) {
        if info.class.is_some() {
            let q = realloc(p, size, info.size);
            if q != p {
                // SAFETY: forwarded from the caller.
                unsafe { count(errors, 1) };
                if q.is_null() {
                    return;
                }
            }
            (p, size) = (q, info.size);
        }
    }
    let mut tag = tid;
    for step in 1..=REALLOC_STEPS {
        let (new, _) = realloc_case(tid, step);
        let q = realloc(p, size, new);
        if q.is_null() {
            // SAFETY: forwarded from the caller.
            unsafe { count(errors, 0) };
            break;
        }
        // SAFETY: `q` holds at least min(filled, new) bytes of the old block.
        if !(q as usize).is_multiple_of(align) || !unsafe { has_tag(q, filled.min(new), tag) } {
            // SAFETY: forwarded from the caller.
            unsafe { count(errors, 1) };
        }
        tag = tid ^ (step << 24);
        // SAFETY: `q` holds `new` bytes.
        unsafe { tag_words(q, new, tag) };
        (p, size, filled) = (q, new, new);
    }
    if global != 0 {
        // SAFETY: this thread's block of `size` bytes at `align`.
        unsafe { alloc::alloc::dealloc(p, layout(size, align)) };
    } else {
        // SAFETY: this thread's block.
        unsafe { dev_free(&h, p) };
    }
}

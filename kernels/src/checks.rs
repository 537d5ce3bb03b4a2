//! Kernels the GPU tests use: a launch smoke test, cross-target
//! conformance of `cuheap-core`, whole-block fill-and-check, and a random
//! stress of the device heap. Parameters and contracts are in
//! `signatures.rs` ([`crate::entry`]); each body here has the contract of
//! its line there.

use crate::arch::global_thread;
use crate::bench::{count, thread_size};
use crate::device_heap::{dev_alloc, dev_free};
use cuheap_core::size_class::{class_of, class_size};
use cuheap_core::{HeapHandle, Layout, Word};

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

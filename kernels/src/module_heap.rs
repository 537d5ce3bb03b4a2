//! The module's heap: the `cuheap_heap` global, which the host writes
//! (`DeviceHeap::install`) or a one-thread kernel sets (`cuheap_init`),
//! and, with the `alloc` feature, [`ModuleHeap`]: Rust's `GlobalAlloc`
//! over it, so kernels can use `alloc::boxed::Box`, `alloc::vec::Vec` and
//! `alloc::string::String`.
//!
//! A `GlobalAlloc` is a `static` and cannot be handed a heap per launch:
//! it reads the module global on every call (one 24-byte load), as the C
//! ABI does.

use cuheap_core::HeapHandle;

/// The heap that the C ABI and [`ModuleHeap`] use; the host writes it
/// (module global `cuheap_heap`) before launching kernels that call them.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut cuheap_heap: HeapHandle = HeapHandle {
    meta: 0,
    data: 0,
    page_count: 0,
    slots: 0,
};

/// The module's heap, `None` while none is set.
///
/// # Safety
///
/// The module global is written only between the kernels that use it
/// (by the host, or by `cuheap_init` from a kernel that runs alone), and
/// a nonzero value describes a live heap.
#[inline(always)]
pub unsafe fn module_heap() -> Option<HeapHandle> {
    // SAFETY: no kernel writes the global while this one runs (above).
    let h = unsafe { core::ptr::addr_of!(cuheap_heap).read_volatile() };
    (h.page_count != 0).then_some(h)
}

#[cfg(feature = "alloc")]
pub use global::ModuleHeap;

#[cfg(feature = "alloc")]
mod global {
    use super::module_heap;
    use crate::device_heap::{dev_alloc_aligned, dev_free, dev_realloc};
    use core::alloc::{GlobalAlloc, Layout};

    /// Rust's global allocator on the module's heap (`cuheap_heap`): every
    /// alignment up to the page size (64 KiB) without padding (the
    /// smallest size class whose blocks all have it), `realloc` in place
    /// while the new size fits the block (spans by whole pages), null when
    /// no heap is set or it is exhausted. Any lanes may call it, converged
    /// or not: allocations and frees of one warp are grouped as in
    /// `dev_alloc`/`dev_free`.
    ///
    /// A failed allocation reaches `alloc::alloc::handle_alloc_error`,
    /// which traps the kernel: code that must survive exhaustion uses the
    /// fallible APIs (`Vec::try_reserve`, `String::try_reserve`).
    pub struct ModuleHeap;

    #[global_allocator]
    static ALLOCATOR: ModuleHeap = ModuleHeap;

    // SAFETY: blocks come from `dev_alloc_aligned`, which returns null or
    // `layout.size()` bytes at a multiple of `layout.align()` that no other
    // live allocation overlaps; `dealloc` and `realloc` take back only
    // what it gave (the trait's contract on their callers), and `realloc`
    // keeps `min(old, new)` bytes and leaves the block alone on failure.
    unsafe impl GlobalAlloc for ModuleHeap {
        #[inline(always)]
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the host sets the global between launches only.
            match unsafe { module_heap() } {
                // SAFETY: a set global describes a live heap.
                Some(h) => unsafe { dev_alloc_aligned(&h, layout.size(), layout.align()) },
                None => core::ptr::null_mut(),
            }
        }

        #[inline(always)]
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: forwarded.
            let p = unsafe { self.alloc(layout) };
            if !p.is_null() {
                // Eight bytes at a time: `write_bytes` becomes a loop of
                // single bytes on the GPU. Blocks are multiples of 16
                // bytes and 16-byte aligned, so the rounding stays inside.
                for i in 0..layout.size().div_ceil(8) {
                    // SAFETY: word `i` is inside the fresh block.
                    unsafe { (p as *mut u64).add(i).write(0) };
                }
            }
            p
        }

        #[inline(always)]
        unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
            // SAFETY: as in `alloc`.
            if let Some(h) = unsafe { module_heap() } {
                // SAFETY: `ptr` came from this allocator (the caller's contract).
                unsafe { dev_free(&h, ptr) }
            }
        }

        #[inline(always)]
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: as in `alloc`.
            match unsafe { module_heap() } {
                // SAFETY: `ptr` is a live block of this allocator with
                // `layout`, owned by the caller (the trait's contract).
                Some(h) => unsafe { dev_realloc(&h, ptr, layout.size(), new_size, layout.align()) },
                None => core::ptr::null_mut(),
            }
        }
    }
}

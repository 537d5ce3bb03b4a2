//! The heap's C ABI for CUDA C/C++ (declared in `include/cuheap.h`):
//! `cuheap_malloc`, `cuheap_aligned_alloc`, `cuheap_realloc` and
//! `cuheap_free` on the module's heap (the global `cuheap_heap` of
//! [`crate::module_heap`]), which the host writes (`DeviceHeap::install`)
//! or a one-thread kernel sets over memory the program owns
//! (`cuheap_meta_bytes`, `cuheap_init`); `cuheap_get_stats`.

use crate::device_heap::{dev_alloc, dev_alloc_aligned, dev_free, dev_realloc};
use crate::module_heap::{cuheap_heap, module_heap};
use cuheap_core::size_class::MIN_BLOCK;
use cuheap_core::{CStats, Heap, HeapHandle, Layout, PAGE_SIZE};

/// `void* cuheap_malloc(size_t)`: [`dev_alloc`] on the module's heap;
/// null if the host set no heap.
///
/// # Safety
///
/// The host set `cuheap_heap` to a live heap, or left it zeroed.
#[no_mangle]
pub unsafe extern "C" fn cuheap_malloc(size: usize) -> *mut u8 {
    // SAFETY: the module global is written only by the host between launches.
    match unsafe { module_heap() } {
        // SAFETY: a nonzero handle was set by the host to a live heap.
        Some(h) => unsafe { dev_alloc(&h, size) },
        None => core::ptr::null_mut(),
    }
}

/// `void cuheap_free(void*)`: [`dev_free`] on the module's heap.
///
/// # Safety
///
/// As for [`cuheap_malloc`].
#[no_mangle]
pub unsafe extern "C" fn cuheap_free(ptr: *mut u8) {
    // SAFETY: as in `cuheap_malloc`.
    if let Some(h) = unsafe { module_heap() } {
        // SAFETY: as in `cuheap_malloc`.
        unsafe { dev_free(&h, ptr) }
    }
}

/// `void* cuheap_realloc(void* ptr, size_t size)`: [`dev_realloc`] on the
/// module's heap, at C's alignment (16 bytes). The same pointer while
/// `size` fits the block (spans take or give back pages at their end);
/// else a new block holding the old contents (up to `size`), the old one
/// freed. A shrink to at most half the block moves to a smaller block if
/// the heap has one, else stays: it never fails. Null `ptr`:
/// [`cuheap_malloc`]. Null on failure, the old block left as it was:
/// size 0 (the block is not freed, unlike some C libraries), sizes over
/// the heap, exhaustion, a pointer that is not a live block's start
/// (counted in `bad_frees`), or no heap set.
///
/// # Safety
///
/// As for [`cuheap_malloc`]; `ptr` is null, a block of this heap that the
/// calling thread owns (nobody else uses it during the call), or an
/// address that is not a live block's start (refused).
#[no_mangle]
pub unsafe extern "C" fn cuheap_realloc(ptr: *mut u8, size: usize) -> *mut u8 {
    // SAFETY: as in `cuheap_malloc`.
    match unsafe { module_heap() } {
        // SAFETY: as in `cuheap_malloc`; `ptr` as the caller guarantees.
        Some(h) => unsafe { dev_realloc(&h, ptr, usize::MAX, size, MIN_BLOCK) },
        None => core::ptr::null_mut(),
    }
}

/// Bytes of zeroed metadata that a heap of `data_bytes` of block memory
/// (whole 64 KiB pages; the rest is not used) and `slots` current-page
/// slots needs: `unsigned long long cuheap_meta_bytes(unsigned long long,
/// unsigned)`. 0 when no heap fits: under one page, over 2^31 pages, or no
/// slot.
#[no_mangle]
pub extern "C" fn cuheap_meta_bytes(data_bytes: u64, slots: u32) -> u64 {
    match pages_of(data_bytes, slots) {
        Some(pages) => Layout::new(pages, slots).meta_bytes as u64,
        None => 0,
    }
}

fn pages_of(data_bytes: u64, slots: u32) -> Option<u32> {
    let pages = data_bytes / PAGE_SIZE as u64;
    (slots > 0 && pages > 0 && pages <= (u32::MAX / 2) as u64).then_some(pages as u32)
}

/// `cuheap_init` succeeded.
pub const CUHEAP_OK: i32 = 0;
/// A null or misaligned pointer, too little memory, or no slot.
pub const CUHEAP_ERROR_INVALID: i32 = 1;

/// Makes memory the caller owns the module's heap (`cuheap_heap`), which
/// `cuheap_malloc` and `cuheap_free` then use: `int cuheap_init(void*
/// meta, unsigned long long meta_bytes, void* data, unsigned long long
/// data_bytes, unsigned slots)`. `meta` holds at least
/// [`cuheap_meta_bytes`]`(data_bytes, slots)` zeroed bytes (zeroed
/// metadata is an empty heap) and is 16-byte aligned, `data` is 64 KiB
/// aligned, `slots` is
/// usually the GPU's SM count. Returns [`CUHEAP_OK`] or
/// [`CUHEAP_ERROR_INVALID`] (and changes nothing).
///
/// # Safety
///
/// One thread calls it, in a kernel that runs while no other kernel of
/// the module uses the heap; the memory stays allocated, and is used by
/// nothing else, while the heap is in use.
#[no_mangle]
pub unsafe extern "C" fn cuheap_init(
    meta: *mut u8,
    meta_bytes: u64,
    data: *mut u8,
    data_bytes: u64,
    slots: u32,
) -> i32 {
    let Some(pages) = pages_of(data_bytes, slots) else {
        return CUHEAP_ERROR_INVALID;
    };
    let need = Layout::new(pages, slots).meta_bytes as u64;
    if meta.is_null()
        || data.is_null()
        || !(meta as usize).is_multiple_of(16)
        || !(data as usize).is_multiple_of(PAGE_SIZE)
        || meta_bytes < need
    {
        return CUHEAP_ERROR_INVALID;
    }
    let handle = HeapHandle {
        meta: meta as u64,
        data: data as u64,
        page_count: pages,
        slots,
    };
    // SAFETY: the caller's contract: no kernel uses the global meanwhile;
    // later launches read it.
    unsafe { core::ptr::addr_of_mut!(cuheap_heap).write_volatile(handle) };
    CUHEAP_OK
}

/// `void* cuheap_aligned_alloc(size_t alignment, size_t size)`:
/// [`dev_alloc_aligned`] on the module's heap: a block at a multiple of
/// `alignment`, a power of two up to 64 KiB (the page size). The block is
/// the smallest size class whose blocks all have that alignment (300 B at
/// 64 takes the 320 B class), so no padding is added; sizes over 64 KiB are
/// spans, 64 KiB aligned. Null (counted in `failed_allocs`) for other
/// alignments, size 0, sizes over the heap and exhaustion; null with no
/// heap set. Free it with [`cuheap_free`].
///
/// # Safety
///
/// As for [`cuheap_malloc`].
#[no_mangle]
pub unsafe extern "C" fn cuheap_aligned_alloc(alignment: usize, size: usize) -> *mut u8 {
    // SAFETY: as in `cuheap_malloc`.
    match unsafe { module_heap() } {
        // SAFETY: as in `cuheap_malloc`.
        Some(h) => unsafe { dev_alloc_aligned(&h, size, alignment) },
        None => core::ptr::null_mut(),
    }
}

/// Fills `*out` with the module heap's statistics: `int
/// cuheap_get_stats(cuheap_stats_t*)`; [`CUHEAP_ERROR_INVALID`] with no
/// heap or a null `out`. One thread reads every page's descriptor: call it
/// between the kernels that allocate, from a one-thread kernel.
///
/// # Safety
///
/// `out` is null or points to a writable `CStats`; the heap is the
/// one `cuheap_init` or the host set, or none.
#[no_mangle]
pub unsafe extern "C" fn cuheap_get_stats(out: *mut CStats) -> i32 {
    // SAFETY: as in `cuheap_malloc`.
    let Some(h) = (unsafe { module_heap() }) else {
        return CUHEAP_ERROR_INVALID;
    };
    if out.is_null() {
        return CUHEAP_ERROR_INVALID;
    }
    // SAFETY: a nonzero handle describes a live heap.
    let s = unsafe { Heap::<u32>::from_handle(&h) }.stats();
    // SAFETY: `out` is writable.
    unsafe { out.write(CStats::from(&s)) };
    CUHEAP_OK
}

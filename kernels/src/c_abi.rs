//! The heap's C ABI for CUDA C/C++ (declared in `include/cuheap.h`).
//!
//! - On the module's heap (the global `cuheap_heap` of
//!   [`crate::module_heap`], which the host writes with
//!   `DeviceHeap::install` or a one-thread kernel sets with `cuheap_init`
//!   over memory the program owns): `cuheap_malloc`,
//!   `cuheap_aligned_alloc`, `cuheap_realloc`, `cuheap_free`,
//!   `cuheap_get_stats` and `cuheap_get_counts`.
//! - On a heap the caller names (`cuheap_heap_t`, a [`HeapHandle`]: a
//!   program may keep several, say one per data structure):
//!   `cuheap_heap_init` fills one, and `cuheap_heap_malloc`,
//!   `cuheap_heap_aligned_alloc`, `cuheap_heap_realloc`,
//!   `cuheap_heap_free`, `cuheap_heap_get_stats` and
//!   `cuheap_heap_get_counts` take it by pointer.
//!
//! A heap that is not set (zeroed) or a null handle pointer gives null
//! allocations, ignored frees and `CUHEAP_ERROR_INVALID` statistics.

use crate::device_heap::{dev_alloc, dev_alloc_aligned, dev_free, dev_realloc};
use crate::module_heap::{cuheap_heap, module_heap};
use cuheap_core::size_class::MIN_BLOCK;
use cuheap_core::{CStats, Counts, Heap, HeapHandle, Layout, PAGE_SIZE};

/// The heap behind a caller's handle pointer, `None` for a null pointer
/// or a zeroed handle.
///
/// # Safety
///
/// `h` is null or points to a readable `HeapHandle`.
#[inline(always)]
unsafe fn named(h: *const HeapHandle) -> Option<HeapHandle> {
    // SAFETY: the caller's contract.
    let h = unsafe { h.as_ref() }?;
    (h.page_count != 0).then_some(*h)
}

/// [`dev_alloc`] on `heap`, null with none.
///
/// # Safety
///
/// `heap` is `None` or describes a live heap; every lane that reaches
/// this call makes it (it is inlined into each entry point).
#[inline(always)]
unsafe fn malloc_on(heap: Option<HeapHandle>, size: usize) -> *mut u8 {
    match heap {
        // SAFETY: the caller's contract.
        Some(h) => unsafe { dev_alloc(&h, size) },
        None => core::ptr::null_mut(),
    }
}

/// [`dev_alloc_aligned`] on `heap`, null with none.
///
/// # Safety
///
/// As for [`malloc_on`].
#[inline(always)]
unsafe fn aligned_on(heap: Option<HeapHandle>, alignment: usize, size: usize) -> *mut u8 {
    match heap {
        // SAFETY: the caller's contract.
        Some(h) => unsafe { dev_alloc_aligned(&h, size, alignment) },
        None => core::ptr::null_mut(),
    }
}

/// [`dev_realloc`] on `heap` at C's alignment, null with none.
///
/// # Safety
///
/// As for [`malloc_on`]; `ptr` as for [`cuheap_realloc`].
#[inline(always)]
unsafe fn realloc_on(heap: Option<HeapHandle>, ptr: *mut u8, size: usize) -> *mut u8 {
    match heap {
        // SAFETY: the caller's contract.
        Some(h) => unsafe { dev_realloc(&h, ptr, usize::MAX, size, MIN_BLOCK) },
        None => core::ptr::null_mut(),
    }
}

/// [`dev_free`] on `heap`; nothing with none.
///
/// # Safety
///
/// As for [`malloc_on`].
#[inline(always)]
unsafe fn free_on(heap: Option<HeapHandle>, ptr: *mut u8) {
    if let Some(h) = heap {
        // SAFETY: the caller's contract.
        unsafe { dev_free(&h, ptr) }
    }
}

/// Writes `f(view of heap)` to `out`: [`CUHEAP_OK`], or
/// [`CUHEAP_ERROR_INVALID`] with no heap or a null `out`.
///
/// # Safety
///
/// `heap` is `None` or describes a live heap; `out` is null or writable.
#[inline(always)]
unsafe fn report<T>(
    heap: Option<HeapHandle>,
    out: *mut T,
    f: impl FnOnce(&Heap<'static, u32>) -> T,
) -> i32 {
    let Some(h) = heap else {
        return CUHEAP_ERROR_INVALID;
    };
    if out.is_null() {
        return CUHEAP_ERROR_INVALID;
    }
    // SAFETY: a nonzero handle describes a live heap.
    let v = f(&unsafe { Heap::<u32>::from_handle(&h) });
    // SAFETY: `out` is writable.
    unsafe { out.write(v) };
    CUHEAP_OK
}

/// `void* cuheap_malloc(size_t)`: [`dev_alloc`] on the module's heap;
/// null if the host set no heap.
///
/// # Safety
///
/// The host set `cuheap_heap` to a live heap, or left it zeroed.
#[no_mangle]
pub unsafe extern "C" fn cuheap_malloc(size: usize) -> *mut u8 {
    // SAFETY: the module global is written only between launches, and a
    // nonzero handle describes a live heap.
    unsafe { malloc_on(module_heap(), size) }
}

/// `void cuheap_free(void*)`: [`dev_free`] on the module's heap.
///
/// # Safety
///
/// As for [`cuheap_malloc`].
#[no_mangle]
pub unsafe extern "C" fn cuheap_free(ptr: *mut u8) {
    // SAFETY: as in `cuheap_malloc`.
    unsafe { free_on(module_heap(), ptr) }
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
    // SAFETY: as in `cuheap_malloc`; `ptr` as the caller guarantees.
    unsafe { realloc_on(module_heap(), ptr, size) }
}

/// Bytes of zeroed metadata that a heap of `data_bytes` of block memory
/// (whole 64 KiB pages; the rest is not used) and `slots` current-page
/// slots needs: `unsigned long long cuheap_meta_bytes(unsigned long long,
/// unsigned)`. 0 when no heap fits: under one page, over 2^31 pages, no
/// slot or more than 65,536.
#[no_mangle]
pub extern "C" fn cuheap_meta_bytes(data_bytes: u64, slots: u32) -> u64 {
    match pages_of(data_bytes, slots) {
        Some(pages) => Layout::new(pages, slots).meta_bytes as u64,
        None => 0,
    }
}

fn pages_of(data_bytes: u64, slots: u32) -> Option<u32> {
    let pages = data_bytes / PAGE_SIZE as u64;
    let slots_fit = slots > 0 && slots <= Layout::MAX_SLOTS;
    (slots_fit && pages > 0 && pages <= (u32::MAX / 2) as u64).then_some(pages as u32)
}

/// `cuheap_init` succeeded.
pub const CUHEAP_OK: i32 = 0;
/// A null or misaligned pointer, too little memory, no slot or more than
/// 65,536.
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
    let Some(handle) = handle_of(meta, meta_bytes, data, data_bytes, slots) else {
        return CUHEAP_ERROR_INVALID;
    };
    // SAFETY: the caller's contract: no kernel uses the global meanwhile;
    // later launches read it.
    unsafe { core::ptr::addr_of_mut!(cuheap_heap).write_volatile(handle) };
    CUHEAP_OK
}

/// The handle of a heap over `meta` and `data`, if they pass
/// [`cuheap_init`]'s checks.
fn handle_of(
    meta: *mut u8,
    meta_bytes: u64,
    data: *mut u8,
    data_bytes: u64,
    slots: u32,
) -> Option<HeapHandle> {
    let pages = pages_of(data_bytes, slots)?;
    let need = Layout::new(pages, slots).meta_bytes as u64;
    let ok = !meta.is_null()
        && !data.is_null()
        && (meta as usize).is_multiple_of(16)
        && (data as usize).is_multiple_of(PAGE_SIZE)
        && meta_bytes >= need;
    ok.then_some(HeapHandle {
        meta: meta as u64,
        data: data as u64,
        page_count: pages,
        slots,
    })
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
    unsafe { aligned_on(module_heap(), alignment, size) }
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
    // SAFETY: as in `cuheap_malloc`; `out` as the caller guarantees.
    unsafe { report(module_heap(), out, |h| CStats::from(&h.stats())) }
}

/// Fills `*out` with the module heap's counts (`int
/// cuheap_get_counts(cuheap_counts_t*)`): allocations and frees ever,
/// failures by cause, spans, the footprint and its peak, from the
/// heap's counters (one load per slot and counter, no page scan).
/// [`CUHEAP_ERROR_INVALID`] with no heap or a null `out`. Any thread, at
/// any time; exact once the kernels that allocate have finished.
///
/// # Safety
///
/// As for [`cuheap_get_stats`]; `out` points to a writable `Counts`.
#[no_mangle]
pub unsafe extern "C" fn cuheap_get_counts(out: *mut Counts) -> i32 {
    // SAFETY: as in `cuheap_get_stats`.
    unsafe { report(module_heap(), out, |h| h.counts()) }
}

/// Fills `*out` with a handle to a heap over memory the caller owns,
/// without making it the module's (`int cuheap_heap_init(cuheap_heap_t*
/// out, void* meta, unsigned long long meta_bytes, void* data, unsigned
/// long long data_bytes, unsigned slots)`), with the checks of
/// [`cuheap_init`]; writes nothing else. The `cuheap_heap_*` functions
/// take the handle. Any thread may call it: it only computes the handle.
///
/// # Safety
///
/// `out` is null (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_heap_init(
    out: *mut HeapHandle,
    meta: *mut u8,
    meta_bytes: u64,
    data: *mut u8,
    data_bytes: u64,
    slots: u32,
) -> i32 {
    let Some(h) = handle_of(meta, meta_bytes, data, data_bytes, slots) else {
        return CUHEAP_ERROR_INVALID;
    };
    if out.is_null() {
        return CUHEAP_ERROR_INVALID;
    }
    // SAFETY: writable by the caller's contract.
    unsafe { out.write(h) };
    CUHEAP_OK
}

/// `void* cuheap_heap_malloc(const cuheap_heap_t* heap, size_t size)`:
/// [`cuheap_malloc`] on `heap`; null when `heap` is null or zeroed.
///
/// # Safety
///
/// `heap` is null or points to a handle of a live heap (from
/// `cuheap_heap_init` or the host's `cuheap_device_heap_handle`), or to
/// a zeroed one.
#[no_mangle]
pub unsafe extern "C" fn cuheap_heap_malloc(heap: *const HeapHandle, size: usize) -> *mut u8 {
    // SAFETY: the caller's contract.
    unsafe { malloc_on(named(heap), size) }
}

/// `void* cuheap_heap_aligned_alloc(const cuheap_heap_t* heap, size_t
/// alignment, size_t size)`: [`cuheap_aligned_alloc`] on `heap`.
///
/// # Safety
///
/// As for [`cuheap_heap_malloc`].
#[no_mangle]
pub unsafe extern "C" fn cuheap_heap_aligned_alloc(
    heap: *const HeapHandle,
    alignment: usize,
    size: usize,
) -> *mut u8 {
    // SAFETY: the caller's contract.
    unsafe { aligned_on(named(heap), alignment, size) }
}

/// `void* cuheap_heap_realloc(const cuheap_heap_t* heap, void* ptr,
/// size_t size)`: [`cuheap_realloc`] on `heap`.
///
/// # Safety
///
/// As for [`cuheap_heap_malloc`]; `ptr` as for [`cuheap_realloc`].
#[no_mangle]
pub unsafe extern "C" fn cuheap_heap_realloc(
    heap: *const HeapHandle,
    ptr: *mut u8,
    size: usize,
) -> *mut u8 {
    // SAFETY: the caller's contract.
    unsafe { realloc_on(named(heap), ptr, size) }
}

/// `void cuheap_heap_free(const cuheap_heap_t* heap, void* ptr)`:
/// [`cuheap_free`] on `heap` (a block of another heap is a foreign
/// pointer there: refused and counted).
///
/// # Safety
///
/// As for [`cuheap_heap_malloc`].
#[no_mangle]
pub unsafe extern "C" fn cuheap_heap_free(heap: *const HeapHandle, ptr: *mut u8) {
    // SAFETY: the caller's contract.
    unsafe { free_on(named(heap), ptr) }
}

/// `int cuheap_heap_get_stats(const cuheap_heap_t* heap, cuheap_stats_t*
/// out)`: [`cuheap_get_stats`] on `heap`.
///
/// # Safety
///
/// As for [`cuheap_heap_malloc`]; `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_heap_get_stats(heap: *const HeapHandle, out: *mut CStats) -> i32 {
    // SAFETY: the caller's contract.
    unsafe { report(named(heap), out, |h| CStats::from(&h.stats())) }
}

/// `int cuheap_heap_get_counts(const cuheap_heap_t* heap,
/// cuheap_counts_t* out)`: [`cuheap_get_counts`] on `heap`.
///
/// # Safety
///
/// As for [`cuheap_heap_malloc`]; `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_heap_get_counts(heap: *const HeapHandle, out: *mut Counts) -> i32 {
    // SAFETY: the caller's contract.
    unsafe { report(named(heap), out, |h| h.counts()) }
}

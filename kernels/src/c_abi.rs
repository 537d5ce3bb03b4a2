//! The heap's C ABI for CUDA C/C++: `void* cuheap_malloc(size_t)` and
//! `void cuheap_free(void*)` on the heap in the module global
//! `cuheap_heap`, which the host writes (`DeviceHeap::install`) before
//! launching kernels that call them.

use crate::device_heap::{dev_alloc, dev_free};
use cuheap_core::HeapHandle;

/// The heap that `cuheap_malloc`/`cuheap_free` use; the host writes it
/// (module global `cuheap_heap`) before launching kernels that call them.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut cuheap_heap: HeapHandle = HeapHandle {
    meta: 0,
    data: 0,
    page_count: 0,
    slots: 0,
};

/// `void* cuheap_malloc(size_t)`: [`dev_alloc`] on the module's heap;
/// null if the host set no heap.
///
/// # Safety
///
/// The host set `cuheap_heap` to a live heap, or left it zeroed.
#[no_mangle]
pub unsafe extern "C" fn cuheap_malloc(size: usize) -> *mut u8 {
    // SAFETY: the module global is written only by the host between launches.
    let h = unsafe { core::ptr::addr_of!(cuheap_heap).read_volatile() };
    if h.page_count == 0 {
        return core::ptr::null_mut();
    }
    // SAFETY: a nonzero handle was set by the host to a live heap.
    unsafe { dev_alloc(&h, size) }
}

/// `void cuheap_free(void*)`: [`dev_free`] on the module's heap.
///
/// # Safety
///
/// As for [`cuheap_malloc`].
#[no_mangle]
pub unsafe extern "C" fn cuheap_free(ptr: *mut u8) {
    // SAFETY: as in `cuheap_malloc`.
    let h = unsafe { core::ptr::addr_of!(cuheap_heap).read_volatile() };
    if h.page_count == 0 {
        return;
    }
    // SAFETY: as in `cuheap_malloc`.
    unsafe { dev_free(&h, ptr) }
}

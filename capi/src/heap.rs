//! `cuheap_device_heap_*`: device heaps for kernels that call
//! `cuheap_malloc`/`cuheap_free` (CUDA C++ linked with cuheap's device
//! library). The host creates, grows, trims and reads the heap; a kernel
//! installs it (`cuheap_device_heap_install` in `cuheap.h` launches one
//! thread that calls `cuheap_init` with the heap's description: a program
//! built with nvcc cannot write a global defined in cuheap's PTX from the
//! host).

use crate::{current_context, entry, invalid, put, put_if};
use cuheap_core::{Counts, HeapHandle, PAGE_SIZE};
use cuheap_host::cudarc::driver::{sys, CudaContext};
use cuheap_host::{DeviceHeap, Gpu, GrowthService, LoadOptions, Result};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// A module with nothing in it: the heap needs a context, not kernels.
const EMPTY_PTX: &str = ".version 7.0\n.target sm_52\n.address_size 64\n";

/// What `cuheap_init` takes to make a heap the module's
/// (`cuheap_heap_desc_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CuheapHeapDesc {
    pub meta: *mut c_void,
    pub meta_bytes: u64,
    pub data: *mut c_void,
    pub data_bytes: u64,
    pub slots: c_uint,
}

/// A heap's statistics (`cuheap_stats_t`), as the device side fills them.
pub use cuheap_core::CStats as CuheapStats;

/// A device heap (`cuheap_device_heap_t`).
pub struct CuheapDeviceHeap {
    /// Its growth service while one runs (`cuheap_device_heap_serve`).
    /// Declared before `heap`, so it stops before the heap goes.
    service: Mutex<Option<GrowthService<'static>>>,
    heap: DeviceHeap,
    /// Bytes it may grow to (`initial` for a fixed heap).
    max: usize,
    /// The context it was made on.
    ctx: Arc<CudaContext>,
    /// The upkeep kernels, once a call needed them ([`UPKEEP`]).
    upkeep: OnceLock<Arc<Gpu>>,
}

/// cuheap's device library per device (by ordinal), which holds the
/// heaps' upkeep kernels: loaded by the first call that needs them on the
/// device (`cuheap_device_heap_set_growth_piece`,
/// `cuheap_device_heap_trim_on`), shared by every heap there that needs
/// them, and unloaded with the last of those heaps.
pub(crate) static UPKEEP: Mutex<Vec<(usize, Weak<Gpu>)>> = Mutex::new(Vec::new());

impl CuheapDeviceHeap {
    pub fn heap(&self) -> &DeviceHeap {
        &self.heap
    }

    /// Stops the growth service, if one runs; returns the first error its
    /// thread met.
    fn stop_service(&self) -> Result<()> {
        let svc = self
            .service
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        svc.map_or(Ok(()), |s| s.stop())
    }

    /// The upkeep kernels on the heap's context ([`UPKEEP`]).
    fn upkeep(&self) -> Result<&Gpu> {
        if let Some(gpu) = self.upkeep.get() {
            return Ok(gpu);
        }
        let mut loaded = UPKEEP.lock().unwrap_or_else(|p| p.into_inner());
        loaded.retain(|(_, gpu)| gpu.strong_count() > 0);
        let device = self.ctx.ordinal();
        let gpu = match loaded
            .iter()
            .find_map(|(d, g)| (*d == device).then(|| g.upgrade()))
        {
            Some(Some(gpu)) => gpu,
            _ => {
                let gpu = Arc::new(cuheap::library_gpu_on(&self.ctx)?);
                loaded.push((device, Arc::downgrade(&gpu)));
                gpu
            }
        };
        Ok(self.upkeep.get_or_init(|| gpu))
    }

    pub fn desc(&self) -> CuheapHeapDesc {
        let h = self.heap.handle();
        CuheapHeapDesc {
            meta: h.meta as *mut c_void,
            meta_bytes: self.heap.meta_bytes() as u64,
            data: h.data as *mut c_void,
            data_bytes: h.page_count as u64 * PAGE_SIZE as u64,
            slots: h.slots,
        }
    }
}

/// Creates a device heap on the current device (its primary context):
/// `int cuheap_device_heap_create(size_t initial, size_t max,
/// cuheap_device_heap_t** out)`. `initial` bytes of block memory
/// (whole 64 KiB pages) are usable at once; with `max` over `initial` the
/// heap reserves `max` bytes of address space and grows into it
/// (`cuheap_device_heap_grow`), else it is fixed. Metadata is sized for
/// the largest size, one slot per SM.
///
/// # Safety
///
/// `out` is NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_create(
    initial: usize,
    max: usize,
    out: *mut *mut CuheapDeviceHeap,
) -> c_int {
    if !out.is_null() {
        // SAFETY: writable by the caller's contract.
        unsafe { out.write(std::ptr::null_mut()) };
    }
    entry("cuheap_device_heap_create", || {
        if out.is_null() {
            return invalid("out is NULL");
        }
        if initial == 0 {
            return invalid("a heap of 0 bytes");
        }
        let ctx = current_context()?;
        let gpu = Gpu::on_context(&ctx, EMPTY_PTX, LoadOptions::default())?;
        let heap = if max > initial {
            DeviceHeap::growable(&gpu, initial, max)?
        } else {
            DeviceHeap::new(&gpu, initial)?
        };
        let h = Box::into_raw(Box::new(CuheapDeviceHeap {
            service: Mutex::new(None),
            heap,
            max: max.max(initial),
            ctx,
            upkeep: OnceLock::new(),
        }));
        // SAFETY: checked above; writable by the caller's contract.
        unsafe { put(out, h, "out") }
    })
}

/// # Safety
///
/// `heap` is NULL or from `cuheap_device_heap_create` and not destroyed.
unsafe fn heap_ref<'a>(heap: *const CuheapDeviceHeap) -> Result<&'a CuheapDeviceHeap> {
    // SAFETY: the caller's contract.
    match unsafe { heap.as_ref() } {
        Some(h) => Ok(h),
        None => invalid("the heap is NULL"),
    }
}

/// The heap's description for `cuheap_init`: `int
/// cuheap_device_heap_desc(const cuheap_device_heap_t*, cuheap_heap_desc_t*
/// out)`.
///
/// # Safety
///
/// `heap` is NULL or a live heap; `out` is NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_desc(
    heap: *const CuheapDeviceHeap,
    out: *mut CuheapHeapDesc,
) -> c_int {
    entry("cuheap_device_heap_desc", || {
        // SAFETY: the caller's contract.
        let d = unsafe { heap_ref(heap) }?.desc();
        // SAFETY: NULL or writable.
        unsafe { put(out, d, "out") }
    })
}

/// Reads the heap's statistics (a synchronous copy: call it between the
/// kernels that allocate): `int cuheap_device_heap_get_stats(const
/// cuheap_device_heap_t*, cuheap_stats_t* out)`.
///
/// # Safety
///
/// `heap` is NULL or a live heap; `out` is NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_get_stats(
    heap: *const CuheapDeviceHeap,
    out: *mut CuheapStats,
) -> c_int {
    entry("cuheap_device_heap_get_stats", || {
        // SAFETY: the caller's contract.
        let s = unsafe { heap_ref(heap) }?.heap.stats()?;
        // SAFETY: NULL or writable.
        unsafe { put(out, CuheapStats::from(&s), "out") }
    })
}

/// Reads the heap's counts (a copy of its counters, not of its page
/// table: see `DeviceHeap::counts`): `int
/// cuheap_device_heap_get_counts(const cuheap_device_heap_t*,
/// cuheap_counts_t* out)`. Exact between the kernels that allocate. The
/// copy is on the legacy default stream: it waits for kernels queued
/// there or on blocking streams (and must not, behind one that waits for
/// growth: see `cuheap_device_heap_serve`); while kernels run on
/// non-blocking streams, each count is a recent value.
///
/// # Safety
///
/// `heap` is NULL or a live heap; `out` is NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_get_counts(
    heap: *const CuheapDeviceHeap,
    out: *mut Counts,
) -> c_int {
    entry("cuheap_device_heap_get_counts", || {
        // SAFETY: the caller's contract.
        let k = unsafe { heap_ref(heap) }?.heap.counts()?;
        // SAFETY: NULL or writable.
        unsafe { put(out, k, "out") }
    })
}

/// The heap's handle for the device's `cuheap_heap_*` functions: `int
/// cuheap_device_heap_handle(const cuheap_device_heap_t*, cuheap_heap_t*
/// out)`. A kernel takes it as an argument, so a program can keep several
/// heaps without installing any.
///
/// # Safety
///
/// `heap` is NULL or a live heap; `out` is NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_handle(
    heap: *const CuheapDeviceHeap,
    out: *mut HeapHandle,
) -> c_int {
    entry("cuheap_device_heap_handle", || {
        // SAFETY: the caller's contract.
        let h = unsafe { heap_ref(heap) }?.heap.handle();
        // SAFETY: NULL or writable.
        unsafe { put(out, h, "out") }
    })
}

/// Bytes of block memory usable now: `int
/// cuheap_device_heap_capacity(const cuheap_device_heap_t*, size_t* out)`.
///
/// # Safety
///
/// `heap` is NULL or a live heap; `out` is NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_capacity(
    heap: *const CuheapDeviceHeap,
    out: *mut usize,
) -> c_int {
    entry("cuheap_device_heap_capacity", || {
        // SAFETY: the caller's contract.
        let c = unsafe { heap_ref(heap) }?.heap.capacity();
        // SAFETY: NULL or writable.
        unsafe { put(out, c, "out") }
    })
}

/// Maps memory until `bytes` are usable: `int
/// cuheap_device_heap_grow(cuheap_device_heap_t*, size_t bytes, size_t*
/// usable)`. Kernels launched afterwards, and running kernels looking for
/// a fresh page, use the new pages; every block keeps its address. A
/// fixed heap, or `bytes` past the heap's maximum, is
/// `CUHEAP_ERROR_INVALID`; no device memory `CUHEAP_ERROR_OUT_OF_MEMORY`
/// (what was mapped before the device ran out stays mapped and usable:
/// `cuheap_device_heap_capacity` says how much). `*usable` (if not NULL)
/// gets the usable bytes afterwards, on success.
///
/// # Safety
///
/// `heap` is NULL or a live heap; `usable` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_grow(
    heap: *const CuheapDeviceHeap,
    bytes: usize,
    usable: *mut usize,
) -> c_int {
    entry("cuheap_device_heap_grow", || {
        // SAFETY: the caller's contract.
        let h = unsafe { heap_ref(heap) }?;
        let max = h.max;
        if bytes > max {
            return invalid(format!("{bytes} bytes: past the heap's maximum of {max}"));
        }
        let now = h.heap.grow(bytes)?;
        // SAFETY: NULL or writable (the caller's contract).
        unsafe { put_if(usable, now) };
        Ok(())
    })
}

/// Unmaps the growth steps at the end of a growable heap that no block
/// uses, keeping at least `keep` bytes: `int
/// cuheap_device_heap_trim(cuheap_device_heap_t*, size_t keep, size_t*
/// mapped)`. A fixed heap keeps its memory. `*mapped` (if not NULL) gets
/// the bytes mapped afterwards.
///
/// # Safety
///
/// `heap` is NULL or a live heap; no kernel that uses it is running or
/// queued, on any stream; `mapped` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_trim(
    heap: *const CuheapDeviceHeap,
    keep: usize,
    mapped: *mut usize,
) -> c_int {
    entry("cuheap_device_heap_trim", || {
        // SAFETY: the caller's contract (no kernel uses the heap).
        let now = unsafe { heap_ref(heap)?.heap.trim(keep) }?;
        // SAFETY: NULL or writable (the caller's contract).
        unsafe { put_if(mapped, now) };
        Ok(())
    })
}

/// Makes the heap's later growth steps map new memory in pieces of at
/// most `piece` bytes (whole 2 MiB chunks; 0: one mapping per step, the
/// default), each of which a trim gives back alone: `int
/// cuheap_device_heap_set_growth_piece(cuheap_device_heap_t*, size_t
/// piece, size_t* set)`. `*set` (if not NULL) gets the piece (0 for whole
/// steps). Each piece costs its own `cuMemCreate` and `cuMemMap`, so
/// small pieces make growth slower (see `DeviceHeap::set_growth_piece`).
/// It also loads the heaps' upkeep kernels (cuheap's device library,
/// shared by the device's heaps: [`UPKEEP`]), after which
/// `cuheap_device_heap_trim`, while no growth service runs, also gives
/// back free pieces before the last one in use, leaving holes that
/// `cuheap_device_heap_grow` maps again. A fixed heap is
/// `CUHEAP_ERROR_INVALID`.
///
/// # Safety
///
/// `heap` is NULL or a live heap; `set` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_set_growth_piece(
    heap: *const CuheapDeviceHeap,
    piece: usize,
    set: *mut usize,
) -> c_int {
    entry("cuheap_device_heap_set_growth_piece", || {
        // SAFETY: the caller's contract.
        let h = unsafe { heap_ref(heap) }?;
        if !h.heap.is_growable() {
            return invalid("a fixed heap does not grow");
        }
        let now = h.heap.set_growth_piece(h.upkeep()?, piece)?;
        // SAFETY: NULL or writable (the caller's contract).
        unsafe { put_if(set, now) };
        Ok(())
    })
}

/// Gives back, in stream order, the memory of a growable heap's steps
/// (or pieces) that no block uses, keeping at least `keep` bytes mapped,
/// while kernels on other streams go on using the heap: `int
/// cuheap_device_heap_trim_on(cuheap_device_heap_t*, cuheap_stream_t
/// stream, size_t keep)`. After the work queued on `stream` (the kernels
/// that freed the blocks), a kernel of one block fences each free step so
/// that no allocation can take its pages; the host does not wait. Once
/// `stream` gets past it, the heap unmaps those steps at its next call
/// that looks (`cuheap_device_heap_finish_trims`, `_grow`, `_get_stats`,
/// `_trim`, the next `_trim_on`) or from its growth service's thread. A
/// step given back stays a hole in the heap's range: growth while kernels
/// run maps past it; `cuheap_device_heap_grow` (with no growth service
/// running) maps it again. Blocks keep their addresses. It loads the
/// upkeep kernels if no heap of the device has them (as
/// `cuheap_device_heap_set_growth_piece`). `stream` is any stream of the
/// heap's device (0 for its legacy default stream) and may be destroyed
/// right after the call: the trim keeps an event, not the stream. A fixed
/// heap keeps its memory (`CUHEAP_OK`); at most 8 trims wait to be
/// finished at once (then `CUHEAP_ERROR_INVALID`: finish them first).
///
/// # Safety
///
/// `heap` is NULL or a live heap; `stream` is 0, a per-thread or legacy
/// default stream handle, or a live stream of the heap's context.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_trim_on(
    heap: *const CuheapDeviceHeap,
    stream: sys::CUstream,
    keep: usize,
) -> c_int {
    entry("cuheap_device_heap_trim_on", || {
        // SAFETY: the caller's contract.
        let h = unsafe { heap_ref(heap) }?;
        if !h.heap.is_growable() {
            return Ok(());
        }
        let gpu = h.upkeep()?;
        // SAFETY: a stream of the heap's context (the caller's contract),
        // used for this call only: the trim keeps an event, not the
        // stream, and the wrapper never destroys it.
        let s = unsafe { h.ctx.wrap_borrowed_stream(stream) };
        h.heap.trim_on(gpu, &s, keep)
    })
}

/// Unmaps what the trims queued by `cuheap_device_heap_trim_on` fenced,
/// for those whose streams got past them (with `wait` non-zero, for all,
/// after waiting for them on the host): `int
/// cuheap_device_heap_finish_trims(cuheap_device_heap_t*, int wait,
/// size_t* freed)`. `*freed` (if not NULL) gets the bytes given back by
/// this call. A fixed heap gives back nothing.
///
/// # Safety
///
/// `heap` is NULL or a live heap; `freed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_finish_trims(
    heap: *const CuheapDeviceHeap,
    wait: c_int,
    freed: *mut usize,
) -> c_int {
    entry("cuheap_device_heap_finish_trims", || {
        // SAFETY: the caller's contract.
        let n = unsafe { heap_ref(heap) }?.heap.finish_trims(wait != 0)?;
        // SAFETY: NULL or writable (the caller's contract).
        unsafe { put_if(freed, n) };
        Ok(())
    })
}

/// Starts a host thread that grows the heap while kernels run: `int
/// cuheap_device_heap_serve(cuheap_device_heap_t*, unsigned
/// fill_percent)`. A kernel's thread that finds the heap short asks it for
/// pages and waits (bounded: 2 s) until they are mapped, instead of
/// getting NULL; NULL still comes when the heap's maximum or the device's
/// memory is reached. `fill_percent` 0 grows on demand only; 1 to 99 also
/// keeps memory ahead: once the heap's pages are that full, the thread
/// maps the next step at once (see `DeviceHeap::serve_ahead`). A fixed
/// heap, a heap already served or a fill over 99 is
/// `CUHEAP_ERROR_INVALID`. The service runs until
/// `cuheap_device_heap_stop_serving` or `cuheap_device_heap_destroy`.
///
/// While a kernel that may wait for growth runs, no host thread of the
/// process may wait in a synchronous copy queued behind it (`cudaMemcpy`
/// right after the launch): the service's driver calls then wait until
/// the kernel ends, and its waiting threads time out (on an H100 80 GB,
/// 1M threads got 828,921 NULLs in 64 s:
/// `docs/growth-behind-a-sync-copy-h100.txt`). `cuheap_device_heap_get_stats`
/// and `_get_counts` are such copies. Synchronise first.
///
/// # Safety
///
/// `heap` is NULL or a live heap.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_serve(
    heap: *const CuheapDeviceHeap,
    fill_percent: c_uint,
) -> c_int {
    entry("cuheap_device_heap_serve", || {
        // SAFETY: the caller's contract.
        let h = unsafe { heap_ref(heap) }?;
        let mut slot = h.service.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return invalid("the heap already has a growth service");
        }
        let svc = match fill_percent {
            0 => h.heap.serve()?,
            f => h.heap.serve_ahead(f)?,
        };
        // SAFETY: the service borrows `h.heap`: its thread writes the
        // heap's counters, in device memory the heap owns. It lives in
        // `h.service`, which `cuheap_device_heap_stop_serving` empties and
        // `cuheap_device_heap_destroy` stops before the heap goes (and
        // field order drops first in any other drop), so it never
        // outlives the heap.
        *slot =
            Some(unsafe { std::mem::transmute::<GrowthService<'_>, GrowthService<'static>>(svc) });
        Ok(())
    })
}

/// Stops the heap's growth service, if one runs: `int
/// cuheap_device_heap_stop_serving(cuheap_device_heap_t*)`. Threads that
/// wait for growth then get NULL; later kernels get NULL when the heap is
/// short, as before the service. Returns the first error the service's
/// thread met, if any.
///
/// # Safety
///
/// `heap` is NULL or a live heap.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_stop_serving(heap: *const CuheapDeviceHeap) -> c_int {
    entry("cuheap_device_heap_stop_serving", || {
        // SAFETY: the caller's contract.
        let h = unsafe { heap_ref(heap) }?;
        h.stop_service()
    })
}

/// Destroys a heap and frees its memory: `int
/// cuheap_device_heap_destroy(cuheap_device_heap_t*)`. Its growth service,
/// if one runs, stops first. NULL does nothing.
///
/// # Safety
///
/// `heap` is NULL or a live heap that no kernel uses any more (running or
/// queued) and no later call names.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_heap_destroy(heap: *mut CuheapDeviceHeap) -> c_int {
    entry("cuheap_device_heap_destroy", || {
        if heap.is_null() {
            return Ok(());
        }
        // SAFETY: from `cuheap_device_heap_create`, destroyed once.
        let h = unsafe { Box::from_raw(heap) };
        // The service first (its thread writes the heap's counters), and
        // its error reported; the heap's memory goes after.
        let stopped = h.stop_service();
        drop(h);
        stopped
    })
}

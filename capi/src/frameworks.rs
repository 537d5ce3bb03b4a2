//! One pool per device for the process, behind the allocator hooks of
//! PyTorch (`torch.cuda.memory.CUDAPluggableAllocator`) and CuPy
//! (`cupy.cuda.CFunctionAllocator`). `python/cuheap.py` switches either to
//! it.
//!
//! A pool is created on a device's first allocation (default settings: a
//! reservation of the device's memory) and lives until the process ends.
//! CuPy's hook returns NULL on a failed allocation, with the reason in
//! [`cuheap_last_error`](crate::cuheap_last_error). PyTorch's pluggable
//! allocator does not check what its hook returns (a NULL becomes a
//! tensor at address 0, and the first kernel that touches it faults), so
//! PyTorch's hook stops the process instead, with the reason on stderr,
//! on every failure but bad arguments: a device out of memory, an
//! allocation on a stream that is being captured into a CUDA graph
//! (which the hooks do not serve), a driver error.
//!
//! With `CUHEAP_TRACE` set to a file name, every allocation and free
//! through these hooks is written there as a trace in RAPIDS RMM's CSV
//! format (written out when the process exits), for `cuheap replay`.
//! The pools refuse a stream that is being captured into a CUDA graph
//! (a driver call per allocation and free); `CUHEAP_POOL_CHECK_CAPTURE=0`
//! turns that off, for programs that never capture.
//! With `CUHEAP_HOOK_TIMES` set, the hooks add up the host time spent
//! inside them ([`cuheap_hook_times`]): what a framework's allocations
//! cost in cuheap, apart from the framework's own work around each call.

use crate::pool::{CuheapPool, CuheapPoolConfig, CuheapPoolStats};
use crate::{device_context, enter, entry, invalid, put, put_if, write_snapshot, Keep};
use cuheap_host::cudarc::driver::sys;
use cuheap_host::{Result, TraceLog};
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Devices a process may use the framework pools on.
const MAX_DEVICES: usize = 64;

static POOLS: [AtomicPtr<CuheapPool>; MAX_DEVICES] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_DEVICES];
static CREATE: Mutex<()> = Mutex::new(());

/// The process's pool on `device`, created on first use.
pub fn device_pool(device: c_int) -> Result<&'static CuheapPool> {
    let Some(slot) = usize::try_from(device).ok().and_then(|d| POOLS.get(d)) else {
        return invalid(format!("device {device}"));
    };
    let p = slot.load(Ordering::Acquire);
    // SAFETY: a non-null slot holds a leaked pool that is never freed.
    if let Some(p) = unsafe { p.as_ref() } {
        return Ok(p);
    }
    let _once = CREATE.lock().unwrap_or_else(|p| p.into_inner());
    let p = slot.load(Ordering::Acquire);
    // SAFETY: as above.
    if let Some(p) = unsafe { p.as_ref() } {
        return Ok(p);
    }
    let ctx = device_context(device as usize)?;
    // PyTorch captures graphs on its pools' streams: refuse that clearly
    // rather than hand a replay's memory out again. It costs a driver call
    // per allocation and free; a program that never captures may turn it
    // off with CUHEAP_POOL_CHECK_CAPTURE=0.
    let check = std::env::var_os("CUHEAP_POOL_CHECK_CAPTURE").is_none_or(|v| v != "0");
    let pool: &'static CuheapPool = Box::leak(Box::new(CuheapPool::new(
        ctx,
        &CuheapPoolConfig {
            flags: if check {
                crate::pool::CUHEAP_POOL_CHECK_CAPTURE
            } else {
                0
            },
            ..CuheapPoolConfig::default()
        },
    )?));
    slot.store(
        pool as *const CuheapPool as *mut CuheapPool,
        Ordering::Release,
    );
    Ok(pool)
}

static TRACE: OnceLock<Option<TraceLog>> = OnceLock::new();

extern "C" {
    /// The C library's exit hook.
    fn atexit(callback: extern "C" fn()) -> c_int;
}

/// The trace `CUHEAP_TRACE` asks for, opened on first use (a file that
/// cannot be created is said on stderr, once, and nothing is traced).
fn trace() -> Option<&'static TraceLog> {
    TRACE
        .get_or_init(|| {
            let path = std::env::var_os("CUHEAP_TRACE")?;
            match TraceLog::to_file(std::path::Path::new(&path)) {
                Ok(t) => {
                    // SAFETY: registers a function that lives as long as
                    // the library (which is never unloaded once used).
                    unsafe { atexit(flush_trace) };
                    Some(t)
                }
                Err(e) => {
                    use std::io::Write;
                    let _ = writeln!(std::io::stderr(), "cuheap: CUHEAP_TRACE: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// Writes the trace's buffered rows at exit (no unwinding out of it).
extern "C" fn flush_trace() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(Some(t)) = TRACE.get() {
            let _ = t.flush();
        }
    });
}

/// Host time inside the hooks: calls, nanoseconds, the longest call.
static HOOK_CALLS: AtomicU64 = AtomicU64::new(0);
static HOOK_NS: AtomicU64 = AtomicU64::new(0);
static HOOK_MAX_NS: AtomicU64 = AtomicU64::new(0);

/// The clock at a hook's start when `CUHEAP_HOOK_TIMES` is set (read once).
fn hook_clock() -> Option<Instant> {
    static ON: OnceLock<bool> = OnceLock::new();
    ON.get_or_init(|| std::env::var_os("CUHEAP_HOOK_TIMES").is_some())
        .then(Instant::now)
}

/// Adds the call that began at `start` (if timed) to the hooks' time.
pub(crate) fn hook_done(start: Option<Instant>) {
    if let Some(t) = start {
        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        HOOK_CALLS.fetch_add(1, Ordering::Relaxed);
        HOOK_NS.fetch_add(ns, Ordering::Relaxed);
        HOOK_MAX_NS.fetch_max(ns, Ordering::Relaxed);
    }
}

/// The host time the allocation hooks (PyTorch's and CuPy's) have spent
/// inside cuheap since the process started, when it runs with
/// `CUHEAP_HOOK_TIMES` set (zeros otherwise): `int cuheap_hook_times(unsigned
/// long long* calls, unsigned long long* ns, unsigned long long* max_ns)`.
/// Any pointer may be NULL.
///
/// # Safety
///
/// Each pointer is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_hook_times(
    calls: *mut u64,
    ns: *mut u64,
    max_ns: *mut u64,
) -> c_int {
    for (out, v) in [(calls, &HOOK_CALLS), (ns, &HOOK_NS), (max_ns, &HOOK_MAX_NS)] {
        if !out.is_null() {
            // SAFETY: writable by the caller's contract.
            unsafe { out.write(v.load(Ordering::Relaxed)) };
        }
    }
    crate::CUHEAP_OK
}

/// The allocation both hooks make: NULL for size 0 (no error) and on
/// failure (the reason kept for `cuheap_last_error`).
fn alloc_on(size: usize, device: c_int, stream: sys::CUstream, name: &str) -> *mut c_void {
    alloc_with_code(size, device, stream, name).0
}

/// [`alloc_on`], with the entry point's code.
fn alloc_with_code(
    size: usize,
    device: c_int,
    stream: sys::CUstream,
    name: &str,
) -> (*mut c_void, c_int) {
    if size == 0 {
        return (std::ptr::null_mut(), crate::CUHEAP_OK);
    }
    let start = hook_clock();
    let mut out = 0u64;
    let rc = enter(name, Keep::Lazy, || {
        let pool = device_pool(device)?;
        out = match trace() {
            Some(t) => t.allocate(size, stream as usize, || pool.alloc(size, stream))?,
            None => pool.alloc(size, stream)?,
        };
        Ok(())
    });
    hook_done(start);
    if rc == crate::CUHEAP_OK {
        (out as *mut c_void, rc)
    } else {
        (std::ptr::null_mut(), rc)
    }
}

/// Whether `stream` is being captured into a CUDA graph (false if the
/// driver cannot say).
fn capturing(stream: sys::CUstream) -> bool {
    if !cuheap_host::driver::driver_present() {
        return false;
    }
    std::panic::catch_unwind(|| {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: out-parameter; PyTorch passes its own live streams.
        let r = unsafe { sys::cuStreamIsCapturing(stream, &mut status) };
        r == sys::CUresult::CUDA_SUCCESS
            && status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    })
    .unwrap_or(false)
}

fn free_on(ptr: *mut c_void, device: c_int, stream: sys::CUstream, name: &str) {
    if ptr.is_null() {
        return;
    }
    let start = hook_clock();
    let rc = enter(name, Keep::Lazy, || {
        let pool = device_pool(device)?;
        match trace() {
            Some(t) => t.free(ptr as u64, stream as usize, || {
                pool.free(ptr as u64, stream)
            }),
            None => pool.free(ptr as u64, stream),
        }
    });
    hook_done(start);
    if rc != crate::CUHEAP_OK {
        // A free has no way to report: say it where a developer looks
        // (a failed write to stderr is ignored, never a panic).
        use std::io::Write;
        // SAFETY: the message is NUL-terminated and owned by this thread.
        let msg = unsafe { std::ffi::CStr::from_ptr(crate::cuheap_last_error()) };
        let _ = writeln!(std::io::stderr(), "cuheap: {}", msg.to_string_lossy());
    }
}

/// PyTorch's allocation hook: `void* cuheap_torch_alloc(ssize_t size, int
/// device, cudaStream_t stream)`: `size` bytes on `device` for work on
/// `stream`, 256-byte aligned; NULL for size 0 and for bad arguments (a
/// negative size, a device that does not exist, no GPU). Any other
/// failure (the device out of memory, `stream` being captured into a CUDA
/// graph, which the pool refuses, a driver error) says why on stderr,
/// writes out the trace if one is kept, and aborts the process: PyTorch
/// does not check the pointer its hook returns.
///
/// # Safety
///
/// `stream` is a stream of `device`'s primary context that lives as long
/// as the process (PyTorch's streams do).
#[no_mangle]
pub unsafe extern "C" fn cuheap_torch_alloc(
    size: isize,
    device: c_int,
    stream: sys::CUstream,
) -> *mut c_void {
    let Ok(bytes) = usize::try_from(size) else {
        entry("cuheap_torch_alloc", || invalid(format!("size {size}")));
        return std::ptr::null_mut();
    };
    let (p, rc) = alloc_with_code(bytes, device, stream, "cuheap_torch_alloc");
    // Every failure stops the process but bad arguments (a direct
    // caller's, which PyTorch does not make) and no GPU: those get NULL,
    // as documented. A capturing stream is refused as an invalid argument.
    let argument = rc == crate::CUHEAP_ERROR_INVALID && !capturing(stream);
    if p.is_null() && bytes > 0 && !argument && rc != crate::CUHEAP_ERROR_NO_DEVICE {
        stop_for_pytorch(size);
    }
    p
}

/// PyTorch would use a NULL from its allocation hook as a tensor's
/// address: say why the allocation failed and stop the process.
fn stop_for_pytorch(size: isize) -> ! {
    use std::io::Write;
    // SAFETY: the message is NUL-terminated and owned by this thread.
    let msg = unsafe { std::ffi::CStr::from_ptr(crate::cuheap_last_error()) };
    let _ = writeln!(
        std::io::stderr(),
        "cuheap: PyTorch asked for {size} bytes and cuheap cannot serve them ({}); PyTorch's \
         pluggable allocator cannot be told (it would use a null pointer), so the process stops",
        msg.to_string_lossy()
    );
    // An abort skips the exit hooks: the trace (`CUHEAP_TRACE`) first.
    flush_trace();
    std::process::abort()
}

/// PyTorch's free hook: `void cuheap_torch_free(void* ptr, ssize_t size,
/// int device, cudaStream_t stream)`: frees `ptr` on `stream` (the stream
/// it was allocated for): work queued on `stream` later may reuse it at
/// once, other streams after the device finishes `stream`'s work so far.
/// A bad free is refused, counted and printed to stderr.
///
/// # Safety
///
/// As for [`cuheap_torch_alloc`].
#[no_mangle]
pub unsafe extern "C" fn cuheap_torch_free(
    ptr: *mut c_void,
    _size: isize,
    device: c_int,
    stream: sys::CUstream,
) {
    free_on(ptr, device, stream, "cuheap_torch_free");
}

/// CuPy's allocation hook (`CFunctionAllocator`): `void*
/// cuheap_cupy_malloc(void* param, size_t size, int device)`. CuPy passes
/// no stream: blocks are ordered on the null stream (see
/// `cuheap_cupy_free`). `param` is not used.
#[no_mangle]
pub extern "C" fn cuheap_cupy_malloc(
    _param: *mut c_void,
    size: usize,
    device: c_int,
) -> *mut c_void {
    alloc_on(size, device, std::ptr::null_mut(), "cuheap_cupy_malloc")
}

/// CuPy's free hook: `void cuheap_cupy_free(void* param, void* ptr, int
/// device)`: frees on the null stream, where the next allocation reuses
/// the block at once. That is safe while the program's GPU work runs on
/// one stream at a time (the null stream, CuPy's default, or one stream
/// of its own); CuPy passes no stream, so work on several streams at once
/// is not ordered (such programs keep CuPy's pool).
///
/// # Safety
///
/// `ptr` is NULL or a block from [`cuheap_cupy_malloc`] (anything else is
/// refused and reported); no work still queued on another stream than
/// the next allocation's uses it.
#[no_mangle]
pub unsafe extern "C" fn cuheap_cupy_free(_param: *mut c_void, ptr: *mut c_void, device: c_int) {
    free_on(ptr, device, std::ptr::null_mut(), "cuheap_cupy_free");
}

/// Statistics of the process's pool on `device` (created if it was not):
/// `int cuheap_device_pool_get_stats(int device, cuheap_pool_stats_t*
/// out)`.
///
/// # Safety
///
/// `out` is NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_pool_get_stats(
    device: c_int,
    out: *mut CuheapPoolStats,
) -> c_int {
    entry("cuheap_device_pool_get_stats", || {
        let s = device_pool(device)?.pool().stats();
        // SAFETY: NULL or writable.
        unsafe { put(out, CuheapPoolStats::from(&s), "out") }
    })
}

/// The process's pool on `device` page by page, as
/// [`cuheap_pool_snapshot`](crate::pool::cuheap_pool_snapshot): `int
/// cuheap_device_pool_snapshot(int device, char* json, size_t size,
/// size_t* needed, const char* html_path)`.
///
/// # Safety
///
/// As `write_snapshot` says of the pointers.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_pool_snapshot(
    device: c_int,
    json: *mut c_char,
    size: usize,
    needed: *mut usize,
    html: *const c_char,
) -> c_int {
    entry("cuheap_device_pool_snapshot", || {
        // SAFETY: the caller's contract, forwarded.
        unsafe { write_snapshot(device_pool(device)?.pool(), json, size, needed, html) }
    })
}

/// Unmaps the memory of the process's pool on `device` that no block
/// uses, keeping `keep` bytes: `int cuheap_device_pool_trim(int device,
/// size_t keep, size_t* mapped)` (what `torch.cuda.empty_cache()` and
/// CuPy's `free_all_blocks` do for their own pools).
///
/// # Safety
///
/// `mapped` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_device_pool_trim(
    device: c_int,
    keep: usize,
    mapped: *mut usize,
) -> c_int {
    entry("cuheap_device_pool_trim", || {
        let now = device_pool(device)?.pool().trim(keep)?;
        // SAFETY: NULL or writable (the caller's contract).
        unsafe { put_if(mapped, now) };
        Ok(())
    })
}

//! `libcuheap.so`: cuheap's host C API, declared in `include/cuheap.h`.
//!
//! - [`pool`]: the host pool on a `cudaStream_t` (`cuheap_pool_*`).
//! - [`heap`]: device heaps that kernels built with nvcc allocate from
//!   (`cuheap_device_heap_*`).
//! - [`frameworks`]: one pool per device behind PyTorch's
//!   `CUDAPluggableAllocator` (`cuheap_torch_*`) and CuPy's
//!   `CFunctionAllocator` (`cuheap_cupy_*`).
//!
//! Everything runs in the device's primary context, the one the CUDA
//! runtime uses, so pointers and streams pass freely between a runtime-API
//! program and cuheap. Every entry point returns a code (or a documented
//! null) and keeps a message for [`cuheap_last_error`]; a panic is caught
//! at the boundary and reported as [`CUHEAP_ERROR_INTERNAL`], never
//! unwound into C.

pub mod frameworks;
pub mod heap;
pub mod pool;

use cuheap_host::cudarc::driver::{result, sys, CudaContext};
use cuheap_host::driver::{before_bind, driver_present, init_driver, KeepContext};
use cuheap_host::{Context, Error, Result};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Success.
pub const CUHEAP_OK: c_int = 0;
/// A null or invalid argument: a null handle or out pointer, size 0, a
/// pointer that is not a live block of this pool, a context that is not a
/// device's primary context.
pub const CUHEAP_ERROR_INVALID: c_int = 1;
/// The device, or the pool's reservation, has no memory for the request.
pub const CUHEAP_ERROR_OUT_OF_MEMORY: c_int = 2;
/// No CUDA driver or no device.
pub const CUHEAP_ERROR_NO_DEVICE: c_int = 3;
/// A CUDA driver call failed (the message names it).
pub const CUHEAP_ERROR_CUDA: c_int = 4;
/// A defect in cuheap (a caught panic); the message says where.
pub const CUHEAP_ERROR_INTERNAL: c_int = 5;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The code of an error.
pub fn code_of(e: &Error) -> c_int {
    match e {
        Error::NoDriver | Error::NoDevice(_) => CUHEAP_ERROR_NO_DEVICE,
        Error::Driver { .. } => CUHEAP_ERROR_CUDA,
        Error::OutOfMemory { .. }
        | Error::PoolExhausted { .. }
        | Error::DeviceHeapExhausted { .. } => CUHEAP_ERROR_OUT_OF_MEMORY,
        Error::InvalidArgument(_) | Error::MissingKernel(_) => CUHEAP_ERROR_INVALID,
    }
}

/// Keeps `message` for [`cuheap_last_error`] on this thread (dropped if
/// the thread is ending).
fn remember(message: String) {
    // Interior NULs would cut the message short: replace them.
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            *l = c;
        }
    });
}

/// Which context an entry point reads before it runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// The caller's current context, read at once and restored: for entry
    /// points whose code may bind through cudarc directly.
    Eager,
    /// Read only when the pool's code first binds a context (it tells
    /// [`before_bind`]): the allocation and free paths, where a cached
    /// block makes no driver call at all.
    Lazy,
}

/// [`enter`] with [`Keep::Eager`]: most entry points.
pub(crate) fn entry(name: &str, f: impl FnOnce() -> Result<()>) -> c_int {
    enter(name, Keep::Eager, f)
}

/// Runs an entry point: its code, its error kept for
/// [`cuheap_last_error`], a panic turned into [`CUHEAP_ERROR_INTERNAL`],
/// and the caller's current context restored (the driver calls inside
/// make the pool's context current; none may be current, on a framework's
/// worker thread that reached the pool before any runtime call).
pub(crate) fn enter(name: &str, keep: Keep, f: impl FnOnce() -> Result<()>) -> c_int {
    let run = || {
        let restore = KeepContext::new();
        if keep == Keep::Eager && driver_present() {
            before_bind();
        }
        let r = f();
        drop(restore);
        match r {
            Ok(()) => CUHEAP_OK,
            Err(e) => {
                remember(format!("{name}: {e}"));
                code_of(&e)
            }
        }
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(code) => code,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            let _ = catch_unwind(|| remember(format!("{name}: internal error: {what}")));
            CUHEAP_ERROR_INTERNAL
        }
    }
}

/// An [`Error::InvalidArgument`].
pub(crate) fn invalid<T>(what: impl Into<String>) -> Result<T> {
    Err(Error::InvalidArgument(what.into()))
}

/// The message of the last call on this thread that failed (`""` if none
/// has): `const char* cuheap_last_error(void)`. The string stays valid
/// until the next failing call on the same thread.
#[no_mangle]
pub extern "C" fn cuheap_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|l| l.try_borrow().map(|l| l.as_ptr()).ok())
        .ok()
        .flatten()
        .unwrap_or(c"".as_ptr())
}

// The layouts `include/cuheap.h` declares (it checks the same sizes).
const _: () = assert!(std::mem::size_of::<pool::CuheapPoolStats>() == 80);
const _: () = assert!(std::mem::size_of::<heap::CuheapStats>() == 48);
const _: () = assert!(std::mem::size_of::<pool::CuheapPoolConfig>() == 48);
const _: () = assert!(std::mem::size_of::<heap::CuheapHeapDesc>() == 40);
const _: () = assert!(std::mem::size_of::<cuheap_core::Counts>() == 160);
const _: () = assert!(std::mem::size_of::<cuheap_core::HeapHandle>() == 24);

/// The primary context of device `ordinal` (the CUDA runtime's context
/// for it), current on this thread until the entry point returns.
pub(crate) fn device_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    let count = init_driver()?;
    if ordinal >= count {
        return invalid(format!("device {ordinal}: the machine has {count}"));
    }
    // The retain makes the context current.
    before_bind();
    CudaContext::new(ordinal).during("cuDevicePrimaryCtxRetain")
}

/// The primary context of the current device: the device of the context
/// current on this thread (as the CUDA runtime sets it), or device 0 when
/// none is. A current context that is not its device's primary context is
/// refused (pointers of the pool would not be valid in it) and stays
/// current.
pub(crate) fn current_context() -> Result<Arc<CudaContext>> {
    let count = init_driver()?;
    let mut current: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: out-parameter.
    unsafe { sys::cuCtxGetCurrent(&mut current) }
        .result()
        .during("cuCtxGetCurrent")?;
    if current.is_null() {
        return device_context(0);
    }
    let mut device: sys::CUdevice = 0;
    // SAFETY: out-parameter; a context is current.
    unsafe { sys::cuCtxGetDevice(&mut device) }
        .result()
        .during("cuCtxGetDevice")?;
    let mut ordinal = None;
    for i in 0..count {
        if result::device::get(i as i32).during("cuDeviceGet")? == device {
            ordinal = Some(i);
            break;
        }
    }
    let Some(ordinal) = ordinal else {
        return invalid("the current context's device is not in the device list");
    };
    let ctx = device_context(ordinal)?;
    if ctx.cu_ctx() != current {
        // Released (its drop makes it current for a moment) before the
        // caller's context is made current again.
        drop(ctx);
        // SAFETY: the context was current on this thread a moment ago.
        let _ = unsafe { sys::cuCtxSetCurrent(current) };
        return invalid(format!(
            "the current context is not device {ordinal}'s primary context (the one the CUDA \
             runtime uses); make the primary context current, or use the runtime API"
        ));
    }
    Ok(ctx)
}

/// `*out = value` after checking `out`.
///
/// # Safety
///
/// `out` is null or valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, value: T, what: &str) -> Result<()> {
    if out.is_null() {
        return invalid(format!("{what} is NULL"));
    }
    // SAFETY: not null; the caller guarantees it is writable.
    unsafe { out.write(value) };
    Ok(())
}

/// Writes `value` to `out` unless `out` is NULL (an optional result).
///
/// # Safety
///
/// `out` is NULL or writable.
pub(crate) unsafe fn put_if<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: not null; the caller guarantees it is writable.
        unsafe { out.write(value) };
    }
}

/// Writes `pool`'s snapshot: as JSON into `buf` (`size` bytes, with a
/// terminating NUL; `*needed`, if not NULL, gets the bytes it takes; a
/// NULL `buf` only asks), and as an HTML page to the file at `html` (if
/// not NULL). A `buf` too small is refused, and nothing is written to it.
///
/// # Safety
///
/// `buf` is NULL or writable for `size` bytes; `needed` is NULL or
/// writable; `html` is NULL or a NUL-terminated path.
pub(crate) unsafe fn write_snapshot(
    pool: &cuheap_host::Pool,
    buf: *mut c_char,
    size: usize,
    needed: *mut usize,
    html: *const c_char,
) -> Result<()> {
    let snap = pool.snapshot();
    let json = snap.to_json();
    if !needed.is_null() {
        // SAFETY: writable by the caller's contract.
        unsafe { needed.write(json.len() + 1) };
    }
    if !buf.is_null() && size < json.len() + 1 {
        return invalid(format!(
            "a buffer of {size} bytes for a snapshot of {} (with its NUL)",
            json.len() + 1
        ));
    }
    if !html.is_null() {
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: a NUL-terminated string by the caller's contract.
        let path =
            std::ffi::OsStr::from_bytes(unsafe { std::ffi::CStr::from_ptr(html) }.to_bytes());
        let title = format!("cuheap pool on device {}", snap.device);
        std::fs::write(path, snap.html(&title, None)).map_err(|e| {
            Error::InvalidArgument(format!("writing {}: {e}", path.to_string_lossy()))
        })?;
    }
    if !buf.is_null() {
        // SAFETY: `buf` holds `size` >= len + 1 bytes by the caller's
        // contract; the JSON has no NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), json.len());
            buf.add(json.len()).write(0);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

//! Device memory from `cuMemAlloc`, with bounds-checked copies of plain
//! data to and from the host.

use super::launch::DevicePtr;
use crate::error::{Context, Error, Result};
use bytemuck::{AnyBitPattern, NoUninit};
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use std::sync::Arc;

/// Device memory from `cuMemAlloc`, freed on drop.
///
/// [`read`](Self::read), [`write`](Self::write) and [`zero`](Self::zero)
/// are synchronous and run on the legacy default stream, which waits for
/// blocking streams but not for non-blocking ones (cudarc's `new_stream`,
/// the pool's streams): after work on such a stream use the `_on`
/// variants, which are ordered on the stream given.
pub struct DeviceMemory {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceMemory {
    /// `bytes` of device memory in `ctx`, zeroed.
    pub(crate) fn alloc_zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceMemory> {
        let mem = DeviceMemory::alloc(ctx, bytes)?;
        mem.zero()?;
        Ok(mem)
    }

    /// `bytes` of device memory in `ctx`, contents undefined.
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceMemory> {
        crate::driver::bind(ctx)?;
        // SAFETY: plain allocation; the pointer is owned by DeviceMemory.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                let (free, total) = result::mem_get_info().unwrap_or((0, 0));
                Error::OutOfMemory {
                    requested: bytes,
                    reserved: total - free,
                    free,
                }
            } else {
                Error::Driver {
                    what: "cuMemAlloc",
                    source: e,
                }
            }
        })?;
        Ok(DeviceMemory {
            ptr,
            bytes,
            ctx: ctx.clone(),
        })
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The device address as a kernel's `*mut T` parameter takes it.
    pub fn as_ptr<T>(&self) -> DevicePtr<T> {
        DevicePtr::from_raw(self.ptr)
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Sets every byte to 0 (legacy default stream, synchronous).
    pub fn zero(&self) -> Result<()> {
        crate::driver::bind(&self.ctx)?;
        // SAFETY: the range is this allocation.
        unsafe { result::memset_d8_sync(self.ptr, 0, self.bytes) }.during("cuMemsetD8")
    }

    /// Copies `out.len()` values from `self` at byte `offset` to the host
    /// (legacy default stream, synchronous). `T` is any type for which
    /// every bit pattern is a value: device bytes cannot make an invalid
    /// `bool`, enum or reference.
    ///
    /// ```compile_fail,E0277
    /// # fn f(mem: &cuheap_host::DeviceMemory) -> cuheap_host::Result<()> {
    /// let mut refs = [&0u8; 4];
    /// mem.read::<&u8>(0, &mut refs)?; // a reference is not AnyBitPattern
    /// # Ok(()) }
    /// ```
    ///
    /// ```no_run
    /// # fn f(mem: &cuheap_host::DeviceMemory) -> cuheap_host::Result<()> {
    /// let mut words = [0u32; 4];
    /// mem.read::<u32>(0, &mut words)?;
    /// # Ok(()) }
    /// ```
    pub fn read<T: AnyBitPattern>(&self, offset: usize, out: &mut [T]) -> Result<()> {
        let src = self.range(offset, std::mem::size_of_val(out))?;
        crate::driver::bind(&self.ctx)?;
        // SAFETY: the range is inside this allocation; any bytes are a
        // valid `T`.
        unsafe { result::memcpy_dtoh_sync(out, src) }.during("cuMemcpyDtoH")
    }

    /// Copies `data` to `self` at byte `offset` (legacy default stream,
    /// synchronous). `T` has no uninitialised (padding) bytes.
    pub fn write<T: NoUninit>(&self, offset: usize, data: &[T]) -> Result<()> {
        let dst = self.range(offset, std::mem::size_of_val(data))?;
        crate::driver::bind(&self.ctx)?;
        // SAFETY: the range is inside this allocation.
        unsafe { result::memcpy_htod_sync(dst, data) }.during("cuMemcpyHtoD")
    }

    /// [`zero`](Self::zero) ordered on `stream`: after the work queued on
    /// it so far; returns when done.
    pub fn zero_on(&self, stream: &CudaStream) -> Result<()> {
        crate::driver::bind(&self.ctx)?;
        // SAFETY: the range is this allocation.
        unsafe { result::memset_d8_async(self.ptr, 0, self.bytes, stream.cu_stream()) }
            .during("cuMemsetD8Async")?;
        stream.synchronize().during("cuStreamSynchronize")
    }

    /// [`read`](Self::read) ordered on `stream`: after the work queued on
    /// it so far; returns when `out` holds the values.
    pub fn read_on<T: AnyBitPattern>(
        &self,
        offset: usize,
        out: &mut [T],
        stream: &CudaStream,
    ) -> Result<()> {
        let src = self.range(offset, std::mem::size_of_val(out))?;
        crate::driver::bind(&self.ctx)?;
        // SAFETY: the range is inside this allocation; any bytes are a
        // valid `T`.
        unsafe { copy_from_device_on(out, src, stream) }
    }

    /// [`write`](Self::write) ordered on `stream`: after the work queued
    /// on it so far; returns when the copy is done.
    pub fn write_on<T: NoUninit>(
        &self,
        offset: usize,
        data: &[T],
        stream: &CudaStream,
    ) -> Result<()> {
        let dst = self.range(offset, std::mem::size_of_val(data))?;
        crate::driver::bind(&self.ctx)?;
        // SAFETY: the range is inside this allocation.
        unsafe { copy_to_device_on(dst, data, stream) }
    }

    /// The device address of `len` bytes at `offset`, if they are inside
    /// this allocation.
    fn range(&self, offset: usize, len: usize) -> Result<u64> {
        range(self.ptr, self.bytes, offset, len)
    }
}

/// Copies `src` to device address `dst` after the work queued on
/// `stream`, and waits for it: `src` stays borrowed until the copy engine
/// is done with it (a pinned `src` is read after the call is queued).
///
/// # Safety
///
/// `dst..dst + size_of_val(src)` is device memory of the stream's context,
/// which is current, and nothing else uses it meanwhile in stream order;
/// `T` has no uninitialised bytes.
pub(crate) unsafe fn copy_to_device_on<T>(dst: u64, src: &[T], stream: &CudaStream) -> Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { result::memcpy_htod_async(dst, src, stream.cu_stream()) }
        .during("cuMemcpyHtoDAsync")?;
    super::before_bind();
    stream.synchronize().during("cuStreamSynchronize")
}

/// Copies device address `src` to `dst` after the work queued on
/// `stream`, and waits: `dst` holds the values when this returns.
///
/// # Safety
///
/// `src..src + size_of_val(dst)` is device memory of the stream's context,
/// which is current, that nothing writes meanwhile in stream order; its
/// bytes are valid values of `T`.
pub(crate) unsafe fn copy_from_device_on<T>(
    dst: &mut [T],
    src: u64,
    stream: &CudaStream,
) -> Result<()> {
    // SAFETY: forwarded from the caller; `dst` is borrowed until the
    // stream is synchronised below.
    unsafe { result::memcpy_dtoh_async(dst, src, stream.cu_stream()) }
        .during("cuMemcpyDtoHAsync")?;
    super::before_bind();
    stream.synchronize().during("cuStreamSynchronize")
}

/// The address of `len` bytes at `offset` in `bytes` at `base`, if they
/// are inside (no overflow).
fn range(base: u64, bytes: usize, offset: usize, len: usize) -> Result<u64> {
    match offset.checked_add(len) {
        Some(end) if end <= bytes => Ok(base + offset as u64),
        _ => Err(Error::InvalidArgument(format!(
            "{len} bytes at offset {offset} are outside device memory of {bytes} bytes"
        ))),
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // Errors cannot be returned from drop; a failed free leaks.
        if crate::driver::bind(&self.ctx).is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc and is freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ranges_past_the_end_or_overflowing_are_refused() {
        assert_eq!(super::range(0x1000, 8, 0, 8).unwrap(), 0x1000);
        assert_eq!(super::range(0x1000, 8, 4, 4).unwrap(), 0x1004);
        assert!(super::range(0x1000, 8, 1, 8).is_err());
        assert!(super::range(0x1000, 8, usize::MAX, 2).is_err());
    }
}

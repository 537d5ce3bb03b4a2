//! [`CudaBackend`]: the pool's [`Backend`] on the CUDA driver: virtual
//! memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`, `cuMemUnmap`) and cudarc's streams and events.

use super::before_bind;
use super::memory::{copy_from_device_on, copy_to_device_on};
use crate::backend::Backend;
use crate::error::{Context, Error, Result};
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// The CUDA driver, on one context's device.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    device: i32,
    /// Memory is created exportable as POSIX file descriptors.
    shareable: bool,
}

/// Physical device memory from `cuMemCreate`, released on drop.
pub struct CudaMemory {
    handle: sys::CUmemGenericAllocationHandle,
    ctx: Arc<CudaContext>,
}

/// An event of the pool's (cudarc's, whose drop makes its context
/// current: [`before_bind`] is told first).
pub struct Event(CudaEvent);

impl Drop for Event {
    fn drop(&mut self) {
        before_bind();
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        // Errors cannot leave drop; a failed release leaks the memory.
        if crate::driver::bind(&self.ctx).is_ok() {
            // SAFETY: the handle came from cuMemCreate and is released once;
            // a mapping still using it keeps the memory until it is unmapped.
            let _ = unsafe { sys::cuMemRelease(self.handle) };
        }
    }
}

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

fn prop(device: i32) -> sys::CUmemAllocationProp {
    // SAFETY: a C struct for which all-zero is a valid value.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device;
    p
}

impl CudaBackend {
    /// Makes driver call `what` with no context bound first: a thread
    /// with no current context (a framework's worker thread before its
    /// first runtime call) gets the pool's bound and the call made again.
    fn call_unbound(
        &self,
        what: &'static str,
        mut call: impl FnMut() -> sys::CUresult,
    ) -> Result<()> {
        let mut r = call();
        if r == sys::CUresult::CUDA_ERROR_INVALID_CONTEXT {
            self.bind()?;
            r = call();
        }
        r.result().during(what)
    }

    pub fn new(ctx: &Arc<CudaContext>) -> CudaBackend {
        CudaBackend {
            ctx: ctx.clone(),
            device: ctx.ordinal() as i32,
            shareable: false,
        }
    }

    /// A backend whose memory other processes can map: each
    /// `cuMemCreate` asks for a POSIX file descriptor handle
    /// ([`Backend::share`] exports it). A device whose driver does not
    /// support such handles (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`)
    /// is an [`Error::InvalidArgument`] that says so.
    pub fn shareable(ctx: &Arc<CudaContext>) -> Result<CudaBackend> {
        let attr =
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED;
        let device = ctx.ordinal() as i32;
        let supported = result::device::get(device)
            .and_then(|d| {
                // SAFETY: a device handle from cuDeviceGet.
                unsafe { result::device::get_attribute(d, attr) }
            })
            .during("cuDeviceGetAttribute")?;
        if supported == 0 {
            return Err(Error::InvalidArgument(format!(
                "device {device} cannot share memory with other processes: its driver does not \
                 support POSIX file descriptor handles"
            )));
        }
        Ok(CudaBackend {
            shareable: true,
            ..CudaBackend::new(ctx)
        })
    }

    /// How `cuMemCreate` makes this backend's memory.
    fn prop(&self) -> sys::CUmemAllocationProp {
        let mut p = prop(self.device);
        if self.shareable {
            p.requestedHandleTypes = POSIX_FD;
        }
        p
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn bind(&self) -> Result<()> {
        crate::driver::bind(&self.ctx)
    }
}

impl Backend for CudaBackend {
    type Stream = Arc<CudaStream>;
    type Event = Event;
    type Memory = CudaMemory;
    type Shared = OwnedFd;

    fn stream_id(stream: &Arc<CudaStream>) -> usize {
        stream.cu_stream() as usize
    }

    fn is_last_handle(stream: &Arc<CudaStream>) -> bool {
        // The null, legacy and per-thread streams live as long as the
        // context, and cudarc hands out a new handle to them on each call:
        // never let them go (`release_stream` does).
        let raw = stream.cu_stream() as usize;
        raw > 2 && Arc::strong_count(stream) == 1
    }

    fn granularity(&self) -> Result<usize> {
        self.bind()?;
        let mut gran = 0usize;
        // SAFETY: out-parameter; `prop` describes device memory.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut gran,
                &self.prop(),
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        }
        .result()
        .during("cuMemGetAllocationGranularity")?;
        Ok(gran)
    }

    fn reserve(&self, bytes: usize, align: usize) -> Result<u64> {
        self.bind()?;
        let mut base = 0u64;
        // SAFETY: out-parameter; no fixed address requested.
        unsafe { sys::cuMemAddressReserve(&mut base, bytes, align, 0, 0) }
            .result()
            .during("cuMemAddressReserve")?;
        Ok(base)
    }

    unsafe fn unreserve(&self, base: u64, bytes: usize) {
        if self.bind().is_ok() {
            // SAFETY: the caller guarantees the range is a reservation with
            // nothing mapped in it.
            let _ = unsafe { sys::cuMemAddressFree(base, bytes) };
        }
    }

    fn create(&self, bytes: usize) -> Result<CudaMemory> {
        self.bind()?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: out-parameter; one chunk of device memory.
        match unsafe { sys::cuMemCreate(&mut handle, bytes, &self.prop(), 0) }.result() {
            Ok(()) => Ok(CudaMemory {
                handle,
                ctx: self.ctx.clone(),
            }),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let (free, total) = result::mem_get_info().unwrap_or((0, 0));
                Err(Error::OutOfMemory {
                    requested: bytes,
                    reserved: total - free,
                    free,
                })
            }
            Err(source) => Err(Error::Driver {
                what: "cuMemCreate",
                source,
            }),
        }
    }

    unsafe fn map(&self, at: u64, bytes: usize, memory: &CudaMemory) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller guarantees `at..at + bytes` is reserved and
        // unmapped; `memory` is exactly `bytes` long.
        unsafe { sys::cuMemMap(at, bytes, 0, memory.handle, 0) }
            .result()
            .during("cuMemMap")
    }

    fn device(&self) -> i32 {
        self.device
    }

    fn check_peer(&self, peer: i32) -> Result<()> {
        let count = result::device::get_count().during("cuDeviceGetCount")?;
        if !(0..count).contains(&peer) {
            return Err(Error::InvalidArgument(format!(
                "device {peer} does not exist (the driver sees {count})"
            )));
        }
        if peer == self.device {
            return Ok(());
        }
        let own = result::device::get(self.device).during("cuDeviceGet")?;
        let other = result::device::get(peer).during("cuDeviceGet")?;
        let mut can = 0;
        // SAFETY: out-parameter; both handles came from cuDeviceGet.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, other, own) }
            .result()
            .during("cuDeviceCanAccessPeer")?;
        if can == 0 {
            return Err(Error::InvalidArgument(format!(
                "device {peer} cannot access device {}'s memory: the driver reports no peer path \
                 between them (cuDeviceCanAccessPeer)",
                self.device
            )));
        }
        Ok(())
    }

    unsafe fn set_access(&self, at: u64, bytes: usize, peers: &[i32]) -> Result<()> {
        self.bind()?;
        let grant = |device| sys::CUmemAccessDesc {
            location: prop(device).location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let mut access = vec![grant(self.device)];
        access.extend(peers.iter().map(|&p| grant(p)));
        // SAFETY: the caller guarantees the range is mapped; `access`
        // holds `access.len()` descriptors.
        unsafe { sys::cuMemSetAccess(at, bytes, access.as_ptr(), access.len()) }
            .result()
            .during("cuMemSetAccess")
    }

    unsafe fn revoke_access(&self, at: u64, bytes: usize, peer: i32) -> Result<()> {
        self.bind()?;
        let none = sys::CUmemAccessDesc {
            location: prop(peer).location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
        };
        // SAFETY: the caller guarantees the range is mapped and unused by
        // `peer`.
        unsafe { sys::cuMemSetAccess(at, bytes, &none, 1) }
            .result()
            .during("cuMemSetAccess")
    }

    unsafe fn unmap(&self, at: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller guarantees the range is one mapping that no
        // work uses.
        unsafe { sys::cuMemUnmap(at, bytes) }
            .result()
            .during("cuMemUnmap")
    }

    unsafe fn copy_to_device(&self, dst: u64, src: &[u8], stream: &Arc<CudaStream>) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller guarantees the device range; bytes have no
        // uninitialised parts.
        unsafe { copy_to_device_on(dst, src, stream) }
    }

    unsafe fn copy_from_device(
        &self,
        dst: &mut [u8],
        src: u64,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller guarantees the device range; any bytes are
        // valid `u8`s.
        unsafe { copy_from_device_on(dst, src, stream) }
    }

    fn shares(&self) -> bool {
        self.shareable
    }

    fn share(&self, memory: &CudaMemory) -> Result<OwnedFd> {
        if !self.shareable {
            return Err(Error::InvalidArgument(
                "this memory cannot go to another process: it was created without a shareable \
                 handle (create the pool with PoolConfig { shareable: true, .. } or on \
                 CudaBackend::shareable)"
                    .into(),
            ));
        }
        self.bind()?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: out-parameter of the handle type's size (an int for
        // POSIX file descriptors); the handle is live memory of ours.
        unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast(),
                memory.handle,
                POSIX_FD,
                0,
            )
        }
        .result()
        .during("cuMemExportToShareableHandle")?;
        // SAFETY: the driver returned a new descriptor that we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn import(&self, shared: &OwnedFd, _bytes: usize) -> Result<CudaMemory> {
        self.bind()?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: out-parameter; a POSIX handle is passed as the
        // descriptor's value in the pointer argument.
        unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                shared.as_raw_fd() as usize as *mut std::ffi::c_void,
                POSIX_FD,
            )
        }
        .result()
        .during("cuMemImportFromShareableHandle")?;
        // Its length is the exporter's word: a wrong one fails the map.
        Ok(CudaMemory {
            handle,
            ctx: self.ctx.clone(),
        })
    }

    /// One driver call, with no context bound first (see
    /// [`CudaBackend::call_unbound`]).
    fn is_capturing(&self, stream: &Arc<CudaStream>) -> Result<bool> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: out-parameter; a live stream of this context.
        self.call_unbound("cuStreamIsCapturing", || unsafe {
            sys::cuStreamIsCapturing(stream.cu_stream(), &mut status)
        })?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// As [`CudaBackend::is_capturing`], with the capture's id
    /// (`cuStreamGetCaptureInfo`; the optional outputs not asked for).
    fn capture_id(&self, stream: &Arc<CudaStream>) -> Result<Option<u64>> {
        use std::ptr::null_mut;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut id: sys::cuuint64_t = 0;
        // SAFETY: out-parameters, the optional ones null; a live stream
        // of this context.
        self.call_unbound("cuStreamGetCaptureInfo", || unsafe {
            sys::cuStreamGetCaptureInfo_v2(
                stream.cu_stream(),
                &mut status,
                &mut id,
                null_mut(),
                null_mut(),
                null_mut(),
            )
        })?;
        // The pool takes 0 for "no capture".
        debug_assert!(
            status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE || id != 0,
            "a capture with id 0"
        );
        Ok((status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE).then_some(id))
    }

    fn free_memory(&self) -> usize {
        before_bind();
        self.ctx.mem_get_info().map(|(free, _)| free).unwrap_or(0)
    }

    fn new_event(&self) -> Result<Event> {
        before_bind();
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map(Event)
            .during("cuEventCreate")
    }

    fn record(&self, event: &Event, stream: &Arc<CudaStream>) -> Result<()> {
        before_bind();
        event.0.record(stream).during("cuEventRecord")
    }

    fn wait(&self, stream: &Arc<CudaStream>, event: &Event) -> Result<()> {
        before_bind();
        stream.wait(&event.0).during("cuStreamWaitEvent")
    }

    fn synchronize(&self, event: &Event) -> Result<()> {
        before_bind();
        event.0.synchronize().during("cuEventSynchronize")
    }

    fn query(&self, event: &Event) -> Result<bool> {
        event.0.try_is_complete().during("cuEventQuery")
    }

    fn synchronize_device(&self) -> Result<()> {
        before_bind();
        self.ctx.synchronize().during("cuCtxSynchronize")
    }
}

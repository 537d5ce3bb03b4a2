//! A range of device address space (`cuMemAddressReserve`) with physical
//! memory mapped behind a growing prefix of it, chunk by chunk
//! (`cuMemCreate`/`cuMemMap`/`cuMemSetAccess`), and unmapped from the end
//! when trimmed. A slab that grows in place: addresses never move.

use crate::error::{Context, Error, Result};
use cudarc::driver::{sys, CudaContext};
use std::sync::{Arc, Mutex};

pub struct VmmRegion {
    base: u64,
    reserved: usize,
    chunk: usize,
    device: i32,
    mapped: Mutex<Vec<sys::CUmemGenericAllocationHandle>>,
    ctx: Arc<CudaContext>,
}

// SAFETY: the handles are plain integers owned by this value; all mutation
// is behind the mutex.
unsafe impl Send for VmmRegion {}
// SAFETY: as above.
unsafe impl Sync for VmmRegion {}

fn prop(device: i32) -> sys::CUmemAllocationProp {
    // SAFETY: a C struct for which all-zero is a valid value.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device;
    p
}

impl VmmRegion {
    /// Reserves `reserve` bytes of address space; maps nothing yet.
    /// `chunk` (rounded to the device's granularity) is the mapping unit.
    pub fn new(ctx: &Arc<CudaContext>, reserve: usize, chunk: usize) -> Result<VmmRegion> {
        ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        let device = ctx.ordinal() as i32;
        let mut gran = 0usize;
        // SAFETY: out-parameter; `prop` describes device memory.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut gran,
                &prop(device),
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        }
        .result()
        .during("cuMemGetAllocationGranularity")?;
        let chunk = chunk.max(gran).div_ceil(gran) * gran;
        let reserved = reserve.max(chunk).div_ceil(chunk) * chunk;
        let mut base = 0u64;
        // SAFETY: out-parameter; no fixed address requested.
        unsafe { sys::cuMemAddressReserve(&mut base, reserved, chunk, 0, 0) }
            .result()
            .during("cuMemAddressReserve")?;
        Ok(VmmRegion {
            base,
            reserved,
            chunk,
            device,
            mapped: Mutex::new(Vec::new()),
            ctx: ctx.clone(),
        })
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    pub fn reserved(&self) -> usize {
        self.reserved
    }

    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// Bytes with physical memory behind them (from `base`).
    pub fn mapped(&self) -> usize {
        self.lock().len() * self.chunk
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<sys::CUmemGenericAllocationHandle>> {
        self.mapped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Maps chunks until at least `bytes` are mapped. Returns the mapped
    /// size; [`Error::OutOfMemory`] when the device or the range is full.
    pub fn grow_to(&self, bytes: usize) -> Result<usize> {
        let mut m = self.lock();
        if bytes > self.reserved {
            return Err(Error::OutOfMemory {
                requested: bytes,
                reserved: self.reserved,
                free: 0,
            });
        }
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        while m.len() * self.chunk < bytes {
            let at = self.base + (m.len() * self.chunk) as u64;
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: out-parameter; one chunk of device memory.
            let r = unsafe { sys::cuMemCreate(&mut h, self.chunk, &prop(self.device), 0) }.result();
            if let Err(e) = r {
                let (free, _) = cudarc::driver::result::mem_get_info().unwrap_or((0, 0));
                return if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    Err(Error::OutOfMemory {
                        requested: self.chunk,
                        reserved: m.len() * self.chunk,
                        free,
                    })
                } else {
                    Err(Error::Driver {
                        what: "cuMemCreate",
                        source: e,
                    })
                };
            }
            let access = sys::CUmemAccessDesc {
                location: prop(self.device).location,
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: `at` is inside the reserved range and unmapped; `h`
            // is a fresh chunk of exactly `chunk` bytes.
            let mapped = unsafe { sys::cuMemMap(at, self.chunk, 0, h, 0) }
                .result()
                .and_then(|_| unsafe { sys::cuMemSetAccess(at, self.chunk, &access, 1) }.result());
            if let Err(e) = mapped {
                // SAFETY: undo: unmap (harmless if not mapped) and release.
                unsafe {
                    let _ = sys::cuMemUnmap(at, self.chunk);
                    let _ = sys::cuMemRelease(h);
                }
                return Err(Error::Driver {
                    what: "cuMemMap",
                    source: e,
                });
            }
            m.push(h);
        }
        Ok(m.len() * self.chunk)
    }

    /// Unmaps chunks from the end until at most `bytes` stay mapped. The
    /// caller guarantees nothing uses the memory being unmapped.
    pub fn shrink_to(&self, bytes: usize) -> Result<usize> {
        let mut m = self.lock();
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        while m.len() * self.chunk > bytes {
            let Some(h) = m.pop() else { break };
            let at = self.base + (m.len() * self.chunk) as u64;
            // SAFETY: `at..at + chunk` was mapped to `h` by `grow_to`.
            unsafe { sys::cuMemUnmap(at, self.chunk) }
                .result()
                .during("cuMemUnmap")?;
            // SAFETY: `h` is no longer mapped anywhere.
            unsafe { sys::cuMemRelease(h) }
                .result()
                .during("cuMemRelease")?;
        }
        Ok(m.len() * self.chunk)
    }
}

impl Drop for VmmRegion {
    fn drop(&mut self) {
        // Errors cannot leave drop; whatever fails here leaks.
        let _ = self.shrink_to(0);
        // SAFETY: the range came from cuMemAddressReserve and is unmapped.
        let _ = unsafe { sys::cuMemAddressFree(self.base, self.reserved) };
    }
}

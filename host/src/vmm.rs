//! A range of device address space with physical memory mapped behind a
//! growing prefix of it, chunk by chunk, and unmapped from the end when
//! trimmed: a slab that grows in place, so addresses never move. Works
//! on any [`Backend`]; [`VmmRegion`] is the one on the CUDA driver.

use crate::backend::Backend;
use crate::driver::CudaBackend;
use crate::error::{Error, Result};
use cudarc::driver::CudaContext;
use std::sync::{Arc, Mutex, MutexGuard};

/// A region on the CUDA driver.
pub type VmmRegion = Region<CudaBackend>;

/// Reserved address space with the first `mapped()` bytes mapped.
pub struct Region<B: Backend> {
    base: u64,
    reserved: usize,
    chunk: usize,
    /// Invariant: chunk `i` (at `base + i * chunk`) is mapped to `mapped[i]`.
    mapped: Mutex<Vec<B::Memory>>,
    backend: B,
}

impl VmmRegion {
    /// A region on `ctx`'s device (see [`Region::with_backend`]).
    pub fn new(ctx: &Arc<CudaContext>, reserve: usize, chunk: usize) -> Result<VmmRegion> {
        Region::with_backend(CudaBackend::new(ctx), reserve, chunk)
    }
}

impl<B: Backend> Region<B> {
    /// Reserves `reserve` bytes of address space; maps nothing yet.
    /// `chunk` (rounded up to the backend's granularity) is the mapping
    /// unit; the reservation is a whole number of chunks.
    pub fn with_backend(backend: B, reserve: usize, chunk: usize) -> Result<Region<B>> {
        let gran = backend.granularity()?.max(1);
        let too_big = || Error::InvalidArgument(format!("reservation of {reserve} bytes"));
        let chunk = chunk
            .max(gran)
            .checked_next_multiple_of(gran)
            .ok_or_else(too_big)?;
        let reserved = reserve
            .max(chunk)
            .checked_next_multiple_of(chunk)
            .ok_or_else(too_big)?;
        let base = backend.reserve(reserved, chunk)?;
        Ok(Region {
            base,
            reserved,
            chunk,
            mapped: Mutex::new(Vec::new()),
            backend,
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

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Bytes with physical memory behind them (from `base`).
    pub fn mapped(&self) -> usize {
        self.lock().len() * self.chunk
    }

    fn lock(&self) -> MutexGuard<'_, Vec<B::Memory>> {
        self.mapped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Maps chunks until at least `bytes` are mapped. Returns the mapped
    /// size; [`Error::OutOfMemory`] when the device or the range is full
    /// (what was mapped before the failure stays mapped).
    pub fn grow_to(&self, bytes: usize) -> Result<usize> {
        let mut m = self.lock();
        if bytes > self.reserved {
            return Err(Error::OutOfMemory {
                requested: bytes,
                reserved: self.reserved,
                free: 0,
            });
        }
        while m.len() * self.chunk < bytes {
            let at = self.base + (m.len() * self.chunk) as u64;
            let memory = self.backend.create(self.chunk).map_err(|e| match e {
                Error::OutOfMemory { requested, .. } => Error::OutOfMemory {
                    requested,
                    reserved: m.len() * self.chunk,
                    free: self.backend.free_memory(),
                },
                e => e,
            })?;
            // SAFETY: `at..at + chunk` is inside the reservation and past
            // every mapped chunk (the invariant on `mapped`).
            unsafe { self.backend.map(at, self.chunk, &memory) }?;
            // SAFETY: just mapped.
            if let Err(e) = unsafe { self.backend.set_access(at, self.chunk) } {
                // SAFETY: mapped above, used by nothing yet.
                let _ = unsafe { self.backend.unmap(at, self.chunk) };
                return Err(e);
            }
            m.push(memory);
        }
        Ok(m.len() * self.chunk)
    }

    /// Unmaps chunks from the end until at most `bytes` stay mapped.
    /// Returns the mapped size.
    ///
    /// # Safety
    ///
    /// No work, queued or running, and no block handed out uses the
    /// memory from `bytes` (rounded up to a chunk) to the mapped end.
    pub unsafe fn shrink_to(&self, bytes: usize) -> Result<usize> {
        let mut m = self.lock();
        while m.len() * self.chunk > bytes {
            let at = self.base + ((m.len() - 1) * self.chunk) as u64;
            // SAFETY: the last chunk is one mapping (the invariant on
            // `mapped`); the caller guarantees nothing uses it.
            unsafe { self.backend.unmap(at, self.chunk) }?;
            m.pop(); // releases its memory
        }
        Ok(m.len() * self.chunk)
    }
}

impl<B: Backend> Drop for Region<B> {
    fn drop(&mut self) {
        // Errors cannot leave drop; whatever fails here leaks. Work still
        // queued may use the memory: wait for the device first.
        let _ = self.backend.synchronize_device();
        // SAFETY: nothing runs on the device any more, and the owner drops
        // the region only once no block of it is handed out.
        if unsafe { self.shrink_to(0) }.is_ok() {
            // SAFETY: the range came from `reserve` and is unmapped.
            unsafe { self.backend.unreserve(self.base, self.reserved) };
        }
    }
}

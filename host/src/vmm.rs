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
    mapped: Mutex<Extents<B>>,
    backend: B,
}

/// The mappings of a region, in address order from its base.
struct Extents<B: Backend> {
    /// Invariant: extent `i`, `(len, memory)`, is mapped to `memory` at
    /// `base` plus the lengths before it; lengths are whole chunks.
    list: Vec<(usize, B::Memory)>,
    /// The sum of the lengths.
    bytes: usize,
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
            mapped: Mutex::new(Extents {
                list: Vec::new(),
                bytes: 0,
            }),
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
        self.lock().bytes
    }

    fn lock(&self) -> MutexGuard<'_, Extents<B>> {
        self.mapped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Maps chunks, one mapping each, until at least `bytes` are mapped:
    /// the region can then shrink chunk by chunk. Returns the mapped size;
    /// [`Error::OutOfMemory`] when the device or the range is full (what
    /// was mapped before the failure stays mapped).
    pub fn grow_to(&self, bytes: usize) -> Result<usize> {
        let mut m = self.lock();
        self.check_fits(bytes)?;
        while m.bytes < bytes {
            self.map_extent(&mut m, self.chunk)?;
        }
        Ok(m.bytes)
    }

    /// Maps what is missing up to `bytes` (whole chunks) as one mapping:
    /// one `create`, one `map` and one `set_access`, whatever the size, so
    /// a large step costs about what a chunk does. It shrinks only as a
    /// whole. Returns the mapped size; errors as [`Region::grow_to`]
    /// (nothing of this step stays mapped after a failure).
    pub fn grow_at_once(&self, bytes: usize) -> Result<usize> {
        let mut m = self.lock();
        self.check_fits(bytes)?;
        if m.bytes < bytes {
            let len = (bytes - m.bytes)
                .next_multiple_of(self.chunk)
                .min(self.reserved - m.bytes);
            self.map_extent(&mut m, len)?;
        }
        Ok(m.bytes)
    }

    fn check_fits(&self, bytes: usize) -> Result<()> {
        if bytes > self.reserved {
            return Err(Error::OutOfMemory {
                requested: bytes,
                reserved: self.reserved,
                free: 0,
            });
        }
        Ok(())
    }

    /// Maps `len` bytes (whole chunks) of new memory at the mapped end.
    fn map_extent(&self, m: &mut Extents<B>, len: usize) -> Result<()> {
        let at = self.base + m.bytes as u64;
        let memory = self.backend.create(len).map_err(|e| match e {
            Error::OutOfMemory { requested, .. } => Error::OutOfMemory {
                requested,
                reserved: m.bytes,
                free: self.backend.free_memory(),
            },
            e => e,
        })?;
        // SAFETY: `at..at + len` is inside the reservation (callers check)
        // and past every mapped extent (the invariant on `Extents`).
        unsafe { self.backend.map(at, len, &memory) }?;
        // SAFETY: just mapped.
        if let Err(e) = unsafe { self.backend.set_access(at, len) } {
            // SAFETY: mapped above, used by nothing yet.
            let _ = unsafe { self.backend.unmap(at, len) };
            return Err(e);
        }
        m.list.push((len, memory));
        m.bytes += len;
        Ok(())
    }

    /// The last mapping: its offset from `base` and its length.
    pub fn last_extent(&self) -> Option<(usize, usize)> {
        let m = self.lock();
        m.list.last().map(|&(len, _)| (m.bytes - len, len))
    }

    /// Unmaps mappings from the end while at least `bytes` stay mapped: a
    /// mapping that straddles `bytes` stays. Returns the mapped size.
    ///
    /// # Safety
    ///
    /// No work, queued or running, and no block handed out uses the
    /// memory from `bytes` to the mapped end.
    pub unsafe fn shrink_to(&self, bytes: usize) -> Result<usize> {
        let mut m = self.lock();
        while let Some(&(len, _)) = m.list.last() {
            if m.bytes - len < bytes {
                break;
            }
            let at = self.base + (m.bytes - len) as u64;
            // SAFETY: the last extent is one mapping (the invariant on
            // `Extents`) past `bytes`; the caller guarantees nothing uses it.
            unsafe { self.backend.unmap(at, len) }?;
            m.list.pop(); // releases its memory
            m.bytes -= len;
        }
        Ok(m.bytes)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::HostBackend;

    const MIB: usize = 1 << 20;

    #[test]
    fn a_step_is_one_mapping_and_shrinks_only_whole() {
        let r = Region::with_backend(HostBackend::new(64 << 10, usize::MAX), 64 * MIB, 2 * MIB)
            .unwrap();
        assert_eq!(r.grow_to(4 * MIB).unwrap(), 4 * MIB); // two chunks
        assert_eq!(r.grow_at_once(13 * MIB).unwrap(), 14 * MIB); // one step of 10 MiB
        assert_eq!(r.last_extent(), Some((4 * MIB, 10 * MIB)));
        assert!(r.grow_at_once(65 * MIB).is_err());
        assert_eq!(r.mapped(), 14 * MIB);
        // SAFETY: nothing uses host-backed test memory.
        unsafe {
            // The step straddles 8 MiB: it stays.
            assert_eq!(r.shrink_to(8 * MIB).unwrap(), 14 * MIB);
            assert_eq!(r.shrink_to(4 * MIB).unwrap(), 4 * MIB);
            assert_eq!(r.shrink_to(3 * MIB).unwrap(), 4 * MIB);
            assert_eq!(r.shrink_to(0).unwrap(), 0);
        }
        assert_eq!(r.last_extent(), None);
        assert_eq!(r.grow_at_once(64 * MIB).unwrap(), 64 * MIB);
    }
}

//! Device address space and the physical memory mapped into it.
//!
//! A [`Reservation`] is one range of reserved address space on a device.
//! [`Region`]s are carved from it: each is a slab that grows in place
//! (physical memory mapped behind a growing prefix, chunk by chunk or a
//! step at once) and shrinks from the end, so addresses never move. A
//! mapping in the middle can be unmapped ([`Region::punch`]): its range
//! becomes a hole and its memory maps at the end on the next growth
//! (blocks stay where they are; free memory moves). A
//! host [`Pool`](crate::Pool) and growable
//! [`DeviceHeap`](crate::DeviceHeap)s can share one reservation
//! ([`Reservation::shared`]): physical memory one of them unmaps is kept
//! in the reservation's *bank* and mapped again by whichever grows next,
//! before any new memory is created, so memory a kernel freed serves a
//! host allocation and the reverse; [`Reservation::release`] gives the
//! bank back to the device (so does running out of device memory while
//! the bank holds pieces too long to use). A region made on its
//! own ([`Region::with_backend`]) has a reservation of its own, which
//! releases unmapped memory at once. Works on any [`Backend`];
//! [`VmmRegion`] is the one on the CUDA driver.

use crate::backend::Backend;
use crate::driver::CudaBackend;
use crate::error::{Error, Result};
use crate::share::Exported;
use cudarc::driver::CudaContext;
use cuheap_core::PAGE_SIZE;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A region on the CUDA driver.
pub type VmmRegion = Region<CudaBackend>;

/// Who maps a region: the statistics of a reservation count each apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// A host pool.
    Pool,
    /// A device heap.
    DeviceHeap,
}

/// One range of reserved address space, the regions carved from it, and
/// the physical memory they gave back (the bank).
pub struct Reservation<B: Backend = CudaBackend> {
    backend: B,
    base: u64,
    reserved: usize,
    /// Whether unmapped memory is banked for reuse (else released).
    banks: bool,
    state: Mutex<Bank<B>>,
    /// Bytes mapped by regions, by [`Part`].
    mapped: [AtomicUsize; 2],
    created: AtomicUsize,
    reused: AtomicUsize,
    released: AtomicUsize,
}

/// The mutable part of a [`Reservation`].
struct Bank<B: Backend> {
    /// Offset of the first byte not carved yet.
    next: usize,
    /// Physical memory given back by a region: `(length, memory)`.
    kept: Vec<(usize, B::Memory)>,
}

/// A snapshot of a [`Reservation`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReservationStats {
    /// Address space reserved.
    pub reserved: usize,
    /// Address space carved into regions so far.
    pub carved: usize,
    /// Physical memory mapped by pools.
    pub pool_mapped: usize,
    /// Physical memory mapped by device heaps.
    pub heap_mapped: usize,
    /// Physical memory unmapped by a region and kept for the next to grow.
    pub banked: usize,
    /// Bytes of physical memory created so far.
    pub created: usize,
    /// Bytes mapped from the bank instead of created.
    pub reused: usize,
    /// Bytes of banked memory given back to the device.
    pub released: usize,
}

impl Reservation<CudaBackend> {
    /// A reservation of `bytes` of address space on `ctx`'s device whose
    /// regions share their physical memory (see [`Reservation::shared`]).
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Arc<Reservation>> {
        Reservation::shared(CudaBackend::new(ctx), bytes)
    }
}

impl<B: Backend> Reservation<B> {
    /// Reserves `bytes` of address space (rounded up to the backend's
    /// granularity) for regions that share physical memory: what one
    /// unmaps is banked, and the next region to grow maps it before it
    /// creates any. Address space is cheap: reserve generously (a
    /// region's range is carved once and not reused after it is dropped).
    pub fn shared(backend: B, bytes: usize) -> Result<Arc<Reservation<B>>> {
        Reservation::make(backend, bytes, true).map(Arc::new)
    }

    fn make(backend: B, bytes: usize, banks: bool) -> Result<Reservation<B>> {
        let align = backend.granularity()?.max(1);
        let reserved = bytes
            .max(align)
            .checked_next_multiple_of(align)
            .ok_or_else(|| Error::InvalidArgument(format!("reservation of {bytes} bytes")))?;
        let base = backend.reserve(reserved, align)?;
        Ok(Reservation {
            backend,
            base,
            reserved,
            banks,
            state: Mutex::new(Bank {
                next: 0,
                kept: Vec::new(),
            }),
            mapped: [AtomicUsize::new(0), AtomicUsize::new(0)],
            created: AtomicUsize::new(0),
            reused: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
        })
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    fn lock(&self) -> MutexGuard<'_, Bank<B>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Carves `bytes` (whole `align` units, `align` a multiple of the
    /// granularity) from the unused end: the offset.
    fn carve(&self, bytes: usize, align: usize) -> Result<usize> {
        let mut b = self.lock();
        let at = b.next.next_multiple_of(align);
        if at.checked_add(bytes).is_none_or(|end| end > self.reserved) {
            return Err(Error::OutOfMemory {
                requested: bytes,
                reserved: self.reserved - b.next.min(self.reserved),
                free: self.backend.free_memory(),
            });
        }
        b.next = at + bytes;
        Ok(at)
    }

    /// Physical memory for a region that wants `min` bytes and has room
    /// for `max`: the smallest banked piece of `min..=max` bytes, else the
    /// largest one shorter than `min` (the region maps more after it),
    /// else `min` bytes created. When the device is out of memory while
    /// the bank holds pieces none of which fits, they are released and the
    /// creation tried again. Returns the length and whether the memory
    /// came from the bank.
    fn take(&self, min: usize, max: usize) -> Result<(usize, B::Memory, bool)> {
        {
            let mut b = self.lock();
            let fits = (b.kept.iter().enumerate())
                .filter(|(_, (len, _))| (min..=max).contains(len))
                .min_by_key(|(_, (len, _))| *len);
            let part = (b.kept.iter().enumerate())
                .filter(|(_, (len, _))| *len < min)
                .max_by_key(|(_, (len, _))| *len);
            if let Some(i) = fits.or(part).map(|(i, _)| i) {
                let (len, memory) = b.kept.swap_remove(i);
                return Ok((len, memory, true));
            }
        }
        Ok((min, self.create(min)?, false))
    }

    /// `len` bytes of new memory, counted. When the device is out of
    /// memory while the bank holds pieces, they are released and the
    /// creation tried again.
    fn create(&self, len: usize) -> Result<B::Memory> {
        let memory = match self.backend.create(len) {
            Err(Error::OutOfMemory { .. }) if self.release() > 0 => self.backend.create(len)?,
            r => r?,
        };
        self.created.fetch_add(len, Ordering::Relaxed);
        Ok(memory)
    }

    /// A banked piece of exactly `len` bytes, if the bank holds one.
    fn take_exact(&self, len: usize) -> Option<B::Memory> {
        let mut b = self.lock();
        let i = b.kept.iter().position(|(l, _)| *l == len)?;
        Some(b.kept.swap_remove(i).1)
    }

    /// Memory a region unmapped: banked, or released at once.
    fn give(&self, len: usize, memory: B::Memory) {
        if self.banks {
            let mut b = self.lock();
            b.kept.push((len, memory));
        } else {
            self.released.fetch_add(len, Ordering::Relaxed);
            drop(memory);
        }
    }

    fn note(&self, part: Part, mapped: isize) {
        let c = &self.mapped[part as usize];
        if mapped >= 0 {
            c.fetch_add(mapped as usize, Ordering::Relaxed);
        } else {
            c.fetch_sub(mapped.unsigned_abs(), Ordering::Relaxed);
        }
    }

    /// Gives the banked memory back to the device; returns its bytes.
    pub fn release(&self) -> usize {
        let kept = std::mem::take(&mut self.lock().kept);
        let bytes = kept.iter().map(|k| k.0).sum();
        self.released.fetch_add(bytes, Ordering::Relaxed);
        drop(kept); // outside the lock: releasing calls the driver
        bytes
    }

    pub fn stats(&self) -> ReservationStats {
        let b = self.lock();
        ReservationStats {
            reserved: self.reserved,
            carved: b.next,
            pool_mapped: self.mapped[Part::Pool as usize].load(Ordering::Relaxed),
            heap_mapped: self.mapped[Part::DeviceHeap as usize].load(Ordering::Relaxed),
            banked: b.kept.iter().map(|k| k.0).sum(),
            created: self.created.load(Ordering::Relaxed),
            reused: self.reused.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
        }
    }
}

impl<B: Backend> Drop for Reservation<B> {
    fn drop(&mut self) {
        // Every region holds the reservation, so none is left; the bank
        // goes with it.
        self.release();
        // A region whose unmap failed left its mappings (and counts) in
        // place: then the range leaks rather than being given back mapped.
        if self.mapped.iter().all(|m| m.load(Ordering::Relaxed) == 0) {
            // SAFETY: the range came from `reserve` and nothing is mapped
            // in it.
            unsafe { self.backend.unreserve(self.base, self.reserved) };
        }
    }
}

/// A region's mappings and holes ([`Region::layout`]): offsets from its
/// base and lengths, in address order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    pub mappings: Vec<(usize, usize)>,
    pub holes: Vec<(usize, usize)>,
    /// Memory held ([`Region::mapped`]).
    pub mapped: usize,
    /// The range's end ([`Region::end`]).
    pub end: usize,
}

/// Reserved address space (carved from a [`Reservation`]) whose first
/// `end()` bytes are mapped, but for holes ([`Region::punch`]).
pub struct Region<B: Backend> {
    res: Arc<Reservation<B>>,
    part: Part,
    base: u64,
    reserved: usize,
    chunk: usize,
    mapped: Mutex<Extents<B>>,
}

/// The mappings of a region, in address order from its base.
struct Extents<B: Backend> {
    /// Invariant: extent `i`, `(len, memory)`, covers `base` plus the
    /// lengths before it, `len` bytes: mapped to `memory`, or a hole
    /// (`None`: unmapped by [`Region::punch`], its pages fenced by the
    /// owner). Lengths are whole granules of the backend (whole chunks,
    /// unless the memory came from the bank).
    list: Vec<(usize, Option<B::Memory>)>,
    /// The sum of the lengths: the end of the mapped prefix, holes
    /// included.
    end: usize,
    /// Bytes of memory held: the mapped lengths (holes left out) and the
    /// spare pieces.
    physical: usize,
    /// Memory unmapped from holes, mapped again at the end before any
    /// other (see [`Region::punch`]).
    spare: Vec<(usize, B::Memory)>,
    /// Devices other than the backend's own that every mapping grants
    /// access to (see [`Region::grant_access`]).
    peers: Vec<i32>,
    /// Those of `peers` whose grant failed part-way and could not be
    /// undone: granted on some mappings only.
    partial: Vec<i32>,
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
    /// unit; the reservation is a whole number of chunks and the region's
    /// own: memory it unmaps is released at once.
    pub fn with_backend(backend: B, reserve: usize, chunk: usize) -> Result<Region<B>> {
        let (chunk, len) = Region::<B>::sizes(&backend, reserve, chunk)?;
        let res = Arc::new(Reservation::make(backend, len, false)?);
        Region::carve(&res, Part::Pool, len, chunk)
    }

    /// A region of `reserve` bytes (whole chunks of `chunk`, rounded up to
    /// the granularity) carved from `res`, mapped by `part`.
    pub fn within(
        res: &Arc<Reservation<B>>,
        part: Part,
        reserve: usize,
        chunk: usize,
    ) -> Result<Region<B>> {
        let (chunk, len) = Region::<B>::sizes(&res.backend, reserve, chunk)?;
        Region::carve(res, part, len, chunk)
    }

    /// The chunk and the length of a region of `reserve` bytes. Chunks
    /// are whole granules and whole heap pages, so every mapping, banked
    /// pieces of other regions included, is whole pages.
    fn sizes(backend: &B, reserve: usize, chunk: usize) -> Result<(usize, usize)> {
        let gran = backend
            .granularity()?
            .max(1)
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or_else(|| Error::InvalidArgument("mapping granularity".into()))?;
        let too_big = || Error::InvalidArgument(format!("reservation of {reserve} bytes"));
        let chunk = chunk
            .max(gran)
            .checked_next_multiple_of(gran)
            .ok_or_else(too_big)?;
        let len = reserve
            .max(chunk)
            .checked_next_multiple_of(chunk)
            .ok_or_else(too_big)?;
        Ok((chunk, len))
    }

    fn carve(res: &Arc<Reservation<B>>, part: Part, len: usize, chunk: usize) -> Result<Region<B>> {
        let at = res.carve(len, chunk)?;
        Ok(Region {
            res: res.clone(),
            part,
            base: res.base + at as u64,
            reserved: len,
            chunk,
            mapped: Mutex::new(Extents {
                list: Vec::new(),
                end: 0,
                physical: 0,
                spare: Vec::new(),
                peers: Vec::new(),
                partial: Vec::new(),
            }),
        })
    }

    /// The reservation this region was carved from.
    pub fn reservation(&self) -> &Arc<Reservation<B>> {
        &self.res
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
        &self.res.backend
    }

    /// Bytes of physical memory the region holds: its mappings (holes
    /// left out) and memory of holes not mapped again yet.
    pub fn mapped(&self) -> usize {
        self.lock().physical
    }

    /// The end of the mapped prefix, from `base`: every byte below it is
    /// mapped or in a hole ([`Region::punch`]).
    pub fn end(&self) -> usize {
        self.lock().end
    }

    /// The holes: each one's offset from `base` and length, in address
    /// order.
    pub fn holes(&self) -> Vec<(usize, usize)> {
        self.layout().holes
    }

    /// The mappings, the holes, the memory held and the range's end, read
    /// together.
    pub fn layout(&self) -> Layout {
        let m = self.lock();
        let pick = |want: bool| {
            m.all(0)
                .filter(|&(_, _, mapped)| mapped == want)
                .map(|(at, len, _)| (at as usize, len))
                .collect()
        };
        Layout {
            mappings: pick(true),
            holes: pick(false),
            mapped: m.physical,
            end: m.end,
        }
    }

    /// Maps memory into every hole again (spare pieces of the same length
    /// first, else new memory): what a pool does once its range's end
    /// reaches the reservation's. Returns the ranges filled (offset from
    /// `base`, length), which the owner may hand out again; on an error
    /// the holes filled before it are returned with it.
    pub fn fill_holes(&self) -> (Vec<(usize, usize)>, Result<()>) {
        let mut m = self.lock();
        let mut filled = Vec::new();
        let holes: Vec<(usize, usize, usize)> = (m.all(0).enumerate())
            .filter(|&(_, (_, _, mapped))| !mapped)
            .map(|(i, (at, len, _))| (i, at as usize, len))
            .collect();
        for (i, at, len) in holes {
            if let Err(e) = self.fill(&mut m, i, at, len) {
                return (filled, Err(e));
            }
            filled.push((at, len));
        }
        (filled, Ok(()))
    }

    /// Maps memory into the hole at `offset` (from `base`): a spare piece
    /// of its length, else a banked one, else new memory. Returns its
    /// length; an offset where no hole starts is an
    /// [`Error::InvalidArgument`]. The owner may hand its range out again
    /// (once it unfences its pages).
    pub fn fill_hole(&self, offset: usize) -> Result<usize> {
        let mut m = self.lock();
        let Some((i, len)) = m.extent_at(offset, false) else {
            return Err(Error::InvalidArgument(format!(
                "no hole to fill at offset {offset}"
            )));
        };
        self.fill(&mut m, i, offset, len).map(|()| len)
    }

    /// Maps memory into hole `i` of `m` (`at`, `len` from `base`): a spare
    /// piece of its length, else a banked one, else new memory.
    fn fill(&self, m: &mut Extents<B>, i: usize, at: usize, len: usize) -> Result<()> {
        let backend = &self.res.backend;
        let memory = match m.spare.iter().position(|(l, _)| *l == len) {
            Some(k) => m.spare.swap_remove(k).1,
            None => {
                let memory = match self.res.take_exact(len) {
                    Some(memory) => {
                        self.res.reused.fetch_add(len, Ordering::Relaxed);
                        memory
                    }
                    None => self.res.create(len)?,
                };
                self.res.note(self.part, len as isize);
                m.physical += len;
                memory
            }
        };
        let addr = self.base + at as u64;
        // SAFETY: the hole is inside the region and nothing is mapped
        // there (the invariant on `Extents`).
        if let Err(e) = unsafe { backend.map(addr, len, &memory) } {
            m.spare.push((len, memory)); // still held, still counted
            return Err(e);
        }
        // SAFETY: just mapped.
        if let Err(e) = unsafe { backend.set_access(addr, len, &m.peers) } {
            // SAFETY: mapped above, used by nothing yet.
            match unsafe { backend.unmap(addr, len) } {
                Ok(()) => m.spare.push((len, memory)),
                // Still mapped: never hand it out again (it leaks).
                Err(_) => std::mem::forget(memory),
            }
            return Err(e);
        }
        m.list[i].1 = Some(memory);
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Extents<B>> {
        self.mapped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Maps chunks, one mapping each (or spare or banked pieces), until
    /// the mapped range reaches at least `bytes` from `base`: the region
    /// can then shrink a mapping at a time. Returns the range's end
    /// ([`Region::end`]);
    /// [`Error::OutOfMemory`] when the device or the range is full (what
    /// was mapped before the failure stays mapped).
    pub fn grow_to(&self, bytes: usize) -> Result<usize> {
        let mut m = self.lock();
        self.check_fits(bytes)?;
        self.map_range(&mut m, |_| self.chunk, bytes, false)
    }

    /// Maps extents of `step(missing)` bytes at the end until it reaches
    /// `bytes`, then grants access to all of them in one call (a
    /// `cuMemSetAccess` costs about what a `cuMemMap` does). A failure
    /// stops the mapping; with `keep_partial`, what was mapped before it
    /// stays (and gets access), else the error is returned after that.
    /// Memory whose access grant fails is unmapped and kept as spare.
    fn map_range(
        &self,
        m: &mut Extents<B>,
        step: impl Fn(usize) -> usize,
        bytes: usize,
        keep_partial: bool,
    ) -> Result<usize> {
        let (start, first) = (m.end, m.list.len());
        let mut failed = None;
        while m.end < bytes {
            if let Err(e) = self.map_extent(m, step(bytes - m.end)) {
                failed = Some(e);
                break;
            }
        }
        if m.end > start {
            let backend = &self.res.backend;
            let at = self.base + start as u64;
            // SAFETY: `start..end` is the extents just mapped, whole and
            // one after another.
            if let Err(e) = unsafe { backend.set_access(at, m.end - start, &m.peers) } {
                while m.list.len() > first {
                    let (len, memory) = m.list.pop().expect("an extent mapped above");
                    let memory = memory.expect("mapped, not a hole");
                    m.end -= len;
                    // SAFETY: mapped above, used by nothing yet.
                    match unsafe { backend.unmap(self.base + m.end as u64, len) } {
                        Ok(()) => m.spare.push((len, memory)), // held, counted
                        // Still mapped: never hand it out again (it leaks).
                        Err(_) => std::mem::forget(memory),
                    }
                }
                return Err(e);
            }
        }
        match failed {
            Some(_) if keep_partial && m.end > start => Ok(m.end),
            Some(e) => Err(e),
            None => Ok(m.end),
        }
    }

    /// Maps what is missing up to `bytes` (whole chunks) as one mapping
    /// of new memory: one `create`, one `map` and one `set_access`,
    /// whatever the size, so a large step costs about what a chunk does
    /// (it shrinks only as a whole). Banked memory of a shared
    /// reservation goes first, one mapping per piece. Returns the range's
    /// end ([`Region::end`]), which is short of `bytes` when pieces were
    /// mapped and then new memory could not be; errors as
    /// [`Region::grow_to`] when nothing could be mapped.
    pub fn grow_at_once(&self, bytes: usize) -> Result<usize> {
        self.grow_in_pieces(bytes, usize::MAX)
    }

    /// As [`Region::grow_at_once`], but new memory comes in mappings of
    /// at most `piece` bytes (rounded up to whole chunks), each its own
    /// `create` and `map`, with one `set_access` for the whole step: the
    /// region can then give the step back a piece at a time
    /// ([`Region::release`]), at the cost of a `create` and a `map` per
    /// piece.
    pub fn grow_in_pieces(&self, bytes: usize, piece: usize) -> Result<usize> {
        let mut m = self.lock();
        self.check_fits(bytes)?;
        // Mappings of new memory of at most a piece; banked pieces, one
        // mapping each; what was mapped before a failure stays.
        let chunk = self.chunk;
        let piece = (piece.max(chunk).checked_next_multiple_of(chunk)).unwrap_or(usize::MAX);
        self.map_range(
            &mut m,
            |missing| missing.next_multiple_of(chunk).min(piece),
            bytes,
            true,
        )
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

    /// Maps memory at the mapped end, without access yet (the caller
    /// grants it, [`Region::map_range`]): a spare piece of this region's holes
    /// that fits the range, else a banked piece (which may be shorter or
    /// longer than `len`, within the range; the first mapping takes none
    /// longer, as a pool keeps its first mapping), else `len` bytes (whole
    /// granules; at most the rest of the range) of new memory.
    fn map_extent(&self, m: &mut Extents<B>, len: usize) -> Result<()> {
        let at = self.base + m.end as u64;
        let len = len.min(self.reserved - m.end);
        let room = if m.end == 0 {
            len
        } else {
            self.reserved - m.end
        };
        let backend = &self.res.backend;
        let spare = (m.spare.iter().enumerate())
            .filter(|(_, (l, _))| *l <= room)
            .min_by_key(|(_, (l, _))| l.abs_diff(len))
            .map(|(i, _)| i);
        let (len, memory, banked) = match spare {
            Some(i) => {
                let (l, memory) = m.spare.swap_remove(i);
                (l, memory, false)
            }
            None => self.res.take(len, room).map_err(|e| match e {
                Error::OutOfMemory { requested, .. } => Error::OutOfMemory {
                    requested,
                    reserved: m.physical,
                    free: backend.free_memory(),
                },
                e => e,
            })?,
        };
        // SAFETY: `at..at + len` is inside the region (`len`, `room` and
        // `take` keep to the rest of the range) and past every extent (the
        // invariant on `Extents`).
        if let Err(e) = unsafe { backend.map(at, len, &memory) } {
            // Memory that fails to map goes back where it came from.
            match spare {
                Some(_) => m.spare.push((len, memory)),
                None => self.res.give(len, memory),
            }
            return Err(e);
        }
        if banked {
            self.res.reused.fetch_add(len, Ordering::Relaxed);
        }
        if spare.is_none() {
            self.res.note(self.part, len as isize);
            m.physical += len;
        }
        m.list.push((len, Some(memory)));
        m.end += len;
        Ok(())
    }

    /// Unmaps the mapping that starts at `offset` (from `base`) and keeps
    /// its memory for the next growth ([`Region::grow_to`] maps it at the
    /// end before any other): the range stays a hole until
    /// [`Region::fill_holes`] maps it again or [`Region::shrink_to`] takes
    /// the end back past it.
    /// Returns its length. An offset where no mapping starts, or the last
    /// mapping, is an [`Error::InvalidArgument`].
    ///
    /// How a pool grows without new memory when its free memory lies in
    /// runs too short for a block: whole free mappings move to the end.
    ///
    /// # Safety
    ///
    /// No work, queued or running, and no block handed out uses the
    /// mapping, and the owner never hands out its range again.
    pub unsafe fn punch(&self, offset: usize) -> Result<usize> {
        let mut m = self.lock();
        let last = m.list.len().saturating_sub(1);
        let Some((i, len)) = m.extent_at(offset, true).filter(|&(i, _)| i < last) else {
            return Err(Error::InvalidArgument(format!(
                "no mapping to unmap at offset {offset} (the last one stays)"
            )));
        };
        // SAFETY: forwarded from the caller.
        let memory = unsafe { self.unmap_extent(&mut m, i, offset, len) }?;
        m.spare.push((len, memory));
        Ok(len)
    }

    /// Unmaps the mapping of `len` bytes that starts at `offset` (from
    /// `base`), the last one included, and gives its memory back at once: to the
    /// reservation's bank, where its other regions map it first, or to the
    /// device for a region of its own. The range stays a hole: growth maps
    /// past the end, [`Region::fill_hole`] maps it again, and
    /// [`Region::shrink_to`] drops holes at the end. No mapping of that
    /// length there (say, the range was mapped again since, longer) is an
    /// [`Error::InvalidArgument`].
    ///
    /// How a device heap gives back memory while kernels run: it fences the
    /// mapping's pages for good, then unmaps it.
    ///
    /// # Safety
    ///
    /// As for [`Region::punch`].
    pub unsafe fn release(&self, offset: usize, len: usize) -> Result<()> {
        let mut m = self.lock();
        let Some((i, _)) = m.extent_at(offset, true).filter(|&(_, l)| l == len) else {
            return Err(Error::InvalidArgument(format!(
                "no mapping of {len} bytes to release at offset {offset}"
            )));
        };
        // SAFETY: forwarded from the caller.
        let memory = unsafe { self.unmap_extent(&mut m, i, offset, len) }?;
        self.hand_back(&mut m, len, memory);
        Ok(())
    }

    /// Unmaps extent `i` of `m`, a mapping of `len` bytes at `offset` from
    /// `base`, and returns its memory; the extent becomes a hole.
    ///
    /// # Safety
    ///
    /// Nothing uses the mapping (as for [`Region::punch`]).
    unsafe fn unmap_extent(
        &self,
        m: &mut Extents<B>,
        i: usize,
        offset: usize,
        len: usize,
    ) -> Result<B::Memory> {
        // SAFETY: extent `i` is one mapping (the invariant on `Extents`);
        // the caller guarantees nothing uses it.
        unsafe { self.res.backend.unmap(self.base + offset as u64, len) }?;
        Ok(m.list[i].1.take().expect("a mapped extent"))
    }

    /// Gives `len` bytes of memory the region held back to the reservation
    /// (banked, or released) and stops counting them.
    fn hand_back(&self, m: &mut Extents<B>, len: usize, memory: B::Memory) {
        m.physical -= len;
        self.res.note(self.part, -(len as isize));
        self.res.give(len, memory);
    }

    /// The holes at the end of the range, as one range: its offset from
    /// `base` and its length (`None` if the last extent is mapped).
    pub fn trailing_hole(&self) -> Option<(usize, usize)> {
        let m = self.lock();
        let len: usize = (m.list.iter().rev())
            .take_while(|(_, memory)| memory.is_none())
            .map(|(len, _)| len)
            .sum();
        (len > 0).then(|| (m.end - len, len))
    }

    /// Gives the spare memory of holes back (to the bank, or the device).
    fn drop_spare(&self, m: &mut Extents<B>) {
        for (len, memory) in std::mem::take(&mut m.spare) {
            self.hand_back(m, len, memory);
        }
    }

    /// Lets kernels on device `peer` read and write the region: what is
    /// mapped now and all it maps later, until
    /// [`Region::revoke_access`]. Granting the own device, or a device
    /// granted before, does nothing. A device that does not exist or has
    /// no peer path to this one is an error. So is a grant the driver
    /// refuses on a mapping: the grants made before it are undone, and
    /// `peer` has access to none; if undoing one fails too, `peer` stays
    /// listed in [`Region::peers`] (it may reach some mappings, and later
    /// mappings grant it), so that [`Region::revoke_access`] can take the
    /// rest away, or a second grant finish.
    pub fn grant_access(&self, peer: i32) -> Result<()> {
        let backend = &self.res.backend;
        backend.check_peer(peer)?;
        let mut m = self.lock();
        let whole = m.peers.contains(&peer) && !m.partial.contains(&peer);
        if peer == backend.device() || whole {
            return Ok(());
        }
        let extents: Vec<(u64, usize)> = m.extents(self.base).collect();
        let mut done = Vec::with_capacity(extents.len());
        for (at, len) in extents {
            // SAFETY: each extent is one mapping (the invariant on `Extents`).
            if let Err(e) = unsafe { backend.set_access(at, len, &[peer]) } {
                let mut undone = true;
                for (at, len) in done {
                    // SAFETY: as above; `peer` got access a moment ago and
                    // nothing it runs knows the memory yet.
                    undone &= unsafe { backend.revoke_access(at, len, peer) }.is_ok();
                }
                m.partial.retain(|&p| p != peer);
                m.peers.retain(|&p| p != peer);
                if !undone {
                    m.peers.push(peer);
                    m.partial.push(peer);
                }
                return Err(e);
            }
            done.push((at, len));
        }
        m.partial.retain(|&p| p != peer);
        if !m.peers.contains(&peer) {
            m.peers.push(peer);
        }
        Ok(())
    }

    /// Takes device `peer`'s access to the region away: from every
    /// mapping, and from those it maps later. A device never granted
    /// does nothing; the own device's access cannot be taken. When the
    /// driver refuses a mapping's revoke, `peer` has lost access to the
    /// mappings before it and keeps it to the others; it stays listed in
    /// [`Region::peers`] (and later mappings still grant it), so a second
    /// call can finish the revoke.
    ///
    /// # Safety
    ///
    /// No work on `peer`, queued or running, uses the region's memory.
    pub unsafe fn revoke_access(&self, peer: i32) -> Result<()> {
        let backend = &self.res.backend;
        if peer == backend.device() {
            return Err(Error::InvalidArgument(format!(
                "device {peer} owns this memory: its access cannot be revoked"
            )));
        }
        let mut m = self.lock();
        let Some(i) = m.peers.iter().position(|&p| p == peer) else {
            return Ok(());
        };
        for (at, len) in m.extents(self.base) {
            // SAFETY: each extent is one mapping; the caller guarantees
            // `peer` no longer uses it.
            unsafe { backend.revoke_access(at, len, peer) }?;
        }
        m.peers.remove(i);
        m.partial.retain(|&p| p != peer);
        Ok(())
    }

    /// The devices besides the own one granted access, in grant order.
    pub fn peers(&self) -> Vec<i32> {
        self.lock().peers.clone()
    }

    /// Shares `offset..offset + len` (from `base`) with another process:
    /// the handles of the mappings that cover it, in address order. The
    /// driver shares memory only whole, so the mappings may hold more
    /// than the range. A range that is empty or not wholly mapped is an
    /// error.
    pub fn share(&self, offset: usize, len: usize) -> Result<Exported<B>> {
        let m = self.lock();
        let end = offset
            .checked_add(len)
            .filter(|&end| len > 0 && end <= m.end)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "cannot share {len} bytes at offset {offset}: {} bytes are mapped",
                    m.end
                ))
            })?;
        let mut first = None;
        let mut pieces = Vec::new();
        for ((at, l, _), (_, memory)) in m.all(0).zip(&m.list) {
            let at = at as usize;
            if at + l > offset && at < end {
                let Some(memory) = memory else {
                    return Err(Error::InvalidArgument(format!(
                        "cannot share {len} bytes at offset {offset}: {l} bytes at {at} are unmapped"
                    )));
                };
                first.get_or_insert(at);
                pieces.push((l, self.res.backend.share(memory)?));
            }
        }
        Exported::from_handles(pieces, offset - first.unwrap_or(0), len)
    }

    /// Each mapping's offset from `base` and length, in address order
    /// (holes left out).
    pub fn mappings(&self) -> Vec<(usize, usize)> {
        let m = self.lock();
        m.extents(0).map(|(at, len)| (at as usize, len)).collect()
    }

    /// The last extent: its offset from `base` and its length. A hole
    /// only after [`Region::release`] of the last mapping
    /// ([`Region::shrink_to`] drops holes at the end; see
    /// [`Region::trailing_hole`]).
    pub fn last_extent(&self) -> Option<(usize, usize)> {
        let m = self.lock();
        m.list.last().map(|&(len, _)| (m.end - len, len))
    }

    /// Unmaps mappings from the end while the range still reaches `bytes`:
    /// a mapping that straddles `bytes` stays; holes at the new end go
    /// too. Returns the memory held afterwards ([`Region::mapped`]).
    ///
    /// # Safety
    ///
    /// No work, queued or running, and no block handed out uses the
    /// memory from `bytes` to the mapped end.
    pub unsafe fn shrink_to(&self, bytes: usize) -> Result<usize> {
        let mut m = self.lock();
        while let Some((len, mapped)) = m.list.last().map(|(len, mem)| (*len, mem.is_some())) {
            if m.end - len < bytes {
                break;
            }
            let at = self.base + (m.end - len) as u64;
            if mapped {
                // SAFETY: the last extent is one mapping (the invariant on
                // `Extents`) past `bytes`; the caller guarantees nothing
                // uses it.
                unsafe { self.res.backend.unmap(at, len) }?;
            }
            let (len, memory) = m.list.pop().expect("the last extent");
            m.end -= len;
            if let Some(memory) = memory {
                self.hand_back(&mut m, len, memory);
            }
        }
        // A hole at the end goes with the mapping after it.
        while m.list.last().is_some_and(|(_, mem)| mem.is_none()) {
            let (len, _) = m.list.pop().expect("the last extent");
            m.end -= len;
        }
        if m.end <= bytes {
            self.drop_spare(&mut m);
        }
        Ok(m.physical)
    }
}

impl<B: Backend> Extents<B> {
    /// Each extent's address, length and whether it is mapped (not a
    /// hole), in address order.
    fn all(&self, base: u64) -> impl Iterator<Item = (u64, usize, bool)> + '_ {
        self.list.iter().scan(base, |at, (len, memory)| {
            let start = *at;
            *at += *len as u64;
            Some((start, *len, memory.is_some()))
        })
    }

    /// The extent that starts at `offset` (from the base) and is mapped
    /// (or, with `mapped` false, a hole): its index and length.
    fn extent_at(&self, offset: usize, mapped: bool) -> Option<(usize, usize)> {
        (self.all(0).enumerate())
            .find(|&(_, (at, _, m))| at as usize == offset && m == mapped)
            .map(|(i, (_, len, _))| (i, len))
    }

    /// Each mapping's address and length, in address order (holes left
    /// out).
    fn extents(&self, base: u64) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.all(base)
            .filter(|&(_, _, mapped)| mapped)
            .map(|(at, len, _)| (at, len))
    }
}

impl<B: Backend> Drop for Region<B> {
    fn drop(&mut self) {
        // Errors cannot leave drop; whatever fails here leaks. Work still
        // queued may use the memory: wait for the device first.
        let _ = self.res.backend.synchronize_device();
        // SAFETY: nothing runs on the device any more, and the owner drops
        // the region only once no block of it is handed out. The memory
        // goes to the bank (or is released); the reservation goes with its
        // last region.
        if unsafe { self.shrink_to(0) }.is_err() {
            // What is still mapped stays so, and counted: the reservation
            // then keeps its range rather than give it back mapped.
            std::mem::forget(std::mem::take(&mut self.lock().list));
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

    /// A released mapping, the last one too, leaves a hole and its memory
    /// goes to the bank at once, where another region maps it; the region
    /// grows past its holes, and shrinking drops those at the end.
    #[test]
    fn a_released_mapping_is_a_hole_and_its_memory_is_banked_at_once() {
        let res = Reservation::shared(HostBackend::new(64 << 10, usize::MAX), 256 * MIB).unwrap();
        let heap = Region::within(&res, Part::DeviceHeap, 64 * MIB, 2 * MIB).unwrap();
        let pool = Region::within(&res, Part::Pool, 64 * MIB, 2 * MIB).unwrap();
        assert_eq!(heap.grow_at_once(2 * MIB).unwrap(), 2 * MIB);
        assert_eq!(heap.grow_at_once(8 * MIB).unwrap(), 8 * MIB); // one step of 6 MiB
        assert_eq!(heap.grow_at_once(12 * MIB).unwrap(), 12 * MIB); // one of 4 MiB
        assert_eq!(heap.trailing_hole(), None);
        // SAFETY: nothing uses host-backed test memory.
        unsafe {
            assert!(
                heap.release(MIB, 6 * MIB).is_err(),
                "no mapping starts there"
            );
            assert!(heap.release(2 * MIB, 4 * MIB).is_err(), "not its length");
            heap.release(2 * MIB, 6 * MIB).unwrap();
            assert!(
                heap.release(2 * MIB, 6 * MIB).is_err(),
                "a hole is not released twice"
            );
            heap.release(8 * MIB, 4 * MIB).unwrap();
        }
        assert_eq!((heap.mapped(), heap.end()), (2 * MIB, 12 * MIB));
        assert_eq!(heap.trailing_hole(), Some((2 * MIB, 10 * MIB)));
        let s = res.stats();
        assert_eq!(
            (s.banked, s.heap_mapped, s.created),
            (10 * MIB, 2 * MIB, 12 * MIB)
        );
        // The pool maps the banked pieces before it creates memory.
        assert_eq!(pool.grow_at_once(4 * MIB).unwrap(), 4 * MIB);
        let s = res.stats();
        assert_eq!(
            (s.banked, s.pool_mapped, s.created),
            (6 * MIB, 4 * MIB, 12 * MIB)
        );
        // The heap grows past its holes (the rest of the bank first).
        assert_eq!(heap.grow_at_once(18 * MIB).unwrap(), 18 * MIB);
        assert_eq!((heap.mapped(), heap.trailing_hole()), (8 * MIB, None));
        assert_eq!(res.stats().created, 12 * MIB);
        // A hole is filled in place: a banked piece of its length first.
        // SAFETY: as above.
        unsafe { heap.release(12 * MIB, 6 * MIB) }.unwrap();
        assert_eq!(res.stats().banked, 6 * MIB);
        assert_eq!(heap.fill_hole(12 * MIB).unwrap(), 6 * MIB);
        assert!(heap.fill_hole(12 * MIB).is_err(), "no hole there any more");
        let s = res.stats();
        assert_eq!((s.banked, s.created, heap.mapped()), (0, 12 * MIB, 8 * MIB));
        assert_eq!(heap.fill_hole(2 * MIB).unwrap(), 6 * MIB); // new memory
        assert_eq!((res.stats().created, heap.mapped()), (18 * MIB, 14 * MIB));
        assert_eq!(heap.holes(), vec![(8 * MIB, 4 * MIB)]);
        // SAFETY: as above.
        unsafe {
            heap.release(12 * MIB, 6 * MIB).unwrap();
            // The holes at the end go; the mapping before them stays.
            assert_eq!(heap.shrink_to(8 * MIB).unwrap(), 8 * MIB);
        }
        assert_eq!((heap.end(), heap.trailing_hole()), (8 * MIB, None));
        assert_eq!(res.stats().banked, 6 * MIB);
    }

    /// A punched mapping leaves a hole that nothing maps again, and its
    /// memory is mapped at the end by the next growth, before any new.
    #[test]
    fn a_punched_mapping_is_a_hole_and_its_memory_maps_at_the_end() {
        let r = Region::with_backend(HostBackend::new(64 << 10, usize::MAX), 64 * MIB, 2 * MIB)
            .unwrap();
        assert_eq!(r.grow_to(6 * MIB).unwrap(), 6 * MIB);
        let maps = r.backend().counts().maps;
        // SAFETY: nothing uses host-backed test memory.
        unsafe {
            assert_eq!(r.punch(2 * MIB).unwrap(), 2 * MIB);
            assert!(r.punch(2 * MIB).is_err(), "a hole is not punched twice");
            assert!(r.punch(4 * MIB).is_err(), "the last mapping stays");
            assert!(r.punch(MIB).is_err(), "no mapping starts there");
        }
        assert_eq!(r.holes(), vec![(2 * MIB, 2 * MIB)]);
        assert_eq!(
            (r.mapped(), r.end()),
            (6 * MIB, 6 * MIB),
            "the memory is held"
        );
        assert_eq!(r.mappings(), vec![(0, 2 * MIB), (4 * MIB, 2 * MIB)]);
        assert!(
            r.share(MIB, 2 * MIB).is_err(),
            "a range over a hole is not shared"
        );
        let physical = r.backend().physical();
        assert_eq!(r.grow_to(10 * MIB).unwrap(), 10 * MIB);
        assert_eq!(r.backend().counts().maps, maps + 2);
        assert_eq!(
            r.backend().physical(),
            physical + 2 * MIB,
            "the spare piece, then one new chunk"
        );
        assert_eq!((r.mapped(), r.end()), (8 * MIB, 10 * MIB));
        // SAFETY: as above.
        unsafe {
            assert_eq!(r.shrink_to(6 * MIB).unwrap(), 4 * MIB);
            assert_eq!(r.end(), 6 * MIB);
            // The last mapping, and the hole before it, go together.
            assert_eq!(r.shrink_to(4 * MIB).unwrap(), 2 * MIB);
            assert_eq!((r.end(), r.holes()), (2 * MIB, vec![]));
            assert_eq!(r.shrink_to(0).unwrap(), 0);
        }
        assert_eq!(r.backend().physical(), 0);
    }

    /// A spare piece that fails to map stays spare and counted; filling
    /// the holes maps spare pieces back where they were, then new memory.
    #[test]
    fn spare_memory_survives_a_failed_map_and_fills_holes() {
        let r = Region::with_backend(HostBackend::new(64 << 10, usize::MAX), 16 * MIB, 2 * MIB)
            .unwrap();
        r.grow_to(8 * MIB).unwrap();
        // SAFETY: nothing uses host-backed test memory.
        unsafe {
            r.punch(2 * MIB).unwrap();
            r.punch(4 * MIB).unwrap();
        }
        let physical = r.backend().physical();
        r.backend()
            .refuse_access_at(r.base() + 8 * MIB as u64, true, false);
        assert!(r.grow_to(10 * MIB).is_err());
        assert_eq!((r.mapped(), r.end()), (8 * MIB, 8 * MIB));
        assert_eq!(r.reservation().stats().pool_mapped, 8 * MIB);
        assert_eq!(
            r.backend().physical(),
            physical,
            "nothing created, nothing lost"
        );
        r.backend()
            .refuse_access_at(r.base() + 8 * MIB as u64, false, false);
        assert_eq!(r.grow_to(10 * MIB).unwrap(), 10 * MIB, "a spare piece");
        let (filled, done) = r.fill_holes();
        done.unwrap();
        assert_eq!(filled, vec![(2 * MIB, 2 * MIB), (4 * MIB, 2 * MIB)]);
        assert!(r.holes().is_empty());
        assert_eq!(r.mappings().len(), 5);
        assert_eq!((r.mapped(), r.end()), (10 * MIB, 10 * MIB));
        assert_eq!(r.backend().physical(), physical + 2 * MIB);
        assert_eq!(r.reservation().stats().pool_mapped, 10 * MIB);
    }
}

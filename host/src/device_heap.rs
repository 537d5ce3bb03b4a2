//! The memory behind an in-kernel heap: zeroed metadata and a
//! page-aligned data region from the driver, the handle kernels take, and
//! statistics read back from the device.
//!
//! A heap is either fixed ([`DeviceHeap::new`], one `cuMemAlloc`) or
//! growable ([`DeviceHeap::growable`]): its data region is a reserved
//! address range with memory mapped behind a prefix, and
//! [`DeviceHeap::grow`] maps more and raises the heap's usable-page limit
//! in device memory. Kernels read that limit when they look for a fresh
//! page, so the heap grows between launches ([`DeviceHeap::grow`],
//! [`DeviceHeap::reserve`], [`DeviceHeap::run_growing`]) and, while a
//! [`GrowthService`] from [`DeviceHeap::serve`] lives, while kernels run
//! (see [`crate::growth`]).

use crate::driver::{DeviceMemory, Gpu, Param};
use crate::error::{Context, Error, Result};
use crate::growth::{Grower, GrowthService, GrowthStats};
use crate::vmm::{Part, Region, Reservation, VmmRegion};
use cudarc::driver::CudaStream;

/// Mapping unit of a growable heap's range (steps map many at once).
const GROWTH_CHUNK: usize = 2 << 20;
use cudarc::driver::CudaContext;
use cuheap_core::heap::Placement;
use cuheap_core::page::PageDesc;
use cuheap_core::{Counters, Counts, Heap, HeapHandle, Layout, Stats, Tallies, PAGE_SIZE};
use std::mem::{align_of, offset_of, size_of};
use std::sync::Arc;

enum Data {
    Fixed { _memory: DeviceMemory },
    Growable(Arc<Grower>),
}

/// What [`DeviceHeap::run_growing`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Growth {
    /// Launches run, the last one with no failed allocation.
    pub launches: u32,
    /// Bytes the heap grew by.
    pub grown: usize,
    /// Bytes usable at the end.
    pub capacity: usize,
}

/// A device heap of `page_count` pages, `slots` current-page slots (one
/// per SM).
pub struct DeviceHeap {
    ctx: Arc<CudaContext>,
    meta: DeviceMemory,
    // The handle points into it.
    data: Data,
    handle: HeapHandle,
    layout: Layout,
    /// The heap's placement bits, kept here to be written again after
    /// [`DeviceHeap::reset`] zeroes the metadata and after
    /// [`DeviceHeap::trim`] writes back its copy. The lock makes each
    /// change and its write to the device one step.
    placement: std::sync::Mutex<u64>,
}

fn pages_of(bytes: usize) -> Result<u32> {
    let pages = bytes.div_ceil(PAGE_SIZE);
    if pages == 0 || pages > u32::MAX as usize / 2 {
        return Err(Error::InvalidArgument(format!("heap of {bytes} bytes")));
    }
    Ok(pages as u32)
}

impl DeviceHeap {
    /// A heap with `bytes` of block memory (rounded up to whole 64 KiB
    /// pages) for `gpu`, one slot per SM.
    pub fn new(gpu: &Gpu, bytes: usize) -> Result<DeviceHeap> {
        let pages = pages_of(bytes)?;
        let slots = gpu.info().sms.max(1);
        let layout = Layout::new(pages, slots);
        let meta = gpu.alloc_zeroed(layout.meta_bytes)?;
        let data = gpu.alloc_zeroed(layout.data_bytes() + PAGE_SIZE)?;
        let base = data.ptr().div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64;
        let handle = HeapHandle {
            meta: meta.ptr(),
            data: base,
            page_count: pages,
            slots,
        };
        Ok(DeviceHeap {
            ctx: gpu.context().clone(),
            meta,
            data: Data::Fixed { _memory: data },
            handle,
            layout,
            placement: std::sync::Mutex::new(0),
        })
    }

    /// A heap that starts with `initial` bytes mapped and may grow to
    /// `max` bytes of address space (its metadata is sized for `max`).
    pub fn growable(gpu: &Gpu, initial: usize, max: usize) -> Result<DeviceHeap> {
        DeviceHeap::on_region(
            gpu,
            VmmRegion::new(gpu.context(), max, GROWTH_CHUNK)?,
            initial,
        )
    }

    /// A growable heap (as [`DeviceHeap::growable`]) whose address range
    /// (`max` bytes) is carved from `res` and whose physical memory is
    /// `res`'s: growth maps memory a [`Pool`](crate::Pool) or another heap
    /// of the reservation gave back before it creates any, and
    /// [`DeviceHeap::trim`] banks what it unmaps for them. `res` must be
    /// on `gpu`'s device.
    pub fn growable_in(
        gpu: &Gpu,
        res: &Arc<Reservation>,
        initial: usize,
        max: usize,
    ) -> Result<DeviceHeap> {
        let theirs = res.backend().context().cu_device();
        if theirs != gpu.context().cu_device() {
            return Err(Error::InvalidArgument(
                "the reservation is on another device than the heap".into(),
            ));
        }
        let region = Region::within(res, Part::DeviceHeap, max, GROWTH_CHUNK)?;
        DeviceHeap::on_region(gpu, region, initial)
    }

    fn on_region(gpu: &Gpu, region: VmmRegion, initial: usize) -> Result<DeviceHeap> {
        // An initial size past the range maps the whole range.
        let initial = initial.max(PAGE_SIZE).min(region.reserved());
        let pages = pages_of(region.reserved())?;
        let slots = gpu.info().sms.max(1);
        let layout = Layout::new(pages, slots);
        let meta = gpu.alloc_zeroed(layout.meta_bytes)?;
        let handle = HeapHandle {
            meta: meta.ptr(),
            data: region.base(),
            page_count: pages,
            slots,
        };
        let counters = meta.ptr() + layout.counters as u64;
        let heap = DeviceHeap {
            ctx: gpu.context().clone(),
            meta,
            data: Data::Growable(Grower::new(
                gpu.context(),
                region,
                counters,
                HeapArg::from(handle),
            )?),
            handle,
            layout,
            placement: std::sync::Mutex::new(0),
        };
        heap.grow(initial)?;
        Ok(heap)
    }

    /// Maps memory until `bytes` are usable (one mapping of new memory,
    /// whatever the step, or one per piece after
    /// [`DeviceHeap::set_growth_piece`]; banked pieces of a shared
    /// reservation first) and writes the new page limit (on the heap's own
    /// non-blocking stream); launches after this call use the new pages,
    /// and so do running kernels that look for a fresh page. Returns the
    /// usable bytes. Fixed heaps cannot grow. Short of `bytes` (the device
    /// or the range full) it is an [`Error::OutOfMemory`]; what it mapped
    /// before that (pieces, banked memory) stays mapped and usable.
    ///
    /// After trims on a stream ([`DeviceHeap::trim_on`]) it first unmaps
    /// what those that are done fenced, then, while no growth service
    /// runs, maps memory into their holes before it maps past them, and
    /// unfences their pages with a kernel on the heap's stream that it
    /// waits for (a kernel that fills the GPU delays it).
    pub fn grow(&self, bytes: usize) -> Result<usize> {
        self.grower()?.grow(bytes)
    }

    fn grower(&self) -> Result<&Arc<Grower>> {
        match &self.data {
            Data::Growable(g) => Ok(g),
            Data::Fixed { .. } => Err(Error::InvalidArgument(
                "a fixed-size heap cannot grow; use DeviceHeap::growable".into(),
            )),
        }
    }

    /// Starts a thread that grows this heap while kernels run, until the
    /// returned service is dropped: a kernel's thread that finds the heap
    /// short asks for pages and waits until they are mapped (steps at
    /// least double the heap), instead of getting null. Null still comes
    /// when the reservation or the device is full, once the service
    /// stopped, or after a wait of 2 s. One service per heap; a fixed heap
    /// has none ([`Error::InvalidArgument`]).
    ///
    /// While a kernel that may wait for growth runs, no host thread of the
    /// process may wait in a synchronous copy queued behind it (a
    /// `DeviceMemory::read`, [`DeviceHeap::stats`] or
    /// [`DeviceHeap::counts`], or `cudaMemcpy`, right after the launch):
    /// the service's driver calls then wait until the kernel ends, and its
    /// waiting threads time out (on an H100 80 GB, 1M threads got 828,921
    /// nulls in 64 s: `docs/growth-behind-a-sync-copy-h100.txt`).
    /// Synchronise first, then read.
    pub fn serve(&self) -> Result<GrowthService<'_>> {
        GrowthService::start(self.grower()?, None)
    }

    /// Starts a growth service, as [`DeviceHeap::serve`], that also keeps
    /// memory ahead of the heap's fill, so that kernels find it mapped
    /// instead of waiting: the service reads the pages the heap's classes
    /// and spans hold (a copy of the heap's counters from the device,
    /// beside the kernels: every 20 µs while it changes, backing off to every 1 ms
    /// while it does not), and once they reach `fill_percent` of the
    /// usable memory it maps the next step (at least doubling the usable
    /// memory) and publishes it at once, with no thread asking.
    ///
    /// The price is memory: right after a step, the heap maps up to about
    /// `2 * 100 / fill_percent` times the pages it holds (2.7x at 75%).
    /// Threads still wait when the heap fills faster than the service
    /// maps (a kernel that fills a step in less time than the mapping
    /// takes) or when a step ahead cannot be mapped (the device or the
    /// reservation full; such a step is tried again once the usable
    /// memory changes). A trim that leaves the heap above the fill makes
    /// the service map again: keep more than the fill's share in
    /// [`DeviceHeap::trim_on`]. `fill_percent` is 1 to 99, else
    /// [`Error::InvalidArgument`].
    pub fn serve_ahead(&self, fill_percent: u32) -> Result<GrowthService<'_>> {
        GrowthService::start(self.grower()?, Some(fill_percent))
    }

    /// How many times threads of kernels waited for growth so far (a
    /// warp's lanes of one class that wait as one count once), read from
    /// the device.
    pub fn growth_waits(&self) -> Result<u64> {
        Ok(self.counters()?.grow_waits.into_inner())
    }

    /// Why the growth service last refused to grow the heap (the
    /// device's or the reservation's limit, or a driver error), if it did.
    pub fn growth_refusal(&self) -> Option<String> {
        match &self.data {
            Data::Growable(g) => g.last_refusal(),
            Data::Fixed { .. } => None,
        }
    }

    /// What growth did so far (zeros for a fixed heap).
    pub fn growth_stats(&self) -> GrowthStats {
        match &self.data {
            Data::Growable(g) => g.stats(),
            Data::Fixed { .. } => GrowthStats::default(),
        }
    }

    /// Makes room for `bytes` more than the heap's footprint now (pages
    /// taken by classes and spans): grows a growable heap until its
    /// capacity is at least that. Returns the capacity. A fixed heap only
    /// checks: [`Error::OutOfMemory`] when it has less room.
    pub fn reserve(&self, bytes: usize) -> Result<usize> {
        let want = (self.stats()?.bytes_reserved as usize).saturating_add(bytes);
        if want <= self.capacity() {
            return Ok(self.capacity());
        }
        match &self.data {
            Data::Growable(g) if want <= g.room() => self.grow(want),
            _ => Err(self.short_of(want - self.capacity())),
        }
    }

    /// Runs `launch(attempt)` (attempt 0, 1, ...), which enqueues work
    /// that allocates from this heap, then waits for the device. While
    /// allocations failed for want of memory, grows the heap by at least
    /// their bytes (and at least doubles it) and runs `launch` again: the
    /// kernel redoes only what failed, e.g. threads that hold no block yet
    /// (`Bench::alloc_missing` does this). Blocks from earlier attempts
    /// stay valid: growth only adds pages. The natural way to launch a
    /// kernel whose output size is unknown.
    ///
    /// Fails with [`Error::OutOfMemory`] when the heap cannot grow enough
    /// (a fixed heap, the reservation or the device full) or `launch` was
    /// run `max_launches` times and allocations still failed.
    pub fn run_growing(
        &self,
        max_launches: u32,
        mut launch: impl FnMut(u32) -> Result<()>,
    ) -> Result<Growth> {
        let start = self.capacity();
        let mut seen = self.shortfall()?;
        for attempt in 0..max_launches {
            launch(attempt)?;
            crate::driver::before_bind();
            self.ctx.synchronize().during("cuCtxSynchronize")?;
            let now = self.shortfall()?;
            let (failed, bytes) = (now.0 - seen.0, now.1 - seen.1);
            seen = now;
            if failed == 0 {
                return Ok(Growth {
                    launches: attempt + 1,
                    grown: self.capacity() - start,
                    capacity: self.capacity(),
                });
            }
            if attempt + 1 == max_launches {
                break;
            }
            let Data::Growable(g) = &self.data else {
                return Err(self.short_of(bytes as usize));
            };
            let cap = self.capacity();
            let target = cap
                .saturating_mul(2)
                .max(cap.saturating_add((bytes as usize).saturating_mul(2)))
                .min(g.room());
            if target <= cap {
                return Err(self.short_of(bytes as usize));
            }
            match self.grow(target) {
                Ok(_) => {}
                // Short of the target, but grown: the retry may fit.
                Err(Error::OutOfMemory { .. }) if self.capacity() > cap => {}
                Err(e) => return Err(e),
            }
        }
        Err(self.short_of(seen.1 as usize))
    }

    /// Failed allocations and their bytes, ever (read from the device).
    pub fn shortfall(&self) -> Result<(u64, u64)> {
        let c = self.counters()?;
        Ok((
            c.failed_allocs.load(std::sync::atomic::Ordering::Relaxed),
            c.failed_bytes.load(std::sync::atomic::Ordering::Relaxed),
        ))
    }

    /// The heap's event counters, read from the device (synchronous).
    fn counters(&self) -> Result<Counters> {
        let mut c = [Counters::new()];
        // SAFETY: Counters is #[repr(C)] integer atomics: any bytes the
        // device holds are a valid value.
        let bytes = unsafe { as_bytes_mut(&mut c) };
        self.meta.read(self.layout.counters, bytes)?;
        let [c] = c;
        Ok(c)
    }

    fn short_of(&self, bytes: usize) -> Error {
        crate::driver::before_bind();
        Error::OutOfMemory {
            requested: bytes,
            reserved: self.capacity(),
            free: self.ctx.mem_get_info().map(|(free, _)| free).unwrap_or(0),
        }
    }

    pub fn handle(&self) -> HeapHandle {
        self.handle
    }

    /// The handle as a kernel parameter takes it (by value).
    pub fn arg(&self) -> HeapArg {
        HeapArg::from(self.handle)
    }

    /// Makes this the heap that `cuheap_malloc`/`cuheap_free` use in
    /// `gpu`'s module: writes its handle to the module global
    /// `cuheap_heap` (synchronous). Launches of kernels that call them
    /// have the contract of every launch: the heap stays live until they end.
    pub fn install(&self, gpu: &Gpu) -> Result<()> {
        gpu.write_global("cuheap_heap", &self.arg())
    }

    /// Whether a slot that finds no partly used page of a class on its own
    /// or its neighbours' lists looks at far slots' lists before it takes
    /// a fresh page ([`Placement::FAR_LISTS`]; off by default). On, a
    /// heap whose blocks are freed on other SMs than the ones that
    /// allocated them (threads land on other SMs at each launch) reuses
    /// its partly used pages instead of growing its footprint: on an H100
    /// 80 GB, `cuheap bench device`'s churn case ends at 1.37 of the live
    /// bytes with far lists and 1.83-1.86 without, and 1M x 256 B to
    /// 4 KiB pairs take 4-7% longer (`docs/ab-far-probes-h100.txt`). An
    /// install that finds its near lists empty reads 16 more list heads.
    /// The setting survives [`DeviceHeap::reset`] and [`DeviceHeap::trim`].
    ///
    /// The word is copied to the device on the legacy default stream
    /// (synchronous for the host): work queued after it there or on a
    /// blocking stream sees it; kernels running meanwhile, or on
    /// non-blocking streams, see it once the copy lands. Either value is
    /// valid at any moment (it only orders an install's search), so this
    /// may be called while kernels run. A device heap uses no other
    /// placement bit, so the whole word is written.
    pub fn set_far_lists(&self, on: bool) -> Result<()> {
        let mut bits = self.placement.lock().unwrap_or_else(|p| p.into_inner());
        *bits = if on { Placement::FAR_LISTS } else { 0 };
        self.write_placement(*bits)
    }

    /// Whether far lists are on, as the device's copy of the word says.
    pub fn far_lists(&self) -> Result<bool> {
        Ok(self
            .counters()?
            .placement
            .load(std::sync::atomic::Ordering::Relaxed)
            & Placement::FAR_LISTS
            != 0)
    }

    /// Writes placement bits `bits` to the heap's counters on the device.
    fn write_placement(&self, bits: u64) -> Result<()> {
        self.meta.write(
            self.layout.counters + offset_of!(Counters, placement),
            &[bits],
        )
    }

    /// Writes the kept placement bits to the device again.
    fn restore_placement(&self) -> Result<()> {
        let bits = self.placement.lock().unwrap_or_else(|p| p.into_inner());
        self.write_placement(*bits)
    }

    /// Whether the heap can grow ([`DeviceHeap::growable`] and
    /// [`DeviceHeap::growable_in`]) or is fixed ([`DeviceHeap::new`]).
    pub fn is_growable(&self) -> bool {
        matches!(self.data, Data::Growable(_))
    }

    /// Bytes of block memory usable now.
    pub fn capacity(&self) -> usize {
        match &self.data {
            Data::Fixed { .. } => self.layout.data_bytes(),
            Data::Growable(g) => g.region.mapped(),
        }
    }

    /// Bytes of metadata on the device.
    pub fn meta_bytes(&self) -> usize {
        self.layout.meta_bytes
    }

    /// Empties the heap. A growable heap keeps its mapped memory usable;
    /// the far-lists setting ([`DeviceHeap::set_far_lists`]) stays.
    ///
    /// # Safety
    ///
    /// No kernel that uses this heap is running or queued, on any stream:
    /// the metadata is cleared under it (on the legacy default stream,
    /// which does not wait for non-blocking streams), and blocks it holds
    /// would be handed out again.
    pub unsafe fn reset(&self) -> Result<()> {
        let Data::Growable(g) = &self.data else {
            self.meta.zero()?;
            return self.restore_placement();
        };
        g.finish_trims(true)?;
        g.forget_lost_trims();
        g.exclusive(|| {
            // Holes at the end go; the pages of those before mapped memory
            // stay fenced in the cleared metadata.
            if let Some((at, _)) = g.region.trailing_hole() {
                // SAFETY: holes hold no memory.
                unsafe { g.region.shrink_to(at) }?;
            }
            let holes = g.region.holes();
            if holes.is_empty() {
                return self.meta.zero();
            }
            self.with_host_copy(false, |heap| {
                for &(at, len) in &holes {
                    let fenced =
                        heap.fence((at / PAGE_SIZE) as u32, ((at + len) / PAGE_SIZE) as u32);
                    debug_assert!(fenced, "a cleared page map has every page free");
                }
                Ok(())
            })
        })?;
        self.restore_placement()?;
        g.restore()
    }

    /// Runs `f` on a view of a host copy of the heap's metadata (read
    /// from the device, or zeroed when `read` is false), then writes the
    /// copy back.
    fn with_host_copy<T>(
        &self,
        read: bool,
        f: impl FnOnce(&Heap<'_, u32>) -> Result<T>,
    ) -> Result<T> {
        let mut meta = vec![MetaLine([0; 128]); self.layout.meta_bytes.div_ceil(128)];
        if read {
            // SAFETY: plain bytes.
            let bytes = unsafe { as_bytes_mut(&mut meta) };
            self.meta.read(0, &mut bytes[..self.layout.meta_bytes])?;
        }
        let host = HeapHandle {
            meta: meta.as_ptr() as u64,
            ..self.handle
        };
        // SAFETY: `meta` is a copy of the heap's metadata, 128-byte
        // aligned and as long as the layout says; the view only touches
        // metadata (never the data region, whose addresses are the
        // device's), and nothing else uses the copy meanwhile.
        let heap = unsafe { Heap::<u32>::from_handle(&host) };
        let out = f(&heap);
        // SAFETY: plain bytes.
        let bytes = unsafe { as_bytes_mut(&mut meta) };
        self.meta.write(0, &bytes[..self.layout.meta_bytes])?;
        out
    }

    /// Gives back the memory at the end of a growable heap that no block
    /// uses, keeping at least `keep` bytes mapped: retires the empty
    /// pages that slots and lists still hold (the core's `scavenge`, run
    /// on a host copy of the metadata), then unmaps whole growth steps
    /// from the end while none of their pages is in use, and lowers the
    /// page limit. Returns the bytes mapped afterwards. The memory goes
    /// back to the device, or, for a heap in a shared [`Reservation`]
    /// ([`DeviceHeap::growable_in`]), to its bank, where the reservation's
    /// pool and heaps map it first when they grow. A fixed heap keeps
    /// its memory. Growth maps the range again later, blocks keep their
    /// addresses, and a step that holds one live block stays.
    ///
    /// Once the heap's upkeep kernels are loaded (by
    /// [`DeviceHeap::set_growth_piece`] or [`DeviceHeap::trim_on`]), and
    /// while no growth service runs, it also gives back the free mappings
    /// before the last one in use (whole steps, or pieces): it fences their
    /// pages in the metadata, writes that back, then unmaps them, and they
    /// stay holes that [`DeviceHeap::grow`] maps again.
    ///
    /// # Time complexity
    ///
    /// Two copies of the metadata (about 1 MiB per GiB of reservation)
    /// and O(slots x classes + pages) work on the host.
    ///
    /// # Safety
    ///
    /// As for [`DeviceHeap::reset`]: no kernel that uses this heap is
    /// running or queued, on any stream.
    pub unsafe fn trim(&self, keep: usize) -> Result<usize> {
        let Data::Growable(g) = &self.data else {
            return Ok(self.capacity());
        };
        g.finish_trims(true)?;
        g.exclusive(|| {
            let region = &g.region;
            let out = self.with_host_copy(true, |heap| {
                heap.scavenge();
                let page = |bytes: usize| (bytes / PAGE_SIZE) as u32;
                let mut failed = Ok(());
                loop {
                    // Holes at the end (trims while kernels ran) go first:
                    // their pages are fenced, and unfenced here, where no
                    // kernel runs, so that growth can map them again.
                    if let Some((at, len)) = region.trailing_hole() {
                        // SAFETY: holes hold no memory.
                        if let Err(e) = unsafe { region.shrink_to(at) } {
                            failed = Err(e);
                            break;
                        }
                        // SAFETY: a trim fenced these pages (all of them:
                        // it unmaps only what it fenced) and nothing uses
                        // them; no kernel runs (the caller's contract).
                        unsafe { heap.unfence(page(at), page(at + len)) };
                        continue;
                    }
                    let Some((start, len)) = region.last_extent() else {
                        break;
                    };
                    if start < keep.max(PAGE_SIZE)
                        || heap.any_in_use(page(start), page(start + len))
                    {
                        break;
                    }
                    // SAFETY: no page of the step is in use (the page map,
                    // after the scavenge) and no kernel runs (the caller's
                    // contract); the limit written below keeps later claims
                    // out of it.
                    if let Err(e) = unsafe { region.shrink_to(start) } {
                        failed = Err(e);
                        break;
                    }
                    // Holes before the step go with it: their pages too.
                    let end = region.end();
                    if end < start {
                        // SAFETY: as for the holes at the end above.
                        unsafe { heap.unfence(page(end), page(start)) };
                    }
                }
                // Then free mappings before the last one in use, when
                // growth can map their holes again: fenced here, unmapped
                // once the fences are on the device.
                let fenced = match failed.is_ok() && g.can_punch() {
                    true => fence_free(region, heap, keep.max(PAGE_SIZE)),
                    false => Vec::new(),
                };
                // Whatever failed, the limit is what the range covers now:
                // lowered past what went, and raised over memory a failed
                // step mapped but did not publish.
                heap.set_limit(page(region.end()));
                // Asks from before stand above the new limit: drop them, or
                // they would keep new asks from ringing (see `restore`).
                let c = heap.counters();
                let limit = heap.limit() as u64;
                c.grow_want
                    .store(limit, std::sync::atomic::Ordering::Relaxed);
                c.grow_rung
                    .store(limit, std::sync::atomic::Ordering::Relaxed);
                // A timeout at a limit the trim came back to must not keep
                // later launches from asking there.
                c.grow_stalled
                    .store(0, std::sync::atomic::Ordering::Relaxed);
                // Fresh pages are searched for in the whole heap again.
                c.grow_floor.store(0, std::sync::atomic::Ordering::Relaxed);
                failed.map(|()| fenced)
            });
            // The fenced mappings go now that no allocation can take their
            // pages; one that fails to unmap stays mapped and fenced
            // (unused until a reset), and its error is returned.
            let out = out.and_then(|fenced| {
                let mut failed = Ok(());
                for (at, len) in fenced {
                    // SAFETY: every page of the mapping is fenced on the
                    // device (the copy was written back) and no kernel
                    // runs (the caller's contract); it is one mapping the
                    // layout listed, of its length.
                    if let Err(e) = unsafe { region.release(at, len) } {
                        failed = failed.and(Err(e));
                    }
                }
                failed
            });
            g.published_as(region.end());
            // A `set_far_lists` since the copy was read wins.
            self.restore_placement()?;
            out.map(|()| region.mapped())
        })
    }

    /// Makes the heap's later growth steps map new memory in pieces of at
    /// most `piece` bytes (rounded up to whole 2 MiB chunks; 0: one
    /// mapping per step, the default), each of which a trim gives back
    /// alone: a step that holds a few live blocks then keeps only the
    /// pieces they are in. Each piece costs its own `cuMemCreate` and
    /// `cuMemMap` (tens of microseconds), so small pieces make growth,
    /// and growth while kernels run above all, slower: `cuheap bench
    /// device` measures both sides. Returns the piece (0 for whole steps).
    ///
    /// It also loads the heap's upkeep kernels from `gpu`'s module (as
    /// [`DeviceHeap::trim_on`] does: `cuheap::PTX` and `cuheap::BENCH_PTX`
    /// hold them),
    /// and from then on [`DeviceHeap::trim`] also gives back free
    /// mappings before the last one in use while no growth service runs,
    /// leaving holes that [`DeviceHeap::grow`] maps again. A fixed heap
    /// is an [`Error::InvalidArgument`].
    ///
    /// In a shared [`Reservation`], banked memory is mapped as the piece
    /// it was banked as, which may be longer than `piece` (a heap's whole
    /// step, say): only new memory comes in pieces.
    pub fn set_growth_piece(&self, gpu: &Gpu, piece: usize) -> Result<usize> {
        self.grower()?.set_piece(gpu, piece)
    }

    /// The pieces growth maps (0: one mapping per step; see
    /// [`DeviceHeap::set_growth_piece`]); 0 for a fixed heap.
    pub fn growth_piece(&self) -> usize {
        match &self.data {
            Data::Growable(g) => g.piece(),
            Data::Fixed { .. } => 0,
        }
    }

    /// Gives back, in stream order, the memory of a growable heap's steps
    /// that no block uses, keeping at least `keep` bytes mapped, while
    /// kernels on other streams go on using the heap: after the work
    /// queued on `stream`, a kernel retires the empty pages that slots
    /// and lists hold and fences each step it finds free (from the end),
    /// so no allocation can take its pages; once `stream` gets past it,
    /// the heap unmaps those steps and their memory goes to the device, or
    /// for a heap in a shared [`Reservation`], to its bank, where the
    /// reservation's pool maps it first. The host never waits: the memory
    /// goes at the heap's next call that looks ([`DeviceHeap::finish_trims`],
    /// [`DeviceHeap::grow`], [`DeviceHeap::stats`], the next `trim_on`,
    /// [`DeviceHeap::trim`], [`DeviceHeap::reset`]) or from its growth
    /// service's thread.
    ///
    /// A step given back this way stays a hole in the heap's range, its
    /// pages fenced: growth while kernels run maps past it (the range is
    /// address space, and reserving plenty costs nothing);
    /// [`DeviceHeap::grow`] (from the host, while no growth service runs)
    /// maps memory into holes again before it maps past them, and unfences
    /// their pages with a kernel on the heap's stream; a trim between
    /// launches drops holes at the end. A step that holds one live block,
    /// or whose pages a kernel takes first, stays mapped. Blocks keep their
    /// addresses. A fixed heap keeps its memory.
    ///
    /// `gpu`'s module must hold the upkeep kernels (`cuheap_fence_free`,
    /// `cuheap_unfence`), as `cuheap::PTX` and `cuheap::BENCH_PTX` do (the
    /// modules of `cuheap::open_gpu` and `cuheap::open_bench_gpu`), on the
    /// heap's device (once loaded, they
    /// also let [`DeviceHeap::trim`], while no growth service runs, give
    /// back free steps or pieces before the last one in use); else
    /// [`Error::InvalidArgument`]. At most 8 trims wait to be finished at
    /// once (then [`Error::InvalidArgument`] too: finish them first).
    pub fn trim_on(&self, gpu: &Gpu, stream: &Arc<CudaStream>, keep: usize) -> Result<()> {
        match &self.data {
            Data::Growable(g) => g.trim_on(gpu, stream, keep),
            Data::Fixed { .. } => Ok(()),
        }
    }

    /// Unmaps what the trims queued by [`DeviceHeap::trim_on`] fenced,
    /// for those whose streams got past them (with `wait`, for all, after
    /// waiting for them). Returns the bytes given back.
    pub fn finish_trims(&self, wait: bool) -> Result<usize> {
        match &self.data {
            Data::Growable(g) => g.finish_trims(wait),
            Data::Fixed { .. } => Ok(0),
        }
    }

    /// Reads the heap's counts (synchronous): allocations and frees ever,
    /// blocks in use, failures by cause, spans, the footprint and its
    /// peak. Only the counters and the slots' tallies are copied (about
    /// 34 KiB for 132 slots), not the page table that [`DeviceHeap::stats`]
    /// scans. Exact between launches. The copy is on the legacy default
    /// stream: it waits for the kernels queued there and on blocking
    /// streams, and must not wait behind one that waits for growth (see
    /// [`DeviceHeap::serve`]).
    pub fn counts(&self) -> Result<Counts> {
        let words = Tallies::words(self.handle.slots);
        let len = Layout::TALLIES + words * 8;
        let mut lines = vec![MetaLine([0; 128]); len.div_ceil(128)];
        // SAFETY: plain bytes.
        let bytes = unsafe { as_bytes_mut(&mut lines) };
        self.meta.read(self.layout.counters, &mut bytes[..len])?;
        let base = lines.as_ptr() as *const u8;
        // SAFETY: the copy is 128-byte aligned and holds the counters at 0
        // and `words` tally words at `Layout::TALLIES` (a multiple of 128);
        // both are integer atomics, valid for any bytes, and nothing
        // changes the copy while these borrows live.
        let (counters, tallies) = unsafe {
            (
                &*(base as *const Counters),
                std::slice::from_raw_parts(
                    base.add(Layout::TALLIES) as *const cuheap_core::sync::AtomicU64,
                    words,
                ),
            )
        };
        Ok(Counts::collect(counters, Tallies::new(tallies)))
    }

    /// Reads the heap's statistics after a launch (synchronous copy).
    pub fn stats(&self) -> Result<Stats> {
        // Pages past the mapped part, and in holes, are neither free nor
        // in use.
        let mapped = match &self.data {
            Data::Fixed { .. } => vec![(0, self.capacity())],
            Data::Growable(g) => {
                g.finish_trims(false)?;
                // Mappings next to each other are read as one range.
                let mut runs: Vec<(usize, usize)> = Vec::new();
                for (at, len) in g.region.mappings() {
                    match runs.last_mut() {
                        Some(r) if r.0 + r.1 == at => r.1 += len,
                        _ => runs.push((at, len)),
                    }
                }
                runs
            }
        };
        let n = mapped.iter().map(|m| m.1).sum::<usize>() / PAGE_SIZE;
        let mut descs: Vec<PageDesc> = (0..n).map(|_| PageDesc::new()).collect();
        let mut at = 0;
        for (start, len) in mapped {
            let (from, pages) = (start / PAGE_SIZE, len / PAGE_SIZE);
            // SAFETY: PageDesc is #[repr(C)] integer atomics: any bytes the
            // device holds are a valid value.
            let bytes = unsafe { as_bytes_mut(&mut descs[at..at + pages]) };
            let offset = self.layout.descs + from * size_of::<PageDesc>();
            self.meta.read(offset, bytes)?;
            at += pages;
        }
        Ok(Stats::collect(&descs, &self.counters()?))
    }
}

impl Drop for DeviceHeap {
    fn drop(&mut self) {
        // A trim queued on a stream still reads the metadata: wait for it
        // (and give back what it fenced) before the memory goes.
        if let Data::Growable(g) = &self.data {
            if g.finish_trims(true).is_err() {
                // A trim's kernel may still run: wait for the device.
                crate::driver::before_bind();
                let _ = self.ctx.synchronize();
            }
        }
    }
}

/// A 128-byte aligned line of a host copy of a heap's metadata.
#[derive(Clone, Copy)]
#[repr(C, align(128))]
struct MetaLine([u8; 128]);

/// The bytes of a slice of plain `#[repr(C)]` atomics, to copy into.
///
/// # Safety
///
/// Every byte pattern is a valid `T` (true of `PageDesc` and `Counters`:
/// `#[repr(C)]` structs of integer atomics).
unsafe fn as_bytes_mut<T>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: the caller guarantees any bytes written are a valid `T`; the
    // slice covers exactly `v`'s memory, borrowed mutably for its lifetime.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

/// A heap handle as kernels take it by value: cuheap-core's
/// [`HeapHandle`] field for field, with the plain-data guarantees a
/// kernel argument needs ([`bytemuck::NoUninit`]; 24 bytes, no padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::NoUninit)]
pub struct HeapArg {
    meta: u64,
    data: u64,
    page_count: u32,
    slots: u32,
}

// The kernels receive a `HeapHandle`: same size, alignment and offsets.
const _: () = {
    assert!(size_of::<HeapArg>() == size_of::<HeapHandle>());
    assert!(align_of::<HeapArg>() == align_of::<HeapHandle>());
    assert!(offset_of!(HeapArg, meta) == offset_of!(HeapHandle, meta));
    assert!(offset_of!(HeapArg, data) == offset_of!(HeapHandle, data));
    assert!(offset_of!(HeapArg, page_count) == offset_of!(HeapHandle, page_count));
    assert!(offset_of!(HeapArg, slots) == offset_of!(HeapHandle, slots));
};

impl From<HeapHandle> for HeapArg {
    fn from(h: HeapHandle) -> HeapArg {
        HeapArg {
            meta: h.meta,
            data: h.data,
            page_count: h.page_count,
            slots: h.slots,
        }
    }
}

/// In a kernel table a `HeapHandle` parameter takes a live `&DeviceHeap`.
impl Param for HeapHandle {
    type Host<'a> = &'a DeviceHeap;
    type Raw = HeapArg;
    fn raw(heap: &DeviceHeap) -> HeapArg {
        heap.arg()
    }
}

/// Fences in `heap` (a host copy of the metadata, no kernel running) the
/// pages of each mapping of `region` that no block uses, from the end,
/// while at least `keep` bytes would stay mapped, and returns those
/// mappings (offset, length), for the caller to unmap once the copy is
/// on the device: they become holes. A mapping that starts below `keep`
/// stays.
fn fence_free(region: &VmmRegion, heap: &Heap<u32>, keep: usize) -> Vec<(usize, usize)> {
    let page = |bytes: usize| (bytes / PAGE_SIZE) as u32;
    let layout = region.layout();
    let mut mapped = layout.mapped;
    let mut fenced = Vec::new();
    for &(at, len) in layout.mappings.iter().rev() {
        if at < keep || mapped.saturating_sub(len) < keep {
            continue;
        }
        if heap.fence(page(at), page(at + len)) {
            mapped -= len;
            fenced.push((at, len));
        }
    }
    fenced
}

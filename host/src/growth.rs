//! Growing a device heap, between launches and while kernels run.
//!
//! A growable heap's data is a [`VmmRegion`]: reserved address space with
//! memory mapped behind a prefix. [`Grower::grow`] maps a step (one
//! `cuMemCreate`, one `cuMemMap`, one `cuMemSetAccess`, whatever its
//! size, unless the heap grows in pieces ([`Grower::set_piece`]: a
//! create and a map per piece); in a shared reservation, banked pieces
//! first, one mapping each) and then writes the heap's page limit in
//! device memory.
//!
//! While kernels run, a [`GrowthService`] thread answers their requests
//! (the protocol is in `cuheap_core`'s `heap::grow`): a thread of a kernel
//! that finds the heap short raises `grow_want` and writes a ticket to a
//! doorbell in pinned host memory mapped into the device; the service
//! polls the doorbell (host memory: no PCIe traffic while idle), reads
//! the ask, maps at least twice the heap (geometric steps), and writes the
//! new limit with a copy on its own stream, which runs beside the kernel.
//! The kernel's waiting threads poll the limit in device memory.

use crate::backend::Backend;
use crate::device_heap::HeapArg;
use crate::driver::memory::{copy_from_device_on, copy_to_device_on};
use crate::driver::{DevicePtr, Gpu, Kernel, LaunchConfig};
use crate::error::{Context, Error, Result};
use crate::vmm::VmmRegion;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use cuheap_core::{Counters, PAGE_SIZE};
use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Pinned host memory mapped into the device: the doorbell kernels ring,
/// and the slots where trim kernels read ranges and report on them.
struct Pinned {
    host: *mut u64,
    words: usize,
    device: u64,
    ctx: Arc<CudaContext>,
}

// SAFETY: the pointer is to pinned memory owned by this value, read with
// volatile loads only; the driver calls are thread-safe.
unsafe impl Send for Pinned {}
// SAFETY: as above.
unsafe impl Sync for Pinned {}

impl Pinned {
    /// `words` zeroed words (at least one).
    fn new(ctx: &Arc<CudaContext>, words: usize) -> Result<Pinned> {
        crate::driver::bind(ctx)?;
        let words = words.max(1);
        let mut p = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: out-parameter; `words` words of pinned memory, freed on drop.
        unsafe { sys::cuMemHostAlloc(&mut p, words * 8, flags) }
            .result()
            .during("cuMemHostAlloc")?;
        let mut pinned = Pinned {
            host: p as *mut u64,
            words,
            device: 0,
            ctx: ctx.clone(),
        };
        for i in 0..words {
            pinned.write(i, 0);
        }
        // SAFETY: out-parameter; `p` is mapped pinned memory.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut pinned.device, p, 0) }
            .result()
            .during("cuMemHostGetDevicePointer")?;
        Ok(pinned)
    }

    fn read(&self, i: usize) -> u64 {
        assert!(i < self.words);
        // SAFETY: a live, aligned word (page-aligned memory, `i` in
        // bounds) that kernels write whole.
        unsafe { self.host.add(i).read_volatile() }
    }

    fn write(&self, i: usize, v: u64) {
        assert!(i < self.words);
        // SAFETY: as in `read`; no kernel uses the word meanwhile (the
        // caller writes before the launch that reads it).
        unsafe { self.host.add(i).write_volatile(v) }
    }
}

impl Drop for Grower {
    fn drop(&mut self) {
        // The stream's drop (cudarc's) makes its context current.
        crate::driver::before_bind();
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // The owner outlives every kernel that uses the memory.
        if crate::driver::bind(&self.ctx).is_ok() {
            // SAFETY: allocated by cuMemHostAlloc, freed once.
            let _ = unsafe { sys::cuMemFreeHost(self.host as *mut _) };
        }
    }
}

/// What growth has done, for statistics and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrowthStats {
    /// Steps mapped (between launches and while kernels ran).
    pub steps: u64,
    /// Of those, steps that answered requests of running kernels.
    pub live_steps: u64,
    /// Of those, steps the service mapped ahead of the heap's fill
    /// ([`DeviceHeap::serve_ahead`](crate::DeviceHeap::serve_ahead)),
    /// with no thread asking.
    pub ahead_steps: u64,
    /// Requests the service could not serve at all.
    pub refusals: u64,
    /// Bytes mapped by all steps.
    pub bytes: u64,
    /// Time spent mapping and publishing, in nanoseconds.
    pub nanos: u64,
}

/// The growth of one growable heap: its region, the stream it publishes
/// the limit on, and the doorbell its kernels ring.
pub(crate) struct Grower {
    pub(crate) region: VmmRegion,
    stream: Arc<CudaStream>,
    /// Device address of the heap's [`Counters`].
    counters: u64,
    bell: Pinned,
    /// Whether a service answers the doorbell (the heap's `grow_bell` is
    /// the doorbell's address then, else 0).
    serving: AtomicBool,
    /// Whether a refusal capped growth (`Counters::grow_cap` is set).
    capped: AtomicBool,
    /// The bytes the device's page limit covers (last written).
    published: AtomicUsize,
    /// Held from mapping to publishing, so limits are written in order.
    lock: Mutex<()>,
    /// The longest mapping of new memory a step makes, in bytes (whole
    /// chunks; `usize::MAX`: one mapping per step). See
    /// [`Grower::set_piece`].
    piece: AtomicUsize,
    steps: AtomicU64,
    live_steps: AtomicU64,
    ahead_steps: AtomicU64,
    refusals: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    refused: Mutex<Option<String>>,
    /// The heap, as the upkeep kernels take it.
    handle: HeapArg,
    /// The upkeep kernels, once a trim while kernels run loaded them.
    upkeep: Mutex<Option<Upkeep>>,
    /// Trims queued on streams and not finished, and how many.
    pending: Mutex<Vec<PendingTrim>>,
    trims_pending: AtomicUsize,
    /// Signalled when a trim being finished is done with (finished, or
    /// left for a later call), for callers that wait for every trim.
    finished: Condvar,
    /// Bit `i`: trim slot `i` is taken (from the queueing of a trim until
    /// its flags are read).
    slots_taken: AtomicU32,
}

type FenceArgs = (HeapArg, DevicePtr<u64>, DevicePtr<u32>, u32);
type UnfenceArgs = (HeapArg, u32, u32);

/// The kernels of a trim while kernels run (`cuheap_fence_free`,
/// `cuheap_unfence`; `kernels/src/upkeep.rs`).
#[derive(Clone)]
struct Upkeep {
    fence: Kernel<FenceArgs>,
    unfence: Kernel<UnfenceArgs>,
}

/// A trim queued on a stream: the mappings a kernel fences, the slot of
/// pinned words it reads them from and reports in (`n` ranges of pages,
/// then a `u32` flag each), and an event after it. The words are the
/// heap's for its life: freeing pinned memory waits for the whole device,
/// kernels that run for long included.
struct PendingTrim {
    extents: Vec<(usize, usize)>,
    slot: usize,
    event: Arc<CudaEvent>,
    /// A call is finishing it (waiting for its event, or unmapping).
    finishing: bool,
}

/// Trims queued and not finished at once, at most (each has a slot of
/// pinned words beside the doorbell).
const TRIM_SLOTS: usize = 8;
/// Pinned words a trim's slot holds: ranges, then a `u32` flag each.
const SLOT_WORDS: usize = 3072;
/// Mappings one trim looks at, at most (the last ones): growth steps are
/// geometric, so a heap has few, unless it grows in pieces
/// ([`Grower::set_piece`]; 4 GiB of 2 MiB pieces is this many).
const TRIM_EXTENTS: usize = SLOT_WORDS * 2 / 3;
/// Where the trims' slots start among the pinned words (after the
/// doorbell's).
const SLOTS_AT: usize = 8;

/// The words of [`Counters`], as the host copies them.
const WORDS: usize = size_of::<Counters>() / 8;

impl Grower {
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        region: VmmRegion,
        counters: u64,
        handle: HeapArg,
    ) -> Result<Arc<Grower>> {
        crate::driver::before_bind();
        let stream = ctx.new_stream().during("cuStreamCreate")?;
        Ok(Arc::new(Grower {
            region,
            stream,
            counters,
            bell: Pinned::new(ctx, SLOTS_AT + TRIM_SLOTS * SLOT_WORDS)?,
            serving: AtomicBool::new(false),
            capped: AtomicBool::new(false),
            published: AtomicUsize::new(0),
            lock: Mutex::new(()),
            piece: AtomicUsize::new(usize::MAX),
            steps: AtomicU64::new(0),
            live_steps: AtomicU64::new(0),
            ahead_steps: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
            refused: Mutex::new(None),
            handle,
            upkeep: Mutex::new(None),
            pending: Mutex::new(Vec::new()),
            trims_pending: AtomicUsize::new(0),
            finished: Condvar::new(),
            slots_taken: AtomicU32::new(0),
        }))
    }

    fn note_refusal(&self, why: String) {
        *self.refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    /// Why the last refusal happened.
    pub(crate) fn last_refusal(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn stats(&self) -> GrowthStats {
        GrowthStats {
            steps: self.steps.load(Ordering::Relaxed),
            live_steps: self.live_steps.load(Ordering::Relaxed),
            ahead_steps: self.ahead_steps.load(Ordering::Relaxed),
            refusals: self.refusals.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            nanos: self.nanos.load(Ordering::Relaxed),
        }
    }

    /// Maps memory until `bytes` are usable and publishes the new page
    /// limit. Returns the usable bytes. Called from the host (not the
    /// service): it first finishes the trims whose streams got past them;
    /// then, unless a growth service runs, it maps memory into holes that
    /// trims left (in address order, while short of `bytes`) and unfences
    /// their pages with a kernel on the grower's stream, waited for; then
    /// it maps the rest at the end (one step).
    pub(crate) fn grow(&self, bytes: usize) -> Result<usize> {
        self.finish_trims(false)?;
        // Past what can ever be usable: refused before anything is mapped.
        if bytes > self.room() {
            return Err(Error::OutOfMemory {
                requested: bytes,
                reserved: self.region.mapped(),
                free: self.region.backend().free_memory(),
            });
        }
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let t = Instant::now();
        let mapped_before = self.region.mapped();
        // A hole that cannot be mapped again (the device full) is passed:
        // growth at the end may still find memory, or say why not.
        let (refilled, _) = self.refill_holes(bytes);
        if refilled > 0 {
            let published = self.published.load(Ordering::Acquire);
            self.count_step(t, self.region.mapped() - mapped_before, published)?;
        }
        if self.region.mapped() < bytes {
            let holes = self.region.end() - self.region.mapped();
            self.grow_locked(bytes.saturating_add(holes))?;
        }
        // Pieces (or banked memory) mapped before the device ran out stay
        // mapped and published; the call still failed.
        let mapped = self.region.mapped();
        if mapped < bytes {
            return Err(Error::OutOfMemory {
                requested: bytes,
                reserved: mapped,
                free: self.region.backend().free_memory(),
            });
        }
        Ok(mapped)
    }

    /// Whether holes can be mapped again now: the upkeep kernels are
    /// loaded (by a trim, the only maker of holes) and no service runs
    /// (a kernel full of threads waiting for growth might not let the
    /// unfencing kernel run).
    fn can_refill(&self) -> Option<Upkeep> {
        if self.serving.load(Ordering::Acquire) {
            return None;
        }
        self.upkeep
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Maps memory into holes, in address order, while fewer than `bytes`
    /// are usable (see [`Grower::grow`]), and unfences their pages (waited
    /// for: `grow` returns with them in service). Returns how many holes
    /// it mapped, and the error that stopped it. The caller holds `lock`.
    fn refill_holes(&self, bytes: usize) -> (usize, Result<()>) {
        let Some(k) = self.can_refill() else {
            return (0, Ok(()));
        };
        let mut filled = Vec::new();
        let mut failed = Ok(());
        for (at, len) in self.region.holes() {
            if self.region.mapped() >= bytes {
                break;
            }
            if let Err(e) = self.region.fill_hole(at) {
                failed = Err(e);
                break;
            }
            filled.push((at, len));
        }
        // Holes side by side (pieces of one step) unfence in one launch.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for &(at, len) in &filled {
            match runs.last_mut() {
                Some(run) if run.0 + run.1 == at => run.1 += len,
                _ => runs.push((at, len)),
            }
        }
        for (at, len) in runs {
            let (from, to) = (at / PAGE_SIZE, (at + len) / PAGE_SIZE);
            let cfg = LaunchConfig::for_threads(1).on(&self.stream);
            // SAFETY: the heap outlives the launch (waited for below);
            // pages `from..to` were fenced by a trim and have memory
            // mapped behind them again.
            let launched = unsafe {
                k.unfence
                    .launch(&cfg, (self.handle, from as u32, to as u32))
            };
            if let Err(e) = launched {
                // Mapped but still fenced: held, not usable, until a reset.
                return (filled.len(), Err(e));
            }
        }
        if !filled.is_empty() {
            crate::driver::before_bind();
            if let Err(e) = self.stream.synchronize().during("cuStreamSynchronize") {
                return (filled.len(), Err(e));
            }
        }
        (filled.len(), failed)
    }

    /// Clears the slots of trims that could not be tracked (a failed event
    /// record), once none is pending. Only while no kernel uses the heap
    /// (a reset): their kernels have ended.
    pub(crate) fn forget_lost_trims(&self) {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.is_empty() {
            self.slots_taken.store(0, Ordering::Release);
        }
    }

    /// Bytes that can be usable at most: the range, less its holes unless
    /// [`Grower::grow`] can map them again.
    pub(crate) fn room(&self) -> usize {
        match self.can_refill() {
            Some(_) => self.region.reserved(),
            None => self.region.reserved() - (self.region.end() - self.region.mapped()),
        }
    }

    /// Maps memory at the end until the range reaches `end` (one step, past
    /// any holes), and publishes the new page limit (the end: pages of
    /// holes are fenced). Returns the range's end. The caller holds
    /// `lock`.
    fn grow_locked(&self, end: usize) -> Result<usize> {
        let t = Instant::now();
        let (before, mapped_before) = (self.region.end(), self.region.mapped());
        let piece = self.piece.load(Ordering::Relaxed);
        let now = (self.region).grow_in_pieces(end.min(self.region.reserved()), piece)?;
        let published = self.published.load(Ordering::Acquire);
        if now > before || published < now {
            let added = self.region.mapped().saturating_sub(mapped_before);
            self.count_step(t, added, published)?;
        }
        Ok(now)
    }

    /// Publishes the limit for the range's end with `floor` beside it
    /// (where fresh pages are searched for first), lets running kernels
    /// ask again if a refusal capped growth, and counts a step of `added`
    /// bytes that began at `t`.
    fn count_step(&self, t: Instant, added: usize, floor: usize) -> Result<()> {
        self.publish_limit(self.region.end(), floor)?;
        if self.capped.swap(false, Ordering::AcqRel) {
            // Memory came back: let running kernels ask again.
            self.write(offset_of!(Counters, grow_cap), 0)?;
        }
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(added as u64, Ordering::Relaxed);
        self.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Makes later steps map new memory in pieces of at most `piece`
    /// bytes (rounded up to whole chunks; 0: one mapping per step), each
    /// of which a trim can give back alone, and loads the upkeep kernels
    /// from `gpu`'s module, with which growth maps holes again and a trim
    /// between launches gives back free pieces before the last one in
    /// use. Returns the piece (0 for whole steps).
    pub(crate) fn set_piece(&self, gpu: &Gpu, piece: usize) -> Result<usize> {
        self.load_upkeep(gpu)?;
        let chunk = self.region.chunk();
        let piece = match piece {
            0 => usize::MAX,
            p => p.checked_next_multiple_of(chunk).unwrap_or(usize::MAX),
        };
        self.piece.store(piece, Ordering::Relaxed);
        Ok(if piece == usize::MAX { 0 } else { piece })
    }

    /// The pieces later steps map (0: whole steps).
    pub(crate) fn piece(&self) -> usize {
        match self.piece.load(Ordering::Relaxed) {
            usize::MAX => 0,
            p => p,
        }
    }

    /// Whether holes a trim between launches leaves can be mapped again
    /// now (see [`Grower::can_refill`]: the upkeep kernels are loaded and
    /// no service runs, which would map past them).
    pub(crate) fn can_punch(&self) -> bool {
        self.can_refill().is_some()
    }

    /// The kernels a trim while kernels run uses, from `gpu`'s module
    /// (loaded once).
    fn load_upkeep(&self, gpu: &Gpu) -> Result<Upkeep> {
        let mut k = self.upkeep.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = &*k {
            return Ok(k.clone());
        }
        if gpu.context().cu_device() != self.stream.context().cu_device() {
            return Err(Error::InvalidArgument(
                "the GPU is another device than the heap's".into(),
            ));
        }
        let missing = |e: Error| {
            Error::InvalidArgument(format!(
                "the GPU's module lacks the heap's upkeep kernels (cuheap_fence_free, \
                 cuheap_unfence; they are in cuheap::PTX and cuheap::BENCH_PTX, which \
                 cuheap::open_gpu and cuheap::open_bench_gpu load): {e}"
            ))
        };
        let loaded = Upkeep {
            fence: gpu.kernel("cuheap_fence_free").map_err(missing)?,
            unfence: gpu.kernel("cuheap_unfence").map_err(missing)?,
        };
        *k = Some(loaded.clone());
        Ok(loaded)
    }

    /// Queues a trim on `stream` (see `DeviceHeap::trim_on`): after the
    /// work queued there, a kernel retires the empty pages slots and lists
    /// hold and fences every mapping it can, from the end, while at least
    /// `keep` bytes stay mapped; [`Grower::finish_trims`] unmaps those it
    /// fenced once the stream gets past it.
    pub(crate) fn trim_on(&self, gpu: &Gpu, stream: &Arc<CudaStream>, keep: usize) -> Result<()> {
        self.finish_trims(false)?;
        let k = self.load_upkeep(gpu)?;
        // Locks in this order everywhere: the pending trims, then growth.
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        // Steps of trims not finished yet, being finished included.
        let queued: Vec<usize> = (pending.iter())
            .flat_map(|t| t.extents.iter().map(|e| e.0))
            .collect();
        let taken = self.slots_taken.load(Ordering::Acquire);
        let Some(slot) = (0..TRIM_SLOTS).find(|i| taken >> i & 1 == 0) else {
            return Err(Error::InvalidArgument(format!(
                "{TRIM_SLOTS} trims are queued and not finished: finish them first (finish_trims)"
            )));
        };
        let layout = self.region.layout();
        let mut left = layout.mapped;
        let mut extents = Vec::new();
        for &(at, len) in layout.mappings.iter().rev() {
            if queued.contains(&at) {
                left -= len;
            } else if left.saturating_sub(len) >= keep.max(PAGE_SIZE)
                && extents.len() < TRIM_EXTENTS
            {
                left -= len;
                extents.push((at, len));
            }
        }
        if extents.is_empty() {
            return Ok(());
        }
        let n = extents.len();
        let words = SLOTS_AT + slot * SLOT_WORDS;
        for (i, &(at, len)) in extents.iter().enumerate() {
            let (from, to) = (at / PAGE_SIZE, (at + len) / PAGE_SIZE);
            self.bell.write(words + i, from as u64 | (to as u64) << 32);
        }
        for i in 0..n.div_ceil(2) {
            self.bell.write(words + n + i, 0);
        }
        let device = self.bell.device + 8 * words as u64;
        let cfg = LaunchConfig::shape((1, 1, 1), (256, 1, 1)).on(stream);
        let args = (
            self.handle,
            DevicePtr::from_raw(device),
            DevicePtr::from_raw(device + 8 * n as u64),
            n as u32,
        );
        crate::driver::before_bind();
        let event = stream
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .during("cuEventCreate")?;
        // SAFETY: the heap outlives the launch (a pending trim is finished,
        // waiting for its event, before the heap's memory goes); the slot
        // holds the `n` ranges and `n` flags, and no other trim uses it
        // until this one is finished.
        unsafe { k.fence.launch(&cfg, args) }?;
        // From here the kernel may write the slot: it stays taken until
        // the trim is finished, or for good if the trim cannot be tracked.
        self.slots_taken.fetch_or(1 << slot, Ordering::AcqRel);
        crate::driver::before_bind();
        // If this fails, the steps the kernel fences stay mapped and
        // fenced (lost to the heap until a reset): the error says so.
        event.record(stream).during("cuEventRecord")?;
        pending.push(PendingTrim {
            extents,
            slot,
            event: Arc::new(event),
            finishing: false,
        });
        self.trims_pending.store(pending.len(), Ordering::Release);
        Ok(())
    }

    /// Unmaps what the trims whose streams got past them fenced (all of
    /// them with `wait`, after waiting for them); its memory goes to the
    /// bank, or to the device. Returns the bytes unmapped. No lock is held
    /// while it waits: a kernel queued before a trim may wait for growth.
    /// A trim being finished stays listed, so no other trim queues its
    /// steps again meanwhile.
    pub(crate) fn finish_trims(&self, wait: bool) -> Result<usize> {
        let mut unmapped = 0;
        let mut failed = Ok(());
        while self.trims_pending.load(Ordering::Acquire) > 0 {
            let (event, slot) = {
                let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    let mut done = None;
                    for t in pending.iter_mut().filter(|t| !t.finishing) {
                        crate::driver::before_bind();
                        if wait || t.event.try_is_complete().during("cuEventQuery")? {
                            t.finishing = true;
                            done = Some((t.event.clone(), t.slot));
                            break;
                        }
                    }
                    if let Some(found) = done {
                        break found;
                    }
                    if !wait || pending.is_empty() {
                        return failed.map(|()| unmapped);
                    }
                    // Others are finishing the rest: wait until they have.
                    pending = self
                        .finished
                        .wait(pending)
                        .unwrap_or_else(|p| p.into_inner());
                }
            };
            let mut pending = if wait {
                crate::driver::before_bind();
                let waited = event.synchronize().during("cuEventSynchronize");
                let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = waited {
                    // Still queued: a later call may finish it.
                    if let Some(t) = pending.iter_mut().find(|t| t.slot == slot) {
                        t.finishing = false;
                    }
                    self.finished.notify_all();
                    return Err(e);
                }
                pending
            } else {
                self.pending.lock().unwrap_or_else(|p| p.into_inner())
            };
            let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            let i = (pending.iter().position(|t| t.slot == slot))
                .expect("a trim being finished stays listed");
            let t = pending.swap_remove(i);
            self.trims_pending.store(pending.len(), Ordering::Release);
            let (n, words) = (t.extents.len(), SLOTS_AT + t.slot * SLOT_WORDS);
            let fenced: Vec<bool> = (0..n)
                .map(|j| self.bell.read(words + n + j / 2) >> (32 * (j % 2)) & u32::MAX as u64 != 0)
                .collect();
            self.slots_taken.fetch_and(!(1 << t.slot), Ordering::AcqRel);
            for (&(at, len), fenced) in t.extents.iter().zip(fenced) {
                if !fenced {
                    continue; // a block was in use there
                }
                // SAFETY: the kernel fenced every page of the mapping (no
                // block is in it, and none can be handed out there again:
                // the pages stay fenced while it is a hole) and has ended;
                // the mapping is the one it fenced (same offset and length:
                // the trim stayed listed, so no other trim took the range,
                // and a hole is mapped again only after this).
                match unsafe { self.region.release(at, len) } {
                    Ok(()) => unmapped += len,
                    // Stays mapped and fenced (lost until a reset).
                    Err(e) => failed = Err(e),
                }
            }
            self.finished.notify_all();
        }
        failed.map(|()| unmapped)
    }

    /// Runs `f` with growth held off (no step maps meanwhile).
    pub(crate) fn exclusive<T>(&self, f: impl FnOnce() -> T) -> T {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        f()
    }

    /// Writes the page limit for `mapped` bytes, and beside it the floor
    /// of the step (`grow_floor`): the limit before it, where searches
    /// for fresh pages start (0 on a heap emptied by a reset).
    fn publish_limit(&self, mapped: usize, floor: usize) -> Result<()> {
        let words = [(mapped / PAGE_SIZE) as u64, (floor / PAGE_SIZE) as u64];
        self.write_words(offset_of!(Counters, page_limit), &words)?;
        self.published.store(mapped, Ordering::Release);
        Ok(())
    }

    /// Records the limit a host copy of the metadata set (`trim`).
    pub(crate) fn published_as(&self, mapped: usize) {
        self.published.store(mapped, Ordering::Release);
    }

    /// Writes the words the host owns after the metadata was cleared: the
    /// page limit, no growth cap, and the doorbell while a service runs.
    pub(crate) fn restore(&self) -> Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mapped = self.region.end();
        self.publish_limit(mapped, 0)?;
        self.capped.store(false, Ordering::Release);
        self.write(offset_of!(Counters, grow_cap), 0)?;
        // No ask is pending (or rung) above the limit: a stale one would
        // keep new asks from ringing. Tickets go on from the doorbell's
        // value, so the first one after a reset is a change to it.
        let limit = (mapped / PAGE_SIZE) as u64;
        self.write(offset_of!(Counters, grow_want), limit)?;
        self.write(offset_of!(Counters, grow_rung), limit)?;
        self.write(offset_of!(Counters, grow_requests), self.bell.read(0))?;
        self.write(offset_of!(Counters, grow_stalled), 0)?;
        if self.serving.load(Ordering::Acquire) {
            self.write(offset_of!(Counters, grow_bell), self.bell.device)?;
        }
        Ok(())
    }

    /// Marks the heap unserved: kernels stop asking, and waiting threads
    /// fail at once.
    fn unserve(&self) -> Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.serving.store(false, Ordering::Release);
        self.write(offset_of!(Counters, grow_bell), 0)
    }

    /// Writes one word of the counters, on the grower's stream, which
    /// runs beside kernels on other streams; returns once it is written.
    fn write(&self, offset: usize, v: u64) -> Result<()> {
        self.write_words(offset, &[v])
    }

    /// Writes consecutive words of the counters (as [`Grower::write`]).
    fn write_words(&self, offset: usize, v: &[u64]) -> Result<()> {
        debug_assert!(offset + v.len() * 8 <= size_of::<Counters>());
        // SAFETY: words inside the heap's counters, in device memory the
        // heap owns. Kernels only read the words the host writes, except
        // `grow_want`, `grow_rung` and `grow_requests`, which the host
        // lowers only to refuse (`answer`) or while no ask can be pending
        // (`restore`), and `grow_stalled`, which it clears only there; a
        // waiter that raises `grow_want` again meanwhile just asks again.
        unsafe { copy_to_device_on(self.counters + offset as u64, v, &self.stream) }
    }

    fn read(&self) -> Result<[u64; WORDS]> {
        let mut w = [0u64; WORDS];
        // SAFETY: the heap's counters; any bytes are valid `u64`s.
        unsafe { copy_from_device_on(&mut w, self.counters, &self.stream) }?;
        Ok(w)
    }

    /// Where a step of the service ends: at `need` bytes or more, and at
    /// least doubling the usable memory (geometric steps). Past holes:
    /// unfencing theirs would take a kernel, which a full GPU might not
    /// run in time.
    fn next_step(&self, need: usize) -> usize {
        need.max(self.region.end().saturating_add(self.region.mapped()))
            .min(self.region.reserved())
    }

    /// The pages the heap's classes and spans hold now
    /// (`Counters::units_taken`), read while kernels run.
    fn read_taken(&self) -> Result<u64> {
        Ok(self.read()?[offset_of!(Counters, units_taken) / 8])
    }

    /// Keeps memory ahead of the heap's fill: once `taken` pages reach
    /// `fill_percent` of the usable ones, maps the next step (as an
    /// answer would) and publishes it at once, so that kernels find the
    /// pages before they run short. Returns whether it mapped a step. A
    /// step that cannot be mapped (the device full, or a driver error) is
    /// not an error: no thread asked for it, and one that runs short asks
    /// as without the service's look ahead. It is tried again once the
    /// usable memory changed (`refused_at`: the usable bytes then).
    fn keep_ahead(&self, taken: u64, fill_percent: u32, refused_at: &mut usize) -> bool {
        let usable = self.region.mapped();
        let full = |usable: usize| {
            (taken as u128) * PAGE_SIZE as u128 * 100 >= usable as u128 * fill_percent as u128
        };
        if !full(usable) || *refused_at == usable || self.region.end() >= self.region.reserved() {
            return false;
        }
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let (end, usable) = (self.region.end(), self.region.mapped());
        if !full(usable) {
            return false; // an answer mapped a step meanwhile
        }
        match self.grow_locked(self.next_step(end)) {
            Ok(m) if m > end => {
                self.ahead_steps.fetch_add(1, Ordering::Relaxed);
                true
            }
            Ok(_) | Err(_) => {
                *refused_at = usable;
                false
            }
        }
    }

    /// Answers the asks pending now: maps at least what was asked, and
    /// at least doubles the heap; if no memory can be mapped at all,
    /// refuses (lowers the ask to the limit, then bumps `grow_refusals`).
    fn answer(&self) -> Result<()> {
        let w = self.read()?;
        let word = |off: usize| w[off / 8];
        let want = word(offset_of!(Counters, grow_want)) as usize;
        // The limit is the range's end: pages of holes are fenced.
        let end = self.region.end();
        let limit = end / PAGE_SIZE;
        if want <= limit {
            return Ok(()); // answered by an earlier step
        }
        let need = (want * PAGE_SIZE).min(self.region.reserved());
        let grown = {
            let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            match self.grow_locked(self.next_step(need)) {
                Ok(m) => Ok(m),
                Err(_) => self.grow_locked(need),
            }
        };
        match grown {
            Ok(m) if m > end => {
                self.live_steps.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Ok(m) => self.note_refusal(format!("{want} pages asked, the range ends at {m} bytes")),
            Err(e) => self.note_refusal(format!("{want} pages asked: {e}")),
        }
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let refusals = word(offset_of!(Counters, grow_refusals)) + 1;
        self.write(offset_of!(Counters, grow_cap), limit as u64)?;
        self.capped.store(true, Ordering::Release);
        self.write(offset_of!(Counters, grow_want), limit as u64)?;
        self.write(offset_of!(Counters, grow_rung), limit as u64)?;
        self.write(offset_of!(Counters, grow_refusals), refusals)?;
        self.refusals.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A thread that grows a heap while kernels run, for as long as this
/// value lives (see the module documentation). Dropping it stops the
/// thread; kernels that wait for it then get null.
pub struct GrowthService<'h> {
    grower: Arc<Grower>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
    _heap: std::marker::PhantomData<&'h ()>,
}

/// How long the service spins after a request before it sleeps between
/// polls, and how long it sleeps.
const SPIN: Duration = Duration::from_millis(5);
const NAP: Duration = Duration::from_micros(20);

impl GrowthService<'_> {
    /// Starts the service; with `ahead` (a fill in percent, 1 to 99) it
    /// also keeps memory ahead of the heap's fill.
    pub(crate) fn start<'h>(grower: &Arc<Grower>, ahead: Option<u32>) -> Result<GrowthService<'h>> {
        if let Some(fill) = ahead.filter(|f| !(1..=99).contains(f)) {
            return Err(Error::InvalidArgument(format!(
                "memory kept ahead at {fill}% of the usable memory: give a fill of 1 to 99%"
            )));
        }
        if grower.serving.swap(true, Ordering::AcqRel) {
            return Err(Error::InvalidArgument(
                "the heap already has a growth service".into(),
            ));
        }
        let stop = Arc::new(AtomicBool::new(false));
        // Read before the doorbell is published: a ring from a kernel
        // that starts before the thread does is still a change to it.
        let seen = grower.bell.read(0);
        if let Err(e) = grower.restore() {
            let _ = grower.unserve();
            return Err(e);
        }
        let (g, halt) = (grower.clone(), stop.clone());
        let thread = match std::thread::Builder::new()
            .name("cuheap-growth".into())
            .spawn(move || serve(&g, &halt, seen, ahead))
        {
            Ok(t) => t,
            Err(e) => {
                let _ = grower.unserve();
                return Err(Error::InvalidArgument(format!(
                    "could not start the growth thread: {e}"
                )));
            }
        };
        Ok(GrowthService {
            grower: grower.clone(),
            stop,
            thread: Some(thread),
            _heap: std::marker::PhantomData,
        })
    }

    /// Stops the service; returns the first error its thread met.
    pub fn stop(mut self) -> Result<()> {
        self.halt()
    }

    fn halt(&mut self) -> Result<()> {
        let Some(t) = self.thread.take() else {
            return Ok(());
        };
        self.stop.store(true, Ordering::Release);
        let ran = t
            .join()
            .unwrap_or_else(|_| Err(Error::InvalidArgument("the growth thread panicked".into())));
        ran.and(self.grower.unserve())
    }
}

impl Drop for GrowthService<'_> {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// The service loop: polls the doorbell, answers each change; with
/// `ahead`, also reads the heap's fill (see [`Look`]) and keeps memory
/// ahead of it.
fn serve(g: &Grower, stop: &AtomicBool, mut seen: u64, ahead: Option<u32>) -> Result<()> {
    crate::driver::bind(g.stream.context())?;
    let mut active = Instant::now();
    let mut look = Look::new();
    while !stop.load(Ordering::Acquire) {
        let t = g.bell.read(0);
        let worked = if t != seen {
            seen = t;
            g.answer().map(|()| true)
        } else if let Some(fill) = ahead.filter(|_| look.due()) {
            g.read_taken()
                .map(|taken| look.saw(taken) | g.keep_ahead(taken, fill, &mut look.refused_at))
        } else {
            Ok(false)
        };
        match worked {
            Err(e) => {
                // Stop looking served: waiting threads fail at once
                // instead of after the timeout.
                let _ = g.write(offset_of!(Counters, grow_bell), 0);
                return Err(e);
            }
            Ok(true) => active = Instant::now(),
            Ok(false) if active.elapsed() < SPIN => std::hint::spin_loop(),
            Ok(false) => {
                // Trims whose streams got past them give their memory
                // back here too. A step that fails to unmap stays mapped
                // and fenced (the error is not kept; a reset takes the
                // fence off).
                let _ = g.finish_trims(false);
                std::thread::sleep(NAP);
            }
        }
    }
    Ok(())
}

/// When the service reads a heap's fill (a copy of the heap's counters
/// from the device, beside the kernels): soon after it changed, less and less
/// often while it stays the same.
struct Look {
    next: Instant,
    gap: Duration,
    last: u64,
    /// The usable bytes when a step ahead could not be mapped.
    refused_at: usize,
}

/// The shortest and the longest gap between reads of the fill.
const LOOK_MIN: Duration = Duration::from_micros(20);
const LOOK_MAX: Duration = Duration::from_millis(1);

impl Look {
    fn new() -> Look {
        Look {
            next: Instant::now(),
            gap: LOOK_MIN,
            last: u64::MAX,
            refused_at: 0,
        }
    }

    fn due(&self) -> bool {
        Instant::now() >= self.next
    }

    /// Records a read of `taken`; returns whether it changed.
    fn saw(&mut self, taken: u64) -> bool {
        let changed = taken != self.last;
        self.gap = if changed {
            LOOK_MIN
        } else {
            (self.gap * 2).min(LOOK_MAX)
        };
        self.last = taken;
        self.next = Instant::now() + self.gap;
        changed
    }
}

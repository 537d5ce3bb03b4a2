//! Growing a device heap, between launches and while kernels run.
//!
//! A growable heap's data is a [`VmmRegion`]: reserved address space with
//! memory mapped behind a prefix. [`Grower::grow`] maps a step (one
//! `cuMemCreate`, one `cuMemMap`, one `cuMemSetAccess`, whatever its
//! size; in a shared reservation, banked pieces first, one mapping each)
//! and then writes the heap's page limit in device memory.
//!
//! While kernels run, a [`GrowthService`] thread answers their requests
//! (the protocol is in `cuheap_core`'s `heap::grow`): a thread of a kernel
//! that finds the heap short raises `grow_want` and writes a ticket to a
//! doorbell in pinned host memory mapped into the device; the service
//! polls the doorbell (host memory: no PCIe traffic while idle), reads
//! the ask, maps at least twice the heap (geometric steps), and writes the
//! new limit with a copy on its own stream, which runs beside the kernel.
//! The kernel's waiting threads poll the limit in device memory.

use crate::driver::memory::{copy_from_device_on, copy_to_device_on};
use crate::error::{Context, Error, Result};
use crate::vmm::VmmRegion;
use cudarc::driver::{sys, CudaContext, CudaStream};
use cuheap_core::{Counters, PAGE_SIZE};
use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A word of pinned host memory that kernels can write: the doorbell.
struct Doorbell {
    host: *mut u64,
    device: u64,
    ctx: Arc<CudaContext>,
}

// SAFETY: the pointer is to pinned memory owned by this value, read with
// volatile loads only; the driver calls are thread-safe.
unsafe impl Send for Doorbell {}
// SAFETY: as above.
unsafe impl Sync for Doorbell {}

impl Doorbell {
    fn new(ctx: &Arc<CudaContext>) -> Result<Doorbell> {
        crate::driver::bind(ctx)?;
        let mut p = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: out-parameter; 64 bytes of pinned memory, freed on drop.
        unsafe { sys::cuMemHostAlloc(&mut p, 64, flags) }
            .result()
            .during("cuMemHostAlloc")?;
        let mut bell = Doorbell {
            host: p as *mut u64,
            device: 0,
            ctx: ctx.clone(),
        };
        // SAFETY: 64 bytes just allocated, 8-byte aligned (page aligned).
        unsafe { bell.host.write_volatile(0) };
        // SAFETY: out-parameter; `p` is mapped pinned memory.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut bell.device, p, 0) }
            .result()
            .during("cuMemHostGetDevicePointer")?;
        Ok(bell)
    }

    fn read(&self) -> u64 {
        // SAFETY: a live, aligned word that kernels write whole.
        unsafe { self.host.read_volatile() }
    }
}

impl Drop for Grower {
    fn drop(&mut self) {
        // The stream's drop (cudarc's) makes its context current.
        crate::driver::before_bind();
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        // The owner (the heap) outlives every kernel that rings it.
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
    bell: Doorbell,
    /// Whether a service answers the doorbell (the heap's `grow_bell` is
    /// the doorbell's address then, else 0).
    serving: AtomicBool,
    /// Whether a refusal capped growth (`Counters::grow_cap` is set).
    capped: AtomicBool,
    /// The bytes the device's page limit covers (last written).
    published: AtomicUsize,
    /// Held from mapping to publishing, so limits are written in order.
    lock: Mutex<()>,
    steps: AtomicU64,
    live_steps: AtomicU64,
    refusals: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    refused: Mutex<Option<String>>,
}

/// The words of [`Counters`], as the host copies them.
const WORDS: usize = size_of::<Counters>() / 8;

impl Grower {
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        region: VmmRegion,
        counters: u64,
    ) -> Result<Arc<Grower>> {
        crate::driver::before_bind();
        let stream = ctx.new_stream().during("cuStreamCreate")?;
        Ok(Arc::new(Grower {
            region,
            stream,
            counters,
            bell: Doorbell::new(ctx)?,
            serving: AtomicBool::new(false),
            capped: AtomicBool::new(false),
            published: AtomicUsize::new(0),
            lock: Mutex::new(()),
            steps: AtomicU64::new(0),
            live_steps: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
            refused: Mutex::new(None),
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
            refusals: self.refusals.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            nanos: self.nanos.load(Ordering::Relaxed),
        }
    }

    /// Maps memory until `bytes` are usable (one step) and publishes the
    /// new page limit. Returns the usable bytes.
    pub(crate) fn grow(&self, bytes: usize) -> Result<usize> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let t = Instant::now();
        let before = self.region.mapped();
        let mapped = self
            .region
            .grow_at_once(bytes.min(self.region.reserved()))?;
        let published = self.published.load(Ordering::Acquire);
        if mapped > before || published < mapped {
            self.publish_limit(mapped, published)?;
            if self.capped.swap(false, Ordering::AcqRel) {
                // Memory came back: let running kernels ask again.
                self.write(offset_of!(Counters, grow_cap), 0)?;
            }
            self.steps.fetch_add(1, Ordering::Relaxed);
            self.bytes
                .fetch_add((mapped - before) as u64, Ordering::Relaxed);
            self.nanos
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        Ok(mapped)
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
        let mapped = self.region.mapped();
        self.publish_limit(mapped, 0)?;
        self.capped.store(false, Ordering::Release);
        self.write(offset_of!(Counters, grow_cap), 0)?;
        // No ask is pending (or rung) above the limit: a stale one would
        // keep new asks from ringing. Tickets go on from the doorbell's
        // value, so the first one after a reset is a change to it.
        let limit = (mapped / PAGE_SIZE) as u64;
        self.write(offset_of!(Counters, grow_want), limit)?;
        self.write(offset_of!(Counters, grow_rung), limit)?;
        self.write(offset_of!(Counters, grow_requests), self.bell.read())?;
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
        // (`restore`); a waiter that raises `grow_want` again meanwhile
        // just asks again.
        unsafe { copy_to_device_on(self.counters + offset as u64, v, &self.stream) }
    }

    fn read(&self) -> Result<[u64; WORDS]> {
        let mut w = [0u64; WORDS];
        // SAFETY: the heap's counters; any bytes are valid `u64`s.
        unsafe { copy_from_device_on(&mut w, self.counters, &self.stream) }?;
        Ok(w)
    }

    /// Answers the asks pending now: maps at least what was asked, and
    /// at least doubles the heap; if no memory can be mapped at all,
    /// refuses (lowers the ask to the limit, then bumps `grow_refusals`).
    fn answer(&self) -> Result<()> {
        let w = self.read()?;
        let word = |off: usize| w[off / 8];
        let want = word(offset_of!(Counters, grow_want)) as usize;
        let mapped = self.region.mapped();
        let limit = mapped / PAGE_SIZE;
        if want <= limit {
            return Ok(()); // answered by an earlier step
        }
        let reserved = self.region.reserved();
        let need = (want * PAGE_SIZE).min(reserved);
        let step = need.max(mapped.saturating_mul(2)).min(reserved);
        let grown = match self.grow(step) {
            Ok(m) => Ok(m),
            Err(_) => self.grow(need),
        };
        match grown {
            Ok(m) if m > mapped => {
                self.live_steps.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Ok(m) => self.note_refusal(format!("{want} pages asked, {m} bytes mapped")),
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
    pub(crate) fn start<'h>(grower: &Arc<Grower>) -> Result<GrowthService<'h>> {
        if grower.serving.swap(true, Ordering::AcqRel) {
            return Err(Error::InvalidArgument(
                "the heap already has a growth service".into(),
            ));
        }
        let stop = Arc::new(AtomicBool::new(false));
        // Read before the doorbell is published: a ring from a kernel
        // that starts before the thread does is still a change to it.
        let seen = grower.bell.read();
        if let Err(e) = grower.restore() {
            let _ = grower.unserve();
            return Err(e);
        }
        let (g, halt) = (grower.clone(), stop.clone());
        let thread = match std::thread::Builder::new()
            .name("cuheap-growth".into())
            .spawn(move || serve(&g, &halt, seen))
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

/// The service loop: polls the doorbell, answers each change.
fn serve(g: &Grower, stop: &AtomicBool, mut seen: u64) -> Result<()> {
    crate::driver::bind(g.stream.context())?;
    let mut active = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let t = g.bell.read();
        if t != seen {
            seen = t;
            if let Err(e) = g.answer() {
                // Stop looking served: waiting threads fail at once
                // instead of after the timeout.
                let _ = g.write(offset_of!(Counters, grow_bell), 0);
                return Err(e);
            }
            active = Instant::now();
        } else if active.elapsed() < SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(NAP);
        }
    }
    Ok(())
}

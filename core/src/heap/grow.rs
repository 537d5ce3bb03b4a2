//! Growth while kernels run: a thread that finds the heap short asks a
//! host service for more pages and waits for the page limit to rise.
//!
//! The protocol, on words of [`Counters`]:
//!
//! 1. A host service publishes the device address of a doorbell word (in
//!    host memory the device can write) in `grow_bell`; 0 means no service,
//!    and a short heap fails as before.
//! 2. A thread that finds no fresh page at limit `L` asks for `L + n`
//!    pages (`n`: the pages its request takes) with one `fetch_max` on
//!    `grow_want`, in device memory, right there: the first to ask for a
//!    step also looks through the other slots' lists of its class and the
//!    empty pages parked near its slot (which may serve it; every slot's
//!    once the heap cannot grow: a refusal or a stopped service sends the
//!    waiting threads to one more search), the others give up the search
//!    at once. A waiting
//!    thread rings when the ask is above `grow_rung`, the largest ask rung
//!    so far, and it raised `grow_rung`: it takes a ticket
//!    (`grow_requests`) and writes it to the doorbell. A burst of threads
//!    short at the same limit asks for the same pages, so it rings about
//!    once: one request per growth step, not per thread.
//! 3. The host sees the doorbell change, reads `grow_want`, maps at least
//!    that many pages (it may map more: steps are geometric), and writes
//!    the new `page_limit`. Waiting threads poll `page_limit` in device
//!    memory (never host memory) and retry once it rose.
//! 4. A host that cannot map any page lowers `grow_want` and `grow_rung`
//!    to the limit, caps growth there (`grow_cap`: later allocations fail
//!    at once instead of asking again, until the host grows the heap
//!    another way and lifts the cap) and bumps `grow_refusals`; the
//!    waiting threads fail (null, counted), as
//!    they do when the service stops (`grow_bell` changes) or after
//!    [`GROW_TIMEOUT_NS`]. Waiting is bounded: never a hang.
//!
//! While an ask is pending (`grow_want` above the limit) allocations that
//! need a fresh page fail at once instead of searching the lists, the
//! fresh pages and every page of the class again: the search found nothing
//! for the thread that asked, and a burst of a million threads each
//! repeating it would take longer than the growth. The full search still
//! runs before a failure is final.

use super::{AllocError, Heap};
use crate::size_class::{class_of_aligned, span_pages, Geometry};
use crate::stats::Counters;
use crate::sync::Ordering;
use crate::word::Word;

/// How long a thread waits for the host before its allocation fails.
pub const GROW_TIMEOUT_NS: u64 = 2_000_000_000;

/// What the growth protocol needs from the platform it runs on.
pub trait GrowHost {
    /// Writes `ticket` to the doorbell at address `bell`, after every
    /// write this thread made before (a system-wide fence on the GPU).
    fn ring(&self, bell: u64, ticket: u64);
    /// A clock in nanoseconds.
    fn now_ns(&self) -> u64;
    /// Pauses a waiting thread; `round` counts its rounds so far.
    fn pause(&self, round: u32);
}

impl<W: Word> Heap<'_, W> {
    /// Whether a host serves growth and the heap can still grow: below
    /// its page count and below the cap a refusal set.
    #[inline(always)]
    pub fn may_grow(&self) -> bool {
        let c = self.counters();
        if c.grow_bell.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let cap = match c.grow_cap.load(Ordering::Relaxed) {
            0 => self.page_count as u64,
            n => n.min(self.page_count as u64),
        };
        (self.limit() as u64) < cap
    }

    /// Whether threads asked for more pages than the limit gives and the
    /// host has not answered yet.
    #[inline(always)]
    pub(super) fn growth_pending(&self) -> bool {
        self.may_grow() && self.counters().grow_want.load(Ordering::Relaxed) > self.limit() as u64
    }

    /// Allocates `size` bytes at a multiple of `align` as
    /// [`Heap::alloc_aligned`] does; when the heap is short and a host
    /// serves growth, asks it for pages and waits (bounded) for them, then
    /// retries. Fails, counted, on what `alloc_aligned` fails on, and when
    /// the host cannot grow the heap, stopped serving it, or did not
    /// answer within [`GROW_TIMEOUT_NS`].
    #[cold]
    #[inline(never)]
    pub fn alloc_growing<G: GrowHost>(
        &self,
        size: usize,
        align: usize,
        slot: u32,
        host: &G,
    ) -> Result<*mut u8, AllocError> {
        loop {
            let seen = self.limit();
            let refusals = self.counters().grow_refusals.load(Ordering::Acquire);
            let grew = self.may_grow();
            match self.try_alloc_aligned(size, align, slot) {
                Ok(p) => return Ok(p),
                Err(AllocError::OutOfMemory) => {}
                Err(e) => return Err(self.count_failure(e, size)),
            }
            if !grew {
                // The full search ran and found nothing.
                return Err(self.count_failure(AllocError::OutOfMemory, size));
            }
            if !self.wait_for_growth(
                seen,
                refusals,
                pages_for(self.geometry(), size, align),
                host,
            ) {
                if !self.may_grow() {
                    // Refused or stopped: one more search, which now
                    // retires every slot's parked pages (see
                    // `scavenge_near`); then the failure is final.
                    continue;
                }
                return self.last_resort(size, align, slot);
            }
        }
    }

    /// For a group of threads (a warp's lanes of one class) whose search
    /// for a page just failed on a heap that may grow: waits, as one, for
    /// the host to raise the limit (true: search again) or gives up
    /// (false: the caller goes on alone, through
    /// [`Heap::alloc_growing`]). A failed search leaves an ask above the
    /// limit (`grow_want`); none is pending when the host has answered it
    /// since, and the group searches again at once. A host that refuses
    /// or stops also means one more search (true), as does a heap that
    /// cannot grow any more after a search that left pages to growth
    /// (`deferred`): the heap cannot grow now, so the search retires every
    /// slot's parked pages.
    #[cold]
    #[inline(never)]
    pub fn await_growth<G: GrowHost>(&self, pages: u32, deferred: bool, host: &G) -> bool {
        let seen = self.limit();
        let refusals = self.counters().grow_refusals.load(Ordering::Acquire);
        if !self.may_grow() {
            // Growth was refused or stopped since a search that left
            // pages to it (`deferred`: [`Heap::reserve`] said
            // [`AllocError::Growing`]): one more search, in full.
            return deferred;
        }
        if self.counters().grow_want.load(Ordering::Acquire) <= seen as u64 {
            return true; // answered since the search failed
        }
        self.wait_for_growth(seen, refusals, pages, host) || !self.may_grow()
    }

    /// Asks for `seen + pages` pages and waits until the limit passes
    /// `seen` (true) or the host refuses, stops or times out (false).
    fn wait_for_growth<G: GrowHost>(&self, seen: u32, refusals: u64, pages: u32, host: &G) -> bool {
        let c = self.counters();
        let bell = c.grow_bell.load(Ordering::Acquire);
        if bell == 0 {
            return false;
        }
        let want = seen as u64 + pages as u64;
        // A wait at this limit timed out: the host is held up (it may be
        // waiting for this very kernel), so this one would too, unless the
        // limit rose since this thread read it. The host clears the word
        // wherever it can lower the limit back to one that timed out
        // (`trim`, `restore`).
        let stalled = seen as u64 + 1;
        if c.grow_stalled.load(Ordering::Relaxed) == stalled {
            return self.limit() > seen;
        }
        Counters::bump(&c.grow_waits, 1);
        let start = host.now_ns();
        let mut round = 0;
        loop {
            if c.grow_want.load(Ordering::Relaxed) < want {
                c.grow_want.fetch_max(want, Ordering::AcqRel);
            }
            self.ring_if_new(bell, host);
            host.pause(round);
            round = round.saturating_add(1);
            if self.limit() > seen {
                return true;
            }
            if c.grow_refusals.load(Ordering::Acquire) != refusals
                || c.grow_bell.load(Ordering::Relaxed) != bell
                || c.grow_stalled.load(Ordering::Relaxed) == stalled
            {
                return false;
            }
            if host.now_ns().wrapping_sub(start) > GROW_TIMEOUT_NS {
                Counters::bump(&c.grow_timeouts, 1);
                c.grow_stalled.store(stalled, Ordering::Relaxed);
                return false;
            }
        }
    }

    /// Records that the heap had no fresh run of `pages` pages below
    /// `limit` (the limit the search used: a thread that read a limit
    /// since raised must not ask for a step beyond it): raises the ask
    /// (the waiting threads ring it). True for the thread that raised it,
    /// which then searches the rest of the heap once for the step; the
    /// others stop searching.
    #[cold]
    pub(super) fn ask_for(&self, limit: u32, pages: u32) -> bool {
        let want = limit as u64 + pages as u64;
        self.counters().grow_want.fetch_max(want, Ordering::AcqRel) < want
    }

    /// Rings the doorbell if the ask is above the largest one rung and
    /// this thread is the one that raised `grow_rung` to it.
    #[inline(always)]
    fn ring_if_new<G: GrowHost>(&self, bell: u64, host: &G) {
        let c = self.counters();
        let want = c.grow_want.load(Ordering::Acquire);
        if c.grow_rung.load(Ordering::Relaxed) < want
            && c.grow_rung.fetch_max(want, Ordering::AcqRel) < want
        {
            let ticket = c.grow_requests.fetch_add(1, Ordering::Relaxed) + 1;
            host.ring(bell, ticket);
        }
    }

    /// The host did not answer in time: the search of every page of the
    /// class (which a pending ask skips), then a counted failure.
    #[cold]
    fn last_resort(&self, size: usize, align: usize, slot: u32) -> Result<*mut u8, AllocError> {
        if let Some(class) = class_of_aligned(size, align) {
            let retired = self.returned_count();
            if self.reserve_by_scan_or_fail(class, slot, retired).is_ok() {
                if let Ok(p) = self.try_alloc_aligned(size, align, slot) {
                    return Ok(p);
                }
            }
        }
        Err(self.count_failure(AllocError::OutOfMemory, size))
    }
}

/// Pages an allocation of `size` bytes at `align` takes from the page map.
fn pages_for(geo: Geometry, size: usize, align: usize) -> u32 {
    match class_of_aligned(size, align) {
        Some(class) => geo.page_units(class),
        None => span_pages(size).min(u32::MAX as usize) as u32,
    }
}

//! Allocation: reserve blocks on a slot's current page, claim them from
//! the bitmap, install a new page when it is full, and the out-of-memory
//! fallbacks (spans of whole units, a scan of every page of the class).

use super::{AllocError, Heap, Placement};
use crate::page::{STATE_ATTACHED, STATE_LISTED};
use crate::size_class::{class_of, class_of_aligned, valid_align, CLASS_COUNT};
use crate::stats::{Counters, Tally};
use crate::sync::{acquire_fence, spin_hint, Ordering};
use crate::word::Word;

/// Blocks of one class reserved on one page, not yet claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub page: u32,
    pub class: u32,
    pub count: u32,
    /// Block to start claiming at: where the reserved blocks are if the
    /// page's blocks are claimed in the order they are reserved (see
    /// [`Bitmap::claim`](crate::bitmap::Bitmap::claim)).
    pub start: u32,
}

/// Blocks claimed from one bitmap word of one page: bit `b` of `mask` is
/// block `word * W::BITS + b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run<W> {
    pub page: u32,
    pub word: u32,
    pub mask: W,
}

/// A slot's cache entry while one thread installs a page there.
pub(super) const INSTALLING: u32 = u32::MAX;
/// Slots whose lists are tried before a fresh page, and whose parked
/// pages a heap that can grow retires before it grows (`scavenge_near`).
const NEAR_SLOTS: u32 = 4;
/// Far slots whose list heads an install reads, all at once, after the
/// near slots' lists and before a fresh page, on a heap with
/// [`Placement::FAR_LISTS`]. On an H100 80 GB (`cuheap bench device`,
/// churn case: 1M threads, 20 rounds, `docs/ab-far-probes-h100.txt`),
/// footprint over live bytes ends at 1.40-1.41 with 8 probes, 1.37 with
/// 16 and 1.39 with 32 (1.83-1.86 without far lists), and rises least
/// with 16 (0.03 from round 4 to 20, 0.05 with 8); 1M x 256 B pairs take
/// 5% longer than without far lists with 8 probes, 7% with 16 and 9%
/// with 32.
const FAR_PROBES: u32 = 16;
// `far_listed` names each probe, one bit of a u32.
const _: () = assert!(FAR_PROBES == 16);
/// Passes of the last-resort scan while it sees pages in transit (see
/// [`Scan::InTransit`]), 64 spin hints apart (on a host with `std`, the first passes: see
/// [`TRANSIT_WAIT`]).
const SCAN_ROUNDS: u32 = 8;
/// Whether the heap counts class-page activations from just before their
/// claim in the page map to the store of their class, so that a
/// last-resort scan waits for a page in between ([`Heap::claim_units`]).
/// Not on the GPU: there the count sat on the critical path of every
/// warp waiting for its slot's new page (the claim's release waited for
/// the count's round trip, then the end's for its own), and on an H200
/// allocation kernels took 1-4% longer (1M threads of 4 KiB: 0.268-0.272
/// ms against 0.257-0.262, `docs/ab-activation-count-h200.txt`), while a
/// GPU's scan gives up on pages in transit after its short passes anyway.
pub(super) const COUNTS_ACTIVATIONS: bool = !cfg!(target_arch = "nvptx64");

/// On a host with `std`: how long the last-resort scan keeps waiting,
/// yielding its CPU between passes, for pages in transit after
/// [`SCAN_ROUNDS`] passes. A page is in transit for a few instructions of
/// its holder's, unless the OS takes the holder's CPU away meanwhile:
/// then for a time slice or more, and a scan of a few microseconds gave
/// up with free blocks on that page, a null (8 threads on a loaded
/// 16-core host). The bound stays so that a page lost in transit by a
/// bug shows as a null, not a hang. A caller with a fallback of its own
/// (a pool that would grow) skips the wait: [`without_transit_wait`].
#[cfg(host_std)]
const TRANSIT_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

#[cfg(host_std)]
std::thread_local! {
    /// This thread's allocations skip [`TRANSIT_WAIT`] (see
    /// [`without_transit_wait`]).
    static NO_TRANSIT_WAIT: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Runs `f` with this thread's allocations giving up on free blocks in
/// transit after the last-resort scan's first short passes, as on a GPU,
/// instead of waiting up to [`TRANSIT_WAIT`] for them: for a caller that
/// has a fallback when the heap says it is out of memory (a pool grows
/// its mapping), which a wait of up to a time slice would only delay. The
/// setting is the thread's, for the length of `f` (also if it panics).
#[cfg(host_std)]
pub fn without_transit_wait<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            NO_TRANSIT_WAIT.with(|n| n.set(self.0));
        }
    }
    let _restore = Restore(NO_TRANSIT_WAIT.with(|n| n.replace(true)));
    f()
}

/// The last-resort scan's wait between passes that saw pages in
/// transit: [`SCAN_ROUNDS`] short spins, then on a host with `std`
/// yields until [`TRANSIT_WAIT`] has passed (each yield counted in
/// [`Counters::transit_waits`]).
#[derive(Default)]
struct TransitWait {
    passes: u32,
    #[cfg(host_std)]
    since: Option<std::time::Instant>,
}

impl TransitWait {
    /// Waits before another pass; false once the wait is over.
    #[inline(always)]
    fn again(&mut self, counters: &Counters) -> bool {
        if self.passes < SCAN_ROUNDS {
            self.passes += 1;
            for _ in 0..64 {
                spin_hint();
            }
            return true;
        }
        #[cfg(host_std)]
        if !NO_TRANSIT_WAIT.with(|n| n.get()) {
            let since = *self.since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() < TRANSIT_WAIT {
                Counters::bump(&counters.transit_waits, 1);
                std::thread::yield_now();
                return true;
            }
        }
        let _ = counters;
        false
    }
}

/// What one pass of the last-resort scan found.
enum Scan {
    /// A page with free blocks is on a list now.
    Listed,
    /// Pages with free blocks, none of which could be taken over, or
    /// pages of any class between activation or retirement and the next
    /// step (whose units are on their way to this class or back to the
    /// page map).
    InTransit,
    /// No page of the class has a free block, and no page is in transit.
    Nothing,
}

impl<W: Word> Heap<'_, W> {
    /// Allocates `size` bytes; slot `slot` picks the current pages to use.
    pub fn alloc(&self, size: usize, slot: u32) -> Result<*mut u8, AllocError> {
        match class_of(size) {
            Some(class) => match self.one_block(class, slot) {
                Ok(p) => Ok(p),
                Err(e) => match self.search_again(class, slot, e == AllocError::Growing) {
                    Some(p) => Ok(p),
                    None => self.alloc_fallback(size, class, slot),
                },
            },
            None => self.alloc_span(size, slot),
        }
    }

    /// Allocates `size` bytes at a multiple of `align` (a power of two up
    /// to [`MAX_ALIGN`](crate::size_class::MAX_ALIGN), the page size; 16
    /// and below are what [`Heap::alloc`] gives anyway). The block is the
    /// smallest class whose blocks all have that alignment, so no padding
    /// is taken; sizes over the largest class are spans, page-aligned.
    /// Fails, counted, on size 0, sizes over the heap, a bad alignment
    /// ([`AllocError::BadAlignment`]) and exhaustion.
    ///
    /// # Time complexity
    ///
    /// That of [`Heap::alloc`]: picking the class is O(1).
    pub fn alloc_aligned(
        &self,
        size: usize,
        align: usize,
        slot: u32,
    ) -> Result<*mut u8, AllocError> {
        self.try_alloc_aligned(size, align, slot)
            .map_err(|e| self.count_failure(e, size))
    }

    /// [`Heap::alloc_aligned`] without counting a failure: for a caller
    /// that has a fallback (a shrinking realloc keeps its block), so the
    /// counters, which a growable heap grows by, see only real shortfalls.
    pub fn try_alloc_aligned(
        &self,
        size: usize,
        align: usize,
        slot: u32,
    ) -> Result<*mut u8, AllocError> {
        if !valid_align(align) {
            return Err(AllocError::BadAlignment);
        }
        match class_of_aligned(size, align) {
            Some(class) => match self.one_block(class, slot) {
                Ok(p) => Ok(p),
                Err(e) => self.try_fallback(size, class, slot, e == AllocError::Growing),
            },
            None => self.try_span(size, slot),
        }
    }

    /// After [`Heap::reserve`] failed for `class` (with a search in full:
    /// not [`AllocError::Growing`] on a heap that can no longer grow): a
    /// class whose pages are several units long may still fit as a span of
    /// whole units (a small or fragmented heap); otherwise the failure is
    /// counted here.
    ///
    /// Out of line, called with the heap's handle in scalars (see
    /// `Heap::settle`: a view passed by reference stays in local memory
    /// for the whole kernel).
    #[inline(always)]
    pub fn alloc_fallback(
        &self,
        size: usize,
        class: u32,
        slot: u32,
    ) -> Result<*mut u8, AllocError> {
        let h = self.handle();
        fallback_at::<W>(h.meta, h.data, h.page_count, h.slots, size, class, slot)
    }

    #[inline(always)]
    fn fallback_here(&self, size: usize, class: u32, slot: u32) -> Result<*mut u8, AllocError> {
        if self.geometry().page_units(class) > 1 {
            return self.alloc_span(size, slot);
        }
        Err(self.count_failure(AllocError::OutOfMemory, size))
    }

    /// A block of `class` from one more search, if the last one was
    /// `deferred` (left pages to growth: [`AllocError::Growing`]) and the
    /// heap cannot grow now, so that this one is in full.
    #[inline(always)]
    fn search_again(&self, class: u32, slot: u32, deferred: bool) -> Option<*mut u8> {
        if !deferred || self.may_grow() {
            return None;
        }
        self.one_block(class, slot).ok()
    }

    /// One block of `class` for slot `slot`: [`Heap::reserve`], then
    /// [`Heap::claim`], counted in the slot's tally.
    #[inline(always)]
    fn one_block(&self, class: u32, slot: u32) -> Result<*mut u8, AllocError> {
        let mut g = self.reserve(class, 1, slot)?;
        let run = self.claim(&mut g);
        self.count_allocated(slot, 0, 1);
        Ok(self.run_addr(&run, class, 0))
    }

    /// Counts `n` class blocks that slot `slot` allocated through
    /// [`Heap::reserve`] and [`Heap::claim`], in its tally (counter `way`:
    /// see [`Tallies::allocated`](crate::Tallies::allocated)): callers of
    /// those two count their blocks here (a warp once for all its lanes);
    /// every other allocation function counts its own.
    #[inline(always)]
    pub fn count_allocated(&self, slot: u32, way: u32, n: u32) {
        self.tallies().allocated(self.slot_index(slot), way, n);
    }

    /// [`Heap::alloc_fallback`] without counting a failure, after one more
    /// search if the last was `deferred` (see [`Heap::search_again`]).
    #[cold]
    #[inline(never)]
    fn try_fallback(
        &self,
        size: usize,
        class: u32,
        slot: u32,
        deferred: bool,
    ) -> Result<*mut u8, AllocError> {
        if let Some(p) = self.search_again(class, slot, deferred) {
            return Ok(p);
        }
        // A heap that can grow grows instead: a span of a whole unit per
        // block would waste most of it.
        if self.geometry().page_units(class) > 1 && !self.may_grow() {
            return self.try_span(size, slot);
        }
        Err(AllocError::OutOfMemory)
    }

    /// Reserves up to `want` (1..=4096) blocks of `class` on one page: the
    /// bulk entry point behind warp aggregation. The grant may hold fewer
    /// than `want` blocks when the page fills; ask again for the rest.
    /// The caller counts the blocks it hands out
    /// ([`Heap::count_allocated`]).
    /// Out of memory is not counted here: callers finish with
    /// [`Heap::alloc_fallback`], which counts what finally fails. On a
    /// heap a host grows while kernels run, [`AllocError::Growing`] says
    /// the search left pages to growth: wait ([`Heap::await_growth`]) and
    /// reserve again.
    #[inline(always)]
    pub fn reserve(&self, class: u32, want: u32, slot: u32) -> Result<Grant, AllocError> {
        if class as usize >= CLASS_COUNT || want == 0 {
            return Err(AllocError::ZeroSize);
        }
        let cache = self.slot_cache(class, slot);
        loop {
            // Relaxed: the `take` below acquires the page's state.
            let cur = cache.load(Ordering::Relaxed);
            if cur == INSTALLING {
                spin_hint();
                continue;
            }
            if cur == 0 {
                self.install_page(class, slot)?;
                continue;
            }
            let page = cur - 1;
            let d = &self.descs()[page as usize];
            let before = d.take(want);
            let got = if before.live && before.free > 0 {
                (before.free as u32).min(want)
            } else {
                0
            };
            if got < want {
                self.return_blocks(page, want - got, slot);
            }
            if got > 0 {
                // The class the page served when `take` reserved on it.
                if before.class == class + 1 {
                    let cap = self.geometry().blocks_per_page(class);
                    return Ok(Grant {
                        page,
                        class,
                        count: got,
                        start: cap.saturating_sub(before.free as u32),
                    });
                }
                // The slot was re-pointed after we read it and the page now
                // serves another class: not ours to use.
                self.return_blocks(page, got, slot);
                continue;
            }
            // Full: detach it so the next round takes another page.
            if cache
                .compare_exchange(cur, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                let a = d.float();
                self.settle(page, a, slot);
            }
        }
    }

    /// Claims up to `g.count` reserved blocks from one word; a grant with
    /// none left gives an empty run (`mask` zero).
    #[inline(always)]
    pub fn claim(&self, g: &mut Grant) -> Run<W> {
        if g.count == 0 {
            return Run {
                page: g.page,
                word: 0,
                mask: W::ZERO,
            };
        }
        let bm = self.bitmap(g.page);
        let nwords = self.geometry().blocks_per_page(g.class).div_ceil(W::BITS);
        loop {
            // A reservation guarantees enough set bits; a pass can miss them
            // only while other claimers move, so retrying terminates.
            if let Some((word, mask)) = bm.claim(g.start, nwords, g.count) {
                g.count -= mask.count_ones();
                // The rest most likely follows the highest block claimed.
                g.start = word * W::BITS + W::BITS - mask.leading_zeros();
                return Run {
                    page: g.page,
                    word,
                    mask,
                };
            }
            spin_hint();
        }
    }

    /// Gives a slot a current page for `class` (cold path). One thread per
    /// slot does it (the slot holds `INSTALLING` meanwhile), so a burst of
    /// warps finding the page full takes one new page, not one each.
    #[inline(never)]
    fn install_page(&self, class: u32, slot: u32) -> Result<(), AllocError> {
        if self.growth_pending() {
            // The heap was found full and the host is adding pages: wait
            // for them (`alloc_growing`) rather than queue behind one
            // installer per slot to find it full again.
            return Err(AllocError::Growing);
        }
        let cache = self.slot_cache(class, slot);
        if cache
            .compare_exchange(0, INSTALLING, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return Ok(()); // someone else is installing or installed one
        }
        // Before the search of the page map: a page retired after it, or
        // a colliding claim that gave back units it had taken, returned
        // units that search did not see (`reserve_by_scan_or_fail`).
        let retired = self.returned_count();
        match self.acquire_page(class, slot) {
            Ok(p) => {
                cache.store(p + 1, Ordering::Release);
                Ok(())
            }
            Err(deferred) => {
                cache.store(0, Ordering::Release);
                if self.may_grow() {
                    // Growing beats a scan of every page (see `grow`).
                    return Err(AllocError::Growing);
                }
                if deferred {
                    // Growth was refused or stopped since the search left
                    // pages to it: search again (`reserve` loops), now in
                    // full.
                    return Ok(());
                }
                self.reserve_by_scan_or_fail(class, slot, retired)
            }
        }
    }

    /// A page for `class`, attached to nobody yet (state `ATTACHED`): this
    /// slot's list, nearby slots' lists, far slots' lists (with
    /// [`Placement::FAR_LISTS`]), a fresh page, any slot's list, then
    /// empty pages reclaimed from every list (near this slot only, on a
    /// heap that can grow). `Err(true)`: none, and the search left pages
    /// to growth (a pending ask, or a scavenge of the near slots only);
    /// `Err(false)`: none after the full search.
    fn acquire_page(&self, class: u32, slot: u32) -> Result<u32, bool> {
        let pop = |s: u32| self.pop_listed(class, s);
        for k in 0..NEAR_SLOTS.min(self.slots) {
            if let Some(p) = pop(slot.wrapping_add(k)) {
                return Ok(p);
            }
        }
        if self.placement() & Placement::FAR_LISTS != 0 {
            let h = self.handle();
            let far = far_listed_at::<W>(h.meta, h.data, h.page_count, h.slots, class, slot);
            if let Some(p) = far.and_then(pop) {
                return Ok(p);
            }
        }
        if self.growth_pending() {
            return Err(true); // the host is adding pages (see `grow`)
        }
        let limit = self.limit();
        let floor = self.fresh_floor(limit);
        let hint = self.fresh_hint(slot, floor, limit);
        let units = self.geometry().page_units(class);
        let mut claimed = self.claim_units(units, hint, floor, limit);
        if claimed.is_none() && floor > 0 {
            claimed = self.claim_whole(units, limit);
        }
        if let Some(p) = claimed {
            self.activate(p, class);
            return Ok(p);
        }
        if self.may_grow() && !self.ask_for(limit, units) {
            return Err(true); // another thread asked for this step first
        }
        for k in NEAR_SLOTS..self.slots {
            if let Some(p) = pop(slot.wrapping_add(k)) {
                return Ok(p);
            }
        }
        // Claim again even if this scavenge retired nothing: another
        // thread's may just have freed the units.
        let deferred = self.scavenge_near(slot);
        if let Some(p) = self.claim_whole(units, self.limit()) {
            self.activate(p, class);
            return Ok(p);
        }
        Err(deferred)
    }

    /// A page popped from `slot`'s list of `class`, now attached.
    #[inline(always)]
    fn pop_listed(&self, class: u32, slot: u32) -> Option<u32> {
        let p = self.list(class, slot).pop(self.next_of())?;
        self.descs()[p as usize]
            .state
            .store(STATE_ATTACHED, Ordering::Relaxed);
        Some(p)
    }

    /// A far slot (past the near ones) whose list of `class` is not empty,
    /// among [`FAR_PROBES`] slots spread evenly over the others; `None` if
    /// all of those are empty. Reads the heads only, in straight-line code
    /// before any is used, so that on a GPU the loads are in flight
    /// together (a loop is unrolled four times at most). The probes start
    /// at an offset taken from the slot's own list tag, which every push
    /// and pop changes, so successive installs of one slot look at
    /// different far slots. With fewer far slots than probes, some are
    /// read twice.
    ///
    /// # Time Complexity
    ///
    /// O([`FAR_PROBES`]).
    #[inline(always)]
    fn far_listed(&self, class: u32, slot: u32) -> Option<u32> {
        let far = self.slots.saturating_sub(NEAR_SLOTS);
        if far == 0 {
            return None;
        }
        let step = far.div_ceil(FAR_PROBES);
        let turn = self.list(class, slot).tag() % step;
        let at = |k: u32| slot.wrapping_add(NEAR_SLOTS + (turn + k * step) % far);
        let listed = |k: u32| (!self.list(class, at(k)).is_empty() as u32) << k;
        macro_rules! probes {
            ($($k:literal)*) => { 0 $(| listed($k))* };
        }
        let found: u32 = probes!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
        if found == 0 {
            None
        } else {
            Some(at(found.trailing_zeros()))
        }
    }

    /// Retires empty parked pages for a search that found no fresh page,
    /// after it asked to grow (or before it fails): those of every slot,
    /// or on a heap that can grow, only those of `slot` and its
    /// neighbours. On an H100 the asking thread's scavenge of every slot
    /// held its warp, and the warps queued behind its slot's install, for
    /// up to 3.6 ms while a kernel ran (2.6 ms with its loads
    /// overlapped). The whole heap's parked pages are retired once it
    /// cannot grow (a search that left pages to growth is repeated when
    /// growth is refused or stopped) and by a trim between launches.
    /// Returns whether it left the far slots to growth.
    pub(super) fn scavenge_near(&self, slot: u32) -> bool {
        if self.may_grow() {
            self.scavenge_slots(slot, NEAR_SLOTS);
            true
        } else {
            self.scavenge();
            false
        }
    }

    /// Claims `units` units anywhere below `limit`: the search that runs
    /// before a heap that grows asks for more, once its last step's pages
    /// are taken (pages freed below the floor come first). A page found
    /// below the floor sends later searches to the whole heap.
    fn claim_whole(&self, units: u32, limit: u32) -> Option<u32> {
        let p = self.claim_units(units, 0, 0, limit)?;
        self.note_claimed(p);
        Some(p)
    }

    /// After a search of the whole heap claimed page `p`: a page below the
    /// floor sends later searches to the whole heap.
    pub(super) fn note_claimed(&self, p: u32) {
        if p < self.counters().grow_floor.load(Ordering::Relaxed) as u32 {
            self.counters().grow_floor.store(0, Ordering::Relaxed);
        }
    }

    /// Where the search for a fresh page starts and wraps: page 0, or on
    /// a heap that grows while kernels run, the limit before the host's
    /// last step (`grow_floor`). Such a heap is mostly full by design, and
    /// its new pages are those of the last step: a search there does not
    /// walk the page map through the pages handed out before it, which on
    /// an H100 made a heap growing in a launch several times slower. What
    /// was freed below the floor is found by the full search that runs
    /// before the heap asks to grow.
    #[inline(always)]
    pub(super) fn fresh_floor(&self, limit: u32) -> u32 {
        if !self.may_grow() {
            return 0;
        }
        let floor = self.counters().grow_floor.load(Ordering::Relaxed);
        if floor < limit as u64 {
            floor as u32
        } else {
            0
        }
    }

    /// Where slot `slot` starts looking for fresh pages in `floor..limit`:
    /// slots spread over it, so their searches do not collide.
    #[inline(always)]
    fn fresh_hint(&self, slot: u32, floor: u32, limit: u32) -> u32 {
        floor + slot.wrapping_mul(0x9E37_79B9) % (limit - floor)
    }

    /// Claims `units` free consecutive units in `floor..limit` from the
    /// page map, for a class page that the caller then activates: on a
    /// host ([`COUNTS_ACTIVATIONS`]) the activation is counted as begun
    /// before the claim takes the units and as ended by
    /// [`Heap::activate`], so a last-resort scan that found them taken
    /// waits until the page names its class.
    #[inline(never)]
    fn claim_units(&self, units: u32, hint: u32, floor: u32, limit: u32) -> Option<u32> {
        // An indexed map counts the units as it claims them; a heap
        // without one counts them in `activate`.
        let map = self.claiming(Tally::ClassPage, COUNTS_ACTIVATIONS);
        // Aligned to the largest power of two that divides the page's
        // units: pages of 2, 4, 8 and 16 units tile aligned blocks of their
        // size, as in a buddy allocator, so an emptied heap has room for
        // its largest pages again; others (3, 5, 6, 7, 10, 12, 14 units)
        // leave less than their alignment between them. Aligned to the
        // next power of two, those left up to 6 free pages after each,
        // which split the runs that spans need and the full words that
        // searches skip over.
        let align = 1 << units.trailing_zeros();
        let hint = match self.placement() & Placement::CLASS_PAGES_LOW {
            0 => hint,
            _ => floor,
        };
        if units == 1 {
            map.claim_one_within(hint, floor, limit)
        } else {
            // Aligned, so pages pack (see `claim_run_aligned`); a page
            // that finds no aligned run is served as a span instead
            // (`try_fallback`), which may start anywhere.
            map.claim_run_within(units, align, floor, limit, hint)
        }
    }

    /// Out of fresh pages: before failing, look for free blocks of `class`
    /// on any page: floating pages under the list threshold and other
    /// slots' current pages are moved to this slot's list, where the next
    /// reserve round finds them. A page with free blocks that is between
    /// two owners (being installed, popped from a list) cannot be taken
    /// over; the scan is repeated a few times while it sees such pages, so
    /// free blocks are reported as exhaustion only when they stay out of
    /// reach.
    ///
    /// A page retired since `retired` was read ([`Heap::returned_count`],
    /// before the caller's search of the page map where it made one) gave
    /// its units back to the page map: then the caller searches again
    /// instead of failing (also after retirements of its own search's
    /// scavenge: one more round, on a path that fails anyway); so does,
    /// on a host, a claim that collided and gave back units it had taken
    /// (which the caller's search may have found taken). A page on
    /// its way there (retired, its release not ended) counts as in
    /// transit: a scavenge may retire the very page this scan waited for.
    /// So is, on a host, a page whose units the caller's search found
    /// taken while its descriptor does not name its class yet: an
    /// activation counted as begun and not ended ([`Heap::claim_units`]).
    #[inline(never)]
    pub(super) fn reserve_by_scan_or_fail(
        &self,
        class: u32,
        slot: u32,
        retired: u64,
    ) -> Result<(), AllocError> {
        if COUNTS_ACTIVATIONS {
            // The search's loads of the page map were relaxed: the counts
            // of the activations whose claims it saw are read after this.
            acquire_fence();
        }
        let mut wait = TransitWait::default();
        loop {
            // Before the pass: an activation ended by now shows its page
            // to the pass; one not ended reads as begun after it.
            let activated = self.activated_count();
            match self.scan_for_free(class, slot) {
                Scan::Listed => return Ok(()),
                // Nothing, and no release or activation under way:
                // nothing to wait for.
                Scan::Nothing if !self.releasing() && !self.activating(activated) => break,
                // In transit, or a release or an activation under way.
                _ if wait.again(self.counters()) => {}
                _ => break,
            }
        }
        match self.returned_count() != retired {
            true => Ok(()),
            false => Err(AllocError::OutOfMemory),
        }
    }

    /// Whether span claims count as begun while they take their pages
    /// (as class-page claims do until their activation ends): on a host
    /// heap without an index of free runs, whose claims take a run a
    /// word at a time and give back what they took when they collide, so
    /// that a search that found the pages taken waits for the claim
    /// ([`Heap::search_after_claims`]). An indexed heap claims under its
    /// lock, all or nothing; a kernel's heap does not count
    /// ([`COUNTS_ACTIVATIONS`]).
    #[inline(always)]
    pub(super) fn span_claims_counted(&self) -> bool {
        COUNTS_ACTIVATIONS && !self.counts_in_map()
    }

    /// The page map for a claim of `what`, counted as begun and given
    /// back ([`PageMap::counting`](crate::page_map::PageMap::counting))
    /// with `counted`.
    #[inline(always)]
    pub(super) fn claiming(&self, what: Tally, counted: bool) -> crate::page_map::PageMap<'_> {
        self.counting_if(self.tallied(what), counted)
    }

    /// `map`, counting its claims as begun and given back with
    /// `counted` (see [`Heap::claiming`]).
    #[inline(always)]
    pub(super) fn counting_if<'m>(
        &'m self,
        map: crate::page_map::PageMap<'m>,
        counted: bool,
    ) -> crate::page_map::PageMap<'m> {
        match counted {
            true => map.counting(
                &self.counters().activations_begun,
                &self.counters().claims_given_back,
            ),
            false => map,
        }
    }

    /// Ends a claim counted as begun (a span's, a fence's) once it holds
    /// its pages (a release: a search that reads the count taken back
    /// sees them taken for good).
    pub(super) fn end_claim(&self) {
        self.counters()
            .activations_begun
            .fetch_sub(1, Ordering::Release);
    }

    /// After a span's searches of the page map failed, on a host heap
    /// without an index ([`Heap::span_claims_counted`]): waits while a
    /// claim (a class page's until its activation ends, a span's until
    /// it holds its pages) or a page release is under way, since the
    /// searches may have found its pages taken; then claims again with
    /// `claim` if units came back since `returned` was read (before the
    /// searches, [`Heap::returned_count`]), within the last-resort scan's
    /// wait and at most [`SCAN_ROUNDS`] times: on a busy heap units come
    /// back all the time, and a span that fits nowhere should not wait
    /// out the whole wait.
    #[cold]
    #[inline(never)]
    pub(super) fn search_after_claims(
        &self,
        mut returned: u64,
        claim: impl Fn() -> Option<u32>,
    ) -> Option<u32> {
        let mut wait = TransitWait::default();
        let mut claims = 0;
        loop {
            // The searches' loads of the page map were relaxed: the
            // counts of the claims whose pages they saw are read after.
            acquire_fence();
            let activated = self.activated_count();
            if !self.releasing() && !self.activating(activated) {
                let now = self.returned_count();
                if now == returned || claims == SCAN_ROUNDS {
                    return None;
                }
                (returned, claims) = (now, claims + 1);
                if let Some(p) = claim() {
                    return Some(p);
                }
            }
            if !wait.again(self.counters()) {
                return None;
            }
        }
    }

    /// Events that returned units to the page map: pages whose release
    /// has ended and, on a host ([`COUNTS_ACTIVATIONS`]), counted claims
    /// (class pages', and spans' and fences' on a heap without an index)
    /// that gave back units they had taken after a collision
    /// ([`PageMap::counting`](crate::page_map::PageMap::counting)). A sum of two counts that only grow: it
    /// moves when either does. Read before a search of the page map, and
    /// again once it failed: a change means units came back that the
    /// search may not have seen.
    #[inline(always)]
    pub(super) fn returned_count(&self) -> u64 {
        let given_back = match COUNTS_ACTIVATIONS {
            true => self.counters().claims_given_back.load(Ordering::Acquire),
            false => 0,
        };
        self.retired_count().wrapping_add(given_back)
    }

    /// Pages whose release has ended (their units back in the page map).
    #[inline(always)]
    pub(super) fn retired_count(&self) -> u64 {
        self.counters().pages_retired.load(Ordering::Acquire)
    }

    /// Whether a page release has begun and not ended: counted as begun
    /// from its retiring CAS on a host ([`Heap::try_retire`], which also
    /// counts an attempt while its CAS runs), from [`Heap::release_units`]
    /// in a kernel.
    fn releasing(&self) -> bool {
        // Ended first: every release is counted as begun before it is as
        // ended, so begun, read after, is at least ended, read before.
        let ended = self.retired_count();
        self.counters().releases_begun.load(Ordering::Acquire) != ended
    }

    /// Activations that have ended (their pages name their class); 0
    /// where activations are not counted ([`COUNTS_ACTIVATIONS`]).
    #[inline(always)]
    fn activated_count(&self) -> u64 {
        match COUNTS_ACTIVATIONS {
            true => self.counters().pages_activated.load(Ordering::Acquire),
            false => 0,
        }
    }

    /// Whether an activation has begun that had not ended when
    /// `activated` was read ([`Heap::activated_count`], earlier): every
    /// activation is counted as begun before it is as ended, and a claim
    /// that lost its pages takes its count back after it counted it, so
    /// begun, read after, is more than `activated` exactly then (or while
    /// such a claim is under way). Never where activations are not
    /// counted ([`COUNTS_ACTIVATIONS`]).
    fn activating(&self, activated: u64) -> bool {
        COUNTS_ACTIVATIONS && self.counters().activations_begun.load(Ordering::Acquire) != activated
    }

    /// Whether any slot's list of `class` holds a page.
    fn any_listed(&self, class: u32) -> bool {
        (0..self.slots).any(|s| !self.list(class, s).is_empty())
    }

    /// One pass of [`Heap::reserve_by_scan_or_fail`].
    fn scan_for_free(&self, class: u32, slot: u32) -> Scan {
        // Pages past the limit were never handed out (or were given back
        // before the limit was lowered): a growable heap's metadata covers
        // its whole reservation, mostly unmapped.
        let pages = &self.descs()[..self.limit() as usize];
        let mut seen = Scan::Nothing;
        // Whether any list of the class holds a page: read once a pass.
        let mut listed = None;
        for (p, d) in pages.iter().enumerate() {
            let p = p as u32;
            let kind = d.kind.load(Ordering::Acquire);
            if !(1..=CLASS_COUNT as u32).contains(&kind) {
                continue; // not a class page's head
            }
            let now = d.now();
            if !now.live {
                // A page of any class between its `kind` store and its
                // count's activation, or retired with its units not yet
                // released (see `release_units`): in transit.
                seen = Scan::InTransit;
                continue;
            }
            if kind != class + 1 || now.free <= 0 {
                continue;
            }
            if !now.floating {
                // Attached to a slot (or listed): detach it from whichever
                // slot holds it; the winner of that CAS floats it.
                let held = (0..self.slots).any(|s| {
                    self.slot_cache(class, s)
                        .compare_exchange(p + 1, 0, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                });
                if !held {
                    // Listed: acquire finds it. On a host with `std`, a
                    // page that says so while no list of its class holds a
                    // page is off its list in a scavenge (to be retired or
                    // put back): in transit then, waited for with a yield
                    // (before, the allocation went back to the empty lists
                    // round after round with no yield until the scavenge
                    // ended; a GPU's, with no such wait, still does).
                    if d.state.load(Ordering::Relaxed) == STATE_LISTED
                        && (!cfg!(host_std)
                            || *listed.get_or_insert_with(|| self.any_listed(class)))
                    {
                        return Scan::Listed;
                    }
                    seen = Scan::InTransit;
                    continue;
                }
                d.float();
            }
            match d.unfloat() {
                Some(now) if now == class => {
                    self.list_page(p, class, slot);
                    return Scan::Listed;
                }
                // Retired and reused for another class since `kind` was
                // read: listed where it belongs.
                Some(now) => self.list_page(p, now, slot),
                None => seen = Scan::InTransit,
            }
        }
        seen
    }

    /// Counts an allocation of `size` bytes that failed with `e`: every
    /// failure in `failed_allocs`, and the bytes of those that failed for
    /// want of memory in `failed_bytes` (the heap's shortfall; size 0,
    /// too large and a bad alignment are not shortfalls growth could fix).
    ///
    /// Out of line (see [`Counters::take_units`]).
    #[cold]
    #[inline(never)]
    pub(super) fn count_failure(&self, e: AllocError, size: usize) -> AllocError {
        let c = self.counters();
        let cause = match e {
            AllocError::ZeroSize => &c.zero_size,
            AllocError::TooLarge => &c.too_large,
            AllocError::BadAlignment => &c.bad_alignment,
            // `Growing` never leaves the allocation functions; were it
            // counted, it would be a shortfall.
            AllocError::OutOfMemory | AllocError::Growing => {
                Counters::bump(&c.failed_bytes, size as u64);
                &c.out_of_memory
            }
        };
        Counters::bump(cause, 1);
        Counters::bump(&c.failed_allocs, 1);
        e
    }
}

/// [`Heap::alloc_fallback`] on the heap of a handle, out of line.
#[cold]
#[inline(never)]
fn fallback_at<W: Word>(
    meta: u64,
    data: u64,
    page_count: u32,
    slots: u32,
    size: usize,
    class: u32,
    slot: u32,
) -> Result<*mut u8, AllocError> {
    // SAFETY: as in `settle_at`.
    let heap = unsafe { Heap::<W>::from_parts(meta, data, page_count, slots) };
    heap.fallback_here(size, class, slot)
}

/// [`Heap::far_listed`] on the heap of a handle, out of line and with the
/// view in scalars (as `settle_at` is): inlined, it raised the spill
/// stores of `alloc_cuheap` at 128 registers (sm_90) from 20 to 44 bytes,
/// out of line to 36 (`docs/ptxas-far-lists-build-machine.txt`), although
/// few installs ever probe.
#[inline(never)]
fn far_listed_at<W: Word>(
    meta: u64,
    data: u64,
    page_count: u32,
    slots: u32,
    class: u32,
    slot: u32,
) -> Option<u32> {
    // SAFETY: the handle of a live view (`Heap::handle`), whose contract
    // holds while its caller runs, and so during this call.
    let heap = unsafe { Heap::<W>::from_parts(meta, data, page_count, slots) };
    heap.far_listed(class, slot)
}

#[cfg(all(test, host_std))]
mod tests {
    use super::{without_transit_wait, INSTALLING};
    use crate::heap::{AllocError, Heap};
    use crate::owned::OwnedHeap;
    use crate::size_class::{class_of, PAGE_SIZE};
    use crate::sync::Ordering;
    use std::time::{Duration, Instant};

    /// Allocates `size` bytes from slot 1 on another thread and, once that
    /// allocation has waited for the page in transit, runs `release`,
    /// which lets the page go; `release`'s argument waits until the
    /// allocation waits again after a whole pass that began after the
    /// call (true) or has ended (false). Asserts that it waited at first;
    /// returns what it got.
    fn alloc_while_held(
        heap: &Heap<'_, u32>,
        size: usize,
        release: impl FnOnce(&dyn Fn() -> bool),
    ) -> Result<usize, AllocError> {
        let waits = || heap.counters().transit_waits.load(Ordering::Relaxed);
        std::thread::scope(|sc| {
            let before = waits();
            let other = sc.spawn(|| heap.alloc(size, 1).map(|p| p as usize));
            // The count `n` past `from` within 10 s, while the allocation
            // runs.
            let past = |from: u64, n: u64| {
                let t = Instant::now();
                while waits() < from + n {
                    if other.is_finished() || t.elapsed() > Duration::from_secs(10) {
                        return false;
                    }
                    std::thread::yield_now();
                }
                true
            };
            // Asserted before `release`: an allocation that did not wait
            // has ended (or gives up within its bound once this panics).
            assert!(past(before, 1), "the allocation never waited for the page");
            // Two: the first may end a pass that began before the call.
            release(&|| past(waits(), 2));
            other.join().unwrap()
        })
    }

    /// A heap of one page of 256 B blocks, one block taken by slot 0, and
    /// that page detached from slot 0 (in transit, as `reserve` leaves a
    /// page it found full, or as an installer leaves one it popped):
    /// the page's number and the block.
    fn one_page_in_transit(heap: &Heap<'_, u32>) -> (u32, *mut u8) {
        let class = class_of(256).unwrap();
        assert_eq!(
            heap.geometry().page_units(class),
            1,
            "a page of 256 B blocks takes one unit"
        );
        let first = heap.alloc(256, 0).unwrap();
        let cache = heap.slot_cache(class, 0);
        let page = cache.load(Ordering::Acquire) - 1;
        assert_eq!(
            cache.compare_exchange(page + 1, 0, Ordering::AcqRel, Ordering::Relaxed),
            Ok(page + 1)
        );
        (page, first)
    }

    /// Frees both blocks and checks the heap ends empty and sound.
    fn free_both(heap: &Heap<'_, u32>, first: *mut u8, second: usize) {
        assert_ne!(second, first as usize);
        heap.free(first, 0).unwrap();
        free_last(heap, second);
    }

    /// Frees the last block, taken from slot 1, and checks the heap ends
    /// empty and sound.
    fn free_last(heap: &Heap<'_, u32>, p: usize) {
        heap.free(p as *mut u8, 1).unwrap();
        heap.check_invariants().unwrap();
        assert!(heap.stats().is_empty());
    }

    /// Another slot runs out while the heap's one page is in transit: the
    /// allocation waits for the page to settle instead of failing. The
    /// holder here settles it only once the allocation has waited, as a
    /// thread the OS took off its CPU does later.
    #[test]
    #[cfg_attr(miri, ignore)] // Miri's clock moves with the code it runs: seconds
    fn an_allocation_waits_for_free_blocks_in_transit() {
        let owned = OwnedHeap::<u32>::new(1, 2).unwrap();
        let heap = owned.heap();
        let (page, first) = one_page_in_transit(&heap);
        let second = alloc_while_held(&heap, 256, |_| {
            // The holder settles the page, as `reserve` does after it.
            let a = heap.descs()[page as usize].float();
            heap.settle(page, a, 0);
        });
        let second = second.expect("a block once the page settled, not a null");
        free_both(&heap, first, second);
    }

    /// The heap's one page, listed, popped off its list by a scavenge:
    /// its page number.
    fn one_page_off_its_list(heap: &Heap<'_, u32>) -> u32 {
        let class = class_of(256).unwrap();
        let (page, first) = one_page_in_transit(heap);
        heap.free(first, 0).unwrap();
        heap.list_page(page, class, 0);
        assert_eq!(heap.list(class, 0).pop(heap.next_of()), Some(page));
        page
    }

    /// The same page off every list while its state still says listed, as
    /// `scavenge_slots` leaves it between its pop and its push back: the
    /// scan waits for it as for any page in transit (yielding, bounded),
    /// rather than sending the allocation back to lists that hold nothing,
    /// round after round with no yield, until the scavenge ends.
    #[test]
    #[cfg_attr(miri, ignore)] // as above
    fn an_allocation_waits_for_a_page_a_scavenge_holds_off_its_list() {
        let owned = OwnedHeap::<u32>::new(1, 2).unwrap();
        let heap = owned.heap();
        let page = one_page_off_its_list(&heap);
        let got = alloc_while_held(&heap, 256, |_| {
            // The scavenge puts the page back on its list.
            let class = class_of(256).unwrap();
            heap.list(class, 0).push(page, heap.next_of());
        });
        free_last(
            &heap,
            got.expect("a block once the page was listed again, not a null"),
        );
    }

    /// The heap's one page, of 256 B blocks and all free, is off its list
    /// in a scavenge that retires it, while an allocation of `size` bytes
    /// runs out (from before the retirement, or with `retired_first` from
    /// once the page reads retired). The allocation keeps waiting while
    /// the page reads retired with its units not yet released, and while
    /// the release is counted as begun and not ended (once it failed in
    /// either window: the scan found no page with free blocks and no
    /// retirement ended); once the release ends it searches again and
    /// takes the units given back.
    fn alloc_while_a_page_retires(size: usize, retired_first: bool) {
        let owned = OwnedHeap::<u32>::new(1, 2).unwrap();
        let heap = owned.heap();
        let page = one_page_off_its_list(&heap);
        let units = heap.geometry().page_units(class_of(size).unwrap());
        assert_eq!(units, 1, "a page of the size fits in the heap");
        let class = class_of(256).unwrap();
        let cap = heap.geometry().blocks_per_page(class);
        let retire = || assert!(heap.try_retire(page, class, cap, false));
        if retired_first {
            retire();
        }
        let got = alloc_while_held(&heap, size, |waits_again| {
            let retired = retired_first || {
                retire();
                waits_again()
            };
            let released = release_after_a_wait(&heap, page, class, waits_again);
            assert!(retired, "the allocation gave up on the retired page");
            assert!(released, "the allocation gave up on a release not ended");
        });
        free_last(
            &heap,
            got.expect("a block from the retired page's units, not a null"),
        );
    }

    /// Gives the retired `page` of `class` back to the page map as a
    /// scavenge does, ending the release only once the allocation has
    /// waited again (`waits_again`, from [`alloc_while_held`]); whether it
    /// did.
    fn release_after_a_wait(
        heap: &Heap<'_, u32>,
        page: u32,
        class: u32,
        waits_again: &dyn Fn() -> bool,
    ) -> bool {
        heap.release_units(page, class);
        let released = waits_again();
        heap.end_release();
        released
    }

    /// The allocation waits for the page of its class off its list, and
    /// the scavenge retires that page meanwhile.
    #[test]
    #[cfg_attr(miri, ignore)] // as above
    fn an_allocation_takes_the_page_a_scavenge_retires_while_it_waits() {
        alloc_while_a_page_retires(256, false);
    }

    /// A page of another class (128 B blocks, whose pages also take one
    /// unit) is waited for the same way: its units are on their way back
    /// to the page map, where the allocation then takes them for a page
    /// of its class.
    #[test]
    #[cfg_attr(miri, ignore)] // as above
    fn an_allocation_waits_for_another_class_s_page_being_retired() {
        alloc_while_a_page_retires(128, true);
    }

    /// A span allocation on a host heap without an index, whose search
    /// finds one of the heap's two units taken by a class page that a
    /// scavenge has retired (its CAS made) and not yet given back: the
    /// release is counted as begun from the CAS on, so the allocation
    /// waits for it, and takes the span once the release has ended,
    /// instead of reporting exhaustion (before, the release was counted
    /// only once its units were on their way back).
    #[test]
    #[cfg_attr(miri, ignore)] // as above
    fn a_span_waits_for_a_page_retired_and_not_yet_released() {
        let owned = OwnedHeap::<u32>::new(2, 2).unwrap();
        let heap = owned.heap();
        let page = one_page_off_its_list(&heap);
        let class = class_of(256).unwrap();
        let cap = heap.geometry().blocks_per_page(class);
        assert!(heap.try_retire(page, class, cap, false));
        let got = alloc_while_held(&heap, 2 * PAGE_SIZE, |waits_again| {
            let released = release_after_a_wait(&heap, page, class, waits_again);
            assert!(released, "the allocation gave up on a release not ended");
        });
        free_last(
            &heap,
            got.expect("the span of the retired page's units, not a null"),
        );
    }

    /// An allocation of `size` bytes on a heap of two free units, both
    /// taken by another thread's claim, which then collides and gives
    /// them back (as a claim of several units does when another claim
    /// took one of them first). The claim's steps are written out, in the
    /// order the page map's `try_claim` makes them
    /// (`a_counting_view_counts_the_claims_that_keep_their_pages` tests
    /// those): counted as begun, the units taken; once the allocation
    /// waits, the units given back, the give-back counted, the begun
    /// count taken back. Returns what the allocation got (the heap's
    /// invariants checked after its free).
    fn alloc_past_a_give_back(size: usize) -> Result<(), AllocError> {
        let owned = OwnedHeap::<u32>::new(2, 2).unwrap();
        let heap = owned.heap();
        let c = heap.counters();
        c.activations_begun.fetch_add(1, Ordering::Relaxed);
        assert!(heap.fence(0, 2));
        let got = alloc_while_held(&heap, size, |_| {
            // SAFETY: the units were free and this test took them.
            unsafe { heap.unfence(0, 2) };
            c.claims_given_back.fetch_add(1, Ordering::Release);
            c.activations_begun.fetch_sub(1, Ordering::Release);
        });
        got.map(|p| free_last(&heap, p))
    }

    /// An allocation of one-unit pages (which no span serves instead)
    /// whose search of the page map finds the heap's units taken by a
    /// colliding claim: it waits for the claim, counted as begun, and
    /// once the claim has given its units back (counted) and taken its
    /// count back, searches again and takes one, instead of reporting
    /// exhaustion.
    #[test]
    #[cfg_attr(miri, ignore)] // as above
    fn an_allocation_searches_again_after_a_claim_gave_its_units_back() {
        let one_unit = OwnedHeap::<u32>::new(2, 2).unwrap();
        let class = class_of(256).unwrap();
        assert_eq!(one_unit.heap().geometry().page_units(class), 1);
        alloc_past_a_give_back(256).expect("a block of the units given back, not a null");
    }

    /// A span allocation whose search finds the heap's units taken by a
    /// colliding claim (of a class page or a span) that then gives them
    /// back: on a host heap without an index it waits for the claim,
    /// counted as begun, and searches again once the give-back is
    /// counted, instead of reporting exhaustion.
    #[test]
    #[cfg_attr(miri, ignore)] // as above
    fn a_span_searches_again_after_a_claim_gave_its_units_back() {
        alloc_past_a_give_back(2 * PAGE_SIZE)
            .expect("the span of the units given back, not a null");
    }

    /// Another slot runs out while the heap's one page is being activated
    /// by slot 0's installer: its unit is claimed in the page map, its
    /// descriptor does not name its class yet. The allocation waits for
    /// the activation, counted as begun and not ended, instead of failing,
    /// and takes a block from the page once the installer has made it
    /// slot 0's current page.
    #[test]
    #[cfg_attr(miri, ignore)] // as above
    fn an_allocation_waits_for_a_page_being_activated() {
        let owned = OwnedHeap::<u32>::new(1, 2).unwrap();
        let heap = owned.heap();
        let class = class_of(256).unwrap();
        let cache = heap.slot_cache(class, 0);
        cache.store(INSTALLING, Ordering::Release);
        let page = heap.claim_units(1, 0, 0, heap.limit()).unwrap();
        let got = alloc_while_held(&heap, 256, |_| {
            heap.activate(page, class);
            cache.store(page + 1, Ordering::Release);
        });
        let got = got.expect("a block from the activated page, not a null");
        free_last(&heap, got);
    }

    /// With [`without_transit_wait`], the allocation gives up on the page
    /// in transit after the short passes, with no wait counted, and the
    /// setting ends with the call.
    #[test]
    fn without_the_wait_an_allocation_fails_at_once_on_a_page_in_transit() {
        let owned = OwnedHeap::<u32>::new(1, 2).unwrap();
        let heap = owned.heap();
        let (page, first) = one_page_in_transit(&heap);
        let before = heap.counters().transit_waits.load(Ordering::Relaxed);
        let got = without_transit_wait(|| heap.alloc(256, 1));
        assert_eq!(got, Err(AllocError::OutOfMemory));
        assert_eq!(
            heap.counters().transit_waits.load(Ordering::Relaxed),
            before,
            "no wait"
        );
        let a = heap.descs()[page as usize].float();
        heap.settle(page, a, 0);
        let second = heap.alloc(256, 1).expect("a block from the settled page");
        free_both(&heap, first, second as usize);
    }
}

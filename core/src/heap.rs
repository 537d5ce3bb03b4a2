//! The heap: size-class pages over a caller-provided region.
//!
//! Allocation of `n` blocks of one class from slot `s` (a GPU uses its SM
//! id, host threads a hash of their id):
//!
//! 1. read the slot's current page for the class (`cache`);
//! 2. [`PageDesc::reserve`] `n` blocks there: one `fetch_sub`;
//! 3. claim the reserved blocks from the page's bitmap: one `fetch_and`
//!    per word (32 blocks for a `u32` word), starting at the word the
//!    reservation counter points to, so concurrent reservers spread out.
//!
//! When the current page is full the slot detaches it and takes a page
//! from the class's list of partly free pages, else a fresh page from the
//! page map, else retires empty pages parked on other classes' lists, else
//! (out of memory) scans every page of the class for a free block. Freeing
//! is one `fetch_or` on the bitmap and one `fetch_add` on `avail`; the page
//! is listed once a quarter of it is free and retired (returned to the page
//! map, for any class or span) once all of it is.

use crate::bitmap::Bitmap;
use crate::layout::Layout;
use crate::page::*;
use crate::page_list::PageList;
use crate::page_map::PageMap;
use crate::size_class::*;
use crate::stats::{Counters, Stats};
use crate::sync::{spin_hint, AtomicU32, AtomicU64, Ordering};
use crate::word::Word;

/// What a kernel (or the host) needs to reach a heap: two device addresses
/// and the shape. `#[repr(C)]`, passed by value to kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapHandle {
    /// Zero-initialised metadata of [`Layout::meta_bytes`] bytes.
    pub meta: u64,
    /// [`PAGE_SIZE`]-aligned data region of `page_count` pages.
    pub data: u64,
    pub page_count: u32,
    pub slots: u32,
}

/// Why an allocation returned null. Every failure is also counted in
/// [`Counters::failed_allocs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocError {
    ZeroSize,
    /// Larger than the whole heap.
    TooLarge,
    OutOfMemory,
}

/// Why a free was refused. Every refusal is counted in
/// [`Counters::bad_frees`] and leaves the heap unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeError {
    /// Outside the heap's data region.
    Foreign,
    /// Inside a block or span, not at its start (or in a page's tail).
    Interior,
    /// The block (or span) is not allocated: a double free or a stray pointer.
    NotAllocated,
}

/// Blocks of one class reserved on one page, not yet claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub page: u32,
    pub class: u32,
    pub count: u32,
    /// Word to start claiming at.
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

/// Result of freeing the blocks of one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeOutcome {
    /// Blocks returned to the heap.
    pub freed: u32,
    /// Blocks that were already free (double frees), counted as bad frees.
    pub already_free: u32,
}

/// A heap over a metadata region and a data region.
pub struct Heap<'a, W: Word = u32> {
    data: usize,
    page_count: u32,
    slots: u32,
    counters: &'a Counters,
    lists: &'a [AtomicU64],
    cache: &'a [AtomicU32],
    descs: &'a [PageDesc],
    page_map: &'a [AtomicU32],
    bitmaps: &'a [W::Atomic],
}

/// Bitmap words of one page for word type `W`.
#[inline(always)]
const fn words_per_page<W: Word>() -> usize {
    BITMAP_BYTES_PER_PAGE * 8 / W::BITS as usize
}

/// A slot's cache entry while one thread installs a page there.
const INSTALLING: u32 = u32::MAX;
/// Slots whose lists are tried before a fresh page.
const NEAR_SLOTS: u32 = 4;

/// Pages of a class are listed once this many blocks are free.
#[inline(always)]
const fn list_threshold(cap: u32) -> u32 {
    // (see `settle`)
    let t = cap / 4;
    if t == 0 {
        1
    } else {
        t
    }
}

impl<'a, W: Word> Heap<'a, W> {
    /// A view of the heap described by `h`.
    ///
    /// # Safety
    ///
    /// - `h.meta` points to [`Layout::new(h.page_count, h.slots).meta_bytes`](Layout)
    ///   bytes, 128-byte aligned, that were zeroed before first use and are
    ///   only ever accessed through heap views (atomically) for `'a`;
    /// - `h.data` is [`PAGE_SIZE`]-aligned and `h.page_count * PAGE_SIZE`
    ///   bytes long, valid for `'a`;
    /// - `h.page_count >= 1`, `h.slots >= 1`, and every view of this heap
    ///   uses the same word type `W`.
    #[inline(always)]
    pub unsafe fn from_handle(h: &HeapHandle) -> Heap<'a, W> {
        let l = Layout::new(h.page_count, h.slots);
        let m = h.meta as usize as *const u8;
        let n = h.page_count as usize;
        // SAFETY: the caller guarantees the region is `meta_bytes` long,
        // aligned and zero-initialised; the layout places each array inside
        // it at a 128-byte boundary; zero is a valid value of every atomic.
        unsafe {
            Heap {
                data: h.data as usize,
                page_count: h.page_count,
                slots: h.slots,
                counters: &*(m.add(l.counters) as *const Counters),
                lists: core::slice::from_raw_parts(
                    m.add(l.lists) as *const AtomicU64,
                    h.slots as usize * CLASS_COUNT,
                ),
                cache: core::slice::from_raw_parts(
                    m.add(l.cache) as *const AtomicU32,
                    h.slots as usize * CLASS_COUNT,
                ),
                descs: core::slice::from_raw_parts(m.add(l.descs) as *const PageDesc, n),
                page_map: core::slice::from_raw_parts(
                    m.add(l.page_map) as *const AtomicU32,
                    n.div_ceil(32),
                ),
                bitmaps: core::slice::from_raw_parts(
                    m.add(l.bitmaps) as *const W::Atomic,
                    n * words_per_page::<W>(),
                ),
            }
        }
    }

    pub fn page_count(&self) -> u32 {
        self.page_count
    }

    /// Pages new pages and spans may come from: `0..limit()`.
    #[inline(always)]
    pub fn limit(&self) -> u32 {
        let l = self.counters.page_limit.load(Ordering::Relaxed);
        if l == 0 || l > self.page_count as u64 {
            self.page_count
        } else {
            l as u32
        }
    }

    /// Sets the usable pages to `0..pages` (clamped to the heap). Lowering
    /// it stops claims above the limit by allocations that read the new
    /// value; one that read the old value may still claim a page there, so
    /// an owner that unmaps memory [`fence`](Heap::fence)s it first. Pages
    /// in use above the limit stay valid.
    pub fn set_limit(&self, pages: u32) {
        self.counters
            .page_limit
            .store(pages.min(self.page_count).max(1) as u64, Ordering::Release);
    }

    /// Takes pages `from..to` out of service, all or none: claims them in
    /// the page map unless any is in use (then it changes nothing and
    /// returns false). Fenced pages are never handed out, whatever limit a
    /// concurrent allocation read, so their memory can be unmapped; a
    /// shrinking owner fences, unmaps, then lowers the limit.
    ///
    /// # Time complexity
    ///
    /// O((to - from) / 32) atomics.
    pub fn fence(&self, from: u32, to: u32) -> bool {
        let to = to.min(self.page_count);
        from >= to
            || PageMap::new(self.page_map)
                .try_claim(from, to - from)
                .is_ok()
    }

    /// Returns fenced pages `from..to` to service (a growing owner maps
    /// their memory first, then unfences, then raises the limit).
    pub fn unfence(&self, from: u32, to: u32) {
        let to = to.min(self.page_count);
        if from < to {
            PageMap::new(self.page_map).release_run(from, to - from);
        }
    }

    /// Whether any page in `from..to` is in use (a snapshot).
    pub fn any_in_use(&self, from: u32, to: u32) -> bool {
        let map = PageMap::new(self.page_map);
        (from..to.min(self.page_count)).any(|p| map.is_set(p))
    }

    pub fn counters(&self) -> &Counters {
        self.counters
    }

    pub fn descs(&self) -> &[PageDesc] {
        self.descs
    }

    pub fn stats(&self) -> Stats {
        Stats::collect(self.descs, self.counters)
    }

    #[inline(always)]
    fn bitmap(&self, page: u32) -> Bitmap<'a, W> {
        let w = words_per_page::<W>();
        let at = page as usize * w;
        Bitmap::new(&self.bitmaps[at..at + w])
    }

    /// Slot `slot`'s list of partly free pages of `class`.
    #[inline(always)]
    fn list(&self, class: u32, slot: u32) -> PageList<'a> {
        PageList::new(&self.lists[(slot % self.slots) as usize * CLASS_COUNT + class as usize])
    }

    #[inline(always)]
    fn next_of(&self) -> impl Fn(u32) -> &'a AtomicU32 + 'a {
        let descs = self.descs;
        move |p| &descs[p as usize].next
    }

    #[inline(always)]
    fn slot_cache(&self, class: u32, slot: u32) -> &'a AtomicU32 {
        &self.cache[(slot % self.slots) as usize * CLASS_COUNT + class as usize]
    }

    /// Address of block `index` of `page` in `class`.
    #[inline(always)]
    pub fn block_addr(&self, page: u32, class: u32, index: u32) -> *mut u8 {
        (self.data + page as usize * PAGE_SIZE + index as usize * class_size(class) as usize)
            as *mut u8
    }

    /// Address of the `r`-th block of a claimed run.
    #[inline(always)]
    pub fn run_addr(&self, run: &Run<W>, class: u32, r: u32) -> *mut u8 {
        self.block_addr(run.page, class, run.word * W::BITS + run.mask.nth_set(r))
    }

    // ---- allocation -------------------------------------------------------

    /// Allocates `size` bytes; slot `slot` picks the current pages to use.
    pub fn alloc(&self, size: usize, slot: u32) -> Result<*mut u8, AllocError> {
        match class_of(size) {
            Some(class) => match self.reserve(class, 1, slot) {
                Ok(mut g) => {
                    let run = self.claim(&mut g);
                    Ok(self.run_addr(&run, class, 0))
                }
                Err(_) => self.alloc_fallback(size, class, slot),
            },
            None => self.alloc_span(size, slot),
        }
    }

    /// After [`Heap::reserve`] failed for `class`: a class whose pages are
    /// several units long may still fit as a span of whole units (a small
    /// or fragmented heap); otherwise the failure is counted here.
    #[cold]
    #[inline(never)]
    pub fn alloc_fallback(
        &self,
        size: usize,
        class: u32,
        slot: u32,
    ) -> Result<*mut u8, AllocError> {
        if page_units(class) > 1 {
            return self.alloc_span(size, slot);
        }
        Err(self.fail(AllocError::OutOfMemory))
    }

    /// Reserves up to `want` (1..=4096) blocks of `class` on one page: the
    /// bulk entry point behind warp aggregation. The grant may hold fewer
    /// than `want` blocks when the page fills; ask again for the rest.
    /// Out of memory is not counted here: callers finish with
    /// [`Heap::alloc_fallback`], which counts what finally fails.
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
            let d = &self.descs[page as usize];
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
                // Relaxed: `take` (AcqRel) synchronised with the activation
                // that wrote the kind before its release.
                if decode_kind(d.kind.load(Ordering::Relaxed)) == Kind::Class(class) {
                    let cap = blocks_per_page(class);
                    return Ok(Grant {
                        page,
                        class,
                        count: got,
                        start: cap.saturating_sub(before.free as u32) / W::BITS,
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

    /// Claims up to `g.count` reserved blocks from one word.
    #[inline(always)]
    pub fn claim(&self, g: &mut Grant) -> Run<W> {
        let bm = self.bitmap(g.page);
        let nwords = blocks_per_page(g.class).div_ceil(W::BITS);
        loop {
            // A reservation guarantees enough set bits; a pass can miss them
            // only while other claimers move, so retrying terminates.
            if let Some((word, mask)) = bm.claim(g.start, nwords, g.count) {
                g.count -= mask.count_ones();
                g.start = word;
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
        let cache = self.slot_cache(class, slot);
        if cache
            .compare_exchange(0, INSTALLING, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return Ok(()); // someone else is installing or installed one
        }
        match self.acquire_page(class, slot) {
            Some(p) => {
                cache.store(p + 1, Ordering::Release);
                Ok(())
            }
            None => {
                cache.store(0, Ordering::Release);
                self.reserve_by_scan_or_fail(class, slot)
            }
        }
    }

    /// A page for `class`, attached to nobody yet (state `ATTACHED`): this
    /// slot's list, nearby slots' lists, a fresh page, any slot's list,
    /// then empty pages reclaimed from every list.
    fn acquire_page(&self, class: u32, slot: u32) -> Option<u32> {
        let pop = |s: u32| {
            let p = self.list(class, s).pop(self.next_of())?;
            self.descs[p as usize]
                .state
                .store(STATE_ATTACHED, Ordering::Relaxed);
            Some(p)
        };
        for k in 0..NEAR_SLOTS.min(self.slots) {
            if let Some(p) = pop(slot.wrapping_add(k)) {
                return Some(p);
            }
        }
        let hint = slot.wrapping_mul(0x9E37_79B9) % self.limit();
        if let Some(p) = self.claim_units(page_units(class), hint) {
            self.activate(p, class);
            return Some(p);
        }
        for k in NEAR_SLOTS..self.slots {
            if let Some(p) = pop(slot.wrapping_add(k)) {
                return Some(p);
            }
        }
        if self.scavenge() > 0 {
            if let Some(p) = self.claim_units(page_units(class), 0) {
                self.activate(p, class);
                return Some(p);
            }
        }
        None
    }

    /// Claims `units` free consecutive units from the page map.
    fn claim_units(&self, units: u32, hint: u32) -> Option<u32> {
        let map = PageMap::new(self.page_map);
        if units == 1 {
            map.claim_one(hint, self.limit())
        } else {
            map.claim_run(units, self.limit(), hint)
        }
    }

    fn activate(&self, page: u32, class: u32) {
        for k in 1..page_units(class) {
            let tail = &self.descs[(page + k) as usize];
            tail.span.store(k, Ordering::Relaxed);
            tail.kind.store(KIND_CLASS_TAIL, Ordering::Release);
        }
        let cap = blocks_per_page(class);
        self.bitmap(page).fill(cap);
        self.descs[page as usize].activate(class, cap);
        Counters::bump(&self.counters.pages_activated, 1);
    }

    /// Out of fresh pages: before failing, look for free blocks of `class`
    /// on any page: floating pages under the list threshold and other
    /// slots' current pages are moved to this slot's list, where the next
    /// reserve round finds them. Nothing free is ever reported as exhausted.
    #[inline(never)]
    fn reserve_by_scan_or_fail(&self, class: u32, slot: u32) -> Result<(), AllocError> {
        for (p, d) in self.descs.iter().enumerate() {
            let p = p as u32;
            if d.kind.load(Ordering::Acquire) != class + 1 || d.now().free <= 0 {
                continue;
            }
            if !d.now().floating {
                // Attached to a slot (or listed): detach it from whichever
                // slot holds it; the winner of that CAS floats it.
                let held = (0..self.slots).any(|s| {
                    self.slot_cache(class, s)
                        .compare_exchange(p + 1, 0, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                });
                if !held {
                    if d.state.load(Ordering::Relaxed) == STATE_LISTED {
                        return Ok(()); // some list holds it: acquire finds it
                    }
                    continue;
                }
                d.float();
            }
            if d.unfloat() {
                self.list_page(p, class, slot);
                return Ok(());
            }
        }
        Err(AllocError::OutOfMemory)
    }

    #[cold]
    fn fail(&self, e: AllocError) -> AllocError {
        Counters::bump(&self.counters.failed_allocs, 1);
        e
    }

    // ---- page life cycle ----------------------------------------------------

    fn list_page(&self, page: u32, class: u32, slot: u32) {
        self.descs[page as usize]
            .state
            .store(STATE_LISTED, Ordering::Relaxed);
        self.list(class, slot).push(page, self.next_of());
    }

    /// Acts on a floating page given the `avail` one RMW returned: retires
    /// it when empty, lists it when a quarter is free.
    #[inline(never)]
    fn settle(&self, page: u32, a: Avail, slot: u32) {
        let d = &self.descs[page as usize];
        let Kind::Class(class) = d.kind() else { return };
        let cap = blocks_per_page(class);
        if a.free >= cap as i64 && d.try_retire(cap, true) {
            self.release_page(page, class);
        } else if a.free >= list_threshold(cap) as i64 && d.unfloat() {
            self.list_page(page, class, slot);
        }
    }

    /// Gives a retired page's units back to the page map.
    fn release_page(&self, page: u32, class: u32) {
        let units = page_units(class);
        for p in page..page + units {
            let d = &self.descs[p as usize];
            d.state.store(STATE_NONE, Ordering::Relaxed);
            d.kind.store(KIND_FREE, Ordering::Release);
        }
        Counters::bump(&self.counters.pages_retired, 1);
        PageMap::new(self.page_map).release_run(page, units);
    }

    /// Returns `n` blocks of a class page to its `avail`, then settles it.
    #[inline(always)]
    fn return_blocks(&self, page: u32, n: u32, slot: u32) {
        let a = self.descs[page as usize].add(n);
        if a.floating {
            self.settle(page, a, slot);
        }
    }

    /// Retires the empty pages parked on lists so any class or span can use
    /// them. Returns how many it retired.
    #[inline(never)]
    pub fn scavenge(&self) -> u32 {
        let mut retired = 0;
        for slot in 0..self.slots {
            for class in 0..CLASS_COUNT as u32 {
                let list = self.list(class, slot);
                if list.is_empty() {
                    continue;
                }
                let cap = blocks_per_page(class);
                let mut kept = 0u32; // private chain through `next`, page + 1
                while let Some(p) = list.pop(self.next_of()) {
                    let d = &self.descs[p as usize];
                    if d.try_retire(cap, false) {
                        self.release_page(p, class);
                        retired += 1;
                    } else {
                        d.next.store(kept, Ordering::Relaxed);
                        kept = p + 1;
                    }
                }
                while kept != 0 {
                    let p = kept - 1;
                    kept = self.descs[p as usize].next.load(Ordering::Relaxed);
                    list.push(p, self.next_of());
                }
            }
        }
        retired
    }

    // ---- spans ------------------------------------------------------------

    fn alloc_span(&self, size: usize, slot: u32) -> Result<*mut u8, AllocError> {
        if size == 0 {
            return Err(self.fail(AllocError::ZeroSize));
        }
        let pages = span_pages(size);
        if pages > self.page_count as usize {
            return Err(self.fail(AllocError::TooLarge));
        }
        let map = PageMap::new(self.page_map);
        // Each slot starts its search in its own part of the heap.
        let limit = self.limit();
        let hint = (slot % self.slots) as u64 * limit as u64 / self.slots as u64;
        let mut start = map.claim_run(pages as u32, limit, hint as u32);
        if start.is_none() && self.scavenge() > 0 {
            start = map.claim_run(pages as u32, limit, 0);
        }
        let Some(start) = start else {
            return Err(self.fail(AllocError::OutOfMemory));
        };
        for p in start + 1..start + pages as u32 {
            self.descs[p as usize]
                .kind
                .store(KIND_SPAN_TAIL, Ordering::Relaxed);
        }
        let head = &self.descs[start as usize];
        head.span.store(pages as u32, Ordering::Relaxed);
        head.kind.store(KIND_SPAN_HEAD, Ordering::Release);
        Counters::bump(&self.counters.spans_allocated, 1);
        Ok((self.data + start as usize * PAGE_SIZE) as *mut u8)
    }

    fn free_span(&self, page: u32) -> Result<FreeOutcome, FreeError> {
        let head = &self.descs[page as usize];
        // One winner among racing double frees.
        if head
            .kind
            .compare_exchange(
                KIND_SPAN_HEAD,
                KIND_SPAN_TAIL,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return Err(self.bad_free(FreeError::NotAllocated));
        }
        let n = head.span.load(Ordering::Relaxed);
        for p in page..page + n {
            self.descs[p as usize]
                .kind
                .store(KIND_FREE, Ordering::Release);
        }
        PageMap::new(self.page_map).release_run(page, n);
        Counters::bump(&self.counters.spans_freed, 1);
        Ok(FreeOutcome {
            freed: 1,
            already_free: 0,
        })
    }

    // ---- free -------------------------------------------------------------

    /// Frees a block or span by address. Null is a no-op; anything that is
    /// not a live block's start is refused, counted, and changes nothing.
    pub fn free(&self, ptr: *mut u8, slot: u32) -> Result<FreeOutcome, FreeError> {
        if ptr.is_null() {
            return Ok(FreeOutcome {
                freed: 0,
                already_free: 0,
            });
        }
        match self.locate(ptr as usize)? {
            Located::Block { page, word, mask } => {
                let out = self.free_run(page, word, mask, slot);
                if out.already_free > 0 {
                    return Err(FreeError::NotAllocated);
                }
                Ok(out)
            }
            Located::Span { page } => self.free_span(page),
        }
    }

    /// Finds the block at `addr` in O(1): page from address arithmetic,
    /// class from the page's descriptor.
    #[inline(always)]
    pub fn locate(&self, addr: usize) -> Result<Located<W>, FreeError> {
        match self.block_at(addr) {
            Ok(BlockInfo {
                page,
                class: Some(_),
                index,
                ..
            }) => Ok(Located::Block {
                page,
                word: index / W::BITS,
                mask: W::bit(index % W::BITS),
            }),
            Ok(BlockInfo { page, .. }) => Ok(Located::Span { page }),
            Err(e) => Err(self.bad_free(e)),
        }
    }

    /// The block or span starting at `addr`, in O(1), without counting or
    /// changing anything: its page (a class page's first unit, or a span's
    /// head), its class (`None` for spans), index and size.
    #[inline(always)]
    pub fn block_at(&self, addr: usize) -> Result<BlockInfo, FreeError> {
        let off = addr.wrapping_sub(self.data);
        if addr < self.data || off >= self.page_count as usize * PAGE_SIZE {
            return Err(FreeError::Foreign);
        }
        // Relaxed: a caller asking about a block it owns already synchronised
        // with the allocation that published the page's kind.
        let kind_of = |p: u32| decode_kind(self.descs[p as usize].kind.load(Ordering::Relaxed));
        let mut page = (off >> PAGE_SHIFT) as u32;
        let mut kind = kind_of(page);
        if kind == Kind::ClassTail {
            page -= self.descs[page as usize]
                .span
                .load(Ordering::Relaxed)
                .min(page);
            kind = kind_of(page);
        }
        let in_page = off - page as usize * PAGE_SIZE;
        match kind {
            Kind::Class(class) if (class as usize) < CLASS_COUNT => {
                let size = class_size(class) as usize;
                let index = in_page / size;
                if !in_page.is_multiple_of(size) || index >= blocks_per_page(class) as usize {
                    return Err(FreeError::Interior);
                }
                Ok(BlockInfo {
                    page,
                    class: Some(class),
                    index: index as u32,
                    size,
                })
            }
            Kind::SpanHead if in_page == 0 => {
                let pages = self.descs[page as usize].span.load(Ordering::Relaxed) as usize;
                Ok(BlockInfo {
                    page,
                    class: None,
                    index: 0,
                    size: pages * PAGE_SIZE,
                })
            }
            Kind::SpanHead | Kind::SpanTail => Err(FreeError::Interior),
            Kind::Free | Kind::Class(_) | Kind::ClassTail => Err(FreeError::NotAllocated),
        }
    }

    /// Frees the blocks `mask` of word `word` of a class page (all located
    /// by [`Heap::locate`]): one `fetch_or`, one `fetch_add`. Blocks that
    /// were already free are counted as bad frees and left alone.
    #[inline(always)]
    pub fn free_run(&self, page: u32, word: u32, mask: W, slot: u32) -> FreeOutcome {
        let dup = self.bitmap(page).release(word, mask);
        let fresh = (mask & !dup).count_ones();
        let already_free = dup.count_ones();
        if already_free > 0 {
            Counters::bump(&self.counters.bad_frees, already_free as u64);
        }
        if fresh > 0 {
            self.return_blocks(page, fresh, slot);
        }
        FreeOutcome {
            freed: fresh,
            already_free,
        }
    }

    #[cold]
    fn bad_free(&self, e: FreeError) -> FreeError {
        Counters::bump(&self.counters.bad_frees, 1);
        e
    }

    // ---- checks -----------------------------------------------------------

    /// Checks every structural invariant; call only while no thread uses
    /// the heap. Returns the first violation found.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let map = PageMap::new(self.page_map);
        let mut p = 0u32;
        while p < self.page_count {
            let d = &self.descs[p as usize];
            match d.kind() {
                Kind::Free => {
                    // Pages past the limit may be fenced (see `fence`).
                    if map.is_set(p) && p < self.limit() {
                        return Err("free page marked used in the page map");
                    }
                    if d.now()
                        != (Avail {
                            floating: false,
                            live: false,
                            free: 0,
                        })
                    {
                        return Err("free page with a live counter");
                    }
                }
                Kind::Class(c) => {
                    if c as usize >= CLASS_COUNT {
                        return Err("page of an unknown class");
                    }
                    if !map.is_set(p) {
                        return Err("class page free in the page map");
                    }
                    let a = d.now();
                    if !a.live {
                        return Err("class page not live");
                    }
                    let cap = blocks_per_page(c);
                    let nwords = cap.div_ceil(W::BITS);
                    let bm = self.bitmap(p);
                    if bm.count_free(nwords) as i64 != a.free {
                        return Err("bitmap free count differs from avail");
                    }
                    let last = bm.word(nwords - 1);
                    let valid = cap - (nwords - 1) * W::BITS;
                    if last & !W::low_bits(valid) != W::ZERO {
                        return Err("bitmap bit set past the page's blocks");
                    }
                    let attached = (0..self.slots)
                        .filter(|&s| self.slot_cache(c, s).load(Ordering::Relaxed) == p + 1)
                        .count();
                    let state = d.state.load(Ordering::Relaxed);
                    match (state, attached, a.floating) {
                        (STATE_ATTACHED, 1, false)
                        | (STATE_FLOATING, 0, true)
                        | (STATE_LISTED, 0, false) => {}
                        _ => {
                            return Err(
                                "page state disagrees with the slot caches or the floating flag",
                            )
                        }
                    }
                    if a.floating && a.free >= list_threshold(cap) as i64 {
                        return Err("floating page with free blocks is neither listed nor retired");
                    }
                    let units = page_units(c);
                    for k in 1..units {
                        let q = p + k;
                        let t = &self.descs[q as usize];
                        if q >= self.page_count
                            || !map.is_set(q)
                            || t.kind() != Kind::ClassTail
                            || t.span.load(Ordering::Relaxed) != k
                        {
                            return Err("class page tail unit not marked");
                        }
                    }
                    p += units;
                    continue;
                }
                Kind::SpanHead => {
                    let n = d.span.load(Ordering::Relaxed);
                    if n == 0 || p + n > self.page_count {
                        return Err("span length out of range");
                    }
                    for q in p..p + n {
                        if !map.is_set(q) {
                            return Err("span page free in the page map");
                        }
                        if q > p && self.descs[q as usize].kind() != Kind::SpanTail {
                            return Err("span tail page not marked");
                        }
                    }
                    p += n;
                    continue;
                }
                Kind::SpanTail => return Err("span tail without a head"),
                Kind::ClassTail => return Err("class page tail without a head"),
            }
            p += 1;
        }
        // Every listed page is on one list of its class, once.
        let mut listed = 0u64;
        for (i, head) in self.lists.iter().enumerate() {
            let class = (i % CLASS_COUNT) as u32;
            let mut at = (head.load(Ordering::Relaxed) & 0xFFFF_FFFF) as u32;
            let mut steps = 0;
            while at != 0 {
                let d = &self.descs[at as usize - 1];
                if d.kind() != Kind::Class(class) || d.state.load(Ordering::Relaxed) != STATE_LISTED
                {
                    return Err("list holds a page that is not a listed page of its class");
                }
                listed += 1;
                steps += 1;
                if steps > self.page_count {
                    return Err("cycle in a page list");
                }
                at = d.next.load(Ordering::Relaxed);
            }
        }
        let states = self
            .descs
            .iter()
            .filter(|d| {
                matches!(d.kind(), Kind::Class(_))
                    && d.state.load(Ordering::Relaxed) == STATE_LISTED
            })
            .count() as u64;
        if states != listed {
            return Err("listed pages missing from their lists");
        }
        Ok(())
    }
}

/// A block or span as [`Heap::block_at`] finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// First page of the block's class page, or the span's head page.
    pub page: u32,
    /// The block's class; `None` for a span.
    pub class: Option<u32>,
    /// Block index in its page (0 for spans).
    pub index: u32,
    /// Bytes of the block (whole pages for spans).
    pub size: usize,
}

/// What [`Heap::locate`] found at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Located<W> {
    Block { page: u32, word: u32, mask: W },
    Span { page: u32 },
}

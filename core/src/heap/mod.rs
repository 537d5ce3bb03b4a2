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
//!
//! Aligned allocation picks the smallest class whose blocks all have the
//! alignment ([`class_of_aligned`](crate::size_class::class_of_aligned)),
//! so it takes the same paths with no padding. `realloc` keeps the block
//! where the new size still fits it (a span grows or shrinks in place by
//! whole pages), else allocates, copies and frees.
//!
//! This file holds the view ([`Heap`], [`HeapHandle`]), the errors and the
//! accessors; `alloc` the allocation paths, `grow` growth while kernels
//! run, `lifecycle` listing and retiring pages, `span` whole-page
//! requests, `free` freeing and address lookup, `realloc` resizing,
//! `check` the invariant checks.

mod alloc;
mod check;
mod free;
mod grow;
mod lifecycle;
mod realloc;
mod span;

#[cfg(host_std)]
pub use alloc::without_transit_wait;
pub use alloc::{Grant, Run};
pub use free::{BlockInfo, FreeOutcome, FreedAll, Located};
pub use grow::{GrowHost, GROW_TIMEOUT_NS};
pub use realloc::{copy_block, Resize};
pub use span::SPAN_BATCH;

use core::marker::PhantomData;

use crate::bitmap::Bitmap;
use crate::layout::Layout;
use crate::page::PageDesc;
use crate::page_list::PageList;
use crate::page_map::PageMap;
#[cfg(not(target_arch = "nvptx64"))]
use crate::run_index::RunIndex;
use crate::size_class::{class_size, Geometry, BITMAP_BYTES_PER_PAGE, CLASS_COUNT, PAGE_SIZE};
use crate::stats::{Counters, Counts, Stats, Tallies, Tally};
use crate::sync::{AtomicU32, AtomicU64, Ordering};
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
/// [`Counters::failed_allocs`] (and, for [`AllocError::OutOfMemory`], its
/// bytes in [`Counters::failed_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocError {
    ZeroSize,
    /// Larger than the whole heap.
    TooLarge,
    OutOfMemory,
    /// An alignment that is not a power of two or exceeds
    /// [`MAX_ALIGN`](crate::size_class::MAX_ALIGN) (the page size).
    BadAlignment,
    /// From [`Heap::reserve`] only: no page, on a heap that a host grows
    /// while kernels run. The search left far slots' parked pages to
    /// growth; the caller waits for it ([`Heap::await_growth`]) and
    /// searches again. Not counted.
    Growing,
}

/// Why a realloc failed. The old block is left as it was, contents
/// included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReallocError {
    /// No block for the new size (size 0, too large, a bad alignment, out
    /// of memory); counted as a failed allocation.
    Alloc(AllocError),
    /// The pointer is not the start of a live block or span (foreign,
    /// interior, already freed); counted in [`Counters::bad_frees`].
    Pointer(FreeError),
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

/// How a heap places fresh pages (bits of [`Heap::set_placement`]).
pub struct Placement;

impl Placement {
    /// Spans go to the shortest free run that holds them (best fit over
    /// the whole heap) instead of the first from the slot's hint: long-
    /// lived blocks of many sizes, as a host pool serves, leave fewer
    /// unusable gaps. Each span allocation then reads the whole page map
    /// (through its summaries; the heap keeps the second one, of words
    /// with pages in use, only with this bit).
    pub const BEST_FIT_SPANS: u64 = 1;
    /// Size-class pages are claimed as low in the heap as they are free
    /// (first fit from the bottom, not from the slot's own part), so they
    /// pack together instead of splitting the long free runs that spans
    /// need. Threads then contend for the same page-map words when they
    /// claim pages at once: for a host pool's few threads, not a kernel's.
    pub const CLASS_PAGES_LOW: u64 = 2;
    /// Class pages of one 64 KiB unit for most classes, at most three
    /// ([`Geometry::SMALL`]), instead of about 256 blocks (up to 1 MiB).
    /// Every slot keeps a current page per class it serves, so with long
    /// pages a host pool's few threads left most of their pages' memory
    /// unused. Host heaps only: the GPU's paths keep
    /// the standard geometry as constants and ignore this bit, so a heap a
    /// kernel uses must never set it. Set before the heap's first class
    /// page (the geometry is read off every page's class).
    pub const SMALL_CLASS_PAGES: u64 = 4;
    /// An install whose slot and near slots have no listed page of the
    /// class reads the list heads of 16 far slots, spread over the others,
    /// and takes a listed page from one of them before it takes a fresh
    /// page. Pages are listed on the slot that freed into them; when
    /// blocks are freed on other slots than the ones that allocated them
    /// (a kernel's threads run on other SMs at each launch), a slot whose
    /// near lists were empty took fresh pages while partly used ones
    /// waited on far lists, and a heap under churn kept growing. On an
    /// H100 80 GB, in `cuheap bench device`'s churn case (1M threads, 20
    /// rounds), footprint over live bytes ends at 1.83-1.86 without this
    /// bit and 1.37 with it; 1M x 256 B to 4 KiB pairs take 4-7% longer,
    /// 16 B, 64 B and mixed sizes the same (`docs/ab-far-probes-h100.txt`).
    /// It costs an install that finds its near lists empty 16 more loads,
    /// issued together. Any setting is valid at any time.
    pub const FAR_LISTS: u64 = 8;
    /// Set by [`Heap::index_runs`] only (never through `set_placement`):
    /// the heap keeps an index of free runs after its metadata.
    pub(crate) const INDEXED: u64 = 1 << 63;
}

/// A heap over a metadata region and a data region: the handle's words
/// and where each array of the metadata starts ([`Layout`], in 128-byte
/// units, which every offset is a multiple of). On the GPU a view that a
/// kernel passes by reference to a function out of line is written to
/// local memory by every thread at the kernel's start: six words, where a
/// view of the arrays' slices was thirteen.
pub struct Heap<'a, W: Word = u32> {
    meta: usize,
    data: usize,
    page_count: u32,
    slots: u32,
    lists_at: u32,
    cache_at: u32,
    descs_at: u32,
    page_map_at: u32,
    bitmaps_at: u32,
    _arrays: PhantomData<(&'a Counters, W)>,
}

// A view is six words that name the arrays: a copy is the same view
// (for the same `'a`), which a caller may keep instead of rebuilding it
// from the handle (its layout's arithmetic) on every call.
impl<W: Word> Clone for Heap<'_, W> {
    #[inline(always)]
    fn clone(&self) -> Self {
        *self
    }
}

impl<W: Word> Copy for Heap<'_, W> {}

/// log2 of the bytes per unit of the offsets a [`Heap`] keeps: the
/// layout's alignment (128 bytes).
const OFFSET_UNIT: u32 = 7;

// Every array's offset fits in a `u32` of those units, whatever the page
// count, up to `Layout::MAX_SLOTS` slots: the last array starts after
// about 32 bytes per page and 2.6 KB per slot.
const _: () =
    assert!(Layout::new(u32::MAX, Layout::MAX_SLOTS).bitmaps >> OFFSET_UNIT <= u32::MAX as usize);

/// Bitmap words of one page for word type `W`.
#[inline(always)]
const fn words_per_page<W: Word>() -> usize {
    BITMAP_BYTES_PER_PAGE * 8 / W::BITS as usize
}

impl<'a, W: Word> Heap<'a, W> {
    /// A view of the heap described by `h`.
    ///
    /// # Safety
    ///
    /// - `h.meta` points to [`Layout::new(h.page_count, h.slots).meta_bytes`](Layout)
    ///   bytes, 16-byte aligned (every array the view reads then has its
    ///   type's alignment; 128-byte alignment, which `OwnedHeap` and the
    ///   host give, also keeps each slot's counters on a line of its own),
    ///   that were zeroed before first use and are only ever accessed
    ///   through heap views (atomically) for `'a`;
    /// - `h.data` is [`PAGE_SIZE`]-aligned and `h.page_count * PAGE_SIZE`
    ///   bytes long, valid for `'a`;
    /// - `h.page_count >= 1`, `1 <= h.slots <= Layout::MAX_SLOTS`, and
    ///   every view of this heap uses the same word type `W`.
    #[inline(always)]
    pub unsafe fn from_handle(h: &HeapHandle) -> Heap<'a, W> {
        let l = Layout::new(h.page_count, h.slots);
        let unit = |offset: usize| (offset >> OFFSET_UNIT) as u32;
        Heap {
            meta: h.meta as usize,
            data: h.data as usize,
            page_count: h.page_count,
            slots: h.slots,
            lists_at: unit(l.lists),
            cache_at: unit(l.cache),
            descs_at: unit(l.descs),
            page_map_at: unit(l.page_map),
            bitmaps_at: unit(l.bitmaps),
            _arrays: PhantomData,
        }
    }

    /// `len` items of `T` at `at` 128-byte units into the metadata.
    ///
    /// # Safety
    ///
    /// `at`, `len` and `T` are one of the arrays that [`Layout`] places for
    /// this view's page count and slots (an atomic type, for which zeroed
    /// memory is a valid value).
    #[inline(always)]
    unsafe fn array<T>(&self, at: u32, len: usize) -> &'a [T] {
        let start = self.meta + ((at as usize) << OFFSET_UNIT);
        // SAFETY: `from_handle`'s caller vouched for a zeroed metadata
        // region of `Layout::meta_bytes` bytes, aligned, used only through
        // heap views for `'a`; the layout places this array (the caller's
        // contract) inside it, aligned for `T`; `at` is exact (offsets fit
        // their `u32`, see `OFFSET_UNIT`).
        unsafe { core::slice::from_raw_parts(start as *const T, len) }
    }

    #[inline(always)]
    fn lists(&self) -> &'a [AtomicU64] {
        // SAFETY: the layout's list heads: `slots * CLASS_COUNT` `u64`s.
        unsafe { self.array(self.lists_at, self.slots as usize * CLASS_COUNT) }
    }

    #[inline(always)]
    fn cache(&self) -> &'a [AtomicU32] {
        // SAFETY: the layout's current pages: `slots * CLASS_COUNT` `u32`s.
        unsafe { self.array(self.cache_at, self.slots as usize * CLASS_COUNT) }
    }

    /// The page map's words, then its summary (see [`PageMap`]).
    #[inline(always)]
    fn page_map(&self) -> &'a [AtomicU32] {
        let n = PageMap::words(self.page_count) + PageMap::summary_words(self.page_count);
        // SAFETY: the layout's page map and summary, `n` `u32`s.
        unsafe { self.array(self.page_map_at, n) }
    }

    #[inline(always)]
    fn bitmaps(&self) -> &'a [W::Atomic] {
        let n = self.page_count as usize * words_per_page::<W>();
        // SAFETY: the layout's bitmaps, `n` words of `W` (every view of
        // the heap uses the same `W`: `from_handle`'s contract).
        unsafe { self.array(self.bitmaps_at, n) }
    }

    /// The page map and its summary.
    #[inline(always)]
    fn map(&self) -> PageMap<'_> {
        let (words, summary) = self.page_map().split_at(PageMap::words(self.page_count));
        let map = PageMap::new(words, summary);
        // Only heaps that place spans by best fit keep the `used` summary
        // (see `without_used`); their searches, first fit included, read it.
        let map = match self.placement() & Placement::BEST_FIT_SPANS {
            0 => map.without_used(),
            _ => map,
        };
        #[cfg(not(target_arch = "nvptx64"))]
        if self.placement() & Placement::INDEXED != 0 {
            return map.with_runs(self.run_index());
        }
        map
    }

    /// The page map, counting the footprint of what it claims and
    /// releases as `what` under its index's lock on an indexed heap (see
    /// [`PageMap::tallying`]); elsewhere the caller counts with atomics
    /// where [`Heap::counts_in_map`] is false.
    #[inline(always)]
    fn tallied(&self, what: Tally) -> PageMap<'_> {
        self.map().tallying(self.counters(), what)
    }

    /// Counts a claim or release of `units` units as `what` with atomics
    /// ([`Counters::tally`]), unless the heap's page map counts it under
    /// its lock ([`Heap::tallied`]).
    #[inline(always)]
    fn tally(&self, what: Tally, units: u32, claim: bool) {
        if !self.counts_in_map() {
            self.counters().tally(what, units, claim);
        }
    }

    /// Whether the heap keeps an index of free runs ([`Heap::index_runs`];
    /// never on the GPU): then every claim and release of its page map
    /// is made under the index's lock, all or nothing, and claims and
    /// releases through [`Heap::tallied`] count themselves there.
    #[inline(always)]
    pub fn counts_in_map(&self) -> bool {
        #[cfg(not(target_arch = "nvptx64"))]
        {
            self.placement() & Placement::INDEXED != 0
        }
        #[cfg(target_arch = "nvptx64")]
        {
            false
        }
    }

    /// The index of free runs after the metadata (see
    /// [`Heap::index_runs`]).
    #[cfg(not(target_arch = "nvptx64"))]
    fn run_index(&self) -> RunIndex<'_> {
        // The metadata ends with the bitmaps, at a 128-byte boundary.
        let bitmaps = self.bitmaps();
        let end = bitmaps.as_ptr() as usize + core::mem::size_of_val(bitmaps);
        let at = end.next_multiple_of(128) as *const AtomicU32;
        // SAFETY: `index_runs` set `INDEXED` only on a heap whose metadata
        // goes on for `Layout::run_index_bytes` past its end, which its
        // caller guaranteed, zeroed or built by it; zero is a valid atomic.
        let cells = unsafe { core::slice::from_raw_parts(at, RunIndex::words(self.page_count)) };
        RunIndex::new(cells, self.page_count)
    }

    /// Keeps an index of the page map's free runs from now on (see
    /// [`RunIndex`]): best fit for spans reads it instead of walking the
    /// page map. Class pages still take the lowest free pages that fit (a
    /// scan of the map under the index's lock), whatever
    /// [`Placement::CLASS_PAGES_LOW`] says. For host heaps (a host pool);
    /// the GPU never reads it.
    ///
    /// # Safety
    ///
    /// The heap's metadata region is at least [`Layout::meta_bytes`] plus
    /// [`Layout::run_index_bytes`] long, and no other thread uses the heap
    /// during this call.
    #[cfg(not(target_arch = "nvptx64"))]
    pub unsafe fn index_runs(&self) {
        let bits = self.placement() | Placement::INDEXED;
        self.counters().placement.store(bits, Ordering::Relaxed);
        self.map().rebuild_runs(self.page_count);
    }

    /// [`Heap::from_handle`] from the handle's fields, as the out-of-line
    /// paths receive them (see `Heap::settle`).
    ///
    /// # Safety
    ///
    /// As for [`Heap::from_handle`].
    #[inline(always)]
    pub(super) unsafe fn from_parts(meta: u64, data: u64, page_count: u32, slots: u32) -> Self {
        let h = HeapHandle {
            meta,
            data,
            page_count,
            slots,
        };
        // SAFETY: forwarded from the caller.
        unsafe { Self::from_handle(&h) }
    }

    /// The handle this view was built from.
    #[inline(always)]
    pub fn handle(&self) -> HeapHandle {
        HeapHandle {
            meta: self.meta as u64,
            data: self.data as u64,
            page_count: self.page_count,
            slots: self.slots,
        }
    }

    pub fn page_count(&self) -> u32 {
        self.page_count
    }

    /// Pages new pages and spans may come from: `0..limit()`.
    #[inline(always)]
    pub fn limit(&self) -> u32 {
        let l = self.counters().page_limit.load(Ordering::Relaxed);
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
    /// in use above the limit stay valid (the last-resort search for free
    /// blocks looks only below the limit).
    pub fn set_limit(&self, pages: u32) {
        self.counters()
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
        if from >= to {
            return true;
        }
        // Counted as a span's claim is, where spans' are (a claim that
        // collides gives back what it took: see `search_after_claims`);
        // the pages are not counted in the footprint.
        let counted = self.span_claims_counted();
        let fenced = self
            .counting_if(self.map(), counted)
            .try_claim(from, to - from)
            .is_ok();
        if fenced && counted {
            self.end_claim();
        }
        fenced
    }

    /// Returns fenced pages `from..to` to service (a growing owner maps
    /// their memory first, then unfences, then raises the limit).
    ///
    /// # Safety
    ///
    /// Every page of `from..to` was fenced by this caller ([`Heap::fence`]
    /// returned true, or the pages were never handed out) and is not fenced
    /// by anyone else: unfencing a page in use would let it be handed out
    /// twice.
    pub unsafe fn unfence(&self, from: u32, to: u32) {
        let to = to.min(self.page_count);
        if from < to {
            self.map().release_run(from, to - from);
        }
    }

    /// Sets how fresh pages are placed ([`Placement`] bits). Call it only
    /// while no thread uses the heap (the owner does, before it serves
    /// anyone): it brings the page-map summary that best fit reads up to
    /// date with the pages in use.
    pub fn set_placement(&self, bits: u64) {
        let keep = self.placement() & Placement::INDEXED;
        let bits = bits & !Placement::INDEXED | keep;
        self.counters().placement.store(bits, Ordering::Relaxed);
        self.map().rebuild_used();
    }

    #[inline(always)]
    fn placement(&self) -> u64 {
        self.counters().placement.load(Ordering::Relaxed)
    }

    /// The length of this heap's class pages ([`Placement::SMALL_CLASS_PAGES`]).
    /// On the GPU always [`Geometry::STANDARD`], a constant.
    #[inline(always)]
    pub fn geometry(&self) -> Geometry {
        Counters::geometry(self.counters())
    }

    /// Free pages right below the page limit (a snapshot): a request that
    /// finds no room needs that many pages fewer mapped past the limit.
    pub fn free_tail(&self) -> u32 {
        self.map().free_below(self.limit())
    }

    /// Whether any page in `from..to` is in use (a snapshot).
    pub fn any_in_use(&self, from: u32, to: u32) -> bool {
        let map = self.map();
        (from..to.min(self.page_count)).any(|p| map.is_set(p))
    }

    /// The counters, which open the metadata (see [`Layout`]).
    #[inline(always)]
    pub fn counters(&self) -> &'a Counters {
        const { assert!(Layout::new(1, 1).counters == 0) };
        // SAFETY: as in `Heap::array`: the counters are the metadata's
        // first bytes.
        unsafe { &*(self.meta as *const Counters) }
    }

    pub fn descs(&self) -> &'a [PageDesc] {
        // SAFETY: the layout's descriptors, one per page (`repr(C)`
        // atomics, zero-valid).
        unsafe { self.array(self.descs_at, self.page_count as usize) }
    }

    /// Statistics from a scan of every page's descriptor (see
    /// [`Heap::counts`] for the counters alone).
    ///
    /// # Time complexity
    ///
    /// O(pages).
    pub fn stats(&self) -> Stats {
        Stats::collect(self.descs(), self.counters())
    }

    /// The heap's counts, from its counters and the slots' tallies.
    ///
    /// # Time complexity
    ///
    /// O(slots).
    pub fn counts(&self) -> Counts {
        Counts::collect(self.counters(), self.tallies())
    }

    /// `slot`'s index among the slots: itself when in range (a GPU's SM
    /// id always is), without the division that `%` costs there.
    #[inline(always)]
    pub(super) fn slot_index(&self, slot: u32) -> u32 {
        if slot < self.slots {
            slot
        } else {
            slot % self.slots
        }
    }

    /// The slots' tallies, which follow the counters (see [`Layout`]).
    #[inline(always)]
    pub(super) fn tallies(&self) -> Tallies<'a> {
        // Through the address, as `Heap::array` reaches every array: a
        // pointer from the counters' reference covers the counters only.
        let at = self.meta + Layout::TALLIES;
        // SAFETY: the layout puts `Tallies::words(slots)` words at
        // `Layout::TALLIES` past the counters, inside the metadata that
        // `from_handle`'s caller vouched for; zero is a valid atomic.
        let words = unsafe {
            core::slice::from_raw_parts(at as *const AtomicU64, Tallies::words(self.slots))
        };
        Tallies::new(words)
    }

    #[inline(always)]
    pub(super) fn bitmap(&self, page: u32) -> Bitmap<'a, W> {
        let w = words_per_page::<W>();
        let at = page as usize * w;
        Bitmap::new(&self.bitmaps()[at..at + w])
    }

    /// Slot `slot`'s list of partly free pages of `class`.
    #[inline(always)]
    pub(super) fn list(&self, class: u32, slot: u32) -> PageList<'a> {
        PageList::new(&self.lists()[(slot % self.slots) as usize * CLASS_COUNT + class as usize])
    }

    #[inline(always)]
    pub(super) fn next_of(&self) -> impl Fn(u32) -> &'a AtomicU32 + 'a {
        let descs = self.descs();
        move |p| &descs[p as usize].next
    }

    /// Slot `slot`'s words of `table` (its list heads or current pages),
    /// one per class.
    #[inline(always)]
    pub(super) fn slot_row<A>(&self, table: &'a [A], slot: u32) -> &'a [A; CLASS_COUNT] {
        let base = (slot % self.slots) as usize * CLASS_COUNT;
        match table[base..base + CLASS_COUNT].first_chunk() {
            Some(row) => row,
            None => unreachable!("a row is CLASS_COUNT words"),
        }
    }

    #[inline(always)]
    pub(super) fn slot_cache(&self, class: u32, slot: u32) -> &'a AtomicU32 {
        &self.cache()[(slot % self.slots) as usize * CLASS_COUNT + class as usize]
    }

    /// Page `page`'s owner word ([`PageDesc::owner`]), which the heap never
    /// touches; `None` past the heap's pages.
    #[inline(always)]
    pub fn owner_word(&self, page: u32) -> Option<&'a AtomicU32> {
        self.descs().get(page as usize).map(|d| &d.owner)
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
}

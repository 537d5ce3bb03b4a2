//! Spans: requests over the largest class take whole pages. A span grows
//! in place by claiming the pages after it and shrinks in place by giving
//! its last pages back.

use super::{AllocError, FreeError, FreeOutcome, Heap, Placement};
use crate::page::{KIND_FREE, KIND_SPAN_HEAD, KIND_SPAN_TAIL};
use crate::size_class::{span_pages, PAGE_SIZE};
use crate::stats::Tally;
use crate::sync::Ordering;
use crate::word::Word;

/// Spans [`Heap::free_all`] gives back under one hold of the index's
/// lock, at most (a batch lives on the stack).
pub const SPAN_BATCH: usize = 32;

impl<W: Word> Heap<'_, W> {
    pub(super) fn alloc_span(&self, size: usize, slot: u32) -> Result<*mut u8, AllocError> {
        self.try_span(size, slot)
            .map_err(|e| self.count_failure(e, size))
    }

    /// [`Heap::alloc_span`] without counting a failure.
    pub(super) fn try_span(&self, size: usize, slot: u32) -> Result<*mut u8, AllocError> {
        if size == 0 {
            return Err(AllocError::ZeroSize);
        }
        let pages = span_pages(size);
        if pages > self.page_count as usize {
            return Err(AllocError::TooLarge);
        }
        // On an indexed heap the claim counts the span (see `tallied`);
        // on a host heap without an index it is counted as begun while
        // it takes its pages (see `span_claims_counted`).
        let counted = self.span_claims_counted();
        let map = self.claiming(Tally::Span, counted);
        // Before the searches: units returned after them are searched
        // again (`search_after_claims`).
        let returned = if counted { self.returned_count() } else { 0 };
        // Each slot starts its search in its own part of the heap (of the
        // last growth step, on a heap that grows while kernels run).
        let limit = self.limit();
        let floor = self.fresh_floor(limit);
        let best = self.placement() & Placement::BEST_FIT_SPANS != 0;
        // Anywhere in the heap.
        let claim = || match best {
            true => map.claim_best(pages as u32, 0, limit),
            false => map.claim_run(pages as u32, limit, 0),
        };
        let mut start = match best {
            true => map.claim_best(pages as u32, floor, limit),
            false => {
                // Only here: best fit takes no hint (two divisions).
                let part = (slot % self.slots) as u64 * (limit - floor) as u64 / self.slots as u64;
                map.claim_run_within(pages as u32, 1, floor, limit, floor + part as u32)
            }
        };
        if start.is_none() && floor > 0 {
            // The last step's pages are taken: pages freed below it first,
            // before any ask for more.
            start = claim();
            start.inspect(|&s| self.note_claimed(s));
        }
        let asked_first = || !self.may_grow() || self.ask_for(limit, pages as u32);
        if start.is_none() && asked_first() {
            // Claim again even if this scavenge retired nothing: another
            // thread's may just have freed the pages.
            self.scavenge_near(slot);
            start = claim();
        }
        // Not on a heap that grows: its host is asked in the meantime
        // (see `alloc_growing`), and the wait would hold the ask back.
        if start.is_none() && counted && !self.may_grow() {
            start = self.search_after_claims(returned, claim);
        }
        let Some(start) = start else {
            return Err(AllocError::OutOfMemory);
        };
        if counted {
            self.end_claim();
        }
        // Counted (where the claim did not count it) before the stores
        // below: a locked add on the host waits for the stores before it
        // to drain, and the descriptors' lines are the ones that miss.
        self.tally(Tally::Span, pages as u32, true);
        for p in start + 1..start + pages as u32 {
            self.descs()[p as usize]
                .kind
                .store(KIND_SPAN_TAIL, Ordering::Relaxed);
        }
        let head = &self.descs()[start as usize];
        head.span.store(pages as u32, Ordering::Relaxed);
        head.kind.store(KIND_SPAN_HEAD, Ordering::Release);
        Ok((self.data + start as usize * PAGE_SIZE) as *mut u8)
    }

    pub(super) fn free_span(&self, page: u32) -> Result<FreeOutcome, FreeError> {
        let n = self.unmark_span(page)?;
        self.retire_span_pages(page, n);
        self.tallied(Tally::Span).release_run(page, n);
        Ok(FreeOutcome {
            freed: 1,
            already_free: 0,
        })
    }

    /// Gives `spans` (head page, pages; each unmarked by
    /// [`Heap::unmark_span`]) back to the heap: every span's descriptors
    /// first, then the pages of all, under one hold of the index's lock
    /// on an indexed heap. A locked instruction waits on x86 for the
    /// stores before it, and a span's descriptors mostly miss the cache:
    /// a span at a time, each span's misses are waited for in turn; a
    /// batch waits for all of them once.
    pub(super) fn release_spans(&self, spans: &[(u32, u32)]) {
        if spans.is_empty() {
            return;
        }
        for &(page, n) in spans {
            self.retire_span_pages(page, n);
        }
        self.tallied(Tally::Span).release_runs(spans);
    }

    /// Takes the span at `page` from its holder: its head's kind moves
    /// from head to tail, one winner among racing double frees (the
    /// others get `NotAllocated`, counted). Returns its pages.
    pub(super) fn unmark_span(&self, page: u32) -> Result<u32, FreeError> {
        let head = &self.descs()[page as usize];
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
        Ok(head.span.load(Ordering::Relaxed))
    }

    /// Marks the `n` pages of the unmarked span at `page` free in their
    /// descriptors, before their release in the page map.
    fn retire_span_pages(&self, page: u32, n: u32) {
        // Counted before the stores, as in `try_span` (on an indexed heap
        // the page map's release counts, after them).
        self.tally(Tally::Span, n, false);
        for p in page..page + n {
            self.descs()[p as usize]
                .kind
                .store(KIND_FREE, Ordering::Release);
        }
    }

    /// Gives back the last `have - want` pages of the span at `page`
    /// (`1 <= want < have`, the span's length): they become free pages.
    /// The caller owns the span.
    ///
    /// # Time complexity
    ///
    /// O(have - want).
    pub(super) fn shrink_span(&self, page: u32, have: u32, want: u32) {
        self.descs()[page as usize]
            .span
            .store(want, Ordering::Release);
        for p in page + want..page + have {
            self.descs()[p as usize]
                .kind
                .store(KIND_FREE, Ordering::Release);
        }
        self.tally(Tally::SpanPart, have - want, false);
        self.tallied(Tally::SpanPart)
            .release_run(page + want, have - want);
    }

    /// Grows the span at `page` from `have` to `want` pages by claiming
    /// the pages after it, all or none (the page map's `try_claim`, which
    /// also keeps out fenced pages); false if any of them is in use or past
    /// the limit. The caller owns the span.
    ///
    /// # Time complexity
    ///
    /// O(want - have).
    pub(super) fn grow_span(&self, page: u32, have: u32, want: u32) -> bool {
        let counted = self.span_claims_counted();
        if page as u64 + want as u64 > self.limit() as u64
            || self
                .claiming(Tally::SpanPart, counted)
                .try_claim(page + have, want - have)
                .is_err()
        {
            return false;
        }
        if counted {
            self.end_claim();
        }
        self.tally(Tally::SpanPart, want - have, true);
        for p in page + have..page + want {
            self.descs()[p as usize]
                .kind
                .store(KIND_SPAN_TAIL, Ordering::Relaxed);
        }
        self.descs()[page as usize]
            .span
            .store(want, Ordering::Release);
        true
    }
}

//! Spans: requests over the largest class take whole pages.

use super::{AllocError, FreeError, FreeOutcome, Heap};
use crate::page::{KIND_FREE, KIND_SPAN_HEAD, KIND_SPAN_TAIL};
use crate::page_map::PageMap;
use crate::size_class::{span_pages, PAGE_SIZE};
use crate::stats::Counters;
use crate::sync::Ordering;
use crate::word::Word;

impl<W: Word> Heap<'_, W> {
    pub(super) fn alloc_span(&self, size: usize, slot: u32) -> Result<*mut u8, AllocError> {
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
            return Err(self.fail_short(size));
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

    pub(super) fn free_span(&self, page: u32) -> Result<FreeOutcome, FreeError> {
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
}

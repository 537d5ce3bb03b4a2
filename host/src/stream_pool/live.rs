//! Live bits: which blocks a caller holds, for O(1) double-free checks.
//!
//! A span's mark is its head page's owner word ([`Heap::owner_word`]), on
//! the descriptor that [`Heap::block_at`] reads to find the block: a free
//! of a span touches no other line. (With a bit apart, that bit's line was
//! a second cache miss per call over a large heap: 69% of the pool's free
//! and 20% of all the time of the mixed-size case in `pool_paths`, by
//! `perf`.) A class block's mark is a bit here.

use super::ALIGN;
use cuheap_core::size_class::PAGE_SIZE;
use cuheap_core::{BlockInfo, Heap};
use std::sync::atomic::{AtomicU64, Ordering};

/// One bit per block a class page can hold at [`ALIGN`] (256 per 64 KiB
/// unit; larger pages hold at most 256 blocks too), indexed by the page
/// [`cuheap_core::Heap::block_at`] returns; spans are marked on their
/// descriptors. Invariant: a block's mark is set iff a caller holds it, so
/// a second free finds it clear, with no shared table on the call path.
///
/// A page's bits take 32 bytes; a 128-byte line holds four pages a
/// quarter of the heap apart (pages `p`, `p + q`, `p + 2q`, `p + 3q`).
/// The pool packs class pages low, so the pages in use at once rarely
/// share a line, and threads working on neighbouring pages do not fight
/// over one (each call sets or clears a bit).
pub(super) struct LiveBits {
    lines: Vec<Line>,
    /// Pages per quarter (`q` above).
    quarter: usize,
}

#[repr(align(128))]
struct Line([AtomicU64; 16]);

const WORDS_PER_PAGE: usize = PAGE_SIZE / ALIGN / 64;

impl LiveBits {
    pub(super) fn new(pages: usize) -> LiveBits {
        let quarter = pages.div_ceil(4).max(1);
        LiveBits {
            lines: (0..quarter)
                .map(|_| Line(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
            quarter,
        }
    }

    /// The words of `page`.
    #[inline]
    fn words(&self, page: usize) -> &[AtomicU64] {
        let at = (page / self.quarter) * WORDS_PER_PAGE;
        &self.lines[page % self.quarter].0[at..at + WORDS_PER_PAGE]
    }

    #[inline]
    fn at(&self, b: &BlockInfo) -> (&AtomicU64, u64) {
        let i = b.index as usize;
        debug_assert!(
            i < 64 * WORDS_PER_PAGE,
            "pool classes hold at most 256 blocks a page"
        );
        (&self.words(b.page as usize)[i / 64], 1 << (i % 64))
    }

    /// Marks a block of `heap` live; false if it already was (or is no
    /// block of `heap`).
    #[inline]
    pub(super) fn set(&self, heap: &Heap<'_, u64>, b: &BlockInfo) -> bool {
        match b.class {
            None => heap
                .owner_word(b.page)
                .is_some_and(|w| w.swap(1, Ordering::AcqRel) == 0),
            Some(_) => {
                let (w, m) = self.at(b);
                w.fetch_or(m, Ordering::AcqRel) & m == 0
            }
        }
    }

    /// [`LiveBits::set`] for a block the heap has just handed out to
    /// this thread (so no other thread marks it): a span's mark is a
    /// plain store, with no locked instruction, which on x86 would wait
    /// for the heap's stores before it. A class block's bit shares its
    /// word with other blocks, and is set as by `set`.
    #[inline]
    pub(super) fn set_fresh(&self, heap: &Heap<'_, u64>, b: &BlockInfo) -> bool {
        match b.class {
            None => heap.owner_word(b.page).is_some_and(|w| {
                let was = w.load(Ordering::Relaxed);
                w.store(1, Ordering::Release);
                was == 0
            }),
            Some(_) => self.set(heap, b),
        }
    }

    /// Whether a block of `heap` is live.
    pub(super) fn is_set(&self, heap: &Heap<'_, u64>, b: &BlockInfo) -> bool {
        match b.class {
            None => heap
                .owner_word(b.page)
                .is_some_and(|w| w.load(Ordering::Acquire) != 0),
            Some(_) => {
                let (w, m) = self.at(b);
                w.load(Ordering::Acquire) & m != 0
            }
        }
    }

    /// Live blocks of the class page whose bits start at `page`.
    pub(super) fn count_page(&self, page: u32) -> u32 {
        self.words(page as usize)
            .iter()
            .map(|w| w.load(Ordering::Acquire).count_ones())
            .sum()
    }

    /// Marks a block of `heap` free; false if it was not live.
    #[inline]
    pub(super) fn clear(&self, heap: &Heap<'_, u64>, b: &BlockInfo) -> bool {
        match b.class {
            None => heap
                .owner_word(b.page)
                .is_some_and(|w| w.swap(0, Ordering::AcqRel) != 0),
            Some(_) => {
                let (w, m) = self.at(b);
                w.fetch_and(!m, Ordering::AcqRel) & m != 0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuheap_core::OwnedHeap;

    #[test]
    fn every_block_of_every_page_has_a_bit_of_its_own() {
        for pages in [1usize, 3, 4, 7, 64] {
            let owned = OwnedHeap::<u64>::new(pages as u32, 1).unwrap();
            let heap = owned.heap();
            let live = LiveBits::new(pages);
            let blocks = |page: u32| {
                (0..(64 * WORDS_PER_PAGE) as u32).map(move |index| BlockInfo {
                    page,
                    class: Some(0),
                    index,
                    size: ALIGN,
                })
            };
            for page in 0..pages as u32 {
                for b in blocks(page).filter(|b| b.index % 3 == page % 3) {
                    assert!(live.set(&heap, &b), "{pages} pages: {page}/{}", b.index);
                }
            }
            for page in 0..pages as u32 {
                let want = blocks(page).filter(|b| b.index % 3 == page % 3).count();
                assert_eq!(
                    live.count_page(page) as usize,
                    want,
                    "{pages} pages: {page}"
                );
                for b in blocks(page) {
                    assert_eq!(live.is_set(&heap, &b), b.index % 3 == page % 3);
                }
            }
        }
    }

    /// A span is marked on its head page's descriptor, apart from the
    /// class pages' bits: set once, cleared once, and nothing else moves.
    #[test]
    fn spans_are_marked_on_their_descriptors() {
        let owned = OwnedHeap::<u64>::new(8, 1).unwrap();
        let heap = owned.heap();
        let live = LiveBits::new(8);
        let span = |page: u32| BlockInfo {
            page,
            class: None,
            index: 0,
            size: 3 * PAGE_SIZE,
        };
        assert!(live.set(&heap, &span(2)));
        assert!(!live.set(&heap, &span(2)), "a span marked twice");
        assert!(live.is_set(&heap, &span(2)));
        assert!(!live.is_set(&heap, &span(3)));
        assert_eq!(heap.owner_word(2).unwrap().load(Ordering::Relaxed), 1);
        assert_eq!(live.count_page(2), 0, "class bits untouched");
        assert!(live.clear(&heap, &span(2)));
        assert!(!live.clear(&heap, &span(2)), "a span freed twice");
        assert!(!live.is_set(&heap, &span(2)));
        // Past the heap's pages: never live.
        assert!(!live.set(&heap, &span(8)) && !live.is_set(&heap, &span(8)));
        // A fresh mark (a block the heap just handed out) reads as `set`'s:
        // live once, refused as a second mark, freed once.
        assert!(live.set_fresh(&heap, &span(4)));
        assert!(live.is_set(&heap, &span(4)));
        assert!(!live.set_fresh(&heap, &span(4)), "a span marked twice");
        assert!(live.clear(&heap, &span(4)) && !live.clear(&heap, &span(4)));
        assert!(!live.set_fresh(&heap, &span(8)));
        let class = BlockInfo {
            page: 5,
            class: Some(0),
            index: 7,
            size: ALIGN,
        };
        assert!(live.set_fresh(&heap, &class) && !live.set_fresh(&heap, &class));
        assert_eq!(live.count_page(5), 1);
    }
}

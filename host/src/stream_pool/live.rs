//! Live bits: which blocks a caller holds, for O(1) double-free checks.

use super::ALIGN;
use cuheap_core::size_class::PAGE_SIZE;
use cuheap_core::BlockInfo;
use std::sync::atomic::{AtomicU64, Ordering};

/// One bit per block a page can hold at [`ALIGN`] (256 per 64 KiB unit;
/// larger pages hold at most 256 blocks too), indexed by the page
/// [`cuheap_core::Heap::block_at`] returns. Invariant: a block's bit is set
/// iff a caller holds it, so a second free finds it clear, with no shared
/// table on the call path.
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

    /// Marks a block live; false if it already was.
    #[inline]
    pub(super) fn set(&self, b: &BlockInfo) -> bool {
        let (w, m) = self.at(b);
        w.fetch_or(m, Ordering::AcqRel) & m == 0
    }

    /// Whether a block is live.
    pub(super) fn is_set(&self, b: &BlockInfo) -> bool {
        let (w, m) = self.at(b);
        w.load(Ordering::Acquire) & m != 0
    }

    /// Live blocks of the page whose bits start at `page`.
    pub(super) fn count_page(&self, page: u32) -> u32 {
        self.words(page as usize)
            .iter()
            .map(|w| w.load(Ordering::Acquire).count_ones())
            .sum()
    }

    /// Marks a block free; false if it was not live.
    #[inline]
    pub(super) fn clear(&self, b: &BlockInfo) -> bool {
        let (w, m) = self.at(b);
        w.fetch_and(!m, Ordering::AcqRel) & m != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_of_every_page_has_a_bit_of_its_own() {
        for pages in [1usize, 3, 4, 7, 64] {
            let live = LiveBits::new(pages);
            let blocks = |page: u32| {
                (0..(64 * WORDS_PER_PAGE) as u32).map(move |index| BlockInfo {
                    page,
                    class: None,
                    index,
                    size: ALIGN,
                })
            };
            for page in 0..pages as u32 {
                for b in blocks(page).filter(|b| b.index % 3 == page % 3) {
                    assert!(live.set(&b), "{pages} pages: {page}/{}", b.index);
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
                    assert_eq!(live.is_set(&b), b.index % 3 == page % 3);
                }
            }
        }
    }
}

//! Live bits: which blocks a caller holds, for O(1) double-free checks.

use super::ALIGN;
use cuheap_core::size_class::PAGE_SIZE;
use cuheap_core::BlockInfo;
use std::sync::atomic::{AtomicU64, Ordering};

/// One bit per block a page can hold at [`ALIGN`] (256 per 64 KiB unit;
/// larger pages hold at most 256 blocks too), indexed by the page
/// [`cuheap_core::Heap::block_at`] returns. Invariant: a block's bit is set
/// iff a caller holds it, so a second free finds it clear, with no shared
/// table on the call path; blocks of one page (mostly one thread's) share
/// one cache line.
pub(super) struct LiveBits(Vec<AtomicU64>);

const WORDS_PER_PAGE: usize = PAGE_SIZE / ALIGN / 64;

impl LiveBits {
    pub(super) fn new(pages: usize) -> LiveBits {
        LiveBits(
            (0..pages * WORDS_PER_PAGE)
                .map(|_| AtomicU64::new(0))
                .collect(),
        )
    }

    fn at(&self, b: &BlockInfo) -> (&AtomicU64, u64) {
        let i = b.index as usize;
        debug_assert!(
            i < 64 * WORDS_PER_PAGE,
            "pool classes hold at most 256 blocks a page"
        );
        (
            &self.0[b.page as usize * WORDS_PER_PAGE + i / 64],
            1 << (i % 64),
        )
    }

    /// Marks a block live; false if it already was.
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
        let at = page as usize * WORDS_PER_PAGE;
        self.0[at..at + WORDS_PER_PAGE]
            .iter()
            .map(|w| w.load(Ordering::Acquire).count_ones())
            .sum()
    }

    /// Marks a block free; false if it was not live.
    pub(super) fn clear(&self, b: &BlockInfo) -> bool {
        let (w, m) = self.at(b);
        w.fetch_and(!m, Ordering::AcqRel) & m != 0
    }
}

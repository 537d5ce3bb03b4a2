//! Block bitmaps: bit `i` of a page's bitmap is set iff block `i` is free
//! and unclaimed. Claiming clears bits with `fetch_and`, freeing sets them
//! with `fetch_or`, so a whole warp's worth of blocks (up to one word) is
//! claimed or freed with one atomic.

use crate::sync::Ordering;
use crate::word::Word;

/// A view of one page's bitmap words.
pub struct Bitmap<'a, W: Word> {
    words: &'a [W::Atomic],
}

impl<'a, W: Word> Bitmap<'a, W> {
    pub fn new(words: &'a [W::Atomic]) -> Self {
        Self { words }
    }

    /// Marks blocks `0..n` free and the rest of the words clear.
    /// Only for a page nobody else can reach yet (activation).
    pub fn fill(&self, n: u32) {
        let mut left = n;
        for w in self.words {
            let take = left.min(W::BITS);
            W::store(w, W::low_bits(take), Ordering::Relaxed);
            left -= take;
        }
    }

    /// Claims up to `want` (>= 1) free blocks from one word, starting at
    /// block `start`: first the `want` blocks from `start` on (to the end
    /// of its word) with one `fetch_and` and no load before it, which is
    /// all a claim takes when blocks are claimed in the order they were
    /// reserved; then, from the value that `fetch_and` returned, the
    /// lowest free blocks of that word and the next, over the first
    /// `nwords` words. Returns the word index and the claimed bits (at
    /// least one), or `None` after a pass found nothing.
    ///
    /// A guess that misses clears only bits that were clear already.
    /// `want` 0 claims nothing: `None`.
    #[inline(always)]
    pub fn claim(&self, start: u32, nwords: u32, want: u32) -> Option<(u32, W)> {
        if want == 0 {
            return None;
        }
        let mut i = (start / W::BITS) % nwords;
        let guess = W::bits_from(start % W::BITS, want);
        // Acquire: the blocks' previous owner freed them with a release.
        let old = W::fetch_and(&self.words[i as usize], !guess, Ordering::Acquire);
        if old & guess != W::ZERO {
            return Some((i, old & guess));
        }
        let mut cur = old;
        for pass in 0..nwords {
            if pass > 0 {
                i += 1;
                if i == nwords {
                    i = 0;
                }
                cur = W::load(&self.words[i as usize], Ordering::Relaxed);
            }
            let cell = &self.words[i as usize];
            while cur != W::ZERO {
                let m = cur.lowest_set(want);
                // Acquire: as above.
                let old = W::fetch_and(cell, !m, Ordering::Acquire);
                let got = old & m;
                if got != W::ZERO {
                    return Some((i, got));
                }
                cur = old;
            }
        }
        None
    }

    /// Sets `mask` in word `word`; returns the bits that were already set
    /// (blocks freed twice), which this call leaves as they were.
    #[inline(always)]
    pub fn release(&self, word: u32, mask: W) -> W {
        // Release: the caller's writes to the blocks happen before the next claim.
        let old = W::fetch_or(&self.words[word as usize], mask, Ordering::Release);
        old & mask
    }

    /// Whether block `i` is free (a snapshot: a block's owner asks about
    /// its own block, which nobody else can claim or free meanwhile).
    #[inline(always)]
    pub fn is_free(&self, i: u32) -> bool {
        W::load(&self.words[(i / W::BITS) as usize], Ordering::Relaxed) & W::bit(i % W::BITS)
            != W::ZERO
    }

    /// Number of set bits in the first `nwords` words (quiescent use only).
    pub fn count_free(&self, nwords: u32) -> u32 {
        self.words[..nwords as usize]
            .iter()
            .map(|w| W::load(w, Ordering::Relaxed).count_ones())
            .sum()
    }

    /// The raw value of word `i` (quiescent use only).
    pub fn word(&self, i: u32) -> W {
        W::load(&self.words[i as usize], Ordering::Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::vec::Vec;

    fn words<W: Word>(n: usize) -> Vec<W::Atomic> {
        (0..n).map(|_| W::new_atomic(W::ZERO)).collect()
    }

    #[test]
    fn claim_takes_lowest_bits_and_release_reports_doubles() {
        let w = words::<u32>(4);
        let b = Bitmap::<u32>::new(&w);
        b.fill(70);
        assert_eq!(b.count_free(4), 70);
        let (i, m) = b.claim(0, 3, 40).unwrap();
        assert_eq!((i, m), (0, u32::MAX));
        let (i, m) = b.claim(64, 3, 40).unwrap();
        assert_eq!((i, m), (2, 0b111_111));
        assert_eq!(b.release(0, 0b1), 0);
        assert_eq!(b.release(0, 0b11), 0b1);
        assert_eq!(b.count_free(3), 70 - 32 - 6 + 2);
    }

    #[test]
    fn a_claim_takes_the_reserved_blocks_first_and_the_lowest_after_a_miss() {
        let w = words::<u32>(2);
        let b = Bitmap::<u32>::new(&w);
        b.fill(64);
        assert_eq!(b.claim(8, 2, 4), Some((0, 0xF00)), "blocks 8..12");
        assert_eq!(
            b.claim(30, 2, 4),
            Some((0, 0xC000_0000)),
            "cut at the word's end"
        );
        assert_eq!(b.claim(32, 2, 4), Some((1, 0xF)));
        // Blocks 8..12 are taken: the miss claims the lowest free ones.
        assert_eq!(b.claim(8, 2, 2), Some((0, 0b11)));
        assert_eq!(b.count_free(2), 64 - 4 - 2 - 4 - 2);
        // A full word: the scan moves on to the next.
        let (_, m) = b.claim(0, 2, 32).unwrap();
        assert_eq!(b.claim(0, 2, 1), Some((1, 0x10)));
        assert_eq!(m.count_ones(), 32 - 8);
    }

    #[test]
    fn empty_pass_returns_none() {
        let w = words::<u64>(2);
        let b = Bitmap::<u64>::new(&w);
        assert!(b.claim(0, 2, 1).is_none());
        b.fill(3);
        assert!(
            b.claim(0, 2, 0).is_none(),
            "nothing wanted, nothing claimed"
        );
        assert_eq!(b.count_free(2), 3);
    }
}

//! The page map: bit `i` is set iff page `i` is in use (by a size class or
//! a span). Zeroed memory is therefore a heap with every page free, and
//! pages past `limit` are never handed out, so a heap can grow by raising
//! its page count.

use crate::sync::{AtomicU32, Ordering};

/// A view of the page map's words.
pub struct PageMap<'a> {
    words: &'a [AtomicU32],
}

#[inline(always)]
fn run_mask(from: u32, len: u32) -> u32 {
    let m = if len >= 32 {
        u32::MAX
    } else {
        (1u32 << len) - 1
    };
    m << from
}

impl<'a> PageMap<'a> {
    pub fn new(words: &'a [AtomicU32]) -> Self {
        Self { words }
    }

    /// Claims one free page below `limit`, scanning from page `hint`.
    pub fn claim_one(&self, hint: u32, limit: u32) -> Option<u32> {
        self.claim_one_within(hint, 0, limit)
    }

    /// [`PageMap::claim_one`] in the window from the word of page `floor`
    /// to `limit`: scans from `hint` to the limit, then from the floor.
    pub fn claim_one_within(&self, hint: u32, floor: u32, limit: u32) -> Option<u32> {
        let nwords = limit.div_ceil(32);
        let first = (floor / 32).min(nwords.saturating_sub(1));
        if nwords == 0 {
            return None;
        }
        let mut w = first + (hint / 32).saturating_sub(first) % (nwords - first);
        for _ in first..nwords {
            let cell = &self.words[w as usize];
            let mut cur = cell.load(Ordering::Relaxed);
            loop {
                let free = !cur;
                if free == 0 {
                    break;
                }
                let bit = free.trailing_zeros();
                if w * 32 + bit >= limit {
                    break;
                }
                let old = cell.fetch_or(1 << bit, Ordering::AcqRel);
                if old & (1 << bit) == 0 {
                    return Some(w * 32 + bit);
                }
                cur = old;
            }
            w += 1;
            if w == nwords {
                w = first;
            }
        }
        None
    }

    /// Claims `len` consecutive free pages below `limit`, first fit from
    /// page `hint` (callers spread their hints so concurrent searches do not
    /// collide), then from page 0. Lock-free: a run whose bits change under
    /// it is given back and the search goes on past the conflict.
    pub fn claim_run(&self, len: u32, limit: u32, hint: u32) -> Option<u32> {
        self.claim_run_aligned(len, 1, limit, hint)
    }

    /// [`PageMap::claim_run`] for a run that starts at a multiple of
    /// `align` (a power of two, at most 32). Class pages of `n` units are
    /// claimed aligned to `n.next_power_of_two()`, so each lies inside one
    /// aligned block of that size and a small heap packs them like a
    /// buddy allocator: pages at arbitrary offsets could leave free units
    /// in pieces too short for the largest pages.
    pub fn claim_run_aligned(&self, len: u32, align: u32, limit: u32, hint: u32) -> Option<u32> {
        self.claim_run_within(len, align, 0, limit, hint)
    }

    /// [`PageMap::claim_run_aligned`] in the window from `floor` to
    /// `limit`: first fit from `hint`, then from the floor.
    pub fn claim_run_within(
        &self,
        len: u32,
        align: u32,
        floor: u32,
        limit: u32,
        hint: u32,
    ) -> Option<u32> {
        if len == 0 || len > limit {
            return None;
        }
        let floor = floor.min(limit - len);
        let hint = floor + (hint.saturating_sub(floor)) % (limit - floor);
        if hint > floor {
            if let Some(p) = self.claim_run_from(hint, len, align, limit) {
                return Some(p);
            }
        }
        self.claim_run_from(floor, len, align, limit)
    }

    fn claim_run_from(&self, from: u32, len: u32, align: u32, limit: u32) -> Option<u32> {
        let mut start = from.next_multiple_of(align);
        while start + len <= limit {
            // Find a candidate from a snapshot.
            let mut run = 0u32;
            let mut i = start;
            while run < len {
                if i >= limit {
                    return None;
                }
                if i.is_multiple_of(32)
                    && run == 0
                    && self.words[(i / 32) as usize].load(Ordering::Relaxed) == u32::MAX
                {
                    i += 32; // a full word: skip it whole (32 is aligned)
                    start = i;
                    continue;
                }
                if self.is_set(i) {
                    run = 0;
                    start = (i + 1).next_multiple_of(align);
                    i = start;
                } else {
                    run += 1;
                    i += 1;
                }
            }
            match self.try_claim(start, len) {
                Ok(()) => return Some(start),
                Err(used) => start = (used + 1).next_multiple_of(align),
            }
        }
        None
    }

    /// Claims pages `start..start + len`, all or none: word by word, and on
    /// a conflict gives back what it took. `Err` carries the first page of
    /// the range found in use.
    pub fn try_claim(&self, start: u32, len: u32) -> Result<(), u32> {
        let mut p = start;
        while p < start + len {
            let from = p % 32;
            let n = (32 - from).min(start + len - p);
            let m = run_mask(from, n);
            let old = self.words[(p / 32) as usize].fetch_or(m, Ordering::AcqRel);
            if old & m != 0 {
                // Keep the bits that were ours in this word, drop the rest.
                let mine = m & !old;
                self.words[(p / 32) as usize].fetch_and(!mine, Ordering::Release);
                if p > start {
                    self.release_run(start, p - start);
                }
                return Err(p + (old & m).trailing_zeros() - from);
            }
            p += n;
        }
        Ok(())
    }

    /// Marks pages `start..start + len` free.
    pub fn release_run(&self, start: u32, len: u32) {
        let mut p = start;
        while p < start + len {
            let from = p % 32;
            let n = (32 - from).min(start + len - p);
            self.words[(p / 32) as usize].fetch_and(!run_mask(from, n), Ordering::Release);
            p += n;
        }
    }

    pub fn is_set(&self, page: u32) -> bool {
        self.words[(page / 32) as usize].load(Ordering::Relaxed) & (1 << (page % 32)) != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn searches_within_a_window_wrap_to_its_floor() {
        let w: Vec<AtomicU32> = (0..4).map(|_| AtomicU32::new(0)).collect();
        let m = PageMap::new(&w);
        // From the hint's word to the limit, then from the floor's word.
        assert_eq!(m.claim_one_within(100, 64, 128), Some(96)); // the hint's word
        assert_eq!(m.claim_one_within(10, 64, 128), Some(64)); // hint below the floor
        for _ in 0..62 {
            assert!(m.claim_one_within(127, 64, 128).is_some());
        }
        assert_eq!(m.claim_one_within(127, 64, 128), None, "the window is full");
        assert_eq!(m.claim_one(127, 128), Some(0), "the whole map is not");
        // Runs: first fit from the hint, then from the floor.
        assert_eq!(m.claim_run_within(4, 4, 32, 64, 40), Some(40));
        assert_eq!(m.claim_run_within(4, 4, 32, 64, 62), Some(32));
        assert_eq!(m.claim_run_within(4, 4, 32, 64, 0), Some(36));
        assert_eq!(
            m.claim_run_within(40, 1, 32, 64, 0),
            None,
            "longer than the window"
        );
    }

    #[test]
    fn aligned_runs_start_at_multiples_of_their_alignment() {
        let w: Vec<AtomicU32> = (0..2).map(|_| AtomicU32::new(0)).collect();
        let m = PageMap::new(&w);
        assert_eq!(m.claim_one(0, 64), Some(0));
        assert_eq!(m.claim_run_aligned(3, 4, 64, 0), Some(4));
        assert_eq!(m.claim_run_aligned(16, 16, 64, 5), Some(16));
        assert_eq!(m.claim_run_aligned(16, 16, 64, 40), Some(48));
        // Pages 1..4 and 7..16 are free, 32..48 too: the first aligned
        // 16-run is 32.
        assert_eq!(m.claim_run_aligned(16, 16, 64, 0), Some(32));
        assert_eq!(m.claim_run_aligned(16, 16, 64, 0), None);
        assert_eq!(m.claim_run_aligned(8, 8, 64, 0), Some(8));
        assert_eq!(m.claim_run_aligned(2, 2, 64, 0), Some(2));
        assert_eq!(m.claim_run_aligned(2, 2, 64, 0), None);
        assert_eq!(m.claim_run(2, 64, 0), None); // pages 1 and 7 are apart
    }

    #[test]
    fn runs_skip_used_pages_and_respect_limit() {
        let w: Vec<AtomicU32> = (0..4).map(|_| AtomicU32::new(0)).collect();
        let m = PageMap::new(&w);
        assert_eq!(m.claim_one(0, 100), Some(0));
        assert_eq!(m.claim_run(40, 100, 0), Some(1));
        assert_eq!(m.claim_one(0, 100), Some(41));
        assert_eq!(m.claim_run(59, 100, 7), None);
        assert_eq!(m.claim_run(58, 100, 0), Some(42));
        assert_eq!(m.claim_one(0, 100), None);
        m.release_run(10, 35);
        assert_eq!(m.claim_run(36, 100, 50), None);
        assert_eq!(m.claim_run(35, 100, 0), Some(10));
        assert_eq!(m.claim_run(0, 100, 0), None);
        assert_eq!(m.claim_run(101, 100, 0), None);
    }

    #[test]
    fn try_claim_is_all_or_nothing() {
        let w: Vec<AtomicU32> = (0..4).map(|_| AtomicU32::new(0)).collect();
        let m = PageMap::new(&w);
        assert_eq!(m.try_claim(70, 3), Ok(()));
        // Overlaps page 70 from three words away: nothing of it stays taken.
        assert_eq!(m.try_claim(5, 80), Err(70));
        assert!((5..70).chain(73..85).all(|p| !m.is_set(p)));
        assert_eq!(m.try_claim(0, 70), Ok(()));
        assert!((0..73).all(|p| m.is_set(p)));
        m.release_run(0, 73);
        assert!(w.iter().all(|x| x.load(Ordering::Relaxed) == 0));
    }
}

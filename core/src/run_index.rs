//! An index of the page map's free runs by length, for heaps that place
//! pages by best fit on the host (a host pool). Without it, best fit walks
//! the whole page map for every span: a pool of gigabytes in blocks of many
//! sizes has thousands of free runs, and the walk took most of an
//! allocation's time. With it, a search reads a bitmap of non-empty length
//! buckets and the head of one list.
//!
//! The index holds every maximal run of free pages, each on the list of
//! its length's bucket: one bucket per length up to [`EXACT`] pages (4 MiB),
//! then [`SUB`] buckets per doubling. Boundary tags (a run's length at its
//! first page, its first page at its last) let a release merge with its
//! free neighbours in O(1), as a buddy or TLSF allocator's do.
//!
//! Every change of a heap's page map goes through the index while it has
//! one, under the index's spin lock: the map's words are changed there
//! with plain atomic loads and stores (no other writer can race them),
//! and lock-free readers (statistics, the free-page scans) see each word
//! change once, as before. A view of such a heap must be built with its
//! index ([`PageMap::with_runs`](crate::page_map::PageMap::with_runs), as
//! `Heap` does once the index exists): one without it would change words
//! outside the lock. The lock is held for a few dozen loads and stores;
//! the pool's threads reach the page map only past their caches.
//!
//! Never on the GPU: a kernel's heap has no index (the views there never
//! build one), and its thousands of threads could not share one lock.

use crate::sync::{spin_hint, AtomicU32, Ordering};

/// Run lengths up to this many pages have a bucket each.
pub const EXACT: u32 = 64;
/// Buckets per doubling of the length above [`EXACT`].
pub const SUB: u32 = 8;
/// Number of buckets: lengths up to `u32::MAX`.
pub const BUCKETS: usize = (EXACT + (32 - 6) * SUB) as usize;
/// Words of the non-empty-bucket bitmap.
const BUCKET_WORDS: usize = BUCKETS.div_ceil(32);
/// Fitting runs of a bucket compared before the search takes the best.
const COMPARE: u32 = 16;
/// Runs of a bucket looked at, fitting or not, before the search moves on.
const WALK: u32 = 64;

/// The bucket of runs of `len >= 1` pages; ascending in `len`.
#[inline]
pub const fn bucket(len: u32) -> u32 {
    if len <= EXACT {
        return len - 1;
    }
    let p = 31 - len.leading_zeros(); // 2^p <= len < 2^(p+1), p >= 6
    EXACT + (p - 6) * SUB + ((len >> (p - 3)) & (SUB - 1))
}

/// A view of a heap's run index.
pub struct RunIndex<'a> {
    pages: u32,
    /// 0 free, 1 held.
    lock: &'a AtomicU32,
    /// Bit `b`: bucket `b`'s list is not empty.
    nonempty: &'a [AtomicU32],
    /// Per bucket: its first run's first page + 1 (0: empty).
    heads: &'a [AtomicU32],
    /// Four words a page, on one cache line: at a run's first page its
    /// length ([`LEN`]) and the next and previous run of its bucket
    /// ([`NEXT`], [`PREV`]: first page + 1, 0 for none); at its last page
    /// its first page ([`START`]).
    cells: &'a [AtomicU32],
}

const LEN: u32 = 0;
const START: u32 = 1;
const NEXT: u32 = 2;
const PREV: u32 = 3;

/// What a search found: claim `len` pages at `at`, in the free run
/// `start..start + run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    pub start: u32,
    pub run: u32,
    pub at: u32,
}

impl<'a> RunIndex<'a> {
    /// Words (`u32`) of an index for `pages` pages.
    pub const fn words(pages: u32) -> usize {
        1 + BUCKET_WORDS + BUCKETS + 4 * pages as usize
    }

    /// `cells` is [`RunIndex::words`] long. Zeroed, it is the index of a
    /// map with no free page (call [`RunIndex::rebuild`] before use).
    #[inline]
    pub fn new(cells: &'a [AtomicU32], pages: u32) -> Self {
        let n = pages as usize;
        let (lock, rest) = cells.split_at(1);
        let (nonempty, rest) = rest.split_at(BUCKET_WORDS);
        let (heads, cells) = rest.split_at(BUCKETS);
        Self {
            pages,
            lock: &lock[0],
            nonempty,
            heads,
            cells: &cells[..4 * n],
        }
    }

    /// Pages the index covers (the heap's).
    #[inline]
    pub fn pages(&self) -> u32 {
        self.pages
    }

    /// Runs `f` holding the index's lock.
    /// The lock is given back even if `f` panics (a host caller that
    /// catches the panic must not leave every later claim spinning).
    #[inline]
    pub fn locked<T>(&self, f: impl FnOnce() -> T) -> T {
        while self
            .lock
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.lock.load(Ordering::Relaxed) != 0 {
                spin_hint();
            }
        }
        struct Unlock<'l>(&'l AtomicU32);
        impl Drop for Unlock<'_> {
            fn drop(&mut self) {
                self.0.store(0, Ordering::Release);
            }
        }
        let _unlock = Unlock(self.lock);
        f()
    }

    // The cells are atomics only so that the metadata stays one region of
    // atomics; the lock orders every access, so all are relaxed.
    #[inline]
    fn get(c: &[AtomicU32], i: u32) -> u32 {
        c[i as usize].load(Ordering::Relaxed)
    }

    #[inline]
    fn set(c: &[AtomicU32], i: u32, v: u32) {
        c[i as usize].store(v, Ordering::Relaxed)
    }

    /// Field `f` of page `p` (indexed in `usize`: `4 * p` overflows `u32`
    /// from 2^30 pages on).
    #[inline]
    fn at(&self, p: u32, f: u32) -> u32 {
        self.cells[4 * p as usize + f as usize].load(Ordering::Relaxed)
    }

    #[inline]
    fn put(&self, p: u32, f: u32, v: u32) {
        self.cells[4 * p as usize + f as usize].store(v, Ordering::Relaxed)
    }

    /// Empties the index (under the lock, or before anyone uses it).
    pub fn clear(&self) {
        for c in self.nonempty.iter().chain(self.heads) {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// Puts the free run `start..start + len` (maximal: its neighbours
    /// are in use) on its bucket's list.
    pub fn insert(&self, start: u32, len: u32) {
        if len == 0 {
            return;
        }
        let b = bucket(len);
        self.put(start, LEN, len);
        self.put(start + len - 1, START, start);
        let head = Self::get(self.heads, b);
        self.put(start, NEXT, head);
        self.put(start, PREV, 0);
        if head != 0 {
            self.put(head - 1, PREV, start + 1);
        }
        Self::set(self.heads, b, start + 1);
        self.mark(b, true);
    }

    /// Sets or clears bucket `b`'s bit of `nonempty`, under the lock: a
    /// load and a store (only if the bit changes), not a locked
    /// read-modify-write, since no one else writes the bitmap meanwhile.
    #[inline]
    fn mark(&self, b: u32, nonempty: bool) {
        let word = &self.nonempty[(b / 32) as usize];
        let (old, bit) = (word.load(Ordering::Relaxed), 1 << (b % 32));
        let new = if nonempty { old | bit } else { old & !bit };
        if new != old {
            word.store(new, Ordering::Relaxed);
        }
    }

    /// Takes the run that starts at `start` off its list; returns its
    /// length.
    pub fn remove(&self, start: u32) -> u32 {
        let len = self.at(start, LEN);
        let b = bucket(len);
        let (n, p) = (self.at(start, NEXT), self.at(start, PREV));
        if p != 0 {
            self.put(p - 1, NEXT, n);
        } else {
            Self::set(self.heads, b, n);
        }
        if n != 0 {
            self.put(n - 1, PREV, p);
        }
        if Self::get(self.heads, b) == 0 {
            self.mark(b, false);
        }
        len
    }

    /// The length of the run that starts at `start` (a run start).
    pub fn len_of(&self, start: u32) -> u32 {
        self.at(start, LEN)
    }

    /// The first page of the run that ends at `last` (a run's last page).
    pub fn start_of(&self, last: u32) -> u32 {
        self.at(last, START)
    }

    /// Every indexed run as (start, length), bucket by bucket; `None` if a
    /// run sits in another length's bucket or a list's links disagree.
    /// For checks (call while no claim or release runs).
    pub fn runs(&self, mut each: impl FnMut(u32, u32)) -> bool {
        for b in 0..BUCKETS as u32 {
            let nonempty = self.nonempty[(b / 32) as usize].load(Ordering::Relaxed) >> (b % 32) & 1;
            let mut at = Self::get(self.heads, b);
            if (at != 0) != (nonempty != 0) {
                return false;
            }
            let mut prev = 0;
            while at != 0 {
                let start = at - 1;
                let len = self.at(start, LEN);
                let ok = len > 0
                    && start + len <= self.pages
                    && bucket(len) == b
                    && self.at(start, PREV) == prev
                    && self.at(start + len - 1, START) == start;
                if !ok {
                    return false;
                }
                each(start, len);
                prev = at;
                at = self.at(start, NEXT);
            }
        }
        true
    }

    /// The first non-empty bucket from `b` on.
    fn next_bucket(&self, b: u32) -> Option<u32> {
        let mut w = b / 32;
        let mut bits = self.nonempty.get(w as usize)?.load(Ordering::Relaxed) & (!0u32 << (b % 32));
        loop {
            if bits != 0 {
                return Some(w * 32 + bits.trailing_zeros());
            }
            w += 1;
            bits = self.nonempty.get(w as usize)?.load(Ordering::Relaxed);
        }
    }

    /// Best fit: `len` pages within
    /// `floor..limit`, in the shortest run that holds them (of the first
    /// [`COMPARE`] that fit in its bucket, the shortest, then the lowest).
    /// `None` can be wrong only for runs that a bucket's walk did not reach
    /// ([`WALK`] runs): callers then search the page map itself.
    pub fn find(&self, len: u32, floor: u32, limit: u32) -> Option<Fit> {
        let mut b = bucket(len);
        while let Some(nb) = self.next_bucket(b) {
            let mut best: Option<Fit> = None;
            let (mut fitting, mut walked) = (0, 0);
            let mut at = Self::get(self.heads, nb);
            while at != 0 && fitting < COMPARE && walked < WALK {
                let start = at - 1;
                let run = self.at(start, LEN);
                let (pos, hi) = (start.max(floor), (start + run).min(limit));
                if pos < hi && hi - pos >= len {
                    fitting += 1;
                    let better = best.is_none_or(|f| (run, start) < (f.run, f.start));
                    if better {
                        best = Some(Fit {
                            start,
                            run,
                            at: pos,
                        });
                    }
                }
                walked += 1;
                at = self.at(start, NEXT);
            }
            if best.is_some() {
                return best;
            }
            b = nb + 1;
        }
        None
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn buckets_ascend_and_the_exact_ones_hold_one_length() {
        let mut last = 0;
        for len in 1..100_000u32 {
            let b = bucket(len);
            assert!(b >= last && b < BUCKETS as u32, "len {len}");
            last = b;
            if len <= EXACT {
                assert_eq!(b, len - 1);
            }
        }
        assert_eq!(bucket(u32::MAX), BUCKETS as u32 - 1);
    }
}

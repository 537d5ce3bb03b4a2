//! The page map: bit `i` is set iff page `i` is in use (by a size class or
//! a span). Zeroed memory is therefore a heap with every page free, and
//! pages past `limit` are never handed out, so a heap can grow by raising
//! its page count.
//!
//! Two summaries keep one bit per page-map word each: `full`, set while
//! the word is full, and `used`, set while any of its pages is in use.
//! Searches step over 1,024 pages in use, or 1,024 free pages, with one
//! load: a heap of gigabytes is crossed in a few dozen loads instead of
//! thousands. The summaries are hints that searches may read stale; the
//! protocol keeps them exact whenever no claim or release is under way:
//!
//! - a claim that fills a word (its `fetch_or` returned the last free bit)
//!   sets the word's `full` bit, then reloads the word and clears the bit
//!   again if a release got in between; a release that takes a full
//!   word's first bit clears the `full` bit after it;
//! - the mirror image for `used`: a release that empties a word clears
//!   its `used` bit, then reloads the word and sets the bit again if a
//!   claim got in between; a claim into an empty word sets the bit after
//!   it.
//!
//! All summary updates are acquire-release read-modify-writes, so a
//! reloading side whose update comes after the other side's also sees the
//! other side's word and undoes its own. (On a map with an index of free
//! runs, every claim and release, summaries included, is made under the
//! index's lock, one at a time, with loads and stores.) Skipping a word on a stale
//! "full" only makes a search miss a page freed a moment ago, as a search
//! that came a moment earlier would have; on a stale "empty", a search
//! picks a run that a claim has just begun to take, and its own claim of
//! the run fails and searches again. A stale "not full" or "not empty"
//! only costs the load of the word.

use crate::run_index::{Fit, RunIndex};
use crate::stats::{Counters, Tally};
use crate::sync::{add_relaxed, AtomicU32, AtomicU64, Ordering};

/// Whether class pages on an indexed map take the lowest fit.
const LOW: bool = true;

/// A view of the page map's words and their summaries.
pub struct PageMap<'a> {
    words: &'a [AtomicU32],
    full: &'a [AtomicU32],
    used: &'a [AtomicU32],
    /// The index of free runs, on a host heap that keeps one: then every
    /// claim and release goes through it, under its lock, and searches
    /// read it instead of the words. Never on the GPU.
    #[cfg(not(target_arch = "nvptx64"))]
    runs: Option<RunIndex<'a>>,
    /// Where this view counts its claims as begun, and the claims that
    /// gave back pages they had taken (see [`PageMap::counting`]); none
    /// on most views. Never on the GPU.
    #[cfg(not(target_arch = "nvptx64"))]
    begun: Option<(&'a AtomicU64, &'a AtomicU64)>,
    /// Where this view counts what it claims and releases, and as what,
    /// on an indexed map (see [`PageMap::tallying`]). Never on the GPU.
    #[cfg(not(target_arch = "nvptx64"))]
    ledger: Option<(&'a Counters, Tally)>,
}

/// Sets (`on`) or clears `bit` of summary word `cell`: an acquire-release
/// read-modify-write, or with `LOCKED` (under an index's lock, where no
/// other writer can race) a load and a release store, as
/// [`PageMap::change_bits_locked`] changes the words.
#[inline(always)]
fn flip<const LOCKED: bool>(cell: &AtomicU32, bit: u32, on: bool) {
    match (LOCKED, on) {
        (true, _) => {
            let v = cell.load(Ordering::Relaxed);
            cell.store(if on { v | bit } else { v & !bit }, Ordering::Release);
        }
        (false, true) => {
            cell.fetch_or(bit, Ordering::AcqRel);
        }
        (false, false) => {
            cell.fetch_and(!bit, Ordering::AcqRel);
        }
    }
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
    /// Page-map words for `pages` pages.
    pub const fn words(pages: u32) -> usize {
        pages.div_ceil(32) as usize
    }

    /// Summary words for `pages` pages (two bits per page-map word).
    pub const fn summary_words(pages: u32) -> usize {
        2 * Self::words(pages).div_ceil(32)
    }

    /// `words`: the page map ([`PageMap::words`] long); `summary`: its
    /// summaries, `full` then `used` ([`PageMap::summary_words`] long).
    /// Zeroed, all say every page is free.
    ///
    /// A heap builds its views on every call, and the host pool's crate
    /// inlines them (this and the builders below): a call and a copy of
    /// the view cost about 40 instructions of a span's allocation there.
    /// The kernels keep their code as it was.
    #[cfg_attr(not(target_arch = "nvptx64"), inline)]
    pub fn new(words: &'a [AtomicU32], summary: &'a [AtomicU32]) -> Self {
        let (full, used) = summary.split_at(summary.len() / 2);
        Self {
            words,
            full,
            used,
            #[cfg(not(target_arch = "nvptx64"))]
            runs: None,
            #[cfg(not(target_arch = "nvptx64"))]
            begun: None,
            #[cfg(not(target_arch = "nvptx64"))]
            ledger: None,
        }
    }

    /// This view, counting in `begun` each claim it makes, before the
    /// read-modify-write (or, on an indexed map, the store under the
    /// lock) that takes the pages, and taking the count back when the
    /// claim loses them: a search that finds the pages taken, and then
    /// reads the counter, sees the claim counted. A claim that collides
    /// after it took some pages gives them back and counts that in
    /// `given_back`, before it takes its count back (a release): a search
    /// that found those pages taken, and reads `begun` with acquire once
    /// the claim is no longer counted there, reads `given_back` moved
    /// and searches again. A heap counts its class pages' activations
    /// so, until their descriptors name their class (see
    /// `Heap::claim_units`). On the GPU this view itself, counting
    /// nothing (a kernel's heap does not count activations: see
    /// `COUNTS_ACTIVATIONS` in the heap's allocation path), with no field
    /// for the counters in its views.
    #[cfg_attr(not(target_arch = "nvptx64"), inline)]
    pub fn counting(self, begun: &'a AtomicU64, given_back: &'a AtomicU64) -> Self {
        #[cfg(not(target_arch = "nvptx64"))]
        return Self {
            begun: Some((begun, given_back)),
            ..self
        };
        #[cfg(target_arch = "nvptx64")]
        {
            let _ = (begun, given_back);
            self
        }
    }

    /// The counters of claims begun and of claims that gave back pages,
    /// if this view counts (never on the GPU, where this is a constant
    /// `None`).
    #[inline(always)]
    fn begun(&self) -> Option<(&'a AtomicU64, &'a AtomicU64)> {
        #[cfg(not(target_arch = "nvptx64"))]
        {
            self.begun
        }
        #[cfg(target_arch = "nvptx64")]
        {
            None
        }
    }

    /// Counts a claim as begun (see [`PageMap::counting`]).
    #[inline(always)]
    fn begin_claim(&self) {
        if let Some((c, _)) = self.begun() {
            // Relaxed: the claiming write after it releases.
            add_relaxed(c, 1);
        }
    }

    /// Takes back the count of a claim that lost its pages, once it gave
    /// back those it took (`gave_back`: it took some), which it counts
    /// first.
    #[inline(always)]
    fn abandon_claim(&self, gave_back: bool) {
        if let Some((c, given)) = self.begun() {
            if gave_back {
                given.fetch_add(1, Ordering::Release);
            }
            // Release: a search that reads the count taken back reads the
            // pages given back, and their count.
            c.fetch_sub(1, Ordering::Release);
        }
    }

    /// This view, counting each claim and release it makes as `what` in
    /// `counters` ([`Counters::tally_locked`]) under the lock of the
    /// map's index of free runs, if the map has one
    /// ([`PageMap::keeps_counts`]); a view without `with_runs` (and any
    /// view on the GPU) counts nothing, and its caller counts with
    /// atomics. The count is made with the pages' bits, before the lock
    /// is given back: a release of the pages, in any thread, is counted
    /// after their claim.
    #[cfg_attr(not(target_arch = "nvptx64"), inline)]
    pub fn tallying(self, counters: &'a Counters, what: Tally) -> Self {
        #[cfg(not(target_arch = "nvptx64"))]
        return Self {
            ledger: Some((counters, what)),
            ..self
        };
        #[cfg(target_arch = "nvptx64")]
        {
            let _ = (counters, what);
            self
        }
    }

    /// Whether this view counts its claims and releases itself (see
    /// [`PageMap::tallying`]): it has an index and a ledger. Never on the
    /// GPU.
    #[inline(always)]
    pub fn keeps_counts(&self) -> bool {
        #[cfg(not(target_arch = "nvptx64"))]
        {
            self.runs.is_some() && self.ledger.is_some()
        }
        #[cfg(target_arch = "nvptx64")]
        {
            false
        }
    }

    /// Counts a claim or release of `len` pages in the ledger, if this
    /// view keeps one (under the index's lock).
    #[inline(always)]
    fn tally(&self, len: u32, claim: bool) {
        #[cfg(not(target_arch = "nvptx64"))]
        if let Some((c, what)) = self.ledger {
            c.tally_locked(what, len, claim);
        }
        #[cfg(target_arch = "nvptx64")]
        let _ = (len, claim);
    }

    /// The index of free runs, if the heap keeps one (never on the GPU,
    /// where this is a constant `None` and the indexed paths vanish).
    #[inline(always)]
    fn runs(&self) -> Option<&RunIndex<'a>> {
        #[cfg(not(target_arch = "nvptx64"))]
        {
            self.runs.as_ref()
        }
        #[cfg(target_arch = "nvptx64")]
        {
            None
        }
    }

    /// This view with its heap's index of free runs (see [`RunIndex`]).
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline]
    pub fn with_runs(self, runs: RunIndex<'a>) -> Self {
        Self {
            runs: Some(runs),
            ..self
        }
    }

    /// Rebuilds the index of free runs from the words: every maximal run
    /// of free pages below `pages`. Call only while no claim or release
    /// runs.
    pub fn rebuild_runs(&self, pages: u32) {
        let Some(r) = self.runs() else { return };
        r.clear();
        for (start, len) in self.free_runs(pages) {
            r.insert(start, len);
        }
    }

    /// The maximal runs of free pages below `pages`, as (start, length),
    /// from the words, a page at a time (a snapshot; for rebuilds and
    /// checks).
    fn free_runs(&self, pages: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
        let mut p = 0;
        core::iter::from_fn(move || {
            while p < pages && self.is_set(p) {
                p += 1;
            }
            let start = p;
            while p < pages && !self.is_set(p) {
                p += 1;
            }
            (p > start).then_some((start, p - start))
        })
    }

    /// Rebuilds the `used` summary from the words; call only while no
    /// claim or release runs.
    pub fn rebuild_used(&self) {
        for (i, cell) in self.used.iter().enumerate() {
            let bits = (0..32)
                .filter(|b| {
                    let w = i * 32 + b;
                    w < self.words.len() && self.words[w].load(Ordering::Relaxed) != 0
                })
                .fold(0u32, |acc, b| acc | 1 << b);
            cell.store(bits, Ordering::Relaxed);
        }
    }

    /// This view without the `used` summary: not read, not kept. A heap
    /// whose searches stop at the first fit gains little from it, and
    /// thousands of GPU threads claiming and giving back pages at once pay
    /// for keeping it. The heap's owner decides once, before first use: a
    /// summary left unkept would be stale for any view that reads it.
    #[cfg_attr(not(target_arch = "nvptx64"), inline)]
    pub fn without_used(self) -> Self {
        Self { used: &[], ..self }
    }

    /// After a claim of bits `m` in word `w` that returned `old`: records a
    /// word it filled in the summary (see the module's protocol). `LOCKED`:
    /// the claim holds the index's lock, under which every change of the
    /// summaries is made too (see [`PageMap::change_bits_locked`]).
    #[inline(always)]
    fn claimed<const LOCKED: bool>(&self, w: u32, old: u32, m: u32) {
        if old == 0 && !self.used.is_empty() {
            self.mark_used::<LOCKED>(w);
        }
        if old | m == u32::MAX && old != u32::MAX {
            self.mark_full::<LOCKED>(w);
        }
    }

    #[cold]
    #[inline(never)]
    fn mark_used<const LOCKED: bool>(&self, w: u32) {
        flip::<LOCKED>(&self.used[(w / 32) as usize], 1 << (w % 32), true);
    }

    /// Out of line: a word fills once per 32 pages claimed at most, and
    /// the allocation paths on the GPU keep their registers for the rest.
    #[cold]
    #[inline(never)]
    fn mark_full<const LOCKED: bool>(&self, w: u32) {
        let (cell, bit) = (&self.full[(w / 32) as usize], 1u32 << (w % 32));
        flip::<LOCKED>(cell, bit, true);
        if self.words[w as usize].load(Ordering::Relaxed) != u32::MAX {
            flip::<LOCKED>(cell, bit, false);
        }
    }

    /// After a release of bits `m` from word `w` that returned `old`: a
    /// word that was full is no longer, one that is now empty may be (see
    /// the module's protocol; `LOCKED` as in [`PageMap::claimed`]).
    #[inline(always)]
    fn released<const LOCKED: bool>(&self, w: u32, old: u32, m: u32) {
        if old == u32::MAX && m & old != 0 {
            self.mark_open::<LOCKED>(w);
        }
        if old != 0 && old & !m == 0 && !self.used.is_empty() {
            self.mark_empty::<LOCKED>(w);
        }
    }

    #[cold]
    #[inline(never)]
    fn mark_empty<const LOCKED: bool>(&self, w: u32) {
        let (cell, bit) = (&self.used[(w / 32) as usize], 1u32 << (w % 32));
        flip::<LOCKED>(cell, bit, false);
        if self.words[w as usize].load(Ordering::Relaxed) != 0 {
            flip::<LOCKED>(cell, bit, true);
        }
    }

    #[cold]
    #[inline(never)]
    fn mark_open<const LOCKED: bool>(&self, w: u32) {
        flip::<LOCKED>(&self.full[(w / 32) as usize], 1u32 << (w % 32), false);
    }

    /// The first word from `w` on that the summary does not call empty
    /// (at least `w`; past the map's words if all are).
    #[inline(always)]
    fn used_word(&self, mut w: u32) -> u32 {
        while (w / 32) < self.used.len() as u32 {
            let s = self.used[(w / 32) as usize].load(Ordering::Relaxed) >> (w % 32);
            let n = s.trailing_zeros().min(32 - w % 32);
            if n == 0 {
                return w;
            }
            w += n;
        }
        w
    }

    /// The first word from `w` on that the summary does not call full
    /// (at least `w`; past the map's words if all are).
    #[inline(always)]
    fn open_word(&self, mut w: u32) -> u32 {
        while (w / 32) < self.full.len() as u32 {
            // Bits above the shifted-in zeros count as not full, so the
            // count stops at the summary word's end.
            let s = self.full[(w / 32) as usize].load(Ordering::Relaxed) >> (w % 32);
            let n = (!s).trailing_zeros();
            if n == 0 {
                return w;
            }
            w += n;
        }
        w
    }

    /// Claims one free page below `limit`, scanning from page `hint`.
    pub fn claim_one(&self, hint: u32, limit: u32) -> Option<u32> {
        self.claim_one_within(hint, 0, limit)
    }

    /// [`PageMap::claim_one`] in the window from the word of page `floor`
    /// to `limit`: scans from `hint` to the limit, then from the floor.
    #[inline(never)]
    pub fn claim_one_within(&self, hint: u32, floor: u32, limit: u32) -> Option<u32> {
        if let Some(r) = self.runs() {
            return self.claim_indexed(r, 1, 1, floor, limit, LOW);
        }
        let nwords = limit.div_ceil(32);
        if nwords == 0 {
            return None;
        }
        let first = (floor / 32).min(nwords - 1);
        let h = first + (hint / 32).saturating_sub(first) % (nwords - first);
        self.claim_one_in(h, nwords, limit)
            .or_else(|| self.claim_one_in(first, h, limit))
    }

    /// Claims one free page below `limit` in words `from..to`, in order.
    fn claim_one_in(&self, from: u32, to: u32, limit: u32) -> Option<u32> {
        let mut w = from;
        loop {
            w = self.open_word(w);
            if w >= to {
                return None;
            }
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
                self.begin_claim();
                let old = cell.fetch_or(1 << bit, Ordering::AcqRel);
                if old & (1 << bit) == 0 {
                    self.claimed::<false>(w, old, 1 << bit);
                    return Some(w * 32 + bit);
                }
                self.abandon_claim(false);
                cur = old;
            }
            w += 1;
        }
    }

    /// Claims `len` consecutive free pages below `limit`, first fit from
    /// page `hint` (callers spread their hints so concurrent searches do not
    /// collide), then from page 0. Lock-free: a run whose bits change under
    /// it is given back and the search goes on past the conflict.
    pub fn claim_run(&self, len: u32, limit: u32, hint: u32) -> Option<u32> {
        self.claim_run_aligned(len, 1, limit, hint)
    }

    /// [`PageMap::claim_run`] for a run that starts at a multiple of
    /// `align` (a power of two, at most 32). Class pages of 2, 4, 8 or 16
    /// units are claimed aligned to their size, so a small heap packs them
    /// like a buddy allocator: pages at arbitrary offsets could leave free
    /// units in pieces too short for the largest pages. Pages of other
    /// sizes are aligned to the power of two in their units (3, 5 and 7
    /// units to none): padding them to the next power of two split the
    /// runs that spans need.
    pub fn claim_run_aligned(&self, len: u32, align: u32, limit: u32, hint: u32) -> Option<u32> {
        self.claim_run_within(len, align, 0, limit, hint)
    }

    /// [`PageMap::claim_run_aligned`] in the window from `floor` to
    /// `limit`: first fit from `hint`, then from the floor.
    #[inline(never)]
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
        if let Some(r) = self.runs() {
            return self.claim_indexed(r, len, align, floor, limit, LOW);
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
        while let Some(found) = self.find_run(start, len, align, limit) {
            match self.try_claim(found, len) {
                Ok(()) => return Some(found),
                Err(used) => start = (used + 1).next_multiple_of(align),
            }
        }
        None
    }

    /// The first run of `len` free pages at or after `start` (a multiple
    /// of `align`) that starts at a multiple of `align` and ends by
    /// `limit`, from a snapshot of the map: a word at a time, full words
    /// skipped through the summary.
    fn find_run(&self, mut start: u32, len: u32, align: u32, limit: u32) -> Option<u32> {
        // Pages start..i are free; i is the next page to look at.
        let mut i = start;
        while start as u64 + len as u64 <= limit as u64 {
            if i == start && i.is_multiple_of(32) {
                // Full words: skip them whole (32 is aligned), those the
                // summary knows a thousand at a time.
                let open = self.open_word(i / 32).saturating_mul(32);
                if open > i {
                    (start, i) = (open, open);
                    continue;
                }
            }
            if i.is_multiple_of(32) {
                // Empty words: the run goes on over them.
                let used = self.used_word(i / 32).saturating_mul(32);
                if used > i {
                    if used - start >= len {
                        return Some(start);
                    }
                    i = used;
                    continue;
                }
            }
            let (w, b) = (i / 32, i % 32);
            let word = self.words[w as usize].load(Ordering::Relaxed) >> b;
            // Free pages from i on in this word (the shifted-in zeros
            // stop the count at the word's end).
            let free = word.trailing_zeros().min(32 - b);
            if i - start + free >= len {
                return Some(start);
            }
            if free == 32 - b {
                i += free;
                continue;
            }
            // Pages in use from i + free on, then a fresh start past them.
            let used = (!(word >> free)).trailing_zeros();
            start = (i + free + used).next_multiple_of(align);
            i = start;
        }
        None
    }

    /// Best fit: claims `len` pages at the start of the shortest free run
    /// of at least `len` pages in `floor..limit` (the lowest of equally
    /// short ones; an exact fit ends the search). Searches the whole window
    /// each time (a word at a time, full words skipped through the
    /// summary), so it suits a heap whose runs are few and long, as a host
    /// pool's are, not thousands of GPU threads at once.
    #[inline(never)]
    pub fn claim_best(&self, len: u32, floor: u32, limit: u32) -> Option<u32> {
        if len == 0 || floor as u64 + len as u64 > limit as u64 {
            return None;
        }
        if let Some(r) = self.runs() {
            return self.claim_indexed(r, len, 1, floor, limit, false);
        }
        loop {
            let at = self.find_best(len, floor, limit)?;
            match self.try_claim(at, len) {
                Ok(()) => return Some(at),
                // The search took a page in use for free: its word's
                // `used` bit lags behind a claim under way (or was left
                // stale). Set it, so the next search reads the word and
                // goes past the page instead of picking it again; a bit
                // set early only costs a load.
                Err(used) if !self.used.is_empty() => self.mark_used::<false>(used / 32),
                Err(_) => {}
            }
        }
    }

    /// [`PageMap::claim_best`]'s search, from a snapshot of the map.
    fn find_best(&self, len: u32, floor: u32, limit: u32) -> Option<u32> {
        // The best run so far: (start, length).
        let mut best: Option<(u32, u32)> = None;
        // Records the free run start..end; true if it fits exactly.
        let mut consider = |start: u32, end: u32| {
            let run = end - start;
            if run >= len && best.is_none_or(|(_, r)| run < r) {
                best = Some((start, run));
            }
            run == len
        };
        // Pages start..i are free; i is the next page to look at.
        let (mut start, mut i) = (floor, floor);
        while i < limit {
            if i.is_multiple_of(32) {
                if i == start {
                    let open = self.open_word(i / 32).saturating_mul(32);
                    if open > i {
                        (start, i) = (open, open);
                        continue;
                    }
                }
                // Empty words: the run goes on over them.
                let used = self.used_word(i / 32).saturating_mul(32);
                if used > i {
                    i = used;
                    continue;
                }
            }
            let (w, b) = (i / 32, i % 32);
            let word = self.words[w as usize].load(Ordering::Relaxed) >> b;
            let free = word.trailing_zeros().min(32 - b);
            if free == 32 - b {
                i += free; // the run goes on into the next word
                continue;
            }
            let end = (i + free).min(limit);
            if consider(start, end) {
                return Some(start);
            }
            // Pages in use from `end` on, then a new run.
            let used = (!(word >> free)).trailing_zeros();
            i = end + used;
            start = i;
        }
        if start < limit && consider(start, limit) {
            return Some(start);
        }
        best.map(|(at, _)| at)
    }

    /// Claims pages `start..start + len`, all or none: word by word, and on
    /// a conflict gives back what it took. `Err` carries the first page of
    /// the range found in use.
    pub fn try_claim(&self, start: u32, len: u32) -> Result<(), u32> {
        if let Some(r) = self.runs() {
            if len == 0 {
                return Ok(());
            }
            if start as u64 + len as u64 > r.pages() as u64 {
                // Past the heap's last page: never free.
                return Err(start.max(r.pages()));
            }
            return r.locked(|| {
                if let Some(used) = (start..start + len).find(|&p| self.is_set(p)) {
                    return Err(used);
                }
                self.begin_claim();
                self.take(r, self.fit_at(r, start), len);
                Ok(())
            });
        }
        if len == 0 {
            return Ok(());
        }
        self.begin_claim();
        let mut p = start;
        while p < start + len {
            let from = p % 32;
            let n = (32 - from).min(start + len - p);
            let m = run_mask(from, n);
            let old = self.words[(p / 32) as usize].fetch_or(m, Ordering::AcqRel);
            if old & m != 0 {
                // Keep the bits that were ours in this word, drop the rest.
                let mine = m & !old;
                let was = self.words[(p / 32) as usize].fetch_and(!mine, Ordering::Release);
                self.released::<false>(p / 32, was, mine);
                if p > start {
                    self.release_run(start, p - start);
                }
                self.abandon_claim(mine != 0 || p > start);
                return Err(p + (old & m).trailing_zeros() - from);
            }
            self.claimed::<false>(p / 32, old, m);
            p += n;
        }
        Ok(())
    }

    /// Marks pages `start..start + len` free.
    pub fn release_run(&self, start: u32, len: u32) {
        if len == 0 {
            return;
        }
        if let Some(r) = self.runs() {
            r.locked(|| self.release_locked(r, start, len));
            return;
        }
        self.clear_bits(start, len);
    }

    /// [`PageMap::release_run`] for each of `runs` (first page, pages),
    /// on an indexed map under one hold of the lock: each run is released
    /// (and counted) apart, as if by its own call.
    pub fn release_runs(&self, runs: &[(u32, u32)]) {
        if let Some(r) = self.runs() {
            r.locked(|| {
                for &(start, len) in runs {
                    if len > 0 {
                        self.release_locked(r, start, len);
                    }
                }
            });
            return;
        }
        for &(start, len) in runs {
            self.release_run(start, len);
        }
    }

    /// Marks pages `start..start + len` (`len >= 1`) free and indexes
    /// them, merged with the free runs on either side (under the index's
    /// lock).
    fn release_locked(&self, r: &RunIndex<'_>, start: u32, len: u32) {
        self.change_bits_locked(start, len, false);
        self.tally(len, false);
        let (mut from, mut end) = (start, start + len);
        if from > 0 && !self.is_set(from - 1) {
            from = r.start_of(from - 1);
            r.remove(from);
        }
        if end < r.pages() && !self.is_set(end) {
            end += r.remove(end);
        }
        r.insert(from, end - from);
    }

    /// Clears the bits of pages `start..start + len` (in use before).
    fn clear_bits(&self, start: u32, len: u32) {
        self.change_bits(start, len, false)
    }

    /// Claims `len` pages in `floor..limit` under the index's lock: with
    /// `low` (class pages), the lowest run at a multiple of `align`; else
    /// (spans, `align` 1) the best fit the index finds.
    fn claim_indexed(
        &self,
        r: &RunIndex<'_>,
        len: u32,
        align: u32,
        floor: u32,
        limit: u32,
        low: bool,
    ) -> Option<u32> {
        if len == 0 || floor as u64 + len as u64 > limit as u64 {
            return None;
        }
        r.locked(|| {
            let fit = match low {
                // The map itself, a word at a time (no claim or release
                // runs while the lock is held).
                true => self
                    .find_run(floor.next_multiple_of(align), len, align, limit)
                    .map(|at| self.fit_at(r, at)),
                // Spans (`align` 1): the index, then the runs its walk left
                // unread.
                false => r.find(len, floor, limit).or_else(|| {
                    self.find_best(len, floor, limit)
                        .map(|at| self.fit_at(r, at))
                }),
            }?;
            self.begin_claim();
            self.take(r, fit, len);
            Some(fit.at)
        })
    }

    /// Pages from the free page `at` on, in the free run that holds it
    /// (under the index's lock).
    fn fit_at(&self, r: &RunIndex<'_>, at: u32) -> Fit {
        let start = at - self.free_below(at);
        Fit {
            start,
            run: r.len_of(start),
            at,
        }
    }

    /// Claims `len` pages at `fit.at` in the free run `fit`, indexes what
    /// is left of the run on either side, and counts the pages in the
    /// ledger if the view keeps one (under the index's lock).
    fn take(&self, r: &RunIndex<'_>, fit: Fit, len: u32) {
        r.remove(fit.start);
        self.set_bits(fit.at, len);
        self.tally(len, true);
        r.insert(fit.start, fit.at - fit.start);
        r.insert(fit.at + len, fit.start + fit.run - fit.at - len);
    }

    /// Sets the bits of pages `start..start + len` (free before), under
    /// the index's lock.
    fn set_bits(&self, start: u32, len: u32) {
        self.change_bits_locked(start, len, true)
    }

    /// [`PageMap::change_bits`] under the index's lock. With an index,
    /// every change of the map's words is made under it (see
    /// [`RunIndex`]), so a load and a store change a word, and the
    /// summary bits it moves, as a read-modify-write would, without the
    /// locked instruction (on x86 a full barrier, which waits for the
    /// metadata stores before it). Lock-free readers see each word change
    /// once, as before. Host heaps only (a GPU heap has no index).
    fn change_bits_locked(&self, start: u32, len: u32, claim: bool) {
        self.each_word(start, len, |cell, w, m| {
            let old = cell.load(Ordering::Relaxed);
            if claim {
                debug_assert_eq!(old & m, 0, "pages {m:#x} of word {w} claimed twice");
                cell.store(old | m, Ordering::Release);
                self.claimed::<true>(w, old, m);
            } else {
                cell.store(old & !m, Ordering::Release);
                self.released::<true>(w, old, m);
            }
        })
    }

    /// Sets (`claim`) or clears the bits of pages `start..start + len`,
    /// a word at a time, keeping the summaries.
    #[inline(always)]
    fn change_bits(&self, start: u32, len: u32, claim: bool) {
        self.each_word(start, len, |cell, w, m| {
            if claim {
                let old = cell.fetch_or(m, Ordering::AcqRel);
                debug_assert_eq!(old & m, 0, "pages {m:#x} of word {w} claimed twice");
                self.claimed::<false>(w, old, m);
            } else {
                let old = cell.fetch_and(!m, Ordering::Release);
                self.released::<false>(w, old, m);
            }
        })
    }

    /// Calls `f(word, index, mask)` for each word of the map that pages
    /// `start..start + len` touch, with the mask of their bits in it.
    #[inline(always)]
    fn each_word(&self, start: u32, len: u32, mut f: impl FnMut(&AtomicU32, u32, u32)) {
        let mut p = start;
        while p < start + len {
            let from = p % 32;
            let n = (32 - from).min(start + len - p);
            f(&self.words[(p / 32) as usize], p / 32, run_mask(from, n));
            p += n;
        }
    }

    /// Whether the index of free runs (if the map has one) holds exactly
    /// the maximal free runs below `pages`, each once, on its length's
    /// list. Call only while no claim or release runs.
    pub fn runs_are_exact(&self, pages: u32) -> bool {
        let Some(r) = self.runs() else { return true };
        let mut free_runs = 0u64;
        for (start, len) in self.free_runs(pages) {
            if r.len_of(start) != len || r.start_of(start + len - 1) != start {
                return false;
            }
            free_runs += 1;
        }
        let mut indexed = 0u64;
        let linked = r.runs(|start, len| {
            indexed += 1;
            // Each listed run is free and maximal.
            let free = (start..start + len).all(|q| !self.is_set(q));
            let maximal = (start == 0 || self.is_set(start - 1))
                && (start + len == pages || self.is_set(start + len));
            if !(free && maximal) {
                indexed = u64::MAX / 2;
            }
        });
        linked && indexed == free_runs
    }

    /// Whether the summaries are exact where they must be: no word called
    /// full that is not, none called empty that is not. Call only while
    /// no claim or release runs. (The reverse, a full or an empty word the
    /// summaries do not know, is allowed: racing updates can leave it.)
    pub fn summary_is_exact(&self) -> bool {
        (0..self.words.len()).all(|w| {
            let bit = |s: &[AtomicU32]| s[w / 32].load(Ordering::Relaxed) & (1 << (w % 32)) != 0;
            let word = self.words[w].load(Ordering::Relaxed);
            (!bit(self.full) || word == u32::MAX)
                && (self.used.is_empty() || bit(self.used) || word == 0)
        })
    }

    /// How many pages right below `limit` are free (a snapshot): the run
    /// that memory mapped at `limit` would extend.
    pub fn free_below(&self, limit: u32) -> u32 {
        let mut i = limit;
        while i > 0 {
            let (w, b) = ((i - 1) / 32, (i - 1) % 32);
            // Pages w * 32 ..= i - 1 of this word, highest first.
            let word = self.words[w as usize].load(Ordering::Relaxed) << (31 - b);
            let free = word.leading_zeros().min(b + 1);
            i -= free;
            if free <= b {
                break;
            }
        }
        limit - i
    }

    pub fn is_set(&self, page: u32) -> bool {
        self.words[(page / 32) as usize].load(Ordering::Relaxed) & (1 << (page % 32)) != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::vec::Vec;

    /// A zeroed page map and summary for `pages` pages.
    fn zeroed(pages: u32) -> (Vec<AtomicU32>, Vec<AtomicU32>) {
        let z = |n| (0..n).map(|_| AtomicU32::new(0)).collect();
        (z(PageMap::words(pages)), z(PageMap::summary_words(pages)))
    }

    /// [`zeroed`] with a zeroed index of free runs beside.
    fn zeroed_indexed(pages: u32) -> (Vec<AtomicU32>, Vec<AtomicU32>, Vec<AtomicU32>) {
        let (w, f) = zeroed(pages);
        let z = (0..RunIndex::words(pages))
            .map(|_| AtomicU32::new(0))
            .collect();
        (w, f, z)
    }

    /// The indexed map over [`zeroed_indexed`]'s cells, its index built.
    fn indexed<'a>(
        w: &'a [AtomicU32],
        f: &'a [AtomicU32],
        z: &'a [AtomicU32],
        pages: u32,
    ) -> PageMap<'a> {
        let m = PageMap::new(w, f).with_runs(RunIndex::new(z, pages));
        m.rebuild_runs(pages);
        m
    }

    /// Numbers below `n`, from a xorshift seeded with `seed`.
    fn rng(mut x: u64) -> impl FnMut(u32) -> u32 {
        move |n: u32| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as u32
        }
    }

    /// An indexed map against a page-by-page model: random claims of every
    /// kind (best fit, aligned and single pages, given ranges) and releases
    /// that merge with their neighbours. After each step the index holds
    /// exactly the maximal free runs, every claim is of free pages, best
    /// fit takes a run of the shortest length's bucket, and a search fails
    /// only when nothing fits.
    #[test]
    fn an_indexed_map_keeps_its_runs_and_fits_best() {
        use crate::run_index::bucket;
        let mut rnd = rng(0x2545_F491_4F6C_DD1Du64);
        for round in 0..if cfg!(miri) { 2 } else { 40 } {
            let pages = 1 + rnd(if cfg!(miri) { 200 } else { 2000 });
            let (w, f, z) = zeroed_indexed(pages);
            let m = indexed(&w, &f, &z, pages);
            let mut used = std::vec![false; pages as usize];
            // Blocks claimed so far: (start, len).
            let mut live: Vec<(u32, u32)> = Vec::new();
            let steps = if cfg!(miri) { 60 } else { 600 };
            for _ in 0..steps {
                let scale = [4, 40, 400][round % 3];
                let len = 1 + rnd(scale);
                let got = match rnd(5) {
                    0 if !live.is_empty() => {
                        let (s, l) = live.swap_remove(rnd(live.len() as u32) as usize);
                        m.release_run(s, l);
                        used[s as usize..(s + l) as usize].fill(false);
                        None
                    }
                    1 => {
                        let s = rnd(pages);
                        let l = len.min(pages - s);
                        let free = (s..s + l).all(|q| !used[q as usize]);
                        assert_eq!(m.try_claim(s, l).is_ok(), free);
                        free.then_some((s, l))
                    }
                    2 => {
                        let align = 1 << rnd(5);
                        let at = m.claim_run_aligned(len, align, pages, 0);
                        // Lowest aligned fit.
                        let want = (0..pages)
                            .step_by(align as usize)
                            .find(|&a| a + len <= pages && (a..a + len).all(|q| !used[q as usize]));
                        assert_eq!(at, want, "{len} pages at {align}");
                        at.map(|a| (a, len))
                    }
                    _ => {
                        // Best fit: the run's length is in the bucket of
                        // the shortest run that holds `len`.
                        let mut shortest = None;
                        let mut a = 0;
                        while a < pages {
                            let e = (a..pages).find(|&q| used[q as usize]).unwrap_or(pages);
                            if e - a >= len && shortest.is_none_or(|r| e - a < r) {
                                shortest = Some(e - a);
                            }
                            a = e + 1;
                        }
                        let at = m.claim_best(len, 0, pages);
                        assert_eq!(at.is_some(), shortest.is_some());
                        if let Some(a) = at {
                            let s =
                                a - (0..a).rev().take_while(|&q| !used[q as usize]).count() as u32;
                            let e = (a..pages).find(|&q| used[q as usize]).unwrap_or(pages);
                            assert_eq!(s, a, "best fit starts its run");
                            assert_eq!(bucket(e - s), bucket(shortest.unwrap()));
                        }
                        at.map(|a| (a, len))
                    }
                };
                if let Some((s, l)) = got {
                    assert!((s..s + l).all(|q| !used[q as usize]), "claimed twice");
                    used[s as usize..(s + l) as usize].fill(true);
                    live.push((s, l));
                }
                assert!((0..pages).all(|q| m.is_set(q) == used[q as usize]));
                assert!(m.runs_are_exact(pages));
                assert!(m.summary_is_exact());
            }
        }
    }

    /// The edges of an indexed map: releasing no pages inside a free run
    /// changes nothing, a claim past the last page is refused, and a panic
    /// under the index's lock gives the lock back.
    #[test]
    fn an_indexed_map_refuses_its_edges_and_survives_a_panic() {
        let pages = 40;
        let (w, f, z) = zeroed_indexed(pages);
        let m = indexed(&w, &f, &z, pages);
        m.release_run(10, 0);
        assert!(m.runs_are_exact(pages));
        assert_eq!(m.try_claim(36, 8), Err(40), "past the last page");
        assert!(m.runs_are_exact(pages));
        assert_eq!(m.try_claim(36, 4), Ok(()));
        #[cfg(not(miri))]
        {
            let r = m.runs().unwrap();
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                r.locked(|| panic!("inside the lock"))
            }));
            assert!(caught.is_err());
        }
        assert_eq!(
            m.claim_best(36, 0, pages),
            Some(0),
            "the lock was given back"
        );
        assert!(m.runs_are_exact(pages));
    }

    /// Random maps (runs of used and free pages of random lengths, so
    /// whole words and whole summary words of either occur), each search
    /// against a page-by-page reference.
    #[test]
    fn searches_agree_with_page_by_page_references() {
        let mut rnd = rng(0x9E37_79B9_7F4A_7C15u64);
        // Miri interprets every page-by-page reference: a few rounds there.
        for round in 0..if cfg!(miri) { 6 } else { 400 } {
            let pages = 1 + rnd(3000);
            let (w, f) = zeroed(pages);
            let m = PageMap::new(&w, &f);
            let mut used = std::vec![false; pages as usize];
            let mut p = 0;
            let scale = [4, 40, 400][round % 3];
            while p < pages {
                let n = (1 + rnd(scale)).min(pages - p);
                if rnd(2) == 0 {
                    assert_eq!(m.try_claim(p, n), Ok(()));
                    used[p as usize..(p + n) as usize].fill(true);
                }
                p += n;
            }
            // Give back some runs (parts of them, or more than one).
            for _ in 0..rnd(20) {
                let a = rnd(pages);
                let n = (1 + rnd(scale * 2)).min(pages - a);
                m.release_run(a, n);
                used[a as usize..(a + n) as usize].fill(false);
            }
            assert!(m.summary_is_exact());
            let free = |a: u32, n: u32| (a..a + n).all(|q| !used[q as usize]);
            for _ in 0..8 {
                let short = rnd(2) == 0;
                let len = 1 + rnd(if short { 8 } else { 300 });
                let align = 1 << rnd(6);
                let floor = rnd(pages);
                let limit = floor + rnd(pages - floor + 1);
                // First fit, aligned.
                let first = (floor.next_multiple_of(align)..=limit.saturating_sub(len))
                    .step_by(align as usize)
                    .find(|&a| a + len <= limit && free(a, len));
                assert_eq!(
                    m.find_run(floor.next_multiple_of(align), len, align, limit),
                    first
                );
                // Best fit: the shortest maximal free run that holds len.
                let mut best: Option<(u32, u32)> = None;
                let mut a = floor;
                while a < limit {
                    if used[a as usize] {
                        a += 1;
                        continue;
                    }
                    let mut e = a;
                    while e < limit && !used[e as usize] {
                        e += 1;
                    }
                    if e - a >= len && best.is_none_or(|(_, r)| e - a < r) {
                        best = Some((a, e - a));
                    }
                    a = e;
                }
                assert_eq!(m.find_best(len, floor, limit), best.map(|b| b.0));
                // The free tail.
                let tail = (0..limit).rev().take_while(|&q| !used[q as usize]).count() as u32;
                assert_eq!(m.free_below(limit), tail);
            }
        }
    }

    /// Best fit gets past a page whose word the `used` summary calls empty
    /// (a claim under way, or a summary left stale): it does not pick the
    /// same run again and again.
    #[test]
    fn best_fit_gets_past_a_word_wrongly_called_empty() {
        let (w, f) = zeroed(64);
        let m = PageMap::new(&w, &f);
        // A view that does not keep `used` claims page 0: the full view's
        // summary still calls word 0 empty.
        assert_eq!(PageMap::new(&w, &f).without_used().try_claim(0, 1), Ok(()));
        assert!(!m.summary_is_exact());
        assert_eq!(m.claim_best(1, 0, 64), Some(1));
        assert!(m.summary_is_exact());
    }

    #[test]
    fn the_summary_follows_full_words_and_searches_skip_them() {
        // 64 words: a summary of two.
        let (w, f) = zeroed(64 * 32);
        let m = PageMap::new(&w, &f);
        let full = |i: usize| f[i / 32].load(Ordering::Relaxed) & (1 << (i % 32)) != 0;
        // Page by page: word 0 is full at its 32nd claim, not before.
        for p in 0..31 {
            assert_eq!(m.claim_one(0, 64 * 32), Some(p));
        }
        assert!(!full(0));
        assert_eq!(m.claim_one(0, 64 * 32), Some(31));
        assert!(full(0) && !full(1));
        // A run over words 1..=40, part of word 41: full words marked,
        // across the summary's word boundary, the partial one not.
        assert_eq!(m.claim_run(40 * 32 + 5, 64 * 32, 0), Some(32));
        assert!((0..=40).all(full) && !full(41));
        // Searches start past the full words.
        assert_eq!(m.claim_one(0, 64 * 32), Some(41 * 32 + 5));
        assert_eq!(m.claim_run(3, 64 * 32, 0), Some(41 * 32 + 6));
        assert!(m.summary_is_exact());
        // A release from a full word clears its bit; the search finds it.
        m.release_run(35 * 32 + 7, 2);
        assert!(!full(35) && full(34) && full(36));
        assert!(m.summary_is_exact());
        assert_eq!(m.claim_run(2, 64 * 32, 0), Some(35 * 32 + 7));
        assert!(full(35));
        // A failed try_claim gives back what it took, summary included.
        assert_eq!(m.try_claim(50 * 32, 32), Ok(()));
        assert!(full(50));
        assert_eq!(m.try_claim(51 * 32, 40), Ok(())); // words 51, part of 52
        m.release_run(52 * 32 + 7, 1); // a hole in word 52
        assert_eq!(m.try_claim(52 * 32, 32), Err(52 * 32));
        assert!(full(51) && !full(52));
        assert!(m.summary_is_exact());
        // Everything back: every summary bit clear.
        for p in 0..64 * 32 {
            if m.is_set(p) {
                m.release_run(p, 1);
            }
        }
        assert!(f.iter().all(|x| x.load(Ordering::Relaxed) == 0));
    }

    #[test]
    fn searches_within_a_window_wrap_to_its_floor() {
        let (w, f) = zeroed(4 * 32);
        let m = PageMap::new(&w, &f);
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
        let (w, f) = zeroed(2 * 32);
        let m = PageMap::new(&w, &f);
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
        let (w, f) = zeroed(4 * 32);
        let m = PageMap::new(&w, &f);
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
        let (w, f) = zeroed(4 * 32);
        let m = PageMap::new(&w, &f);
        assert_eq!(m.try_claim(70, 3), Ok(()));
        // Overlaps page 70 from three words away: nothing of it stays taken.
        assert_eq!(m.try_claim(5, 80), Err(70));
        assert!((5..70).chain(73..85).all(|p| !m.is_set(p)));
        assert_eq!(m.try_claim(0, 70), Ok(()));
        assert!((0..73).all(|p| m.is_set(p)));
        m.release_run(0, 73);
        assert!(w.iter().all(|x| x.load(Ordering::Relaxed) == 0));
        assert!(m.summary_is_exact());
    }

    /// A counting view counts each claim it makes, once, and takes back
    /// the count of one that lost its pages, counting those that gave
    /// back pages they had taken; searches that find nothing count
    /// nothing. With and without an index of free runs.
    #[test]
    fn a_counting_view_counts_the_claims_that_keep_their_pages() {
        let pages = 4 * 32;
        let (w, f) = zeroed(pages);
        let (wi, fi, zi) = zeroed_indexed(pages);
        let plain = PageMap::new(&w, &f);
        let with_index = indexed(&wi, &fi, &zi, pages);
        for (m, plain) in [(plain, true), (with_index, false)] {
            let (begun, given_back) = (AtomicU64::new(0), AtomicU64::new(0));
            let m = m.counting(&begun, &given_back);
            let count = || begun.load(Ordering::Relaxed);
            let given = || given_back.load(Ordering::Relaxed);
            assert_eq!(m.claim_one(0, pages), Some(0));
            assert_eq!(count(), 1);
            assert_eq!(m.claim_run_aligned(4, 4, pages, 0), Some(4));
            assert_eq!(count(), 2);
            assert_eq!(m.try_claim(70, 3), Ok(()));
            assert_eq!(count(), 3);
            // Page 70 is in use: the plain map takes pages 40..64 (word
            // 1), finds it in word 2 and gives them back; the indexed one
            // finds it first. No count either way; the plain map counts
            // the pages it gave back.
            assert_eq!(m.try_claim(40, 40), Err(70));
            assert_eq!(count(), 3);
            assert_eq!(given(), plain as u64);
            // It takes page 69 and gives it back; a collision on its
            // first page, with the page after it taken too, takes and
            // gives back nothing.
            assert_eq!(m.try_claim(69, 2), Err(70));
            assert_eq!(given(), 2 * plain as u64);
            assert_eq!(m.try_claim(70, 2), Err(70));
            assert_eq!((count(), given()), (3, 2 * plain as u64));
            assert_eq!(m.claim_run(200, pages, 0), None);
            assert_eq!(m.try_claim(90, 0), Ok(()));
            assert_eq!(count(), 3);
            assert!((40..70).all(|p| !m.is_set(p)));
            // Searches of a full map that find nothing.
            while m.claim_one(0, pages).is_some() {}
            let full = count();
            assert_eq!(full, 3 + pages as u64 - 8, "one count a page claimed");
            assert_eq!(m.claim_one(0, pages), None);
            assert_eq!(m.claim_run_aligned(2, 2, pages, 0), None);
            assert_eq!(m.claim_best(1, 0, pages), None);
            assert_eq!(count(), full);
            assert_eq!(given(), 2 * plain as u64);
        }
    }

    /// A tallying view of an indexed map counts what it claims and
    /// releases under the index's lock, as its kind says: the footprint
    /// and its peak always, span pages for spans and their parts, and one
    /// span per whole span. A failed claim counts nothing; a plain map's
    /// view counts nothing (its caller counts with atomics).
    #[test]
    fn a_tallying_view_counts_under_the_lock_as_its_kind_says() {
        let pages = 4 * 32;
        let (wi, fi, zi) = zeroed_indexed(pages);
        let c = Counters::new();
        let map = || indexed(&wi, &fi, &zi, pages);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let counts = || {
            (
                get(&c.units_taken),
                get(&c.units_peak),
                get(&c.span_pages),
                get(&c.spans_allocated),
                get(&c.spans_freed),
            )
        };
        assert!(!map().keeps_counts(), "no ledger");
        let spans = map().tallying(&c, Tally::Span);
        let parts = map().tallying(&c, Tally::SpanPart);
        let class = map().tallying(&c, Tally::ClassPage);
        assert!(spans.keeps_counts() && parts.keeps_counts() && class.keeps_counts());
        assert_eq!(spans.claim_best(5, 0, pages), Some(0));
        assert_eq!(counts(), (5, 5, 5, 1, 0));
        assert_eq!(parts.try_claim(5, 3), Ok(()));
        assert_eq!(counts(), (8, 8, 8, 1, 0));
        assert_eq!(class.claim_run_aligned(4, 4, pages, 0), Some(8));
        assert_eq!(class.claim_one(0, pages), Some(12));
        assert_eq!(counts(), (13, 13, 8, 1, 0));
        // Claims that fail count nothing.
        assert_eq!(parts.try_claim(10, 4), Err(10));
        assert_eq!(spans.claim_best(pages, 0, pages), None);
        assert_eq!(counts(), (13, 13, 8, 1, 0));
        parts.release_run(6, 2);
        assert_eq!(counts(), (11, 13, 6, 1, 0));
        spans.release_run(0, 6);
        class.release_run(8, 4);
        assert_eq!(counts(), (1, 13, 0, 1, 1));
        // Pages claimed through a view without a ledger, or of a map
        // without an index, are not counted.
        assert_eq!(map().try_claim(40, 2), Ok(()));
        let (w, f) = zeroed(pages);
        let plain = PageMap::new(&w, &f).tallying(&c, Tally::Span);
        assert!(!plain.keeps_counts());
        assert_eq!(plain.claim_best(3, 0, pages), Some(0));
        plain.release_run(0, 3);
        assert_eq!(counts(), (1, 13, 0, 1, 1));
    }

    /// Threads that claim single pages of one word through counting
    /// views, colliding on its bits, and give them back: every claim that
    /// lost its bit took its count back, so the count is the number of
    /// claims made; none gave back a page (a lost bit was never taken).
    #[test]
    #[cfg_attr(miri, ignore)] // many thousands of claims on every thread
    fn colliding_claims_take_their_counts_back() {
        let (w, f) = zeroed(32);
        let (begun, given_back) = (AtomicU64::new(0), AtomicU64::new(0));
        let made = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let m = PageMap::new(&w, &f).counting(&begun, &given_back);
                    for _ in 0..20_000 {
                        if let Some(p) = m.claim_one(0, 32) {
                            made.fetch_add(1, Ordering::Relaxed);
                            m.release_run(p, 1);
                        }
                    }
                });
            }
        });
        assert_eq!(begun.load(Ordering::Relaxed), made.load(Ordering::Relaxed));
        assert_eq!(given_back.load(Ordering::Relaxed), 0);
    }
}

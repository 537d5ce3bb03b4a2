//! A class page's life cycle: activated on fresh units, listed once a
//! quarter of it is free, retired (its units back to the page map) once all
//! of it is, and the scavenger that retires empty pages parked on lists.

use super::alloc::{COUNTS_ACTIVATIONS, INSTALLING};
use super::Heap;
use crate::page::{Avail, KIND_CLASS_TAIL, KIND_FREE, STATE_LISTED, STATE_NONE};
use crate::page_list::PageList;
use crate::size_class::CLASS_COUNT;
use crate::stats::{Counters, Tally};
use crate::sync::Ordering;
use crate::word::Word;

/// Pages of a class are listed once this many blocks are free.
#[inline(always)]
pub(super) const fn list_threshold(cap: u32) -> u32 {
    // (see `settle`)
    let t = cap / 4;
    if t == 0 {
        1
    } else {
        t
    }
}

impl<W: Word> Heap<'_, W> {
    pub(super) fn activate(&self, page: u32, class: u32) {
        for k in 1..self.geometry().page_units(class) {
            let tail = &self.descs()[(page + k) as usize];
            tail.span.store(k, Ordering::Relaxed);
            tail.kind.store(KIND_CLASS_TAIL, Ordering::Release);
        }
        let cap = self.geometry().blocks_per_page(class);
        self.bitmap(page).fill(cap);
        // (On an indexed heap `claim_units` counted them.)
        self.tally(Tally::ClassPage, self.geometry().page_units(class), true);
        self.descs()[page as usize].activate(class, cap);
        let activated = &self.counters().pages_activated;
        match COUNTS_ACTIVATIONS {
            // Ends the activation that `claim_units` counted as begun: a
            // scan that reads this count (acquire) sees the page's class.
            true => {
                activated.fetch_add(1, Ordering::Release);
            }
            false => Counters::bump(activated, 1),
        }
    }

    pub(super) fn list_page(&self, page: u32, class: u32, slot: u32) {
        self.descs()[page as usize]
            .state
            .store(STATE_LISTED, Ordering::Relaxed);
        self.list(class, slot).push(page, self.next_of());
    }

    /// Acts on a floating page given the `avail` one RMW returned: retires
    /// it when empty, lists it when a quarter is free. Out of line, and
    /// called with the heap's handle in scalars, not with `&self`: a
    /// kernel that passes the view by reference keeps the whole view in
    /// local memory, written by every thread at its start, although few
    /// threads ever settle a page (the free kernel spent a good part of
    /// its time on those stores).
    #[inline(always)]
    pub(super) fn settle(&self, page: u32, a: Avail, slot: u32) {
        let h = self.handle();
        settle_at::<W>(h.meta, h.data, h.page_count, h.slots, page, a, slot);
    }

    #[inline(always)]
    fn settle_here(&self, page: u32, a: Avail, slot: u32) {
        // The class the RMW that returned `a` saw, not a load of `kind`:
        // a free's `add` only releases, so a `kind` read after it may be
        // older than the activation whose page that RMW hit
        // (`settle_acts_on_the_class_its_rmw_saw` in the loom tests).
        if !a.live || a.class == 0 {
            return;
        }
        let class = a.class - 1;
        let d = &self.descs()[page as usize];
        let cap = self.geometry().blocks_per_page(class);
        if a.free >= cap as i64 && self.try_retire(page, class, cap, true) {
            self.release_page(page, class);
        } else if a.free >= list_threshold(cap) as i64 {
            // Listed under the class `unfloat` saw: the page may serve
            // another one by now.
            if let Some(now) = d.unfloat() {
                self.list_page(page, now, slot);
            }
        }
    }

    /// Retires the page at `page`, of `class` and `cap` blocks, if all of
    /// them are free and unreserved and its floating flag is `floating`
    /// ([`PageDesc::try_retire`](crate::page::PageDesc::try_retire)); the
    /// caller then gives its units back ([`Heap::release_page`]).
    ///
    /// On a host the release is counted as begun before the retiring CAS,
    /// and the count taken back if the CAS fails; only a page that reads
    /// as retirable is tried (a scavenge pops many pages still in use,
    /// and each attempt would cost two locked instructions on a shared
    /// count). A retirement itself costs what it did: the count moved
    /// here from `release_units`. From the CAS until
    /// [`Heap::release_units`] gives them back, the page's units read as
    /// taken in the page map: a span's search on a heap without an index
    /// ([`Heap::search_after_claims`]), which reads no descriptor, waits
    /// for the release only if it is counted by then. A search that saw
    /// the page retired (its own scavenge's load or failed CAS on it,
    /// then its acquire fence) reads the count. In a kernel the count is
    /// made by `release_units` (no span search there waits).
    #[inline(always)]
    pub(super) fn try_retire(&self, page: u32, class: u32, cap: u32, floating: bool) -> bool {
        let d = &self.descs()[page as usize];
        if !COUNTS_ACTIVATIONS {
            return d.try_retire(class, cap, floating);
        }
        if !d.retirable(class, cap, floating) {
            return false;
        }
        let begun = &self.counters().releases_begun;
        // Before the CAS, whose release publishes it.
        begun.fetch_add(1, Ordering::Relaxed);
        let retired = d.try_retire(class, cap, floating);
        if !retired {
            begun.fetch_sub(1, Ordering::Relaxed);
        }
        retired
    }

    /// Gives a page [`Heap::try_retire`] retired back to the page map.
    pub(super) fn release_page(&self, page: u32, class: u32) {
        self.release_units(page, class);
        self.end_release();
    }

    /// The first part of [`Heap::release_page`]: the page's units back in
    /// the page map, the release counted as begun (in a kernel here; on a
    /// host by [`Heap::try_retire`], before).
    ///
    /// A last-resort scan must not miss the units on their way: it waits
    /// for a page whose `kind` still names its class while its count reads
    /// retired (from the retiring CAS to the store of `KIND_FREE` here),
    /// then for a release counted as begun and not ended (from that store
    /// to [`Heap::end_release`]); counted before the store (which
    /// releases), so a scan that reads `KIND_FREE` reads the count too.
    pub(super) fn release_units(&self, page: u32, class: u32) {
        if !COUNTS_ACTIVATIONS {
            // Before the `kind` stores, whose release publishes it.
            self.counters()
                .releases_begun
                .fetch_add(1, Ordering::Relaxed);
        }
        let units = self.geometry().page_units(class);
        for p in page..page + units {
            let d = &self.descs()[p as usize];
            d.state.store(STATE_NONE, Ordering::Relaxed);
            d.kind.store(KIND_FREE, Ordering::Release);
        }
        self.tally(Tally::ClassPage, units, false);
        self.tallied(Tally::ClassPage).release_run(page, units);
    }

    /// Counts a release as ended once the units are back in the map: a
    /// last-resort scan that sees the count move searches the map again
    /// (release, so that it finds the units then).
    pub(super) fn end_release(&self) {
        self.counters()
            .pages_retired
            .fetch_add(1, Ordering::Release);
    }

    /// Returns `n` blocks of a class page to its `avail`, then settles it.
    #[inline(always)]
    pub(super) fn return_blocks(&self, page: u32, n: u32, slot: u32) {
        let a = self.descs()[page as usize].add(n);
        if a.floating {
            self.settle(page, a, slot);
        }
    }

    /// Retires the empty pages parked on lists so any class or span can use
    /// them. Returns how many it retired.
    #[inline(never)]
    pub fn scavenge(&self) -> u32 {
        self.scavenge_slots(0, self.slots)
    }

    /// [`Heap::scavenge`] on the lists and current pages of `count` slots
    /// from `from` (wrapping).
    #[inline(never)]
    pub fn scavenge_slots(&self, from: u32, count: u32) -> u32 {
        let mut retired = 0;
        for slot in self.slots_from(from, count) {
            let empty = per_class(self.slot_row(self.lists(), slot), |h| {
                PageList::new(h).is_empty()
            });
            for class in 0..CLASS_COUNT as u32 {
                if empty >> class & 1 != 0 {
                    continue;
                }
                let list = self.list(class, slot);
                let cap = self.geometry().blocks_per_page(class);
                let mut kept = 0u32; // private chain through `next`, page + 1
                while let Some(p) = list.pop(self.next_of()) {
                    if self.try_retire(p, class, cap, false) {
                        self.release_page(p, class);
                        retired += 1;
                    } else {
                        let d = &self.descs()[p as usize];
                        d.next.store(kept, Ordering::Relaxed);
                        kept = p + 1;
                    }
                }
                while kept != 0 {
                    let p = kept - 1;
                    kept = self.descs()[p as usize].next.load(Ordering::Relaxed);
                    list.push(p, self.next_of());
                }
            }
        }
        retired + self.scavenge_current(from, count)
    }

    /// `count` slots (at most all) from `from`, wrapping.
    fn slots_from(&self, from: u32, count: u32) -> impl Iterator<Item = u32> {
        let (n, from) = (self.slots, from % self.slots);
        (0..count.min(n)).map(move |k| (from + k) % n)
    }

    /// Detaches the empty current pages of `count` slots from `from` (every
    /// class) and lets
    /// them settle (retire), as a full page is detached: without it, a
    /// heap whose blocks were all freed could still hold every page as some
    /// slot's empty current page, and refuse a span or another class.
    ///
    /// The snapshot only picks candidates: the decision is `settle`'s, on
    /// the value the `float` RMW returns, so a reservation that lands
    /// meanwhile keeps its page (it is then listed or stays floating, as
    /// any detached page). A thread that read the slot before the detach
    /// and takes blocks afterwards is handled as for a full page: it gets
    /// its blocks from the floating page, or gives them back if the page
    /// was retired or serves another class by then.
    fn scavenge_current(&self, from: u32, count: u32) -> u32 {
        let before = self.counters().pages_retired.load(Ordering::Relaxed);
        for slot in self.slots_from(from, count) {
            let held = per_class(self.slot_row(self.cache(), slot), |c| {
                c.load(Ordering::Relaxed) != 0
            });
            for class in 0..CLASS_COUNT as u32 {
                if held >> class & 1 == 0 {
                    continue; // as if read as 0 below, a moment earlier
                }
                let cache = self.slot_cache(class, slot);
                let cur = cache.load(Ordering::Acquire);
                if cur == 0 || cur == INSTALLING {
                    continue;
                }
                let page = cur - 1;
                let d = &self.descs()[page as usize];
                let a = d.now();
                let empty = a.live
                    && !a.floating
                    && a.free >= self.geometry().blocks_per_page(class) as i64;
                if empty
                    && cache
                        .compare_exchange(cur, 0, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    let a = d.float();
                    self.settle(page, a, slot);
                }
            }
        }
        (self.counters().pages_retired.load(Ordering::Relaxed) - before) as u32
    }
}

/// `f` of each word of a slot's row (see [`Heap::slot_row`]), as bits,
/// all read before any result is used: on a GPU the loads then overlap
/// instead of each waiting for the one before. A scavenge reads two words
/// per class of every slot (11,616 on an H100).
#[inline(always)]
fn per_class<A>(row: &[A; CLASS_COUNT], f: impl Fn(&A) -> bool) -> u64 {
    // Straight-line code: a loop is unrolled four times at most, which
    // leaves four loads in flight instead of a row's.
    macro_rules! bits {
        ($($c:literal)*) => { 0 $(| (f(&row[$c]) as u64) << $c)* };
    }
    bits!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43)
}

// `per_class` names every class.
const _: () = assert!(CLASS_COUNT == 44);

/// [`Heap::settle`] on the heap of a handle, out of line.
#[inline(never)]
fn settle_at<W: Word>(
    meta: u64,
    data: u64,
    page_count: u32,
    slots: u32,
    page: u32,
    a: Avail,
    slot: u32,
) {
    // SAFETY: the handle of a live view (`Heap::handle`), whose contract
    // holds while its caller runs, and so during this call.
    let heap = unsafe { Heap::<W>::from_parts(meta, data, page_count, slots) };
    heap.settle_here(page, a, slot);
}

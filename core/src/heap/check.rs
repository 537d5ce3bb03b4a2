//! Structural invariants of the whole heap, checked while it is quiet.

use super::lifecycle::list_threshold;
use super::Heap;
use crate::page::{Avail, Kind, STATE_ATTACHED, STATE_FLOATING, STATE_LISTED};
use crate::size_class::CLASS_COUNT;
use crate::sync::Ordering;
use crate::word::Word;

impl<W: Word> Heap<'_, W> {
    /// Checks every structural invariant; call only while no thread uses
    /// the heap. Returns the first violation found.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let c = self.counters();
        let begun = c.activations_begun.load(Ordering::Relaxed);
        // While the heap is quiet every activation counted as begun has
        // ended: one left over would make each failing allocation on a
        // host wait out the last-resort scan's whole wait. 0 on a heap
        // whose activations are not counted (a kernel's, read here).
        if begun != 0 && begun != c.pages_activated.load(Ordering::Relaxed) {
            return Err("class-page activations counted as begun and never ended");
        }
        // Likewise every release of a retired page's units has ended.
        if c.releases_begun.load(Ordering::Relaxed) != c.pages_retired.load(Ordering::Relaxed) {
            return Err("page releases counted as begun and never ended");
        }
        let map = self.map();
        if !map.summary_is_exact() {
            return Err("page-map summary out of date: a word called full or empty that is not");
        }
        if !map.runs_are_exact(self.page_count) {
            return Err("the index of free runs differs from the page map's free runs");
        }
        // The footprint the counters keep, from the descriptors: units
        // of class pages and of spans, and spans.
        let (mut units, mut span_pages, mut spans) = (0u64, 0u64, 0u64);
        let mut p = 0u32;
        while p < self.page_count {
            let d = &self.descs()[p as usize];
            match d.kind() {
                Kind::Free => {
                    // Pages past the limit may be fenced (see `Heap::fence`).
                    if map.is_set(p) && p < self.limit() {
                        return Err("free page marked used in the page map");
                    }
                    if d.now()
                        != (Avail {
                            floating: false,
                            live: false,
                            free: 0,
                            class: 0,
                        })
                    {
                        return Err("free page with a live counter");
                    }
                }
                Kind::Class(c) => {
                    if c as usize >= CLASS_COUNT {
                        return Err("page of an unknown class");
                    }
                    if !map.is_set(p) {
                        return Err("class page free in the page map");
                    }
                    let a = d.now();
                    if !a.live {
                        return Err("class page not live");
                    }
                    if a.class != c + 1 {
                        return Err("class page's counter names another class");
                    }
                    let cap = self.geometry().blocks_per_page(c);
                    let nwords = cap.div_ceil(W::BITS);
                    let bm = self.bitmap(p);
                    if bm.count_free(nwords) as i64 != a.free {
                        return Err("bitmap free count differs from avail");
                    }
                    let last = bm.word(nwords - 1);
                    let valid = cap - (nwords - 1) * W::BITS;
                    if last & !W::low_bits(valid) != W::ZERO {
                        return Err("bitmap bit set past the page's blocks");
                    }
                    let attached = (0..self.slots)
                        .filter(|&s| self.slot_cache(c, s).load(Ordering::Relaxed) == p + 1)
                        .count();
                    let state = d.state.load(Ordering::Relaxed);
                    match (state, attached, a.floating) {
                        (STATE_ATTACHED, 1, false)
                        | (STATE_FLOATING, 0, true)
                        | (STATE_LISTED, 0, false) => {}
                        _ => {
                            return Err(
                                "page state disagrees with the slot caches or the floating flag",
                            )
                        }
                    }
                    if a.floating && a.free >= list_threshold(cap) as i64 {
                        return Err("floating page with free blocks is neither listed nor retired");
                    }
                    let page_units = self.geometry().page_units(c);
                    units += page_units as u64;
                    for k in 1..page_units {
                        let q = p + k;
                        let t = &self.descs()[q as usize];
                        if q >= self.page_count
                            || !map.is_set(q)
                            || t.kind() != Kind::ClassTail
                            || t.span.load(Ordering::Relaxed) != k
                        {
                            return Err("class page tail unit not marked");
                        }
                    }
                    p += page_units;
                    continue;
                }
                Kind::SpanHead => {
                    let n = d.span.load(Ordering::Relaxed);
                    if n == 0 || p + n > self.page_count {
                        return Err("span length out of range");
                    }
                    for q in p..p + n {
                        if !map.is_set(q) {
                            return Err("span page free in the page map");
                        }
                        if q > p && self.descs()[q as usize].kind() != Kind::SpanTail {
                            return Err("span tail page not marked");
                        }
                    }
                    (units, span_pages, spans) =
                        (units + n as u64, span_pages + n as u64, spans + 1);
                    p += n;
                    continue;
                }
                Kind::SpanTail => return Err("span tail without a head"),
                Kind::ClassTail => return Err("class page tail without a head"),
            }
            p += 1;
        }
        let counted = |a: &crate::sync::AtomicU64| a.load(Ordering::Relaxed);
        if counted(&c.units_taken) != units {
            return Err("the counted footprint differs from the pages in use");
        }
        if counted(&c.units_peak) < units {
            return Err("the counted peak footprint is below the footprint");
        }
        if counted(&c.span_pages) != span_pages {
            return Err("the counted span pages differ from the spans' pages");
        }
        if counted(&c.spans_allocated).wrapping_sub(counted(&c.spans_freed)) != spans {
            return Err("spans counted as allocated and not freed differ from the spans");
        }
        // Every listed page is on one list of its class, once.
        let mut listed = 0u64;
        for (i, head) in self.lists().iter().enumerate() {
            let class = (i % CLASS_COUNT) as u32;
            let mut at = (head.load(Ordering::Relaxed) & 0xFFFF_FFFF) as u32;
            let mut steps = 0;
            while at != 0 {
                let d = &self.descs()[at as usize - 1];
                if d.kind() != Kind::Class(class) || d.state.load(Ordering::Relaxed) != STATE_LISTED
                {
                    return Err("list holds a page that is not a listed page of its class");
                }
                listed += 1;
                steps += 1;
                if steps > self.page_count {
                    return Err("cycle in a page list");
                }
                at = d.next.load(Ordering::Relaxed);
            }
        }
        let states = self
            .descs()
            .iter()
            .filter(|d| {
                matches!(d.kind(), Kind::Class(_))
                    && d.state.load(Ordering::Relaxed) == STATE_LISTED
            })
            .count() as u64;
        if states != listed {
            return Err("listed pages missing from their lists");
        }
        Ok(())
    }
}

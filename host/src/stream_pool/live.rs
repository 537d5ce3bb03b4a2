//! Live bits: which blocks a caller holds, for O(1) double-free checks.
//!
//! A span's mark is its head page's owner word ([`Heap::owner_word`]), on
//! the descriptor that [`Heap::block_at`] reads to find the block: a free
//! of a span touches no other line. (With a bit apart, that bit's line was
//! a second cache miss per call over a large heap: 69% of the pool's free
//! and 20% of all the time of the mixed-size case in `pool_paths`, by
//! `perf`.) A class block's mark is a bit here, found from its address
//! alone: a block taken from a cache is marked with no lookup of its page.

use super::ALIGN;
use cuheap_core::page::Kind;
use cuheap_core::size_class::{PAGE_SHIFT, PAGE_SIZE};
use cuheap_core::Heap;
use std::sync::atomic::{AtomicU64, Ordering};

/// One bit per [`ALIGN`] bytes of the heap (256 per 64 KiB unit), at the
/// address a class block starts at (every class the pool serves is a
/// multiple of [`ALIGN`], so no two blocks share a bit); spans are marked
/// on their descriptors. Invariant: a block's mark is set iff a caller
/// holds it, so a second free finds it clear, with no shared table on the
/// call path.
///
/// A unit's bits take 32 bytes; a 128-byte line holds four units a
/// quarter of the heap apart (units `u`, `u + q`, `u + 2q`, `u + 3q`;
/// `q` is at least 2, so a heap of under 8 pages has lines to spare).
/// The pool packs class pages low, so the pages in use at once rarely
/// share a line, and threads working on neighbouring pages do not fight
/// over one (each call sets or clears a bit).
pub(super) struct LiveBits {
    lines: Vec<Line>,
    /// Units per quarter (`q` above), at least 2.
    quarter: u64,
    /// `u64::MAX / quarter + 1`: a unit's quarter and line by multiplying
    /// ([`LiveBits::word`]), not dividing.
    magic: u64,
    /// The heap's first byte.
    data: u64,
    /// Units with bits (the heap's pages).
    units: u64,
}

#[repr(align(128))]
struct Line([AtomicU64; 16]);

const WORDS_PER_UNIT: usize = PAGE_SIZE / ALIGN / 64;
const ALIGN_SHIFT: u32 = ALIGN.trailing_zeros();

impl LiveBits {
    /// Bits for `pages` units of a heap whose data starts at `data`.
    pub(super) fn new(pages: usize, data: u64) -> LiveBits {
        let quarter = pages.div_ceil(4).max(2) as u64;
        LiveBits {
            lines: (0..quarter)
                .map(|_| Line(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
            quarter,
            magic: u64::MAX / quarter + 1,
            data,
            units: pages as u64,
        }
    }

    /// The unit (page) that `ptr` lies in, counted from the heap's first
    /// byte; past the heap (or below it, wrapping) a unit no heap has.
    #[inline]
    fn unit_of(&self, ptr: u64) -> u64 {
        ptr.wrapping_sub(self.data) >> PAGE_SHIFT
    }

    /// The words of `unit`'s bits; `None` past the heap. Unit `u`'s line
    /// is `u % q` and its place there `u / q`, by the remainder and
    /// quotient of Lemire, Kaser and Kurz ("Faster remainder by direct
    /// computation", 2019), exact for every 32-bit `u` and `q` (the
    /// heap's pages are a `u32`; `q >= 2`).
    #[inline]
    fn unit_words(&self, unit: u64) -> Option<&[AtomicU64]> {
        if unit >= self.units {
            return None;
        }
        let low = self.magic.wrapping_mul(unit);
        let line = ((low as u128 * self.quarter as u128) >> 64) as usize;
        let place = ((self.magic as u128 * unit as u128) >> 64) as usize;
        self.lines[line]
            .0
            .get(place * WORDS_PER_UNIT..(place + 1) * WORDS_PER_UNIT)
    }

    /// The word and bit of the class block at `ptr`; `None` past the heap.
    #[inline]
    fn word(&self, ptr: u64) -> Option<(&AtomicU64, u64)> {
        let i =
            ((ptr.wrapping_sub(self.data) >> ALIGN_SHIFT) % (PAGE_SIZE / ALIGN) as u64) as usize;
        let w = self.unit_words(self.unit_of(ptr))?.get(i / 64)?;
        Some((w, 1 << (i % 64)))
    }

    /// Marks the block at `ptr` live (`span`: a span's head, else a class
    /// block); false if it already was (or is past the heap).
    #[inline]
    pub(super) fn set(&self, heap: &Heap<'_, u64>, ptr: u64, span: bool) -> bool {
        match span {
            true => self
                .owner(heap, ptr)
                .is_some_and(|w| w.swap(1, Ordering::AcqRel) == 0),
            false => self
                .word(ptr)
                .is_some_and(|(w, m)| w.fetch_or(m, Ordering::AcqRel) & m == 0),
        }
    }

    /// [`LiveBits::set`] for a block the heap has just handed out to
    /// this thread (so no other thread marks it): a span's mark is a
    /// plain store, with no locked instruction, which on x86 would wait
    /// for the heap's stores before it. A class block's bit shares its
    /// word with other blocks, and is set as by `set`.
    #[inline]
    pub(super) fn set_fresh(&self, heap: &Heap<'_, u64>, ptr: u64, span: bool) -> bool {
        match span {
            true => self.owner(heap, ptr).is_some_and(|w| {
                let was = w.load(Ordering::Relaxed);
                w.store(1, Ordering::Release);
                was == 0
            }),
            false => self.set(heap, ptr, false),
        }
    }

    /// Whether the block at `ptr` is live.
    pub(super) fn is_set(&self, heap: &Heap<'_, u64>, ptr: u64, span: bool) -> bool {
        match span {
            true => self
                .owner(heap, ptr)
                .is_some_and(|w| w.load(Ordering::Acquire) != 0),
            false => self
                .word(ptr)
                .is_some_and(|(w, m)| w.load(Ordering::Acquire) & m != 0),
        }
    }

    /// Marks the block at `ptr` free; false if it was not live.
    #[inline]
    pub(super) fn clear(&self, heap: &Heap<'_, u64>, ptr: u64, span: bool) -> bool {
        match span {
            true => self
                .owner(heap, ptr)
                .is_some_and(|w| w.swap(0, Ordering::AcqRel) != 0),
            false => self
                .word(ptr)
                .is_some_and(|(w, m)| w.fetch_and(!m, Ordering::AcqRel) & m != 0),
        }
    }

    /// Whether the block at `ptr`, cached under a key of `bytes`, is a
    /// span: every block under a page is a class block; at a page or more
    /// it is what its page's descriptor says (a request of a page or less
    /// may have been served by a one-page span, cached under the key of
    /// 64 KiB: [`super::cache::Key::of_block`]).
    #[inline]
    pub(super) fn is_span(&self, heap: &Heap<'_, u64>, ptr: u64, bytes: usize) -> bool {
        bytes >= PAGE_SIZE
            && heap
                .descs()
                .get(self.unit_of(ptr) as usize)
                .is_some_and(|d| d.kind() == Kind::SpanHead)
    }

    /// The owner word of the span whose head is at `ptr`.
    #[inline]
    fn owner<'h>(
        &self,
        heap: &Heap<'h, u64>,
        ptr: u64,
    ) -> Option<&'h std::sync::atomic::AtomicU32> {
        let page = u32::try_from(self.unit_of(ptr)).ok()?;
        heap.owner_word(page)
    }

    /// Live blocks of the class page of `units` units at `page`.
    pub(super) fn count_page(&self, page: u32, units: u32) -> u32 {
        (page..page.saturating_add(units))
            .filter_map(|u| self.unit_words(u as u64))
            .flatten()
            .map(|w| w.load(Ordering::Acquire).count_ones())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuheap_core::OwnedHeap;

    /// Every granule of every unit has a bit of its own, for heaps of
    /// several sizes (the quarter's arithmetic at its edges), and a page
    /// of several units counts the bits of all of them.
    #[test]
    fn every_granule_of_every_unit_has_a_bit_of_its_own() {
        const DATA: u64 = 1 << 40;
        let per_unit = (PAGE_SIZE / ALIGN) as u64;
        for pages in [1usize, 3, 4, 7, 8, 9, 64, 1001] {
            let owned = OwnedHeap::<u64>::new(pages as u32, 1).unwrap();
            let heap = owned.heap();
            let live = LiveBits::new(pages, DATA);
            let at = |unit: u64, g: u64| DATA + (unit << PAGE_SHIFT) + g * ALIGN as u64;
            let chosen = |unit: u64, g: u64| (g + unit).is_multiple_of(3);
            for unit in 0..pages as u64 {
                for g in (0..per_unit).filter(|&g| chosen(unit, g)) {
                    assert!(
                        live.set(&heap, at(unit, g), false),
                        "{pages} pages: {unit}/{g}"
                    );
                    assert!(!live.set(&heap, at(unit, g), false), "set twice");
                }
            }
            for unit in 0..pages as u64 {
                let want = (0..per_unit).filter(|&g| chosen(unit, g)).count() as u32;
                assert_eq!(
                    live.count_page(unit as u32, 1),
                    want,
                    "{pages} pages: {unit}"
                );
                for g in 0..per_unit {
                    assert_eq!(live.is_set(&heap, at(unit, g), false), chosen(unit, g));
                }
            }
            if pages >= 3 {
                let two: u32 = (0..2).map(|u| live.count_page(u, 1)).sum();
                assert_eq!(live.count_page(0, 2), two, "a page of two units");
            }
            // Past the heap, and below it: no bit, no panic.
            for ptr in [
                at(pages as u64 * 4, 0),
                at(u32::MAX as u64 + 1, 0),
                DATA - 256,
            ] {
                assert!(!live.set(&heap, ptr, false) && !live.is_set(&heap, ptr, false));
            }
            for unit in 0..pages as u64 {
                for g in (0..per_unit).filter(|&g| chosen(unit, g)) {
                    assert!(live.clear(&heap, at(unit, g), false));
                    assert!(!live.clear(&heap, at(unit, g), false), "cleared twice");
                }
                assert_eq!(live.count_page(unit as u32, 1), 0);
            }
        }
    }

    /// A span is marked on its head page's descriptor, apart from the
    /// class pages' bits: set once, cleared once, and nothing else moves.
    #[test]
    fn spans_are_marked_on_their_descriptors() {
        let owned = OwnedHeap::<u64>::new(8, 1).unwrap();
        let heap = owned.heap();
        let data = 1u64 << 40;
        let live = LiveBits::new(8, data);
        let span = |page: u64| data + page * PAGE_SIZE as u64;
        assert!(live.set(&heap, span(2), true));
        assert!(!live.set(&heap, span(2), true), "a span marked twice");
        assert!(live.is_set(&heap, span(2), true));
        assert!(!live.is_set(&heap, span(3), true));
        assert_eq!(heap.owner_word(2).unwrap().load(Ordering::Relaxed), 1);
        assert_eq!(live.count_page(2, 1), 0, "class bits untouched");
        assert!(!live.is_set(&heap, span(2), false), "class bits untouched");
        assert!(live.clear(&heap, span(2), true));
        assert!(!live.clear(&heap, span(2), true), "a span freed twice");
        assert!(!live.is_set(&heap, span(2), true));
        // Past the heap's pages: never live.
        assert!(!live.set(&heap, span(8), true) && !live.is_set(&heap, span(8), true));
        // A fresh mark (a block the heap just handed out) reads as `set`'s:
        // live once, refused as a second mark, freed once.
        assert!(live.set_fresh(&heap, span(4), true));
        assert!(live.is_set(&heap, span(4), true));
        assert!(!live.set_fresh(&heap, span(4), true), "a span marked twice");
        assert!(live.clear(&heap, span(4), true) && !live.clear(&heap, span(4), true));
        assert!(!live.set_fresh(&heap, span(8), true));
        let class = span(5) + 7 * ALIGN as u64;
        assert!(live.set_fresh(&heap, class, false) && !live.set_fresh(&heap, class, false));
        assert_eq!(live.count_page(5, 1), 1);
        // Free pages are no spans, whatever the key.
        assert!(!live.is_span(&heap, span(5), PAGE_SIZE));
        assert!(!live.is_span(&heap, span(5), 256));
    }

    /// A block of a page or more is a span where its page's descriptor
    /// says so: a span, and a one-page span that served 64 KiB (no class
    /// page fitted); a class block of 64 KiB is not.
    #[test]
    fn a_block_of_a_page_or_more_is_a_span_where_its_descriptor_says() {
        // The heap's first byte: block 0 of page 0.
        let base = |heap: &Heap<'_, u64>| heap.block_addr(0, 0, 0) as u64;
        // 16 pages: after 3 in a span, no room for a 64 KiB class page.
        let owned = OwnedHeap::<u64>::new(16, 1).unwrap();
        let heap = owned.heap();
        let span = heap.alloc(3 * PAGE_SIZE, 0).unwrap() as u64;
        let live = LiveBits::new(16, base(&heap));
        assert!(live.is_span(&heap, span, 3 * PAGE_SIZE));
        assert!(
            !live.is_span(&heap, span, PAGE_SIZE - ALIGN),
            "under a page"
        );
        let one = heap.alloc(PAGE_SIZE, 0).unwrap() as u64;
        assert_eq!(heap.block_at(one as usize).unwrap().class, None);
        assert!(live.is_span(&heap, one, PAGE_SIZE), "a one-page span");
        // 64 pages: 64 KiB from a class page.
        let owned = OwnedHeap::<u64>::new(64, 1).unwrap();
        let heap = owned.heap();
        let class = heap.alloc(PAGE_SIZE, 0).unwrap() as u64;
        assert!(heap.block_at(class as usize).unwrap().class.is_some());
        let live = LiveBits::new(64, base(&heap));
        assert!(
            !live.is_span(&heap, class, PAGE_SIZE),
            "a 64 KiB class block"
        );
    }
}

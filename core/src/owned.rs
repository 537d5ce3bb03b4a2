//! A heap in host memory that owns its regions (feature `std`): what the
//! CPU tests, benchmarks and `cuheap bench cpu` run on. The GPU heap is the
//! same [`Heap`] over device memory.

use crate::heap::{Heap, HeapHandle};
use crate::layout::Layout;
use crate::size_class::PAGE_SIZE;
use crate::word::Word;
use core::marker::PhantomData;
use std::alloc::{alloc_zeroed, dealloc, Layout as AllocLayout};

/// A heap of `page_count` pages in host memory.
pub struct OwnedHeap<W: Word = u64> {
    handle: HeapHandle,
    meta: AllocLayout,
    data: AllocLayout,
    word: PhantomData<W>,
}

// SAFETY: the regions are only reached through `Heap` views, whose state is
// all atomics; the raw pointers are owned by this value.
unsafe impl<W: Word> Send for OwnedHeap<W> {}
// SAFETY: as above; `&OwnedHeap` only hands out `Heap` views.
unsafe impl<W: Word> Sync for OwnedHeap<W> {}

impl<W: Word> OwnedHeap<W> {
    /// A zeroed heap; `None` if the host cannot provide the memory, the
    /// shape is empty or it has more than [`Layout::MAX_SLOTS`] slots.
    pub fn new(page_count: u32, slots: u32) -> Option<Self> {
        if page_count == 0 || slots == 0 || slots > Layout::MAX_SLOTS {
            return None;
        }
        let l = Layout::new(page_count, slots);
        // Room for an index of free runs ([`OwnedHeap::indexed`]).
        let meta = AllocLayout::from_size_align(l.meta_bytes + l.run_index_bytes(), 128).ok()?;
        let data = AllocLayout::from_size_align(l.data_bytes(), PAGE_SIZE).ok()?;
        // SAFETY: both layouts have non-zero size (page_count, slots >= 1).
        let m = unsafe { alloc_zeroed(meta) };
        if m.is_null() {
            return None;
        }
        // SAFETY: as above.
        let d = unsafe { alloc_zeroed(data) };
        if d.is_null() {
            // SAFETY: `m` was allocated just above with `meta`.
            unsafe { dealloc(m, meta) };
            return None;
        }
        Some(Self {
            handle: HeapHandle {
                meta: m as usize as u64,
                data: d as usize as u64,
                page_count,
                slots,
            },
            meta,
            data,
            word: PhantomData,
        })
    }

    /// [`OwnedHeap::new`] with an index of free runs
    /// ([`Heap::index_runs`]), as a host pool's heap has.
    pub fn indexed(page_count: u32, slots: u32) -> Option<Self> {
        let h = Self::new(page_count, slots)?;
        // SAFETY: `new` sized the metadata for the index, and no one else
        // holds the heap yet.
        unsafe { h.heap().index_runs() };
        Some(h)
    }

    pub fn heap(&self) -> Heap<'_, W> {
        // SAFETY: the regions were sized by `Layout`, zeroed, aligned as
        // required, live as long as `self`, and always viewed with `W`.
        unsafe { Heap::from_handle(&self.handle) }
    }

    pub fn handle(&self) -> HeapHandle {
        self.handle
    }

    /// Bytes of the data region.
    pub fn data_bytes(&self) -> usize {
        self.data.size()
    }
}

impl<W: Word> Drop for OwnedHeap<W> {
    fn drop(&mut self) {
        // SAFETY: both pointers came from `alloc_zeroed` with these layouts.
        unsafe {
            dealloc(self.handle.meta as usize as *mut u8, self.meta);
            dealloc(self.handle.data as usize as *mut u8, self.data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heap::{AllocError, FreeError, Placement, ReallocError, Resize, SPAN_BATCH};
    use crate::size_class::{class_of, class_size, CLASS_SIZES, MAX_ALIGN, MAX_CLASS_SIZE};
    use std::vec::Vec;

    /// [`Heap::realloc`] on slot 0.
    fn resize<W: Word>(
        heap: &Heap<'_, W>,
        p: *mut u8,
        size: usize,
        align: usize,
    ) -> Result<*mut u8, ReallocError> {
        // SAFETY: the tests pass null, their own live blocks, or addresses
        // that are not live blocks (refused before anything is read).
        unsafe { heap.realloc(p, size, align, 0) }
    }

    /// Fills `n` bytes at `p` with `tag`.
    fn fill(p: *mut u8, n: usize, tag: u8) {
        // SAFETY: callers pass a live block of at least `n` bytes they own.
        unsafe { p.write_bytes(tag, n) };
    }

    /// Whether the `n` bytes at `p` all hold `tag`.
    fn holds(p: *const u8, n: usize, tag: u8) -> bool {
        // SAFETY: as for `fill`.
        unsafe { core::slice::from_raw_parts(p, n) }
            .iter()
            .all(|&b| b == tag)
    }

    /// Every power-of-two alignment up to the page size, at sizes below,
    /// at and above it: aligned, no padding beyond the smallest aligned
    /// class, and freed normally.
    #[test]
    fn every_alignment_up_to_the_page_size() {
        let h = OwnedHeap::<u32>::new(160, 2).unwrap();
        let heap = h.heap();
        let mut live = Vec::new();
        let mut align = 1;
        // Under Miri (about 30 minutes for the whole set): every fourth
        // power of two, the page size included, at three sizes.
        let (step, sizes) = if cfg!(miri) { (4, 3) } else { (2, 6) };
        while align <= MAX_ALIGN {
            for size in [align, 3 * align / 2 + 1, 1, align / 2 + 1, 100, 5000]
                .into_iter()
                .take(sizes)
            {
                let p = heap.alloc_aligned(size, align, 0).unwrap();
                assert!((p as usize).is_multiple_of(align), "{size} B at {align}");
                let got = heap.block_at(p as usize).unwrap().size;
                assert!(got >= size);
                if let Some(c) = crate::size_class::class_of_aligned(size, align) {
                    assert_eq!(got, class_size(c) as usize, "{size} B at {align}");
                }
                fill(p, size, align.trailing_zeros() as u8);
                live.push((p, size, align.trailing_zeros() as u8));
            }
            align *= step;
        }
        heap.check_invariants().unwrap();
        for (p, size, tag) in live {
            assert!(holds(p, size, tag));
            heap.free(p, 1).unwrap();
        }
        heap.check_invariants().unwrap();
        assert!(heap.stats().is_empty());
        assert_eq!(heap.stats().failed_allocs, 0);
    }

    #[test]
    fn bad_alignments_are_refused_and_counted() {
        let h = OwnedHeap::<u64>::new(4, 1).unwrap();
        let heap = h.heap();
        for align in [0, 3, 24, 2 * MAX_ALIGN, usize::MAX] {
            assert_eq!(
                heap.alloc_aligned(64, align, 0),
                Err(AllocError::BadAlignment)
            );
        }
        assert_eq!(heap.alloc_aligned(0, 64, 0), Err(AllocError::ZeroSize));
        let s = heap.stats();
        assert_eq!((s.failed_allocs, s.failed_bytes), (6, 0));
        assert!(s.is_empty());
    }

    /// Growth within the block stays in place; growth past it moves and
    /// keeps the contents; a shrink to at most half moves to a smaller
    /// block; a shrink by less stays.
    #[test]
    fn realloc_in_place_moves_and_shrinks() {
        let h = OwnedHeap::<u32>::new(16, 1).unwrap();
        let heap = h.heap();
        let p = heap.alloc(100, 0).unwrap(); // the 112 B class
        fill(p, 100, 7);
        let q = resize(&heap, p, 112, 16).unwrap();
        assert_eq!(q, p, "fits its class: in place");
        let q = resize(&heap, q, 113, 16).unwrap();
        assert_ne!(q, p, "past its class: moved");
        assert!(holds(q, 100, 7), "contents kept");
        assert_eq!(
            heap.free(p, 0),
            Err(FreeError::NotAllocated),
            "old block freed"
        );
        assert_eq!(heap.block_at(q as usize).unwrap().size, 128);
        let r = resize(&heap, q, 65, 16).unwrap();
        assert_eq!(r, q, "80 B would do, more than half of 128: stays");
        let r = resize(&heap, q, 64, 16).unwrap();
        assert_ne!(r, q, "64 B is half of 128: moves");
        assert!(holds(r, 64, 7));
        assert_eq!(heap.block_at(r as usize).unwrap().size, 64);
        // A larger alignment than the block has moves it.
        let a = resize(&heap, r, 64, 4096).unwrap();
        assert!((a as usize).is_multiple_of(4096) && holds(a, 64, 7));
        heap.free(a, 0).unwrap();
        heap.check_invariants().unwrap();
        let s = heap.stats();
        assert!(s.is_empty());
        assert_eq!((s.failed_allocs, s.bad_frees), (0, 1));
    }

    /// Best fit takes the shortest run that holds a span; turned on over a
    /// heap with pages in use, its summary is rebuilt first.
    #[test]
    fn best_fit_spans_take_the_shortest_run() {
        use crate::heap::Placement;
        let owned = OwnedHeap::<u32>::new(64, 1).unwrap();
        let heap = owned.heap();
        let page = |n: usize| heap.alloc(n * PAGE_SIZE, 0).unwrap();
        // Spans of 10, 2, 3 and 40 pages (9 left at the end); freeing the
        // first and the third leaves free runs of 10, 3 and 9 pages.
        let (a, mid, b) = (page(10), page(2), page(3));
        let rest = page(40);
        heap.free(a, 0).unwrap();
        heap.free(b, 0).unwrap();
        heap.set_placement(Placement::BEST_FIT_SPANS | Placement::CLASS_PAGES_LOW);
        heap.check_invariants().unwrap();
        assert_eq!(page(2), b, "the 3-page run, not the first fit");
        assert_eq!(page(10), a, "only the 10-page run holds 10");
        for p in [a, b, mid, rest] {
            heap.free(p, 0).unwrap();
        }
        heap.check_invariants().unwrap();
        assert!(heap.stats().is_empty());
    }

    /// A class page of 10 units is aligned to 2 pages, not to 16: the
    /// next power of two left 6 free pages after each such page.
    #[test]
    fn a_class_page_is_aligned_to_the_power_of_two_in_its_size() {
        use crate::size_class::{class_of, page_units};
        assert_eq!(page_units(class_of(2560).unwrap()), 10);
        let owned = OwnedHeap::<u32>::new(64, 1).unwrap();
        let heap = owned.heap();
        let first = heap.alloc(2 * PAGE_SIZE, 0).unwrap();
        let block = heap.alloc(2560, 0).unwrap();
        let at = (block as usize - first as usize) / PAGE_SIZE;
        assert_eq!(at, 2, "right after the first span");
        for p in [block, first] {
            heap.free(p, 0).unwrap();
        }
        heap.check_invariants().unwrap();
        assert!(heap.stats().is_empty());
    }

    /// With small class pages a 4 KiB block takes one 64 KiB unit (16
    /// blocks) instead of 16 units (256 blocks); the page holds 16 blocks,
    /// the 17th opens another, and both go back to the map when freed.
    #[test]
    fn small_class_pages_hold_sixteen_blocks() {
        use crate::heap::Placement;
        use crate::size_class::{class_of, Geometry};
        let c = class_of(4096).unwrap();
        assert_eq!(
            (
                Geometry::STANDARD.page_units(c),
                Geometry::SMALL.page_units(c)
            ),
            (16, 1)
        );
        assert_eq!(Geometry::SMALL.blocks_per_page(c), 16);
        let owned = OwnedHeap::<u64>::new(16, 1).unwrap();
        let heap = owned.heap();
        heap.set_placement(Placement::SMALL_CLASS_PAGES);
        assert_eq!(heap.geometry(), Geometry::SMALL);
        let blocks: std::vec::Vec<*mut u8> =
            (0..17).map(|_| heap.alloc(4096, 0).unwrap()).collect();
        let held = |h: &crate::heap::Heap<'_, u64>| h.counts().bytes_reserved;
        assert_eq!(held(&heap), 2 * PAGE_SIZE as u64, "two one-unit pages");
        let s = heap.stats();
        assert_eq!(
            (
                s.class_pages[c as usize],
                s.class_units,
                s.blocks_in_use[c as usize]
            ),
            (2, 2, 17)
        );
        heap.check_invariants().unwrap();
        // Each block's page is found from its address, its index within 16.
        for &b in &blocks {
            let info = heap.block_at(b as usize).unwrap();
            assert!(info.index < 16 && info.size == 4096);
        }
        for b in blocks {
            heap.free(b, 0).unwrap();
        }
        heap.scavenge();
        heap.check_invariants().unwrap();
        assert!(heap.stats().is_empty());
        assert_eq!(held(&heap), 0);
    }

    /// Spans grow into the pages after them and shrink by giving pages
    /// back; a class block grows into a span and back.
    #[test]
    fn realloc_spans_in_place() {
        let h = OwnedHeap::<u64>::new(12, 1).unwrap();
        let heap = h.heap();
        let s = heap.alloc(PAGE_SIZE + 1, 0).unwrap();
        fill(s, PAGE_SIZE + 1, 3);
        let g = resize(&heap, s, 5 * PAGE_SIZE, 8).unwrap();
        assert_eq!(g, s, "the next pages are free: grown in place");
        assert_eq!(heap.block_at(g as usize).unwrap().size, 5 * PAGE_SIZE);
        assert!(holds(g, PAGE_SIZE + 1, 3));
        heap.check_invariants().unwrap();
        fill(g, 5 * PAGE_SIZE, 4);
        let k = resize(&heap, g, 2 * PAGE_SIZE, 8).unwrap();
        assert_eq!(k, g, "shrunk in place");
        assert_eq!(heap.stats().span_pages, 2);
        heap.check_invariants().unwrap();
        // Block the pages after it: growing moves.
        let wall = heap.alloc(2 * PAGE_SIZE, 0).unwrap();
        assert_eq!(wall as usize, k as usize + 2 * PAGE_SIZE);
        let m = resize(&heap, k, 3 * PAGE_SIZE, 8).unwrap();
        assert_ne!(m, k);
        assert!(holds(m, 2 * PAGE_SIZE, 4));
        heap.check_invariants().unwrap();
        // Down to a class block at most half a page: moves off the span.
        let c = resize(&heap, m, 1000, 8).unwrap();
        assert_eq!(heap.block_at(c as usize).unwrap().class, class_of(1000));
        assert!(holds(c, 1000, 4));
        // And back up to a span.
        let b = resize(&heap, c, MAX_CLASS_SIZE + 1, 8).unwrap();
        assert!((b as usize).is_multiple_of(PAGE_SIZE) && holds(b, 1000, 4));
        for p in [b, wall] {
            heap.free(p, 0).unwrap();
        }
        heap.check_invariants().unwrap();
        let s = heap.stats();
        assert!(s.is_empty());
        assert_eq!((s.failed_allocs, s.bad_frees), (0, 0));
    }

    #[test]
    fn realloc_bad_input_leaves_the_block() {
        let h = OwnedHeap::<u64>::new(4, 1).unwrap();
        let heap = h.heap();
        let p = heap.alloc(48, 0).unwrap();
        fill(p, 48, 9);
        let alloc_err = |e| Err(ReallocError::Alloc(e));
        let ptr_err = |e| Err(ReallocError::Pointer(e));
        assert_eq!(resize(&heap, p, 0, 16), alloc_err(AllocError::ZeroSize));
        assert_eq!(
            resize(&heap, p, 64, 48),
            alloc_err(AllocError::BadAlignment)
        );
        assert_eq!(
            resize(&heap, p, 5 * PAGE_SIZE, 16),
            alloc_err(AllocError::TooLarge)
        );
        assert_eq!(
            resize(&heap, p.wrapping_add(16), 64, 16),
            ptr_err(FreeError::Interior)
        );
        let mut x = 0u64;
        let foreign = &mut x as *mut u64 as *mut u8;
        assert_eq!(resize(&heap, foreign, 64, 16), ptr_err(FreeError::Foreign));
        let unused = (h.handle().data as usize + 3 * PAGE_SIZE) as *mut u8;
        assert_eq!(
            resize(&heap, unused, 64, 16),
            ptr_err(FreeError::NotAllocated)
        );
        // A block freed since (its page still serves the class) is refused.
        let q = heap.alloc(48, 0).unwrap();
        heap.free(q, 0).unwrap();
        let r = resize(&heap, q, 64, 16);
        assert_eq!(r, ptr_err(FreeError::NotAllocated));
        assert_eq!(
            heap.resize_in_place(q, 64, 16),
            Err(ReallocError::Pointer(FreeError::NotAllocated))
        );
        // Exhaustion: growing fails, the block stays.
        let mut rest = Vec::new();
        while let Ok(x) = heap.alloc(PAGE_SIZE, 0) {
            rest.push(x);
        }
        assert_eq!(
            heap.resize_in_place(p, 1000, 16),
            Ok(Resize::Move { copy: 48 })
        );
        let r = resize(&heap, p, 1000, 16);
        assert_eq!(r, alloc_err(AllocError::OutOfMemory));
        assert!(holds(p, 48, 9), "a failed realloc keeps the contents");
        // A null pointer allocates.
        for x in rest {
            heap.free(x, 0).unwrap();
        }
        let n = resize(&heap, core::ptr::null_mut(), 4096, 4096).unwrap();
        assert!((n as usize).is_multiple_of(4096));
        heap.free(n, 0).unwrap();
        heap.free(p, 0).unwrap();
        heap.check_invariants().unwrap();
        let s = heap.stats();
        assert!(s.is_empty());
        // Zero, alignment, too large, out of memory (1000 B and the page
        // that ended the loop); two pointers refused twice, three once.
        assert_eq!(s.failed_allocs, 3 + 2);
        assert_eq!(s.failed_bytes, 1000 + PAGE_SIZE as u64);
        assert_eq!(s.bad_frees, 5);
    }

    /// A shrink that would move, on a full heap, keeps its block and
    /// counts no failure.
    #[test]
    fn a_shrink_never_fails() {
        let h = OwnedHeap::<u64>::new(1, 1).unwrap();
        let heap = h.heap();
        let p = heap.alloc(PAGE_SIZE, 0).unwrap();
        fill(p, 64, 5);
        assert_eq!(
            heap.resize_in_place(p, 64, 16),
            Ok(Resize::Shrink { copy: 64 })
        );
        let q = resize(&heap, p, 64, 16).unwrap();
        assert_eq!(q, p);
        assert!(holds(q, 64, 5));
        let s = heap.stats();
        assert_eq!((s.failed_allocs, s.failed_bytes), (0, 0));
        heap.free(q, 0).unwrap();
        heap.check_invariants().unwrap();
    }

    /// Every class (a sample of them under Miri) and a span: alloc, fill,
    /// check, free.
    #[test]
    fn every_class_round_trip() {
        let (pages, step) = if cfg!(miri) { (160, 7) } else { (1024, 1) };
        let h = OwnedHeap::<u32>::new(pages, 2).unwrap();
        let heap = h.heap();
        let mut live = Vec::new();
        for (i, &s) in CLASS_SIZES.iter().enumerate().step_by(step) {
            for k in 0..3u32 {
                let p = heap.alloc(s as usize, k).unwrap();
                assert_eq!(p as usize % 16, 0);
                if s.is_power_of_two() {
                    assert_eq!(p as usize % s as usize, 0);
                }
                // SAFETY: p is a fresh block of s bytes.
                unsafe { p.write_bytes(i as u8, s as usize) };
                live.push((p, s, i as u8));
            }
        }
        let span = heap.alloc(MAX_CLASS_SIZE + 1, 0).unwrap();
        assert_eq!(span as usize % PAGE_SIZE, 0);
        heap.check_invariants().unwrap();
        assert_eq!(heap.stats().spans, 1);
        for (p, s, tag) in live {
            // SAFETY: p is live with s bytes written above.
            let bytes = unsafe { core::slice::from_raw_parts(p, s as usize) };
            assert!(bytes.iter().all(|&b| b == tag));
            heap.free(p, 0).unwrap();
        }
        heap.free(span, 0).unwrap();
        assert_eq!(heap.free(span, 0), Err(FreeError::NotAllocated));
        heap.check_invariants().unwrap();
        assert!(heap.stats().is_empty());
        assert_eq!(heap.stats().bad_frees, 1);
    }

    /// A heap's view keeps its arrays' offsets in `u32`s of 128 bytes,
    /// which hold up to `Layout::MAX_SLOTS` slots.
    #[test]
    #[cfg_attr(miri, ignore)] // 170 MB of metadata
    fn more_slots_than_the_layout_allows_are_refused() {
        assert!(OwnedHeap::<u32>::new(1, Layout::MAX_SLOTS + 1).is_none());
        assert!(OwnedHeap::<u32>::new(1, u32::MAX).is_none());
        let owned = OwnedHeap::<u32>::new(1, Layout::MAX_SLOTS).expect("the most slots");
        let heap = owned.heap();
        let p = heap.alloc(16, Layout::MAX_SLOTS - 1).unwrap();
        heap.free(p, 0).unwrap();
        heap.check_invariants().unwrap();
    }

    #[test]
    fn bad_input_is_refused_and_counted() {
        let h = OwnedHeap::<u64>::new(4, 1).unwrap();
        let heap = h.heap();
        assert_eq!(heap.alloc(0, 0), Err(AllocError::ZeroSize));
        assert_eq!(heap.alloc(usize::MAX, 0), Err(AllocError::TooLarge));
        assert_eq!(heap.alloc(5 * PAGE_SIZE, 0), Err(AllocError::TooLarge));
        let p = heap.alloc(48, 0).unwrap();
        assert_eq!(heap.free(core::ptr::null_mut(), 0).unwrap().freed, 0);
        assert_eq!(heap.free(p.wrapping_add(16), 0), Err(FreeError::Interior));
        let mut x = 0u8;
        assert_eq!(heap.free(&mut x, 0), Err(FreeError::Foreign));
        let unused = (h.handle().data as usize + 3 * PAGE_SIZE) as *mut u8;
        assert_eq!(heap.free(unused, 0), Err(FreeError::NotAllocated));
        heap.free(p, 0).unwrap();
        assert_eq!(heap.free(p, 0), Err(FreeError::NotAllocated));
        let s = heap.stats();
        // Size 0 and too large are failures, but no shortfall growth could fix.
        assert_eq!((s.failed_allocs, s.failed_bytes, s.bad_frees), (3, 0, 4));
        heap.check_invariants().unwrap();
    }

    /// `free_all` frees what `free` would, one pointer at a time, with
    /// spans given back in batches: more spans than a batch holds, class
    /// blocks between them, and bad pointers (null, a span twice, an
    /// interior address, a foreign one) refused and counted; the heap
    /// keeps its invariants and loses no page, indexed (best fit, as a
    /// host pool's) or not.
    #[test]
    fn free_all_frees_each_block_once_and_refuses_the_rest() {
        for indexed in [false, true] {
            let h = match indexed {
                true => OwnedHeap::<u64>::indexed(512, 2).unwrap(),
                false => OwnedHeap::<u64>::new(512, 2).unwrap(),
            };
            let heap = h.heap();
            if indexed {
                heap.set_placement(Placement::BEST_FIT_SPANS | Placement::CLASS_PAGES_LOW);
            }
            let mut ptrs = Vec::new();
            for i in 0..3 * SPAN_BATCH + 5 {
                // Spans of two or three pages, and a class block each
                // fourth time.
                let size = MAX_CLASS_SIZE + 1 + (i % 2) * PAGE_SIZE;
                ptrs.push(heap.alloc(size, 0).unwrap());
                if i % 4 == 0 {
                    ptrs.push(heap.alloc(48 + i, 1).unwrap());
                }
            }
            let blocks = ptrs.len() as u32;
            // Every other one first, then the rest: freed spans sit next
            // to live ones and to each other.
            let mut order: Vec<*mut u8> = ptrs.iter().copied().step_by(2).collect();
            order.extend(ptrs.iter().copied().skip(1).step_by(2));
            let mut x = 0u8;
            let bad = [
                core::ptr::null_mut(),
                ptrs[0],
                ptrs[3].wrapping_add(PAGE_SIZE),
                &mut x as *mut u8,
            ];
            order.splice(40..40, bad);
            let out = heap.free_all(order, 1);
            assert_eq!((out.freed, out.refused), (blocks, 3), "indexed: {indexed}");
            let s = heap.stats();
            assert!(s.is_empty(), "blocks left: {s:?}");
            assert_eq!(s.bad_frees, 3);
            assert_eq!(heap.counts().frees, blocks as u64);
            heap.check_invariants().unwrap();
            // No page lost: the class pages' blocks are free, so after a
            // scavenge the whole heap is one span.
            heap.scavenge();
            let all = heap.alloc(512 * PAGE_SIZE, 0).unwrap();
            heap.free(all, 0).unwrap();
            heap.check_invariants().unwrap();
        }
    }

    #[test]
    fn a_spent_grant_claims_nothing() {
        let h = OwnedHeap::<u64>::new(4, 1).unwrap();
        let heap = h.heap();
        let class = crate::size_class::class_of(64).unwrap();
        let mut g = heap.reserve(class, 3, 0).unwrap();
        let run = heap.claim(&mut g);
        assert_eq!((run.mask.count_ones(), g.count), (3, 0));
        // Claiming again returns at once with an empty run.
        assert_eq!(heap.claim(&mut g).mask, 0);
        heap.count_allocated(0, 0, 3);
        for i in 0..3 {
            let bit = run.mask.nth_set(i);
            let p = heap.block_addr(run.page, class, run.word * u64::BITS + bit);
            heap.free(p, 0).unwrap();
        }
        heap.check_invariants().unwrap();
    }

    #[test]
    fn shortfall_counts_the_bytes_that_did_not_fit() {
        let h = OwnedHeap::<u64>::new(5, 1).unwrap();
        let heap = h.heap();
        heap.set_limit(2);
        let a = heap.alloc(PAGE_SIZE, 0).unwrap();
        let b = heap.alloc(PAGE_SIZE, 0).unwrap();
        // A span and a class block that no longer fit.
        assert_eq!(heap.alloc(PAGE_SIZE + 1, 0), Err(AllocError::OutOfMemory));
        assert_eq!(heap.alloc(100, 0), Err(AllocError::OutOfMemory));
        let s = heap.stats();
        assert_eq!(
            (s.failed_allocs, s.failed_bytes),
            (2, PAGE_SIZE as u64 + 1 + 100)
        );
        // Growing by the shortfall (three pages) serves both.
        heap.set_limit(5);
        let c = heap.alloc(PAGE_SIZE + 1, 0).unwrap();
        let d = heap.alloc(100, 0).unwrap();
        for p in [a, b, c, d] {
            heap.free(p, 0).unwrap();
        }
        heap.check_invariants().unwrap();
    }

    #[test]
    fn page_limit_bounds_claims_and_can_grow() {
        let h = OwnedHeap::<u64>::new(8, 1).unwrap();
        let heap = h.heap();
        heap.set_limit(2);
        let a = heap.alloc(PAGE_SIZE, 0).unwrap();
        let b = heap.alloc(PAGE_SIZE, 0).unwrap();
        assert_eq!(heap.alloc(PAGE_SIZE, 0), Err(AllocError::OutOfMemory));
        assert!(heap.any_in_use(0, 2) && !heap.any_in_use(2, 8));
        heap.set_limit(8);
        let c = heap.alloc(3 * PAGE_SIZE, 0).unwrap();
        assert!(c as usize >= a.max(b) as usize + PAGE_SIZE);
        for p in [a, b, c] {
            heap.free(p, 0).unwrap();
        }
        heap.check_invariants().unwrap();
    }

    #[test]
    fn exhaustion_returns_error_and_recovers() {
        let h = OwnedHeap::<u64>::new(2, 1).unwrap();
        let heap = h.heap();
        let mut live = Vec::new();
        while let Ok(p) = heap.alloc(256, 0) {
            live.push(p);
        }
        assert_eq!(live.len(), 512);
        // A class whose pages are 16 units long falls back to a span.
        assert_eq!(heap.alloc(4096, 0), Err(AllocError::OutOfMemory));
        assert_eq!(heap.alloc(16, 0), Err(AllocError::OutOfMemory));
        assert_eq!(heap.alloc(PAGE_SIZE + 1, 0), Err(AllocError::OutOfMemory));
        for p in live.drain(..) {
            heap.free(p, 0).unwrap();
        }
        // Empty pages return to the page map: a two-page span fits again.
        let s = heap.alloc(PAGE_SIZE + 1, 0).unwrap();
        heap.free(s, 0).unwrap();
        heap.check_invariants().unwrap();
        assert!(heap.stats().is_empty());
    }
}

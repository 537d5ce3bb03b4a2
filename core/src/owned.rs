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
    /// A zeroed heap; `None` if the host cannot provide the memory or the
    /// shape is empty.
    pub fn new(page_count: u32, slots: u32) -> Option<Self> {
        if page_count == 0 || slots == 0 {
            return None;
        }
        let l = Layout::new(page_count, slots);
        let meta = AllocLayout::from_size_align(l.meta_bytes, 128).ok()?;
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
    use crate::heap::{AllocError, FreeError};
    use crate::size_class::{CLASS_SIZES, MAX_CLASS_SIZE};
    use std::vec::Vec;

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

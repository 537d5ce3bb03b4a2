//! `Heap::alloc_near`: a span search that starts where the caller says
//! (the pool passes the end of its last span: next fit).
#![cfg(not(loom))]

use cuheap_core::size_class::PAGE_SIZE;
use cuheap_core::OwnedHeap;

/// The page a span starts on.
fn page_of(owned: &OwnedHeap, p: *mut u8) -> u32 {
    ((p as usize - owned.handle().data as usize) / PAGE_SIZE) as u32
}

#[test]
fn spans_start_at_the_hint_and_wrap_to_the_start() {
    let owned = OwnedHeap::<u64>::new(64, 2).unwrap();
    let heap = owned.heap();
    let span = 3 * PAGE_SIZE;
    // Free at the hint: the span starts there.
    let a = heap.alloc_near(span, 0, 10).unwrap();
    assert_eq!(page_of(&owned, a), 10);
    // Next fit: from the end of the last span.
    let b = heap.alloc_near(span, 0, 13).unwrap();
    assert_eq!(page_of(&owned, b), 13);
    // A taken hint: the next free run after it.
    let c = heap.alloc_near(span, 0, 11).unwrap();
    assert_eq!(page_of(&owned, c), 16);
    // Past the end there is no room for 3 pages at 62: wraps to page 0.
    let d = heap.alloc_near(span, 0, 62).unwrap();
    assert_eq!(page_of(&owned, d), 0);
    // A hint past the heap is taken modulo its pages.
    let e = heap.alloc_near(span, 0, 64 + 40).unwrap();
    assert_eq!(page_of(&owned, e), 40);
    for p in [a, b, c, d, e] {
        heap.free(p, 0).unwrap();
    }
    assert_eq!(heap.stats().bytes_in_use, 0);
}

#[test]
fn class_sizes_and_failures_are_as_for_alloc() {
    let owned = OwnedHeap::<u64>::new(8, 1).unwrap();
    let heap = owned.heap();
    // A class size ignores the hint.
    let small = heap.alloc_near(256, 0, 5).unwrap();
    assert_eq!(small as usize % 256, 0);
    // More pages than the heap has, and exhaustion: counted failures.
    assert!(heap.alloc_near(9 * PAGE_SIZE, 0, 0).is_err());
    let big = heap.alloc_near(7 * PAGE_SIZE, 0, 3).unwrap();
    assert!(heap.alloc_near(2 * PAGE_SIZE, 0, 0).is_err());
    assert_eq!(heap.stats().failed_allocs, 2);
    heap.free(big, 0).unwrap();
    heap.free(small, 0).unwrap();
    assert_eq!(heap.stats().bytes_in_use, 0);
}

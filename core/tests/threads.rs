//! Host threads at full contention on one heap: allocate, fill with the
//! thread's id, verify, free; millions of operations in all. Any overlap
//! between live blocks shows up as a foreign id.
#![cfg(not(loom))]

use cuheap_core::heap::Placement;
use cuheap_core::size_class::PAGE_SIZE;
use cuheap_core::OwnedHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn stress(threads: usize, ops: usize, pages: u32, max_size: usize, slots: u32) {
    stress_placed(threads, ops, pages, max_size, slots, 0)
}

/// [`stress`] on a heap whose pages are placed by `placement`; with best
/// fit, it keeps an index of free runs (a host pool's heap), which every
/// claim and release then goes through under its lock. With
/// [`Placement::FAR_LISTS`], thread `t` allocates on slot `4 t` (so no two
/// threads' near slots overlap) and frees on any slot, as a kernel's
/// threads do on another launch: pages are listed on slots that only far
/// probes reach, and taken from under other threads' pushes and pops.
fn stress_placed(
    threads: usize,
    ops: usize,
    pages: u32,
    max_size: usize,
    slots: u32,
    placement: u64,
) {
    let far = placement & Placement::FAR_LISTS != 0;
    // (allocation slot, free slot) for thread `t` and a random `r`.
    let slot_of = move |t: usize, r: u64| match far {
        false => (t as u32, t as u32),
        true => (4 * t as u32, (r >> 40) as u32 % slots),
    };
    let owned = match placement & Placement::BEST_FIT_SPANS {
        0 => OwnedHeap::<u64>::new(pages, slots),
        _ => OwnedHeap::<u64>::indexed(pages, slots),
    }
    .unwrap();
    owned.heap().set_placement(placement);
    let barrier = Barrier::new(threads);
    // Allocations served and refused, over all threads.
    let (served, refused) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|sc| {
        for t in 0..threads {
            let owned = &owned;
            let barrier = &barrier;
            let (served, refused) = (&served, &refused);
            sc.spawn(move || {
                let heap = owned.heap();
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ ((t as u64 + 1) * 0x1234_5678);
                let mut live: Vec<(*mut u8, usize)> = Vec::with_capacity(64);
                let id = (t as u8).wrapping_add(1);
                barrier.wait();
                for _ in 0..ops {
                    let r = xorshift(&mut rng);
                    if live.len() < 64 && (r & 1 == 0 || live.is_empty()) {
                        let size = 1 + (r >> 8) as usize % max_size;
                        // Exhaustion is allowed (and counted); nothing else fails.
                        match heap.alloc(size, slot_of(t, r).0) {
                            Ok(p) => {
                                let n = size.min(256);
                                // SAFETY: p is a fresh block of at least `size` bytes.
                                unsafe { p.write_bytes(id, n) };
                                live.push((p, n));
                                served.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => _ = refused.fetch_add(1, Ordering::Relaxed),
                        }
                    } else {
                        // One block, or now and then up to eight at once
                        // (`free_all`, spans given back in a batch).
                        let many = (r >> 32).is_multiple_of(8);
                        let count = match many {
                            true => 1 + (r >> 36) as usize % 8.min(live.len()),
                            false => 1,
                        };
                        let mut batch = Vec::with_capacity(count);
                        for k in 0..count {
                            let (p, n) = live.swap_remove((r >> (16 + k)) as usize % live.len());
                            // SAFETY: p is live and holds n bytes this thread wrote.
                            let bytes = unsafe { std::slice::from_raw_parts(p, n) };
                            assert!(
                                bytes.iter().all(|&b| b == id),
                                "block overwritten by another thread"
                            );
                            batch.push(p);
                        }
                        match many {
                            true => {
                                let out = heap.free_all(batch, slot_of(t, r).1);
                                assert_eq!((out.freed, out.refused), (count as u32, 0));
                            }
                            false => _ = heap.free(batch[0], slot_of(t, r).1).unwrap(),
                        }
                    }
                }
                for (p, _) in live {
                    heap.free(p, slot_of(t, 0).1).unwrap();
                }
            });
        }
    });
    let heap = owned.heap();
    heap.check_invariants().unwrap();
    let s = heap.stats();
    assert!(s.is_empty(), "blocks lost: {s:?}");
    assert_eq!(s.bad_frees, 0);
    // The slots' tallies and the counters saw every call.
    let k = heap.counts();
    let served = served.load(Ordering::Relaxed);
    assert_eq!((k.allocs, k.frees), (served, served), "{k:?}");
    assert_eq!(k.failed_allocs, refused.load(Ordering::Relaxed));
    assert_eq!(k.out_of_memory, k.failed_allocs);
    assert_eq!((k.bytes_reserved, k.span_bytes), (s.bytes_reserved, 0));
    // Every page is free again, in one run.
    let a = heap
        .alloc(pages as usize * PAGE_SIZE, 0)
        .expect("the whole heap as one span");
    heap.free(a, 0).unwrap();
    assert!(k.peak_bytes_reserved <= pages as u64 * PAGE_SIZE as u64);
}

/// Aligned allocations and reallocs (in place, moved, spans grown and
/// shrunk in place) from every thread: each block is filled with its
/// thread's id; a realloc must keep the id in the bytes it keeps, every
/// block must have its alignment, and no block may be overwritten.
fn stress_realloc(threads: usize, ops: usize, pages: u32, max_size: usize, slots: u32) {
    let owned = OwnedHeap::<u32>::new(pages, slots).unwrap();
    let barrier = Barrier::new(threads);
    std::thread::scope(|sc| {
        for t in 0..threads {
            let owned = &owned;
            let barrier = &barrier;
            sc.spawn(move || {
                let heap = owned.heap();
                let slot = t as u32;
                let mut rng = 0xD1B5_4A32_D192_ED03u64 ^ ((t as u64 + 1) * 0x9E37_79B9);
                // (block, bytes filled, alignment)
                let mut live: Vec<(*mut u8, usize, usize)> = Vec::with_capacity(32);
                let id = (t as u8).wrapping_add(1);
                let check = |p: *mut u8, n: usize| {
                    // SAFETY: a live block of this thread holding `n` bytes it wrote.
                    let bytes = unsafe { std::slice::from_raw_parts(p, n) };
                    assert!(bytes.iter().all(|&b| b == id), "block overwritten");
                };
                barrier.wait();
                for _ in 0..ops {
                    let r = xorshift(&mut rng);
                    let size = 1 + (r >> 8) as usize % max_size;
                    let align = 1usize << ((r >> 40) % 17);
                    let n = size.min(512);
                    match r % 4 {
                        0 | 1 if live.len() < 32 => {
                            if let Ok(p) = heap.alloc_aligned(size, align, slot) {
                                assert!((p as usize).is_multiple_of(align));
                                // SAFETY: p is a fresh block of at least `size` bytes.
                                unsafe { p.write_bytes(id, n) };
                                live.push((p, n, align));
                            }
                        }
                        2 if !live.is_empty() => {
                            let i = (r >> 20) as usize % live.len();
                            let (p, had, _) = live[i];
                            // SAFETY: p is this thread's live block.
                            match unsafe { heap.realloc(p, size, align, slot) } {
                                Ok(q) => {
                                    assert!((q as usize).is_multiple_of(align));
                                    check(q, had.min(size));
                                    // SAFETY: q holds at least `size` bytes.
                                    unsafe { q.write_bytes(id, n) };
                                    live[i] = (q, n, align);
                                }
                                // Exhaustion: the block stays as it was.
                                Err(_) => check(p, had),
                            }
                        }
                        _ if !live.is_empty() => {
                            let (p, had, align) = live.swap_remove((r >> 16) as usize % live.len());
                            assert!((p as usize).is_multiple_of(align));
                            check(p, had);
                            heap.free(p, slot).unwrap();
                        }
                        _ => {}
                    }
                }
                for (p, had, _) in live {
                    check(p, had);
                    heap.free(p, slot).unwrap();
                }
            });
        }
    });
    let heap = owned.heap();
    heap.check_invariants().unwrap();
    let s = heap.stats();
    assert!(s.is_empty(), "blocks lost: {s:?}");
    assert_eq!(s.bad_frees, 0);
}

#[test]
fn aligned_and_realloc_small_sizes() {
    stress_realloc(4, 200_000, 64, 512, 2);
}

#[test]
fn aligned_and_realloc_with_spans_and_exhaustion() {
    // Spans grow into the pages after them while other threads claim pages.
    stress_realloc(4, 100_000, 48, 4 * PAGE_SIZE, 4);
}

#[test]
fn small_blocks_shared_slot() {
    // Every thread on the same slot: maximum contention on one page.
    stress(4, 400_000, 64, 64, 1);
}

#[test]
fn mixed_sizes_own_slots() {
    stress(4, 300_000, 256, 8192, 4);
}

/// Installs that take pages from far slots' lists while other threads
/// push and pop them, on a heap small enough to run out.
#[test]
fn mixed_sizes_far_lists() {
    stress_placed(4, 300_000, 96, 8192, 16, Placement::FAR_LISTS);
}

#[test]
fn spans_and_exhaustion() {
    // Small heap with spans: threads run out of memory and recover.
    stress(4, 100_000, 24, 3 * PAGE_SIZE, 2);
}

/// A host pool's placement: spans and class pages claimed through the
/// index of free runs by four threads at once, small pages, exhaustion.
#[test]
fn pool_placement_spans_and_exhaustion() {
    let pool =
        Placement::BEST_FIT_SPANS | Placement::CLASS_PAGES_LOW | Placement::SMALL_CLASS_PAGES;
    stress_placed(4, 100_000, 24, 3 * PAGE_SIZE, 2, pool);
    stress_placed(4, 100_000, 256, 5 * PAGE_SIZE, 4, pool);
}

#[test]
fn empty_current_pages_are_reclaimed_under_contention() {
    // Many slots for few pages: most allocations find the page map empty
    // while other slots hold current pages, some of them empty, so the
    // failure path detaches and retires current pages while threads
    // allocate from them.
    stress(4, 150_000, 48, 3 * PAGE_SIZE, 16);
}

#[test]
fn a_heap_whose_blocks_were_all_freed_serves_a_span_of_half_of_it() {
    use cuheap_core::{class_size, CLASS_COUNT};
    // 256 pages and 132 slots: one block of every class on every slot
    // leaves every page some slot's current page (or in use).
    let owned = OwnedHeap::<u32>::new(256, 132).unwrap();
    let heap = owned.heap();
    let mut blocks = Vec::new();
    for slot in 0..132 {
        for c in 0..CLASS_COUNT as u32 {
            if let Ok(p) = heap.alloc(class_size(c) as usize, slot) {
                blocks.push((p, slot));
            }
        }
    }
    assert!(blocks.len() > 1000);
    for (p, slot) in blocks {
        heap.free(p, slot).unwrap();
    }
    assert!(heap.stats().is_empty());
    // Every page is an empty current page of some slot; a span of half the
    // heap needs them back.
    let span = heap
        .alloc(128 * PAGE_SIZE, 0)
        .expect("the empty current pages are retired for the span");
    heap.free(span, 0).unwrap();
    heap.check_invariants().unwrap();
    assert!(heap.stats().is_empty());
}

/// The GPU test `exhaustion_returns_null_and_recovers` on host threads:
/// a 4 MiB heap with 132 slots is exhausted with 256 B blocks, emptied,
/// then serves 4 KiB blocks (16-unit pages) up to all but one block per
/// slot of its capacity, with no null: the largest pages still fit once
/// the small ones are gone (class pages are claimed aligned, so they do
/// not cut the free units into short pieces), and blocks on pages that
/// are between owners are found by the repeated last-resort scan.
#[test]
fn an_emptied_small_heap_serves_a_near_full_load_of_its_largest_pages() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const THREADS: usize = 8;
    const SLOTS: u32 = 132;
    for round in 0..20 {
        let owned = OwnedHeap::<u32>::new(64, SLOTS).unwrap();
        let barrier = Barrier::new(THREADS);
        let nulls = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for t in 0..THREADS {
                let (owned, barrier, nulls) = (&owned, &barrier, &nulls);
                sc.spawn(move || {
                    let heap = owned.heap();
                    let slot = |i: usize| (t * 7919 + i * 31) as u32 % SLOTS;
                    let mut live = Vec::new();
                    barrier.wait();
                    let mut failed = 0;
                    for i in 0..25_000 {
                        match heap.alloc(256, slot(i)) {
                            Ok(p) => live.push(p),
                            Err(_) if failed == 3 => break,
                            Err(_) => failed += 1,
                        }
                    }
                    barrier.wait();
                    for p in live.drain(..) {
                        heap.free(p, t as u32).unwrap();
                    }
                    barrier.wait();
                    for i in 0..(64 * 16 - SLOTS as usize) / THREADS {
                        match heap.alloc(4096, slot(i)) {
                            Ok(p) => live.push(p),
                            Err(_) => {
                                nulls.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    barrier.wait();
                    for p in live.drain(..) {
                        heap.free(p, t as u32).unwrap();
                    }
                });
            }
        });
        let heap = owned.heap();
        assert_eq!(
            nulls.load(Ordering::Relaxed),
            0,
            "round {round}: {:?}",
            heap.stats()
        );
        heap.check_invariants().unwrap();
        assert!(heap.stats().is_empty());
    }
}

/// A trim while threads allocate and free (what a device heap's trim on a
/// stream does beside running kernels): an owner thread retires the empty
/// pages slots and lists hold, fences every free range of 32 pages it can,
/// overwrites all of the ranges it fenced (as an unmapping would take
/// their memory away), then gives them back; the threads' blocks must
/// keep their contents throughout.
#[test]
fn fenced_ranges_hold_no_block_while_threads_allocate() {
    const PAGES: u32 = 512;
    const RANGE: u32 = 32;
    const SLOTS: u32 = 4;
    let owned = OwnedHeap::<u64>::new(PAGES, SLOTS).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (fenced_total, refused) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|sc| {
        for t in 0..3usize {
            let (owned, stop, refused) = (&owned, &stop, &refused);
            sc.spawn(move || {
                let heap = owned.heap();
                let mut rng = 0x2545_F491_4F6C_DD1Du64 ^ ((t as u64 + 1) << 20);
                let mut live: Vec<(*mut u8, usize)> = Vec::new();
                let id = t as u8 + 1;
                while !stop.load(Ordering::Relaxed) {
                    let r = xorshift(&mut rng);
                    if live.len() < 48 && (r & 1 == 0 || live.is_empty()) {
                        // Class blocks of up to 4 KiB, and a span of up
                        // to two pages in 16.
                        let max = if r >> 60 == 0 { 2 * PAGE_SIZE } else { 4096 };
                        let size = 1 + (r >> 8) as usize % max;
                        match heap.alloc(size, t as u32) {
                            Ok(p) => {
                                let n = size.min(256);
                                // SAFETY: a fresh block of at least `size` bytes.
                                unsafe { p.write_bytes(id, n) };
                                live.push((p, n));
                            }
                            Err(_) => _ = refused.fetch_add(1, Ordering::Relaxed),
                        }
                    } else {
                        let (p, n) = live.swap_remove((r >> 16) as usize % live.len());
                        // SAFETY: p is live and holds n bytes this thread wrote.
                        let bytes = unsafe { std::slice::from_raw_parts(p, n) };
                        assert!(bytes.iter().all(|&b| b == id), "a block in a fenced range");
                        heap.free(p, t as u32).unwrap();
                    }
                }
                for (p, _) in live {
                    heap.free(p, t as u32).unwrap();
                }
            });
        }
        let heap = owned.heap();
        let data = heap.handle().data as *mut u8;
        for _ in 0..300 {
            heap.scavenge_slots(0, SLOTS);
            let fenced: Vec<u32> = (0..PAGES / RANGE)
                .filter(|&r| heap.fence(r * RANGE, (r + 1) * RANGE))
                .collect();
            for &r in &fenced {
                // Every 16th byte: each block's first byte at least.
                for off in (0..(RANGE as usize * PAGE_SIZE)).step_by(16) {
                    // SAFETY: inside the heap's data; the fence keeps every
                    // block out of the range until it is unfenced below.
                    unsafe {
                        data.add((r * RANGE) as usize * PAGE_SIZE + off)
                            .write_volatile(0xEE)
                    };
                }
            }
            std::thread::yield_now();
            for &r in &fenced {
                // SAFETY: this thread fenced the range above.
                unsafe { heap.unfence(r * RANGE, (r + 1) * RANGE) };
            }
            fenced_total.fetch_add(fenced.len() as u64, Ordering::Relaxed);
        }
        stop.store(true, Ordering::Relaxed);
    });
    let heap = owned.heap();
    heap.check_invariants().unwrap();
    assert!(heap.stats().is_empty(), "blocks lost: {:?}", heap.stats());
    let fenced = fenced_total.load(Ordering::Relaxed);
    assert!(fenced >= 300, "only {fenced} ranges fenced in 300 rounds");
    println!(
        "{fenced} ranges of {RANGE} pages fenced and overwritten; {} allocations refused meanwhile",
        refused.load(Ordering::Relaxed)
    );
}

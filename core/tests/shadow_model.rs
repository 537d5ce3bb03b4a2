//! Property tests against a shadow model: random alloc, aligned alloc,
//! realloc and free sequences (including bad frees, bad reallocs and
//! exhaustion) checked for alignment, overlap, data integrity (realloc
//! keeps the contents), where realloc may and must move a block,
//! statistics and structural invariants after every step.
#![cfg(not(loom))]

use cuheap_core::heap::Located;
use cuheap_core::size_class::{
    class_of, class_of_aligned, class_size, span_pages, MAX_ALIGN, MAX_CLASS_SIZE, PAGE_SIZE,
};
use cuheap_core::{AllocError, FreeError, Heap, OwnedHeap, Placement, ReallocError, Word};
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
enum Action {
    Alloc {
        size: usize,
        slot: u32,
    },
    AllocAligned {
        size: usize,
        align: usize,
        slot: u32,
    },
    Realloc {
        pick: usize,
        size: usize,
        align: usize,
    },
    ReallocInterior {
        pick: usize,
    },
    ReallocFreed,
    Free {
        pick: usize,
    },
    /// Up to `count` live blocks through one `free_all`, with the first
    /// again (`twice`) and a foreign and a null pointer among them.
    FreeAll {
        pick: usize,
        count: usize,
        twice: bool,
    },
    FreeInterior {
        pick: usize,
    },
    DoubleFree,
    FreeForeign,
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        8 => 1usize..=256,
        4 => 257usize..=4096,
        2 => 4097usize..=65536,
        1 => 65537usize..=(4 * PAGE_SIZE),
        1 => Just(0usize),
        1 => Just(usize::MAX / 2),
    ]
}

/// Every power of two up to twice the page size (the last is refused),
/// and now and then one that is not a power of two.
fn align() -> impl Strategy<Value = usize> {
    prop_oneof![
        12 => (0u32..=17).prop_map(|k| 1usize << k),
        1 => Just(48usize),
    ]
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (size(), 0u32..4).prop_map(|(size, slot)| Action::Alloc { size, slot }),
        3 => (size(), align(), 0u32..4)
            .prop_map(|(size, align, slot)| Action::AllocAligned { size, align, slot }),
        4 => (any::<usize>(), size(), align())
            .prop_map(|(pick, size, align)| Action::Realloc { pick, size, align }),
        1 => any::<usize>().prop_map(|pick| Action::ReallocInterior { pick }),
        1 => Just(Action::ReallocFreed),
        4 => any::<usize>().prop_map(|pick| Action::Free { pick }),
        2 => (any::<usize>(), 1usize..6, any::<bool>())
            .prop_map(|(pick, count, twice)| Action::FreeAll { pick, count, twice }),
        1 => any::<usize>().prop_map(|pick| Action::FreeInterior { pick }),
        1 => Just(Action::DoubleFree),
        1 => Just(Action::FreeForeign),
    ]
}

/// Bytes a live allocation really owns (its block or span).
fn footprint(size: usize) -> usize {
    match class_of(size) {
        Some(c) => class_size(c) as usize,
        None => size.div_ceil(PAGE_SIZE) * PAGE_SIZE,
    }
}

/// The block the heap should pick for `size` at `align` (class blocks;
/// spans are whole pages).
fn best(size: usize, align: usize) -> usize {
    match class_of_aligned(size, align) {
        Some(c) => class_size(c) as usize,
        None => span_pages(size) * PAGE_SIZE,
    }
}

/// Bytes the block at `at` really owns, as the heap reports it.
fn owned_bytes<W: Word>(heap: &Heap<'_, W>, at: usize) -> usize {
    heap.live_block_at(at).expect("a live block").size
}

/// Checks a new block against the live ones, fills it with `tag` and
/// records it.
fn admit(live: &mut BTreeMap<usize, (usize, u8)>, at: usize, len: usize, tag: u8) {
    if let Some((&s, &(l, _))) = live.range(..at + len).next_back() {
        assert!(s + l <= at, "overlap: [{s:#x},+{l}) and [{at:#x},+{len})");
    }
    // SAFETY: a block of `len` bytes that the model now owns.
    unsafe { (at as *mut u8).write_bytes(tag, len) };
    live.insert(at, (len, tag));
}

fn holds(at: usize, len: usize, tag: u8) -> bool {
    // SAFETY: the model's live block of at least `len` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
    bytes.iter().all(|&b| b == tag)
}

/// Where the heap counts a failure: size 0, too large, a bad alignment,
/// out of memory.
fn cause(e: AllocError) -> usize {
    match e {
        AllocError::ZeroSize => 0,
        AllocError::TooLarge => 1,
        AllocError::BadAlignment => 2,
        AllocError::OutOfMemory | AllocError::Growing => 3,
    }
}

/// A host pool's placement bits (its default).
const POOL: u64 =
    Placement::BEST_FIT_SPANS | Placement::CLASS_PAGES_LOW | Placement::SMALL_CLASS_PAGES;

fn run<W: Word>(pages: u32, actions: Vec<Action>) {
    run_placed::<W>(pages, 0, actions)
}

/// [`run`] with the heap's pages placed by `placement` (`Placement` bits).
fn run_placed<W: Word>(pages: u32, placement: u64, actions: Vec<Action>) {
    run_slotted::<W>(pages, 3, placement, actions)
}

/// [`run_placed`] on a heap of `slots` slots. Allocations use slots 0-3
/// and frees slot 0, so with 8 slots slot 0 is a far slot of slots 1-3.
fn run_slotted<W: Word>(pages: u32, slots: u32, placement: u64, actions: Vec<Action>) {
    // Best fit reads an index of free runs, as a host pool's heap keeps.
    let owned = match placement & Placement::BEST_FIT_SPANS {
        0 => OwnedHeap::<W>::new(pages, slots),
        _ => OwnedHeap::<W>::indexed(pages, slots),
    }
    .unwrap();
    let heap = owned.heap();
    heap.set_placement(placement);
    // start address -> (footprint, fill byte)
    let mut live: BTreeMap<usize, (usize, u8)> = BTreeMap::new();
    let mut freed_once: Option<usize> = None;
    let (mut failed, mut bad) = (0u64, 0u64);
    // What the heap's counters must say: blocks handed out and freed,
    // failures by cause (size 0, too large, bad alignment, out of
    // memory), and the most bytes of pages it has held.
    let (mut allocs, mut frees) = (0u64, 0u64);
    let mut causes = [0u64; 4];
    let mut peak = 0u64;
    let heap_bytes = pages as usize * PAGE_SIZE;
    for (step, a) in actions.into_iter().enumerate() {
        match a {
            Action::AllocAligned { size, align, slot } => {
                match heap.alloc_aligned(size, align, slot) {
                    Ok(p) => {
                        let at = p as usize;
                        assert!(at.is_multiple_of(align), "{size} B at {align}: {at:#x}");
                        let len = owned_bytes(&heap, at);
                        // The smallest aligned class, or a span when no
                        // class page fits.
                        assert!(len == best(size, align) || len == span_pages(size) * PAGE_SIZE);
                        admit(&mut live, at, len, step as u8);
                        allocs += 1;
                    }
                    Err(e) => {
                        failed += 1;
                        causes[cause(e)] += 1;
                        match e {
                            AllocError::BadAlignment => {
                                assert!(!align.is_power_of_two() || align > MAX_ALIGN)
                            }
                            AllocError::ZeroSize => assert_eq!(size, 0),
                            AllocError::TooLarge => assert!(size > heap_bytes),
                            AllocError::OutOfMemory => {}
                            // Only `reserve` says so, on a served heap.
                            AllocError::Growing => panic!("{e:?} from an allocation"),
                        }
                    }
                }
            }
            Action::Realloc { pick, size, align } => {
                if live.is_empty() {
                    continue;
                }
                let at = *live.keys().nth(pick % live.len()).unwrap();
                let (len, tag) = live[&at];
                let span = matches!(heap.locate(at), Ok(Located::Span { .. }));
                let valid = align.is_power_of_two() && align <= MAX_ALIGN;
                // SAFETY: `at` is a live block the model owns.
                match unsafe { heap.realloc(at as *mut u8, size, align, 1) } {
                    Ok(q) => {
                        let q = q as usize;
                        assert!(valid && size > 0 && size <= heap_bytes);
                        assert!(q.is_multiple_of(align), "{size} B at {align}: {q:#x}");
                        let fits = size <= len && at.is_multiple_of(align);
                        if q == at {
                            // In place: a class block keeps its size, a
                            // span takes the pages of the new size.
                            assert!(fits || span, "grew in place past its block");
                        } else {
                            assert!(heap.live_block_at(at).is_err(), "old block not freed");
                            (allocs, frees) = (allocs + 1, frees + 1);
                            if !span && fits {
                                assert!(2 * best(size, align) <= len, "moved a block that fits");
                            }
                            if span && size > MAX_CLASS_SIZE && span_pages(size) <= len / PAGE_SIZE
                            {
                                panic!("moved a span that could shrink in place");
                            }
                        }
                        let (old, _) = live.remove(&at).unwrap();
                        assert!(holds(q, old.min(size), tag), "realloc lost the contents");
                        let new_len = owned_bytes(&heap, q);
                        assert!(new_len >= size);
                        if q == at && span {
                            assert_eq!(new_len, span_pages(size) * PAGE_SIZE);
                        } else if q == at {
                            assert_eq!(new_len, len);
                        }
                        admit(&mut live, q, new_len, step as u8);
                    }
                    Err(ReallocError::Alloc(e)) => {
                        failed += 1;
                        causes[cause(e)] += 1;
                        match e {
                            AllocError::BadAlignment => assert!(!valid),
                            AllocError::ZeroSize => assert!(valid && size == 0),
                            AllocError::TooLarge => assert!(size > heap_bytes),
                            AllocError::OutOfMemory => assert!(
                                size > len || !at.is_multiple_of(align),
                                "a realloc that fits its block failed"
                            ),
                            // Only `reserve` says so, on a served heap.
                            AllocError::Growing => panic!("{e:?} from a realloc"),
                        }
                        assert!(holds(at, len, tag), "a failed realloc changed the block");
                    }
                    Err(ReallocError::Pointer(e)) => panic!("live block refused: {e:?}"),
                }
            }
            Action::ReallocInterior { pick } => {
                if live.is_empty() {
                    continue;
                }
                let at = *live.keys().nth(pick % live.len()).unwrap();
                // SAFETY: not a block's start: refused before anything is read.
                let r = unsafe { heap.realloc((at + 8) as *mut u8, 64, 16, 0) };
                assert_eq!(r, Err(ReallocError::Pointer(FreeError::Interior)));
                bad += 1;
            }
            Action::ReallocFreed => {
                if let Some(at) = freed_once {
                    if !live.contains_key(&at) {
                        // SAFETY: not a live block: refused before anything is read.
                        let r = unsafe { heap.realloc(at as *mut u8, 64, 16, 0) };
                        assert!(
                            matches!(
                                r,
                                Err(ReallocError::Pointer(
                                    FreeError::NotAllocated | FreeError::Interior
                                ))
                            ),
                            "{r:?}"
                        );
                        bad += 1;
                    }
                }
            }
            Action::Alloc { size, slot } => match heap.alloc(size, slot) {
                Ok(p) => {
                    let at = p as usize;
                    // Large classes fall back to spans when no class page fits.
                    let len = match heap.locate(at) {
                        Ok(Located::Span { .. }) => size.div_ceil(PAGE_SIZE) * PAGE_SIZE,
                        _ => footprint(size),
                    };
                    assert_eq!(at % 16, 0, "16-byte alignment");
                    if len.is_power_of_two() {
                        assert_eq!(at % len.min(PAGE_SIZE), 0, "natural alignment");
                    }
                    if let Some((&s, &(l, _))) = live.range(..at + len).next_back() {
                        assert!(s + l <= at, "overlap: [{s:#x},+{l}) and [{at:#x},+{len})");
                    }
                    let tag = step as u8;
                    // SAFETY: a fresh allocation of at least `len` bytes.
                    unsafe { p.write_bytes(tag, len) };
                    live.insert(at, (len, tag));
                    allocs += 1;
                }
                Err(e) => {
                    failed += 1;
                    causes[cause(e)] += 1;
                    match e {
                        AllocError::ZeroSize => assert_eq!(size, 0),
                        AllocError::TooLarge => assert!(size > pages as usize * PAGE_SIZE),
                        AllocError::OutOfMemory => {}
                        AllocError::BadAlignment => panic!("no alignment asked"),
                        // Only `reserve` says so, on a served heap.
                        AllocError::Growing => panic!("{e:?} from an allocation"),
                    }
                }
            },
            Action::Free { pick } => {
                if live.is_empty() {
                    continue;
                }
                let at = *live.keys().nth(pick % live.len()).unwrap();
                let (len, tag) = live.remove(&at).unwrap();
                // SAFETY: live block of `len` bytes filled with `tag`.
                let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
                assert!(bytes.iter().all(|&b| b == tag), "block contents changed");
                heap.free(at as *mut u8, 0).unwrap();
                frees += 1;
                freed_once = Some(at);
            }
            Action::FreeAll { pick, count, twice } => {
                if live.is_empty() {
                    continue;
                }
                let mut ptrs = Vec::new();
                for k in 0..count.min(live.len()) {
                    let at = *live.keys().nth((pick + k * 7) % live.len()).unwrap();
                    let (len, tag) = live.remove(&at).unwrap();
                    assert!(holds(at, len, tag), "block contents changed");
                    ptrs.push(at as *mut u8);
                }
                let (n, first) = (ptrs.len() as u32, ptrs[0]);
                let mut x = 0u64;
                ptrs.insert(ptrs.len() / 2, std::ptr::null_mut());
                ptrs.push(&mut x as *mut u64 as *mut u8);
                if twice {
                    ptrs.push(first);
                }
                let out = heap.free_all(ptrs, 0);
                let refused = 1 + twice as u32;
                assert_eq!((out.freed, out.refused), (n, refused), "step {step}");
                frees += n as u64;
                bad += refused as u64;
            }
            Action::FreeInterior { pick } => {
                if live.is_empty() {
                    continue;
                }
                let at = *live.keys().nth(pick % live.len()).unwrap();
                assert_eq!(heap.free((at + 8) as *mut u8, 1), Err(FreeError::Interior));
                bad += 1;
            }
            Action::DoubleFree => {
                if let Some(at) = freed_once.take() {
                    if !live.contains_key(&at) {
                        // Its page may serve another class or a span by now,
                        // which makes the address interior: refused either way.
                        let r = heap.free(at as *mut u8, 2);
                        assert!(
                            matches!(r, Err(FreeError::NotAllocated | FreeError::Interior)),
                            "{r:?}"
                        );
                        bad += 1;
                    }
                }
            }
            Action::FreeForeign => {
                let mut x = 0u64;
                assert_eq!(
                    heap.free(&mut x as *mut u64 as *mut u8, 0),
                    Err(FreeError::Foreign)
                );
                bad += 1;
            }
        }
        heap.check_invariants()
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        let s = heap.stats();
        assert_eq!(s.failed_allocs, failed);
        assert_eq!(s.bad_frees, bad);
        assert_eq!(
            s.bytes_in_use,
            live.values().map(|v| v.0 as u64).sum::<u64>()
        );
        // The counters alone agree with the model and with the scan.
        let k = heap.counts();
        assert_eq!((k.allocs, k.frees), (allocs, frees), "step {step}");
        assert_eq!(k.in_use(), live.len() as u64);
        assert_eq!(k.failed_allocs, failed);
        assert_eq!(
            [k.zero_size, k.too_large, k.bad_alignment, k.out_of_memory],
            causes
        );
        assert_eq!(k.bad_frees, bad);
        assert_eq!(k.bytes_reserved, s.bytes_reserved, "step {step}");
        assert_eq!(k.spans_in_use(), s.spans);
        assert_eq!(k.span_bytes, s.span_pages * PAGE_SIZE as u64);
        peak = peak.max(s.bytes_reserved);
        assert!(k.peak_bytes_reserved >= peak);
    }
    for (&at, _) in live.iter() {
        heap.free(at as *mut u8, 0).unwrap();
    }
    heap.check_invariants().unwrap();
    let s = heap.stats();
    assert!(s.is_empty(), "blocks lost: {s:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn shadow_model_u32(actions in proptest::collection::vec(action(), 1..300)) {
        run::<u32>(24, actions);
    }

    #[test]
    fn shadow_model_u64(actions in proptest::collection::vec(action(), 1..300)) {
        run::<u64>(24, actions);
    }

    /// A tiny heap, so exhaustion and page turnover happen all the time.
    #[test]
    fn shadow_model_tiny_heap(actions in proptest::collection::vec(action(), 1..300)) {
        run::<u32>(5, actions);
    }

    /// A host pool's placement: spans by best fit, class pages packed low
    /// and small, on the pool's 64-bit bitmap words.
    #[test]
    fn shadow_model_pool_placement(actions in proptest::collection::vec(action(), 1..300)) {
        run_placed::<u64>(24, POOL, actions);
    }

    #[test]
    fn shadow_model_pool_placement_tiny_heap(
        actions in proptest::collection::vec(action(), 1..300)
    ) {
        run_placed::<u32>(5, POOL, actions);
    }

    /// Far lists: pages freed on slot 0 reach allocations on slots 1-3
    /// through far probes only.
    #[test]
    fn shadow_model_far_lists(actions in proptest::collection::vec(action(), 1..300)) {
        run_slotted::<u32>(24, 8, Placement::FAR_LISTS, actions);
    }

    #[test]
    fn shadow_model_far_lists_tiny_heap(actions in proptest::collection::vec(action(), 1..300)) {
        run_slotted::<u32>(5, 8, Placement::FAR_LISTS, actions);
    }

    /// Best fit and low class pages with the GPU's 256-block pages.
    #[test]
    fn shadow_model_pool_placement_large_pages(
        actions in proptest::collection::vec(action(), 1..300)
    ) {
        run_placed::<u32>(24, Placement::BEST_FIT_SPANS | Placement::CLASS_PAGES_LOW, actions);
    }
}

//! Property tests against a shadow model: random alloc/free sequences
//! (including bad frees and exhaustion) checked for alignment, overlap,
//! data integrity, statistics and structural invariants after every step.
#![cfg(not(loom))]

use cuheap_core::heap::Located;
use cuheap_core::size_class::{class_of, class_size, PAGE_SIZE};
use cuheap_core::{AllocError, FreeError, OwnedHeap, Word};
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
enum Action {
    Alloc { size: usize, slot: u32 },
    Free { pick: usize },
    FreeInterior { pick: usize },
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

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (size(), 0u32..4).prop_map(|(size, slot)| Action::Alloc { size, slot }),
        4 => any::<usize>().prop_map(|pick| Action::Free { pick }),
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

fn run<W: Word>(pages: u32, actions: Vec<Action>) {
    let owned = OwnedHeap::<W>::new(pages, 3).unwrap();
    let heap = owned.heap();
    // start address -> (footprint, fill byte)
    let mut live: BTreeMap<usize, (usize, u8)> = BTreeMap::new();
    let mut freed_once: Option<usize> = None;
    let (mut failed, mut bad) = (0u64, 0u64);
    for (step, a) in actions.into_iter().enumerate() {
        match a {
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
                }
                Err(e) => {
                    failed += 1;
                    match e {
                        AllocError::ZeroSize => assert_eq!(size, 0),
                        AllocError::TooLarge => assert!(size > pages as usize * PAGE_SIZE),
                        AllocError::OutOfMemory => {}
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
                freed_once = Some(at);
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
}

//! Fuzzes the heap with an enum of actions against a shadow map of live
//! blocks: `cargo +nightly fuzz run heap_actions` (in core/).
#![no_main]

use arbitrary::Arbitrary;
use cuheap_core::OwnedHeap;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;

#[derive(Arbitrary, Debug)]
enum Action {
    Alloc {
        size: u32,
        slot: u8,
    },
    AllocAligned {
        size: u32,
        align_log: u8,
        slot: u8,
    },
    Realloc {
        pick: u16,
        size: u32,
        align_log: u8,
        slot: u8,
    },
    Free {
        pick: u16,
        slot: u8,
    },
    FreeOffset {
        pick: u16,
        offset: u16,
    },
    FreeAddr {
        addr: u64,
    },
}

fuzz_target!(|actions: Vec<Action>| {
    let owned = OwnedHeap::<u32>::new(8, 3).unwrap();
    let heap = owned.heap();
    let mut live: BTreeMap<usize, usize> = BTreeMap::new();
    for a in actions.into_iter().take(512) {
        match a {
            Action::Alloc { size, slot } => {
                let size = size as usize % (3 << 16);
                if let Ok(p) = heap.alloc(size, slot as u32) {
                    let at = p as usize;
                    if let Some((&s, &l)) = live.range(..at + size.max(1)).next_back() {
                        assert!(s + l <= at, "overlap");
                    }
                    live.insert(at, size.max(1));
                }
            }
            Action::AllocAligned {
                size,
                align_log,
                slot,
            } => {
                let size = size as usize % (3 << 16);
                let align = 1usize << (align_log % 18);
                if let Ok(p) = heap.alloc_aligned(size, align, slot as u32) {
                    let at = p as usize;
                    assert!(at.is_multiple_of(align), "misaligned");
                    if let Some((&s, &l)) = live.range(..at + size.max(1)).next_back() {
                        assert!(s + l <= at, "overlap");
                    }
                    live.insert(at, size.max(1));
                }
            }
            Action::Realloc {
                pick,
                size,
                align_log,
                slot,
            } => {
                if let Some(&at) = live.keys().nth(pick as usize % live.len().max(1)) {
                    let size = size as usize % (3 << 16);
                    let align = 1usize << (align_log % 18);
                    // SAFETY: `at` is a live block this loop owns.
                    if let Ok(q) = unsafe { heap.realloc(at as *mut u8, size, align, slot as u32) }
                    {
                        let q = q as usize;
                        assert!(q.is_multiple_of(align), "misaligned");
                        live.remove(&at);
                        if q != at {
                            assert!(heap.live_block_at(at).is_err(), "old block kept");
                        }
                        let block = heap.live_block_at(q).expect("a live block");
                        assert!(block.size >= size, "a block smaller than asked");
                        if let Some((&s, &l)) = live.range(..q + size).next_back() {
                            assert!(s + l <= q, "overlap");
                        }
                        live.insert(q, size);
                    } else {
                        assert!(
                            heap.live_block_at(at).is_ok(),
                            "a failed realloc freed the block"
                        );
                    }
                }
            }
            Action::Free { pick, slot } => {
                if let Some(&at) = live.keys().nth(pick as usize % live.len().max(1)) {
                    live.remove(&at);
                    heap.free(at as *mut u8, slot as u32).unwrap();
                }
            }
            Action::FreeOffset { pick, offset } => {
                if let Some(&at) = live.keys().nth(pick as usize % live.len().max(1)) {
                    let addr = at + offset as usize;
                    if offset != 0 && !live.contains_key(&addr) {
                        assert!(
                            heap.free(addr as *mut u8, 0).is_err(),
                            "a non-block address was freed"
                        );
                    }
                }
            }
            Action::FreeAddr { addr } => {
                if !live.contains_key(&(addr as usize)) {
                    let _ = heap.free(addr as usize as *mut u8, 0);
                }
            }
        }
        heap.check_invariants().unwrap();
    }
    for (&at, _) in live.iter() {
        heap.free(at as *mut u8, 0).unwrap();
    }
    assert!(heap.stats().is_empty());
});

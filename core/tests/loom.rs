//! loom models of the lock-free structures: every interleaving of a few
//! threads. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p cuheap-core --test loom --release`.
#![cfg(loom)]

use cuheap_core::bitmap::Bitmap;
use cuheap_core::page::PageDesc;
use cuheap_core::page_list::PageList;
use cuheap_core::page_map::PageMap;
use cuheap_core::sync::{AtomicU32, AtomicU64};
use cuheap_core::Word;
use loom::sync::Arc;
use loom::thread;

/// Two pushers and a popper on one list: nothing lost, nothing twice.
#[test]
fn page_list_push_pop() {
    loom::model(|| {
        let head = Arc::new(AtomicU64::new(0));
        let next: Arc<Vec<AtomicU32>> = Arc::new((0..3).map(|_| AtomicU32::new(0)).collect());
        let ts: Vec<_> = (0..2u32)
            .map(|p| {
                let (head, next) = (head.clone(), next.clone());
                thread::spawn(move || PageList::new(&head).push(p, |i| &next[i as usize]))
            })
            .collect();
        let popped = {
            let (head, next) = (head.clone(), next.clone());
            thread::spawn(move || PageList::new(&head).pop(|i| &next[i as usize]))
        };
        for t in ts {
            t.join().unwrap();
        }
        let mut seen = vec![popped.join().unwrap()];
        let list = PageList::new(&head);
        while let Some(p) = list.pop(|i| &next[i as usize]) {
            seen.push(Some(p));
        }
        let mut got: Vec<u32> = seen.into_iter().flatten().collect();
        got.sort();
        assert_eq!(got, vec![0, 1]);
    });
}

/// Two claimers and a freer on one bitmap word: every block has one owner.
#[test]
fn bitmap_claim_release() {
    loom::model(|| {
        let words: Arc<Vec<<u32 as Word>::Atomic>> = Arc::new(vec![u32::new_atomic(0b0111)]);
        let ts: Vec<_> = (0..2)
            .map(|_| {
                let words = words.clone();
                thread::spawn(move || {
                    Bitmap::<u32>::new(&words)
                        .claim(0, 1, 2)
                        .map_or(0, |(_, m)| m)
                })
            })
            .collect();
        let freer = {
            let words = words.clone();
            thread::spawn(move || Bitmap::<u32>::new(&words).release(0, 0b1000))
        };
        let a = ts
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect::<Vec<_>>();
        assert_eq!(freer.join().unwrap(), 0);
        assert_eq!(a[0] & a[1], 0, "a block claimed twice");
        let left = Bitmap::<u32>::new(&words).word(0);
        assert_eq!((a[0] | a[1] | left).count_ones(), 4, "a block lost");
        assert_eq!((a[0] | a[1]) & left, 0);
    });
}

/// Reservers and a freer on one page's counter: grants never exceed the
/// free blocks, and once all is given back the page retires exactly once.
#[test]
fn page_reserve_free_retire() {
    loom::model(|| {
        let d = Arc::new(PageDesc::new());
        d.activate(0, 2);
        let ts: Vec<_> = (0..2)
            .map(|_| {
                let d = d.clone();
                thread::spawn(move || {
                    let before = d.take(2);
                    let got = if before.live && before.free > 0 {
                        (before.free as u32).min(2)
                    } else {
                        0
                    };
                    if got < 2 {
                        d.add(2 - got);
                    }
                    got
                })
            })
            .collect();
        let got: u32 = ts.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(got, 2, "grants must add up to the free blocks");
        d.float();
        let a = d.add(2);
        assert!(a.floating && a.free == 2);
        assert!(d.try_retire(0, 2, true));
        assert!(!d.try_retire(0, 2, true));
    });
}

/// A reservation that finds a page live sees what its activation wrote
/// before: the kind and the filled bitmap (`take` acquires what
/// `activate` releases). With a relaxed `take`, loom finds a reserver that
/// reads the page's old kind.
#[test]
fn a_reservation_sees_what_the_activation_published() {
    use cuheap_core::page::{decode_kind, Kind};
    use cuheap_core::sync::Ordering;
    loom::model(|| {
        let d = Arc::new(PageDesc::new());
        let words: Arc<Vec<<u32 as Word>::Atomic>> = Arc::new(vec![u32::new_atomic(0)]);
        let activator = {
            let (d, words) = (d.clone(), words.clone());
            thread::spawn(move || {
                Bitmap::<u32>::new(&words).fill(1);
                d.activate(3, 1);
            })
        };
        let before = d.take(1);
        if before.live && before.free > 0 {
            assert_eq!(before.class, 4, "the counter names the class");
            assert_eq!(decode_kind(d.kind.load(Ordering::Relaxed)), Kind::Class(3));
            assert!(Bitmap::<u32>::new(&words).claim(0, 1, 1).is_some());
        } else {
            d.add(1);
        }
        activator.join().unwrap();
    });
}

/// A freer's last writes to its block happen before whoever retires the
/// page (and so may hand its memory to anyone): the block's writes, then
/// the bitmap's release, then `add`, which releases both to the retiring
/// compare-exchange. With a relaxed `add`, loom reports the block's two
/// writes as a data race.
#[test]
fn a_retired_page_sees_the_freers_writes() {
    loom::model(|| {
        let d = Arc::new(PageDesc::new());
        let words: Arc<Vec<<u32 as Word>::Atomic>> = Arc::new(vec![u32::new_atomic(0)]);
        let block = Arc::new(loom::cell::UnsafeCell::new(0u32));
        Bitmap::<u32>::new(&words).fill(1);
        d.activate(0, 1);
        assert_eq!(d.take(1).free, 1);
        assert!(Bitmap::<u32>::new(&words).claim(0, 1, 1).is_some());
        assert!(d.float().floating);
        let freer = {
            let (d, words, block) = (d.clone(), words.clone(), block.clone());
            thread::spawn(move || {
                // SAFETY: the freer owns the block until its release.
                block.with_mut(|p| unsafe { *p = 7 });
                assert_eq!(Bitmap::<u32>::new(&words).release(0, 1), 0);
                d.add(1)
            })
        };
        if d.try_retire(0, 1, true) {
            // SAFETY: a retired page is the retirer's.
            block.with_mut(|p| unsafe { *p = 9 });
        }
        freer.join().unwrap();
    });
}

/// A stale reserver (it read its slot before the page was retired) takes
/// from the retired page, gets nothing and gives it back, while another
/// thread reactivates the page for another class and floats it. The give
/// back's `add` returns the page floating and live, and the free path
/// then settles it (`Heap::settle`): it must act on the class that `add`
/// saw. Returns whether a `kind` loaded after the `add` can name another
/// class (the `add` only releases, so nothing orders that load after the
/// activation); the class field of the `add`'s value never does.
fn settle_with_a_stale_return(load_kind: bool) -> bool {
    use cuheap_core::page::{decode_kind, Kind, KIND_FREE};
    use cuheap_core::sync::Ordering;
    in_some_interleaving(move || {
        let d = Arc::new(PageDesc::new());
        d.activate(0, 1); // class 0, listed, all free
        let other = {
            let d = d.clone();
            thread::spawn(move || {
                // Retired (a scavenge), its units reused by an install of
                // class 1, then detached when full.
                if d.try_retire(0, 1, false) {
                    d.kind.store(KIND_FREE, Ordering::Release);
                    d.activate(1, 1);
                    d.float();
                }
            })
        };
        // A reservation of one block, then its give-back (nothing was
        // granted) or the free of the block it got: an `add` of one.
        d.take(1);
        let a = d.add(1);
        let class = match (a.floating && a.live, load_kind) {
            (false, _) => 1, // not settled
            (true, true) => match decode_kind(d.kind.load(Ordering::Acquire)) {
                Kind::Class(c) => c,
                _ => u32::MAX,
            },
            (true, false) => a.class - 1,
        };
        other.join().unwrap();
        class != 1
    })
}

/// Whether `body` returns true in any interleaving loom explores.
fn in_some_interleaving(body: impl Fn() -> bool + Sync + Send + 'static) -> bool {
    let found = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = found.clone();
    loom::model(move || {
        if body() {
            seen.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    found.load(std::sync::atomic::Ordering::Relaxed)
}

/// Settling acts on the class its RMW saw: a `kind` loaded after the
/// free's `add` can be stale, the value `add` returned cannot.
#[test]
fn settle_acts_on_the_class_its_rmw_saw() {
    only_the_old_way_goes_wrong(settle_with_a_stale_return);
}

/// `goes_wrong(true)` (the old protocol) fails in some interleaving loom
/// explores, so the model can catch the race; `goes_wrong(false)` (the
/// protocol as it is) in none.
fn only_the_old_way_goes_wrong(goes_wrong: fn(bool) -> bool) {
    assert!(
        goes_wrong(true),
        "loom found no interleaving that loses the old protocol"
    );
    assert!(!goes_wrong(false));
}

/// A settler that saw a floating page of class 0 lists it (unfloats)
/// while another thread retires that page, reactivates it for class 1 and
/// floats it again. Returns whether, in some interleaving, the settler
/// lists the page under the wrong class or nobody settles it: with
/// `blind`, the old unfloat (a `fetch_and` whose winner listed the page
/// under the class it had read before), else `PageDesc::unfloat`.
fn unfloat_goes_wrong(blind: bool) -> bool {
    in_some_interleaving(move || {
        let d = Arc::new(PageDesc::new());
        d.activate(0, 1);
        d.float(); // floating, all free: listed or retired next
        let other = {
            let d = d.clone();
            thread::spawn(move || {
                let retired = d.try_retire(0, 1, true);
                if retired {
                    d.activate(1, 1);
                    d.take(1);
                    d.float();
                }
                retired
            })
        };
        let listed = if blind {
            use cuheap_core::sync::Ordering;
            let won = d
                .avail
                .fetch_and(!cuheap_core::page::FLOAT, Ordering::AcqRel)
                & cuheap_core::page::FLOAT
                != 0;
            won.then_some(0)
        } else {
            d.unfloat()
        };
        let retired = other.join().unwrap();
        let right = if retired {
            listed != Some(0)
        } else {
            listed == Some(0)
        };
        !right
    })
}

#[test]
fn unfloat_lists_a_page_under_the_class_it_serves() {
    only_the_old_way_goes_wrong(unfloat_goes_wrong);
}

/// A retired page: a stale reserver takes from it and gives back, a
/// settler's unfloat finds bit 40 set by that negative transient (clears
/// it and adds it back), and the page is activated meanwhile. Whatever the
/// interleaving, the activation returns with the page live (without its
/// wait for the settler's add, it could return with the page reading as
/// retired, and an installer would drop it), and everything ends live,
/// unfloated and all free.
#[test]
fn activation_waits_for_an_unfloat_that_put_bit_40_back() {
    loom::model(|| {
        let d = Arc::new(PageDesc::new());
        let reserver = {
            let d = d.clone();
            thread::spawn(move || {
                d.take(3);
                d.add(3);
            })
        };
        let settler = {
            let d = d.clone();
            thread::spawn(move || d.unfloat())
        };
        d.activate(1, 4);
        assert!(
            d.now().live,
            "activation returned on a page that reads as retired"
        );
        assert_eq!(settler.join().unwrap(), None, "the page never floated");
        reserver.join().unwrap();
        let end = d.now();
        assert!(
            end.live && !end.floating && end.free == 4 && end.class == 2,
            "{end:?}"
        );
    });
}

/// Two threads claiming pages from a two-page map get different pages.
#[test]
fn page_map_claims_are_exclusive() {
    loom::model(|| {
        let words = Arc::new(vec![AtomicU32::new(0)]);
        let full = Arc::new(vec![AtomicU32::new(0), AtomicU32::new(0)]);
        let ts: Vec<_> = (0..2)
            .map(|i| {
                let (words, full) = (words.clone(), full.clone());
                thread::spawn(move || PageMap::new(&words, &full).claim_one(i, 2))
            })
            .collect();
        let r: Vec<_> = ts.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(r[0].is_some() && r[1].is_some() && r[0] != r[1]);
    });
}

/// A span growing in place (claiming the page after it, all or none, as
/// `realloc` does) races an allocation of a run over the same pages: each
/// page has one owner, and a failed growth leaves nothing claimed.
#[test]
fn span_growth_and_claims_are_exclusive() {
    loom::model(|| {
        // Page 0 is the span; pages 1 and 2 are free.
        let words = Arc::new(vec![AtomicU32::new(0b001)]);
        let full = Arc::new(vec![AtomicU32::new(0), AtomicU32::new(0)]);
        let other = {
            let (words, full) = (words.clone(), full.clone());
            thread::spawn(move || PageMap::new(&words, &full).claim_run(2, 3, 1))
        };
        let grew = PageMap::new(&words, &full).try_claim(1, 2).is_ok();
        let got = other.join().unwrap();
        assert!(grew != got.is_some(), "both or neither got pages 1..3");
        use cuheap_core::sync::Ordering;
        assert_eq!(
            words[0].load(Ordering::Relaxed),
            0b111,
            "a claim left half done"
        );
    });
}

/// The page map's summaries under a claim racing a release in one word:
/// from either side of full, and from a release that empties the word
/// while the claim takes a page of it. Whatever the interleaving, once
/// both are done the summaries never call the word full unless it is (a
/// stale "full" would hide free pages for good) nor empty unless it is (a
/// stale "empty" would send searches to pages in use for good).
#[test]
fn the_page_map_summary_is_exact_after_racing_claims_and_releases() {
    use cuheap_core::sync::Ordering;
    for start in [u32::MAX >> 1, u32::MAX, 1] {
        loom::model(move || {
            // Page 31 is the word's last free page (a claim fills the
            // word), or the word is full and known to be, or page 0 is
            // its only page in use (the release empties the word).
            let words = Arc::new(vec![AtomicU32::new(start)]);
            let full = Arc::new(vec![
                AtomicU32::new((start == u32::MAX) as u32),
                AtomicU32::new(1),
            ]);
            let claim = {
                let (words, full) = (words.clone(), full.clone());
                thread::spawn(move || {
                    let m = PageMap::new(&words, &full);
                    // Page 31 if free, else page 0 once the release is in.
                    m.claim_one(0, 32)
                })
            };
            let m = PageMap::new(&words, &full);
            m.release_run(0, 1);
            let got = claim.join().unwrap();
            let word = words[0].load(Ordering::Relaxed);
            assert_eq!(got.is_some(), start != u32::MAX || word == u32::MAX);
            assert!(m.summary_is_exact(), "word {word:#x}, summary stale");
        });
    }
}

/// A heap shrinking while an allocation runs: page 0 is in use, page 1
/// free; the allocator reads the page limit (2), then claims a page
/// below what it read; the shrinking owner takes page 1 away and unmaps
/// it if it found it free. With `fence`, the owner claims page 1 in the
/// page map itself (the protocol of `Heap::fence`); without, it lowers
/// the limit and then checks the page map (the protocol it replaced).
/// Returns whether any interleaving handed page 1 to the allocator after
/// the owner decided to unmap it.
fn shrink_can_unmap_a_claimed_page(fence: bool) -> bool {
    use cuheap_core::sync::Ordering;
    in_some_interleaving(move || {
        let words = Arc::new(vec![AtomicU32::new(0b01)]);
        let full = Arc::new(vec![AtomicU32::new(0), AtomicU32::new(0)]);
        let limit = Arc::new(AtomicU32::new(2));
        let alloc = {
            let (words, full, limit) = (words.clone(), full.clone(), limit.clone());
            thread::spawn(move || {
                let l = limit.load(Ordering::Acquire);
                PageMap::new(&words, &full).claim_one(0, l)
            })
        };
        let map = PageMap::new(&words, &full);
        let unmapped = if fence {
            map.try_claim(1, 1).is_ok()
        } else {
            limit.store(1, Ordering::Release);
            !map.is_set(1)
        };
        let got = alloc.join().unwrap();
        unmapped && got == Some(1)
    })
}

/// The trim race: lowering the limit and then checking loses to an
/// allocation that read the old limit; fencing the pages never does.
#[test]
fn fencing_closes_the_shrink_race() {
    assert!(
        shrink_can_unmap_a_claimed_page(false),
        "loom found no interleaving that loses the old protocol"
    );
    assert!(!shrink_can_unmap_a_claimed_page(true));
}

/// The last-resort scan (`Heap::reserve_by_scan_or_fail`) racing the
/// retirement of the class's one page, all of whose blocks are free
/// (`try_retire`, then `Heap::release_units` and `Heap::end_release`):
/// the scan reads the count of ended releases, searches the page map (one
/// bit here), then scans the descriptor until nothing is in transit. It
/// must find the page's free blocks, or the units in the page map, or
/// see the retirement end (and then find the units, as the caller's next
/// search does); never report the class exhausted. `wait_retired`: a
/// page whose count reads retired while its `kind` still names the class
/// is in transit; `wait_release`: so is a release begun and not ended;
/// `count_first`: the count of ended releases is read before the search
/// of the page map (else after it). Returns whether some interleaving
/// reports exhaustion.
fn a_scan_can_miss_a_retirement(wait_retired: bool, wait_release: bool, count_first: bool) -> bool {
    use cuheap_core::page::KIND_FREE;
    use cuheap_core::sync::Ordering;
    in_some_interleaving(move || {
        let d = Arc::new(PageDesc::new());
        d.activate(0, 1);
        let units_back = Arc::new(AtomicU32::new(0));
        let begun = Arc::new(AtomicU64::new(0));
        let ended = Arc::new(AtomicU64::new(0));
        let retirer = {
            let (d, units_back) = (d.clone(), units_back.clone());
            let (begun, ended) = (begun.clone(), ended.clone());
            thread::spawn(move || {
                assert!(d.try_retire(0, 1, false));
                begun.fetch_add(1, Ordering::Relaxed);
                d.kind.store(KIND_FREE, Ordering::Release);
                units_back.store(1, Ordering::Release);
                ended.fetch_add(1, Ordering::Release);
            })
        };
        let mut before = ended.load(Ordering::Acquire);
        let exhausted = 'scan: {
            if units_back.load(Ordering::Acquire) == 1 {
                break 'scan false;
            }
            if !count_first {
                before = ended.load(Ordering::Acquire);
            }
            loop {
                let mut transit = false;
                if d.kind.load(Ordering::Acquire) == 1 {
                    let a = d.now();
                    if a.live && a.free > 0 {
                        break 'scan false;
                    }
                    transit = wait_retired && !a.live;
                }
                if !transit && wait_release {
                    let e = ended.load(Ordering::Acquire);
                    transit = begun.load(Ordering::Acquire) != e;
                }
                if !transit {
                    break;
                }
                thread::yield_now();
            }
            if ended.load(Ordering::Acquire) != before {
                assert_eq!(units_back.load(Ordering::Acquire), 1, "units back");
                break 'scan false;
            }
            true
        };
        retirer.join().unwrap();
        exhausted
    })
}

/// Each part closes one window of the retirement: without any one of
/// them, some interleaving reports the class exhausted; with all three,
/// none does.
#[test]
fn a_scan_waits_out_a_retirement() {
    each_part_closes_a_window(
        a_scan_can_miss_a_retirement,
        [
            "the wait for a retired page",
            "the wait for a release",
            "the count read before the search",
        ],
    );
}

/// A span's search on a host heap without an index (`Heap::try_span`,
/// then `Heap::search_after_claims`) racing a scavenge that retires the
/// one class page whose unit the span needs, all of whose blocks are free
/// (`Heap::try_retire`, `Heap::release_units`, `Heap::end_release`). The
/// search's own scavenge (`scavenge_near`) tries to retire the page too;
/// once the other's CAS has won (the search's load or CAS reads the page
/// retired), the search claims the unit (one bit), finds it taken, waits
/// while a release reads begun and not ended, and claims again if the
/// count of ended releases moved. Its search of the page map reads no
/// descriptor: the count is all it has. It must get the unit, never
/// report exhaustion. `count_before_cas`: the release is counted as begun
/// before the retiring CAS of a page that reads as retirable, the count
/// taken back if the CAS fails (else after the CAS, as `release_units`
/// counted it before); `count_first`: the count of ended releases read
/// before the scavenge and the claim (else after the claim). The search's
/// acquire fence after its claims is modelled as the code makes it
/// (`search_after_claims`; loom finds no interleaving of this model that
/// loses without it, so it is not a part here). Returns whether some
/// interleaving reports exhaustion.
fn a_span_search_can_miss_a_retirement(count_before_cas: bool, count_first: bool) -> bool {
    use cuheap_core::sync::{acquire_fence, Ordering};
    in_some_interleaving(move || {
        let d = Arc::new(PageDesc::new());
        d.activate(0, 1);
        // Bit 0: the page's unit, taken while the page is a class page.
        let word = Arc::new(AtomicU32::new(1));
        let begun = Arc::new(AtomicU64::new(0));
        let ended = Arc::new(AtomicU64::new(0));
        // A scavenge's retirement of the page; whether its CAS won.
        let retire = move |d: &PageDesc, word: &AtomicU32, begun: &AtomicU64, ended: &AtomicU64| {
            if count_before_cas {
                // Only a page that reads as retirable is tried.
                if !d.retirable(0, 1, false) {
                    return false;
                }
                begun.fetch_add(1, Ordering::Relaxed);
            }
            if !d.try_retire(0, 1, false) {
                if count_before_cas {
                    begun.fetch_sub(1, Ordering::Relaxed);
                }
                return false;
            }
            if !count_before_cas {
                begun.fetch_add(1, Ordering::Relaxed);
            }
            word.fetch_and(!1, Ordering::Release);
            ended.fetch_add(1, Ordering::Release);
            true
        };
        let retirer = {
            let (d, word) = (d.clone(), word.clone());
            let (begun, ended) = (begun.clone(), ended.clone());
            thread::spawn(move || {
                retire(&d, &word, &begun, &ended);
            })
        };
        let mut before = ended.load(Ordering::Acquire);
        let exhausted = 'search: {
            if retire(&d, &word, &begun, &ended) {
                break 'search false; // its own scavenge freed the unit
            }
            if word.load(Ordering::Relaxed) & 1 == 0 {
                break 'search false;
            }
            if !count_first {
                before = ended.load(Ordering::Acquire);
            }
            acquire_fence();
            loop {
                let e = ended.load(Ordering::Acquire);
                if begun.load(Ordering::Acquire) == e {
                    break;
                }
                thread::yield_now();
            }
            if ended.load(Ordering::Acquire) != before {
                assert_eq!(word.load(Ordering::Relaxed) & 1, 0, "the unit is back");
                break 'search false;
            }
            true
        };
        retirer.join().unwrap();
        exhausted
    })
}

/// Each part closes one window of a span's search racing a retirement:
/// without either, some interleaving reports exhaustion; with both, none
/// does.
#[test]
fn a_span_search_waits_out_a_retirement() {
    assert!(
        a_span_search_can_miss_a_retirement(false, true),
        "loom found no interleaving that loses with the release counted after the retiring CAS"
    );
    assert!(
        a_span_search_can_miss_a_retirement(true, false),
        "loom found no interleaving that loses with the count read after the search"
    );
    assert!(!a_span_search_can_miss_a_retirement(true, true));
}

/// Asserts that `loses`, a model of three parts each on or off, reports
/// a loss in some interleaving with any one part off and in none with
/// all three on; `parts` names them for the messages.
fn each_part_closes_a_window(loses: fn(bool, bool, bool) -> bool, parts: [&str; 3]) {
    for (off, part) in parts.iter().enumerate() {
        let on = |k: usize| k != off;
        assert!(
            loses(on(0), on(1), on(2)),
            "loom found no interleaving that loses without {part}"
        );
    }
    assert!(!loses(true, true, true));
}

/// The last-resort scan racing the activation of the one free page for
/// the scanning class (`Heap::claim_units`, then `Heap::activate`): the
/// scanner's search of the page map finds the page taken (had it found it
/// free, it would have claimed it), then scans the descriptor until
/// nothing is in transit. It must find the page's free blocks once the
/// activation has ended; never report the class exhausted. `count`: the
/// claim is counted as begun before its `fetch_or` (as a counting view of
/// the map claims, `PageMap::counting`) and the scan waits while begun
/// differs from ended; `fence`: an acquire fence after the search;
/// `ended_first`: each pass reads the count of ended activations before
/// it looks at the descriptor (else after). Returns whether some
/// interleaving reports exhaustion.
///
/// The claim is written out, without the relaxed load of the word that
/// precedes the map's `fetch_or`: with that load, loom 0.7 explores no
/// interleaving in which the other thread reads the word after the
/// `fetch_or`, so a reader without the fence would go unchecked.
fn a_scan_can_miss_an_activation(count: bool, fence: bool, ended_first: bool) -> bool {
    use cuheap_core::sync::{acquire_fence, Ordering};
    in_some_interleaving(move || {
        // Page 0 free; the word's other pages past the limit (1).
        let word = Arc::new(AtomicU32::new(!1));
        let d = Arc::new(PageDesc::new());
        let begun = Arc::new(AtomicU64::new(0));
        let ended = Arc::new(AtomicU64::new(0));
        let activator = {
            let (word, d) = (word.clone(), d.clone());
            let (begun, ended) = (begun.clone(), ended.clone());
            thread::spawn(move || {
                if count {
                    begun.fetch_add(1, Ordering::Relaxed);
                }
                if word.fetch_or(1, Ordering::AcqRel) & 1 == 0 {
                    d.activate(0, 1);
                    ended.fetch_add(1, Ordering::Release);
                } else if count {
                    begun.fetch_sub(1, Ordering::Relaxed);
                }
            })
        };
        let exhausted = 'scan: {
            if word.load(Ordering::Relaxed) & 1 == 0 {
                break 'scan false;
            }
            if fence {
                acquire_fence();
            }
            loop {
                let mut activated = ended.load(Ordering::Acquire);
                let mut transit = false;
                if d.kind.load(Ordering::Acquire) == 1 {
                    let a = d.now();
                    if a.live && a.free > 0 {
                        break 'scan false;
                    }
                    transit = !a.live;
                }
                if !ended_first {
                    activated = ended.load(Ordering::Acquire);
                }
                if count {
                    transit |= begun.load(Ordering::Acquire) != activated;
                }
                if !transit {
                    break;
                }
                thread::yield_now();
            }
            true
        };
        activator.join().unwrap();
        exhausted
    })
}

/// Each part closes one window of the activation: without any one of
/// them, some interleaving reports the class exhausted; with all three,
/// none does.
#[test]
fn a_scan_waits_out_an_activation() {
    each_part_closes_a_window(
        a_scan_can_miss_an_activation,
        [
            "the count",
            "the fence",
            "the count of ended read before the pass",
        ],
    );
}

/// The last-resort path racing a claim of two units that collides (the
/// page map's `try_claim` through a counting view): the claimer counts
/// its claim as begun, takes unit 0, finds unit 1 taken (by a claim that
/// keeps it), gives unit 0 back and takes its count back. The scanner
/// read the count of claims given back before its search; its search
/// finds unit 0 taken; after an acquire fence it waits while a claim is
/// counted as begun and not ended, then searches again if the count of
/// claims given back moved. It must end with unit 0 (free again once the
/// claim is over), never report exhaustion. `given`: the claimer counts
/// the give-back (`claims_given_back`); `release`: it takes its count
/// back with a release; `given_first`: it counts the give-back before it
/// takes its count back (else after). Returns whether some interleaving
/// reports exhaustion. Written out as `a_scan_can_miss_an_activation` is.
fn a_search_can_miss_a_give_back(given: bool, release: bool, given_first: bool) -> bool {
    use cuheap_core::sync::{acquire_fence, Ordering};
    in_some_interleaving(move || {
        // Unit 0 free; unit 1 (and the rest of the word) taken for good.
        let word = Arc::new(AtomicU32::new(!1));
        let begun = Arc::new(AtomicU64::new(0));
        let given_back = Arc::new(AtomicU64::new(0));
        let claimer = {
            let (word, begun, given_back) = (word.clone(), begun.clone(), given_back.clone());
            thread::spawn(move || {
                let count_given = || {
                    if given {
                        given_back.fetch_add(1, Ordering::Release);
                    }
                };
                begun.fetch_add(1, Ordering::Relaxed);
                let old = word.fetch_or(0b11, Ordering::AcqRel);
                assert_ne!(old & 0b10, 0, "unit 1 is taken");
                word.fetch_and(!(0b11 & !old), Ordering::Release);
                if given_first {
                    count_given();
                }
                let order = if release {
                    Ordering::Release
                } else {
                    Ordering::Relaxed
                };
                begun.fetch_sub(1, order);
                if !given_first {
                    count_given();
                }
            })
        };
        let returned = given_back.load(Ordering::Acquire);
        let exhausted = 'search: {
            if word.load(Ordering::Relaxed) & 1 == 0 {
                break 'search false; // unit 0 found free
            }
            acquire_fence();
            // No activation ends here: the ended count stays 0.
            while begun.load(Ordering::Acquire) != 0 {
                thread::yield_now();
            }
            given_back.load(Ordering::Acquire) == returned || word.load(Ordering::Relaxed) & 1 != 0
        };
        claimer.join().unwrap();
        exhausted
    })
}

/// Each part closes one window of a claim that gives back units: without
/// any one of them, some interleaving reports exhaustion; with all
/// three, none does.
#[test]
fn a_search_sees_units_a_colliding_claim_gave_back() {
    each_part_closes_a_window(
        a_search_can_miss_a_give_back,
        [
            "the count of claims given back",
            "the release that takes the count back",
            "the give-back counted before the count is taken back",
        ],
    );
}

/// On a map with an index of free runs, claims and releases change the
/// words, the summaries and the heap's counts with loads and stores under
/// the index's lock (no read-modify-write). Two threads, one claiming a
/// span that fills the word and one giving back the only class page in
/// use before claiming another, leave the summaries, the index and the
/// counts exact: no update of one is lost to the other's.
#[test]
fn indexed_claims_and_releases_keep_summaries_and_counts_exact() {
    use cuheap_core::run_index::RunIndex;
    use cuheap_core::sync::Ordering;
    use cuheap_core::{Counters, Tally};
    let pages = 32;
    let mut builder = loom::model::Builder::new();
    // The lock's holder makes dozens of loads and stores: a bound on
    // preemptions keeps the model to the interleavings that matter
    // (either thread inside the lock while the other waits or runs).
    builder.preemption_bound = Some(2);
    // Every load and store is a branch: the index alone is hundreds of
    // words.
    builder.max_branches = 100_000;
    builder.check(move || {
        let words = Arc::new(vec![AtomicU32::new(0)]);
        let summary = Arc::new(vec![AtomicU32::new(0), AtomicU32::new(0)]);
        let cells: Arc<Vec<AtomicU32>> = Arc::new(
            (0..RunIndex::words(pages))
                .map(|_| AtomicU32::new(0))
                .collect(),
        );
        let counters = Arc::new(Counters::new());
        let view = |what| {
            PageMap::new(&words, &summary)
                .with_runs(RunIndex::new(&cells, pages))
                .tallying(&counters, what)
        };
        view(Tally::ClassPage).rebuild_runs(pages);
        // Page 0: a class page in use; pages 1..32 free.
        assert_eq!(view(Tally::ClassPage).claim_one(0, pages), Some(0));
        let span = {
            let (words, summary, cells, counters) = (
                words.clone(),
                summary.clone(),
                cells.clone(),
                counters.clone(),
            );
            thread::spawn(move || {
                PageMap::new(&words, &summary)
                    .with_runs(RunIndex::new(&cells, pages))
                    .tallying(&counters, Tally::Span)
                    .claim_best(31, 0, pages)
            })
        };
        let class = view(Tally::ClassPage);
        class.release_run(0, 1);
        let again = class.claim_one(0, pages);
        let got = span.join().unwrap();
        // Either the span took pages 1..32 and the class page 0 again, or
        // the span took 0..31 after the release and the class page 31.
        assert!(got.is_some() && again.is_some());
        assert_eq!(words[0].load(Ordering::Relaxed), u32::MAX);
        let m = view(Tally::ClassPage);
        assert!(m.summary_is_exact() && m.runs_are_exact(pages));
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        assert_eq!(get(&counters.units_taken), 32);
        assert_eq!(get(&counters.span_pages), 31);
        assert_eq!(get(&counters.spans_allocated), 1);
        assert!(get(&counters.units_peak) >= 32);
    });
}

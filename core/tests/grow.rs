//! Growth while allocating: host threads stand in for a kernel's threads
//! and one more thread for the host service that raises the page limit
//! (the GPU does the same on `cuheap-host`'s service). Blocks are filled
//! and checked, so an overlap or a page handed out twice shows.
#![cfg(not(loom))]

use cuheap_core::heap::GrowHost;
use cuheap_core::size_class::{class_of, page_units, PAGE_SIZE};
use cuheap_core::{AllocError, Heap, OwnedHeap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Instant;

/// The CPU side of the protocol: the doorbell is an `AtomicU64`.
struct Cpu {
    start: Instant,
}

impl GrowHost for Cpu {
    fn ring(&self, bell: u64, ticket: u64) {
        // SAFETY: the tests publish the address of a live `AtomicU64`.
        unsafe { &*(bell as usize as *const AtomicU64) }.store(ticket, Ordering::SeqCst);
    }
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
    fn pause(&self, _round: u32) {
        std::thread::yield_now();
    }
}

/// A host service: answers each ring by raising the limit to the ask (at
/// least doubling it), up to `cap` pages; refuses past that.
struct Service<'a> {
    bell: &'a AtomicU64,
    stop: &'a AtomicBool,
    cap: u32,
}

impl Service<'_> {
    fn run(&self, heap: &Heap<'_, u64>) -> u32 {
        let c = heap.counters();
        let (mut seen, mut grown) = (0, 0);
        while !self.stop.load(Ordering::Acquire) {
            let t = self.bell.load(Ordering::SeqCst);
            if t == seen {
                std::thread::yield_now();
                continue;
            }
            seen = t;
            let want = c.grow_want.load(Ordering::SeqCst);
            let limit = heap.limit() as u64;
            if want <= limit {
                continue;
            }
            if limit >= self.cap as u64 {
                c.grow_cap.store(limit, Ordering::SeqCst);
                c.grow_want.store(limit, Ordering::SeqCst);
                c.grow_rung.store(limit, Ordering::SeqCst);
                c.grow_refusals.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            let to = want.max(limit * 2).min(self.cap as u64);
            // The floor of the step, as `cuheap-host`'s service writes it.
            c.grow_floor.store(limit, Ordering::SeqCst);
            heap.set_limit(to as u32);
            grown += 1;
        }
        grown
    }
}

/// Makes `bell` the heap's doorbell, as a host service publishes its
/// own: the heap may grow from now on.
fn publish_bell(heap: &Heap<'_, u64>, bell: &AtomicU64) {
    heap.counters()
        .grow_bell
        .store(bell as *const AtomicU64 as u64, Ordering::SeqCst);
}

/// How a thread allocates on a heap that may grow.
#[derive(Clone, Copy)]
enum Way {
    /// On its own (`alloc_growing`), as a GPU thread's slow path does.
    Alone,
    /// As a warp's group does on the GPU (`warp_alloc`, class sizes; spans
    /// go alone): search; after a failure, wait for growth as one
    /// (`await_growth`) and search again; after 64 waits, or when waiting
    /// cannot help, go on alone (or to the fallback, on a heap that cannot
    /// grow).
    Group,
}

fn alloc(
    heap: &Heap<'_, u64>,
    way: Way,
    size: usize,
    slot: u32,
    host: &Cpu,
) -> Result<*mut u8, AllocError> {
    if let (Way::Group, Some(class)) = (way, class_of(size)) {
        // As `warp_alloc` does with its leader's `reserve`.
        let mut deferred = false;
        for _ in 0..=64 {
            deferred = match heap.reserve(class, 1, slot) {
                Ok(mut g) => {
                    let run = heap.claim(&mut g);
                    return Ok(heap.run_addr(&run, class, 0));
                }
                Err(e) => e == AllocError::Growing,
            };
            if !heap.await_growth(page_units(class), deferred, host) {
                break;
            }
        }
        // The kernel's lanes then go on alone while the heap may grow, or
        // after a search that left pages to growth; else to the fallback.
        if !heap.may_grow() && !deferred {
            return heap.alloc_fallback(size, class, slot);
        }
    }
    heap.alloc_growing(size, 16, slot, host)
}

/// `threads` threads each allocate `per_thread` blocks of mixed sizes
/// (spans included) on a heap that starts at 4 pages and may grow to
/// `cap`. Returns (blocks allocated, failures, growth steps, requests).
fn run(threads: usize, per_thread: usize, cap: u32, way: Way) -> (usize, u64, u32, u64) {
    let owned = OwnedHeap::<u64>::new(1024, 8).unwrap();
    let heap = owned.heap();
    heap.set_limit(4);
    let bell = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    publish_bell(&heap, &bell);
    let barrier = Barrier::new(threads);
    let service = Service {
        bell: &bell,
        stop: &stop,
        cap,
    };
    let (got, steps) = std::thread::scope(|sc| {
        let svc = sc.spawn(|| service.run(&owned.heap()));
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (owned, barrier) = (&owned, &barrier);
                sc.spawn(move || {
                    let heap = owned.heap();
                    let host = Cpu {
                        start: Instant::now(),
                    };
                    let id = t as u8 + 1;
                    let mut live = Vec::new();
                    barrier.wait();
                    for i in 0..per_thread {
                        let size = match i % 50 {
                            49 => PAGE_SIZE + 100, // a two-page span
                            k => 16 << (k % 6 + t % 3),
                        };
                        if let Ok(p) = alloc(&heap, way, size, t as u32, &host) {
                            let n = size.min(512);
                            // SAFETY: a fresh block of at least `size` bytes.
                            unsafe { p.write_bytes(id, n) };
                            live.push((p as usize, n));
                        }
                    }
                    for &(p, n) in &live {
                        // SAFETY: this thread's live block, filled above.
                        let b = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
                        assert!(b.iter().all(|&x| x == id), "block {p:#x} overwritten");
                    }
                    live
                })
            })
            .collect();
        let live: Vec<_> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        stop.store(true, Ordering::Release);
        (live, svc.join().unwrap())
    });
    let s = heap.stats();
    assert_eq!(s.failed_allocs as usize, threads * per_thread - got.len());
    // Every wait was answered (a refusal answers too): none timed out.
    assert_eq!(s.grow_timeouts, 0, "{s:?}");
    // Threads waited for each step the host took.
    assert!(s.grow_waits >= steps as u64, "{s:?}, {steps} steps");
    for (p, _) in &got {
        heap.free(*p as *mut u8, 0).unwrap();
    }
    heap.check_invariants().unwrap();
    assert!(heap.stats().is_empty());
    (got.len(), s.failed_allocs, steps, s.grow_requests)
}

#[test]
fn threads_grow_the_heap_from_4_pages_and_every_block_checks() {
    for way in [Way::Alone, Way::Group] {
        let (got, failed, steps, requests) = run(8, 2000, 1024, way);
        assert_eq!((got, failed), (16_000, 0));
        // Geometric steps: 4 pages to what 16,000 blocks need in a few
        // steps, and about one request per step, not one per thread.
        assert!((3..=10).contains(&steps), "{steps} steps");
        assert!(requests <= 4 * steps as u64 + 16, "{requests} requests");
    }
}

#[test]
fn a_refusing_host_fails_the_rest_counted_and_nothing_hangs() {
    for way in [Way::Alone, Way::Group] {
        let (got, failed, _, requests) = run(8, 2000, 64, way);
        assert!(got > 0 && failed > 0, "{got} blocks, {failed} failed");
        // After the refusal the heap stops asking: a handful of requests,
        // not one per failed allocation.
        assert!(requests < 64, "{requests} requests for {failed} failures");
    }
}

#[test]
fn without_a_service_a_short_heap_fails_at_once() {
    let owned = OwnedHeap::<u64>::new(64, 1).unwrap();
    let heap = owned.heap();
    heap.set_limit(1);
    let host = Cpu {
        start: Instant::now(),
    };
    let a = heap.alloc_growing(PAGE_SIZE, 16, 0, &host).unwrap();
    assert_eq!(
        heap.alloc_growing(PAGE_SIZE, 16, 0, &host),
        Err(AllocError::OutOfMemory)
    );
    let s = heap.stats();
    assert_eq!(
        (s.failed_allocs, s.failed_bytes, s.grow_requests),
        (1, PAGE_SIZE as u64, 0)
    );
    heap.free(a, 0).unwrap();
}

/// Pages freed below the last growth step's floor serve a served heap
/// before it asks for more: a span and a class page both find them, and
/// nothing is asked or rung.
#[test]
fn pages_freed_below_the_floor_serve_before_an_ask() {
    let owned = OwnedHeap::<u64>::new(64, 1).unwrap();
    let heap = owned.heap();
    let bell = AtomicU64::new(0);
    publish_bell(&heap, &bell);
    let c = heap.counters();
    // Pages 0..8 were there before the last step, 8..16 came with it.
    heap.set_limit(16);
    c.grow_floor.store(8, Ordering::SeqCst);
    // Two-page spans: the first four fill the step, the next four 0..8.
    let spans: Vec<*mut u8> = (0..8)
        .map(|_| heap.alloc(PAGE_SIZE + 1, 0).unwrap())
        .collect();
    // The four below the floor are freed; the floor is the step's again.
    for &p in &spans[4..] {
        heap.free(p, 0).unwrap();
    }
    c.grow_floor.store(8, Ordering::SeqCst);
    let span = heap.alloc(PAGE_SIZE + 1, 0).unwrap();
    c.grow_floor.store(8, Ordering::SeqCst);
    let block = heap.alloc(1024, 0).unwrap();
    assert!(
        c.grow_want.load(Ordering::SeqCst) <= 16,
        "asked with pages free"
    );
    assert_eq!(bell.load(Ordering::SeqCst), 0, "rang with pages free");
    assert_eq!(heap.stats().failed_allocs, 0);
    for p in spans[..4].iter().copied().chain([span, block]) {
        heap.free(p, 0).unwrap();
    }
    heap.check_invariants().unwrap();
    assert!(heap.stats().is_empty());
}

/// How the far-page test reaches a heap that cannot grow any more.
#[derive(Clone, Copy, Debug)]
enum Then {
    /// The near page serves at once.
    Near,
    /// The host refuses the thread's own ask (`alloc_growing`).
    RefusedAlone,
    /// The host refuses the group's ask (`await_growth`, then a search).
    RefusedGroup,
    /// Another thread's refusal capped the heap before the group waits:
    /// it searches once more.
    CappedGroup,
    /// The same, for a group whose lanes go on alone (its wait ended for
    /// another reason).
    CappedAlone,
    /// A span (one page), whose host refuses.
    SpanRefused,
}

/// A heap that can grow retires the empty pages parked near the asking
/// slot before it grows, but not those of far slots (under a running
/// kernel a scavenge of every slot took milliseconds): it asks for more
/// instead. Once it cannot grow (refused, however the thread learns it),
/// the next search retires them too, and the allocation is served.
#[test]
fn far_parked_pages_serve_only_once_the_heap_cannot_grow() {
    let cases = [
        (1, Then::Near),
        (5, Then::RefusedAlone),
        (5, Then::RefusedGroup),
        (5, Then::CappedGroup),
        (5, Then::CappedAlone),
        (5, Then::SpanRefused),
    ];
    for (parked_on, then) in cases {
        let owned = OwnedHeap::<u64>::new(64, 8).unwrap();
        let heap = owned.heap();
        let bell = AtomicU64::new(0);
        publish_bell(&heap, &bell);
        let c = heap.counters();
        // One page, held empty as a slot's current page of 64 B blocks
        // (two, of 64 and 128 B blocks, for a two-page span).
        let parked: &[usize] = match then {
            Then::SpanRefused => &[64, 128],
            _ => &[64],
        };
        heap.set_limit(parked.len() as u32);
        for &size in parked {
            let p = heap.alloc(size, parked_on).unwrap();
            heap.free(p, parked_on).unwrap();
        }
        let pages = parked.len() as u64;
        // A 256 B block (or a span) on slot 0 needs a page: it asks for
        // more, and a page parked on a neighbour (slot 1) serves it at once.
        let size = match then {
            Then::SpanRefused => PAGE_SIZE + 1,
            _ => 256,
        };
        // As a warp's leader searches (`reserve`), a span as `alloc`.
        let got = match class_of(size) {
            Some(class) => heap.reserve(class, 1, 0).map(|mut g| {
                let run = heap.claim(&mut g);
                heap.run_addr(&run, class, 0)
            }),
            None => heap.try_alloc_aligned(size, 16, 0),
        };
        assert!(
            c.grow_want.load(Ordering::SeqCst) > pages,
            "{then:?}: no ask"
        );
        let host = Cpu {
            start: Instant::now(),
        };
        let block = match then {
            Then::Near => got.unwrap(),
            _ => {
                // The far page (slot 5) stays parked: left to growth.
                let left = match then {
                    Then::SpanRefused => AllocError::OutOfMemory,
                    _ => AllocError::Growing,
                };
                assert_eq!(got, Err(left), "{then:?}");
                assert_eq!(c.pages_retired.load(Ordering::SeqCst), 0, "{then:?}");
                if let Then::CappedGroup | Then::CappedAlone = then {
                    // The search above left pages to growth; now the heap
                    // cannot grow. The group searches once more (and one
                    // whose search was full does not), and that search, as
                    // any search now, retires every slot's parked pages.
                    c.grow_cap.store(1, Ordering::SeqCst);
                    let block = match then {
                        Then::CappedGroup => {
                            // The search above left pages to growth.
                            assert!(heap.await_growth(1, true, &host), "no search again");
                            assert!(!heap.await_growth(1, false, &host));
                            heap.try_alloc_aligned(256, 16, 0)
                        }
                        // Its lanes go on alone: one more search.
                        _ => heap.alloc_growing(256, 16, 0, &host),
                    };
                    let block = block.unwrap_or_else(|e| panic!("{then:?}: {e:?}"));
                    assert_eq!(c.pages_retired.load(Ordering::SeqCst), 1);
                    heap.free(block, 0).unwrap();
                    heap.check_invariants().unwrap();
                    assert!(heap.stats().is_empty());
                    continue;
                }
                let stop = AtomicBool::new(false);
                let service = Service {
                    bell: &bell,
                    stop: &stop,
                    cap: pages as u32,
                };
                let way = match then {
                    Then::RefusedGroup => Way::Group,
                    _ => Way::Alone,
                };
                std::thread::scope(|sc| {
                    let svc = sc.spawn(|| service.run(&owned.heap()));
                    let block = alloc(&heap, way, size, 0, &host);
                    stop.store(true, Ordering::Release);
                    assert_eq!(svc.join().unwrap(), 0, "grew past its cap");
                    block
                })
                .unwrap_or_else(|e| panic!("{then:?}: {e:?}"))
            }
        };
        assert_eq!(c.pages_retired.load(Ordering::SeqCst), pages, "{then:?}");
        assert_eq!(heap.stats().failed_allocs, 0, "{then:?}");
        heap.free(block, 0).unwrap();
        heap.check_invariants().unwrap();
        assert!(heap.stats().is_empty());
    }
}

/// A host that never answers (it is held up), on a clock that jumps a
/// tenth of the timeout at each reading.
struct HeldUp {
    now: AtomicU64,
}

impl GrowHost for HeldUp {
    fn ring(&self, bell: u64, ticket: u64) {
        Cpu {
            start: Instant::now(),
        }
        .ring(bell, ticket)
    }
    fn now_ns(&self) -> u64 {
        self.now
            .fetch_add(cuheap_core::heap::GROW_TIMEOUT_NS / 10, Ordering::Relaxed)
    }
    fn pause(&self, _round: u32) {
        std::thread::yield_now();
    }
}

/// Once a wait at a limit has timed out, the other threads short at that
/// limit give up at once instead of each waiting out the timeout: a
/// held-up host costs a kernel one timeout, not one per wave of threads.
/// A new limit ends it, and the next ask waits again.
#[test]
fn after_a_timeout_the_threads_short_at_that_limit_give_up_at_once() {
    // 4 KiB blocks take pages of 16 units: a limit of 4 serves none.
    let owned = OwnedHeap::<u64>::new(128, 8).unwrap();
    let heap = owned.heap();
    heap.set_limit(4);
    let bell = AtomicU64::new(0);
    publish_bell(&heap, &bell);
    let host = HeldUp {
        now: AtomicU64::new(0),
    };
    let (threads, per_thread) = (8, 200);
    let failed: u64 = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (heap, host) = (&heap, &host);
                sc.spawn(move || {
                    (0..per_thread)
                        .filter(|_| heap.alloc_growing(4096, 16, t, host).is_err())
                        .count() as u64
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    let s = heap.stats();
    assert_eq!(failed, threads as u64 * per_thread, "a limit of 4 units");
    // At most one timeout per thread that was already waiting.
    assert!(s.grow_timeouts <= threads as u64, "{s:?}");
    assert!(s.grow_waits <= threads as u64, "{s:?}");
    // A new limit: the heap serves up to it, and the next ask waits
    // again (and times out again).
    heap.set_limit(64);
    let before = heap.stats().grow_timeouts;
    let mut got = Vec::new();
    while let Ok(p) = heap.alloc_growing(4096, 16, 0, &host) {
        got.push(p);
    }
    assert!(!got.is_empty());
    let s = heap.stats();
    assert_eq!(s.grow_timeouts, before + 1);
    // Emptied and back at the limit of 4 (where a trim brings it): with
    // the word still naming 4's timeout, an ask there gives up unasked,
    // which is why the host's trim clears the word; cleared, the ask
    // waits (and times out) again.
    for p in got {
        heap.free(p, 0).unwrap();
    }
    heap.set_limit(4);
    heap.counters().grow_stalled.store(5, Ordering::Relaxed);
    assert!(heap.alloc_growing(4096, 16, 0, &host).is_err());
    assert_eq!(heap.stats().grow_waits, s.grow_waits, "gave up unasked");
    heap.counters().grow_stalled.store(0, Ordering::Relaxed);
    assert!(heap.alloc_growing(4096, 16, 0, &host).is_err());
    let t = heap.stats();
    assert_eq!(
        (t.grow_waits, t.grow_timeouts),
        (s.grow_waits + 1, s.grow_timeouts + 1)
    );
}

//! The pool's logic on the CPU, over [`HostBackend`]: host memory standing
//! in for the device, with unmapped memory poisoned and every stream's
//! waits recorded. No GPU needed.

use cuheap_host::backend::host_memory::{Recorded, POISON};
use cuheap_host::snapshot::{Holder, PageRun};
use cuheap_host::trace::Action;
use cuheap_host::{
    read_trace, DeviceBuffer, Error, HostBackend, HostStream, Logged, Pool, PoolConfig, Resource,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

mod common;
use common::{host_pool, pool, KIB, MIB};

/// Fills `len` bytes at `ptr` with a pattern of `seed`; the error names
/// the address if any byte is unmapped.
fn fill(pool: &Pool<HostBackend>, ptr: u64, len: usize, seed: u64) -> Result<(), Error> {
    let bytes: Vec<u8> = (0..len).map(|i| (seed as usize * 31 + i) as u8).collect();
    pool.backend().write(ptr, &bytes)
}

/// Checks the pattern [`fill`] wrote.
fn check(pool: &Pool<HostBackend>, ptr: u64, len: usize, seed: u64) -> Result<(), String> {
    let mut got = vec![0u8; len];
    pool.backend()
        .read(ptr, &mut got)
        .map_err(|e| e.to_string())?;
    match (0..len).find(|&i| got[i] != (seed as usize * 31 + i) as u8) {
        None => Ok(()),
        Some(i) => Err(format!(
            "block {ptr:#x} byte {i}: {:#x} (poison is {POISON:#x})",
            got[i]
        )),
    }
}

/// The race a trim must not lose. Threads allocate batches of blocks,
/// fill them, check them, free them and hand them back to the heap
/// (`release_stream`), so pages are claimed and retired all the time,
/// while another thread trims the pool to nothing, again and again, on
/// one-page chunks. A trim that unmapped a page an allocation had just
/// claimed makes that allocation's fill or check fail (unmapped or
/// poisoned memory).
///
/// The run is cut into phases. Between phases every thread is idle and the
/// trimmer shrinks the pool as far as it goes (so each phase starts by
/// growing it again under concurrent trims); during a phase it trims
/// without pause.
#[test]
fn trim_never_unmaps_a_live_block() {
    const THREADS: usize = 4;
    const PHASES: usize = 20;
    const ROUNDS: u64 = 15;
    const BATCH: u64 = 24;
    let pool = pool(64 * MIB, 64 * KIB, usize::MAX);
    let barrier = Arc::new(std::sync::Barrier::new(THREADS + 1));
    let active = Arc::new(AtomicU64::new(0));
    let trimmer = {
        let (pool, barrier, active) = (pool.clone(), barrier.clone(), active.clone());
        // Never panics (the workers would wait at the barrier for ever):
        // errors are returned.
        std::thread::spawn(move || -> Result<u64, String> {
            let mut concurrent = 0;
            let mut failure = None;
            let trim = |failure: &mut Option<String>| {
                let unmaps = pool.backend().counts().unmaps;
                if let Err(e) = pool.trim(0) {
                    failure.get_or_insert(e.to_string());
                }
                pool.backend().counts().unmaps - unmaps
            };
            for _ in 0..PHASES {
                barrier.wait(); // every thread idle, every block freed
                trim(&mut failure);
                active.store(THREADS as u64, Ordering::SeqCst);
                barrier.wait();
                while active.load(Ordering::SeqCst) > 0 {
                    concurrent += trim(&mut failure);
                }
            }
            failure.map_or(Ok(concurrent), Err)
        })
    };
    let workers: Vec<_> = (0..THREADS as u64)
        .map(|t| {
            let (pool, barrier, active) = (pool.clone(), barrier.clone(), active.clone());
            std::thread::spawn(move || -> Result<u64, String> {
                let mut done = 0;
                let mut failure = None;
                for phase in 0..PHASES as u64 {
                    barrier.wait();
                    barrier.wait();
                    if failure.is_none() {
                        match rounds(&pool, t, phase) {
                            Ok(n) => done += n,
                            Err(e) => failure = Some(e),
                        }
                    }
                    active.fetch_sub(1, Ordering::SeqCst);
                }
                failure.map_or(Ok(done), Err)
            })
        })
        .collect();
    /// One phase of one thread: `ROUNDS` batches.
    fn rounds(pool: &Pool<HostBackend>, t: u64, phase: u64) -> Result<u64, String> {
        let mut done = 0;
        for round in 0..ROUNDS {
            let s = HostStream::new();
            let mut live = Vec::new();
            for i in 0..BATCH {
                // Class blocks of several sizes, and a span of pages.
                let size = if i == 0 { 96 * KIB } else { 256 << (i % 8) };
                let p = pool.alloc(size, &s).map_err(|e| e.to_string())?;
                let seed = t << 48 | phase << 32 | round << 16 | i;
                fill(pool, p, size, seed).map_err(|e| format!("fill: {e}"))?;
                live.push((p, size, seed));
            }
            std::thread::yield_now();
            for (p, size, seed) in live {
                check(pool, p, size, seed)?;
                pool.free(p, &s).map_err(|e| e.to_string())?;
                done += 1;
            }
            pool.release_stream(&s).map_err(|e| e.to_string())?;
        }
        Ok(done)
    }
    let results: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let concurrent = trimmer.join().unwrap().unwrap();
    for r in &results {
        assert_eq!(
            r.as_ref().map_err(String::clone),
            Ok(&(PHASES as u64 * ROUNDS * BATCH)),
            "{results:?}"
        );
    }
    let s = pool.stats();
    let n = THREADS as u64 * PHASES as u64 * ROUNDS * BATCH;
    assert_eq!((s.in_use, s.allocs, s.frees, s.bad_frees), (0, n, n, 0));
    // How hard the race was run: chunks unmapped while threads allocated.
    println!("{concurrent} chunks unmapped under load");
    assert!(
        concurrent > 0,
        "no trim unmapped memory while threads allocated"
    );
}

/// The trim race, forced: an allocation that read the page limit before a
/// trim began claims a page with that stale limit between the trim's
/// decision to unmap a chunk and the unmap itself (the backend's unmap
/// hook runs in that gap). The trim must have taken the chunk's pages out
/// of the page map first, so the stale claim gets none of them, and every
/// page it can get is still mapped afterwards.
#[test]
fn a_stale_allocation_cannot_claim_a_page_being_unmapped() {
    use cuheap_core::page_map::PageMap;
    use cuheap_core::run_index::RunIndex;
    use cuheap_core::sync::AtomicU32;
    use cuheap_core::{Layout, PAGE_SIZE};
    use std::sync::Mutex;
    let pool = pool(64 * MIB, 64 * KIB, usize::MAX);
    let s = HostStream::new();
    // Map 8 chunks (one page each), then free everything.
    let p = pool.alloc(8 * 64 * KIB, &s).unwrap();
    pool.free(p, &s).unwrap();
    let h = pool.heap_handle();
    let base = h.data;
    let pages = pool.stats().reserved / PAGE_SIZE;
    assert!(pages >= 8, "{pages} pages mapped");
    let claimed = Arc::new(Mutex::new(Vec::new()));
    {
        let claimed = claimed.clone();
        pool.backend().on_unmap(move |at, _| {
            let l = Layout::new(h.page_count, h.slots);
            // SAFETY: the pool's page map, its summary and its index of
            // free runs at these offsets of its live host metadata, used
            // only atomically.
            let (words, full, runs) = unsafe {
                let at = (h.meta as usize + l.page_map) as *const AtomicU32;
                let n = PageMap::words(h.page_count);
                let runs = (h.meta as usize + l.meta_bytes) as *const AtomicU32;
                (
                    std::slice::from_raw_parts(at, n),
                    std::slice::from_raw_parts(at.add(n), PageMap::summary_words(h.page_count)),
                    std::slice::from_raw_parts(runs, RunIndex::words(h.page_count)),
                )
            };
            let page = ((at - base) as usize / PAGE_SIZE) as u32;
            let map = PageMap::new(words, full).with_runs(RunIndex::new(runs, h.page_count));
            // The limit this allocation read: before the trim, all mapped.
            // From the chunk being unmapped up (an indexed map takes the
            // lowest free page above the floor, whatever the hint).
            if let Some(q) = map.claim_one_within(page, page, pages as u32) {
                claimed.lock().unwrap().push(q);
            }
        });
    }
    let kept = pool.trim(0).unwrap();
    // The pool's drop unmaps too, after its metadata is gone: no hook then.
    pool.backend().on_unmap(|_, _| {});
    assert!(kept < pages * PAGE_SIZE, "trim unmapped nothing");
    for &q in claimed.lock().unwrap().iter() {
        let addr = base + (q as usize * PAGE_SIZE) as u64;
        assert!(
            pool.backend().write(addr, &[1u8; 64]).is_ok(),
            "page {q} was handed out while its memory was unmapped"
        );
    }
}

#[test]
fn same_stream_reuse_is_immediate_and_waits_for_nothing() {
    let pool = pool(64 * MIB, 2 * MIB, usize::MAX);
    let s = HostStream::new();
    let a = pool.alloc(1000, &s).unwrap();
    s.enqueue();
    pool.free(a, &s).unwrap();
    assert_eq!(pool.alloc(1000, &s).unwrap(), a);
    assert!(s.waits().is_empty());
    let st = pool.stats();
    assert_eq!((st.same_stream_reuse, st.cross_stream_reuse), (1, 0));
    assert_eq!(st.in_use, 1024);
}

/// With the heap full, a block freed on stream A goes to stream B only
/// with B waiting, on the device, for A's work up to the free.
#[test]
fn cross_stream_reuse_waits_for_the_freeing_stream() {
    let pool = pool(2 * MIB, 2 * MIB, 2 * MIB);
    let (a, b) = (HostStream::new(), HostStream::new());
    let mut held = Vec::new();
    while let Ok(p) = pool.alloc(64 * KIB, &a) {
        held.push(p);
    }
    assert_eq!(held.len(), 32, "2 MiB of 64 KiB blocks");
    let freed = held.pop().unwrap();
    a.hold();
    a.enqueue(); // a kernel on A still using the block
    let work_at_free = a.enqueue();
    pool.free(freed, &a).unwrap();
    let got = pool.alloc(64 * KIB, &b).unwrap();
    assert_eq!(got, freed);
    assert_eq!(
        b.waits(),
        vec![Recorded {
            stream: a.id(),
            work: work_at_free
        }]
    );
    assert_eq!(pool.stats().cross_stream_reuse, 1);
    a.finish();
    // Nothing left anywhere: out of memory, said with the numbers.
    match pool.alloc(64 * KIB, &b) {
        Err(Error::PoolExhausted {
            requested,
            reserved,
            in_use,
            limit,
            ..
        }) => assert_eq!(
            (requested, reserved, in_use, limit),
            (64 * KIB, 2 * MIB, 2 * MIB, 2 * MIB)
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn grows_on_demand_and_trims_back() {
    let pool = pool(256 * MIB, 2 * MIB, usize::MAX);
    let s = HostStream::new();
    assert_eq!(pool.stats().reserved, 2 * MIB);
    let blocks: Vec<u64> = (0..100).map(|_| pool.alloc(MIB, &s).unwrap()).collect();
    for (i, &p) in blocks.iter().enumerate() {
        fill(&pool, p, MIB, i as u64).unwrap();
    }
    let st = pool.stats();
    assert!(st.reserved >= 100 * MIB && st.grows > 1, "{st:?}");
    assert_eq!(st.in_use, 100 * MIB);
    for (i, &p) in blocks.iter().enumerate() {
        check(&pool, p, MIB, i as u64).unwrap();
    }
    // Trim keeps what is in use: the first block stays mapped.
    for &p in &blocks[1..] {
        pool.free(p, &s).unwrap();
    }
    let syncs = pool.backend().counts().event_syncs;
    let kept = pool.trim(0).unwrap();
    assert!(
        pool.backend().counts().event_syncs > syncs,
        "trim waited for the stream"
    );
    assert!(kept < 10 * MIB, "kept {kept} bytes");
    check(&pool, blocks[0], MIB, 0).unwrap();
    pool.free(blocks[0], &s).unwrap();
    assert_eq!(pool.trim(0).unwrap(), 2 * MIB);
    assert_eq!(pool.backend().mapped(), 2 * MIB);
    assert_eq!(pool.backend().physical(), 2 * MIB);
    // And it grows again.
    let p = pool.alloc(50 * MIB, &s).unwrap();
    fill(&pool, p, 50 * MIB, 7).unwrap();
    check(&pool, p, 50 * MIB, 7).unwrap();
}

#[test]
fn out_of_device_memory_is_an_error_and_the_pool_recovers() {
    // 256 MiB of address space, but only 8 MiB of memory on the "device".
    let pool = pool(256 * MIB, 2 * MIB, 8 * MIB);
    let s = HostStream::new();
    let mut held = Vec::new();
    let err = loop {
        match pool.alloc(MIB, &s) {
            Ok(p) => held.push(p),
            Err(e) => break e,
        }
    };
    // Spans start at a per-thread hint in the heap, so one 1 MiB span's
    // worth may be lost to placement; every byte mapped is still counted.
    let n = held.len();
    assert!((7..=8).contains(&n), "{n} MiB served from 8 MiB");
    match &err {
        Error::PoolExhausted {
            requested,
            reserved,
            in_use,
            cached,
            ..
        } => assert_eq!(
            (*requested, *reserved, *in_use, *cached),
            (MIB, 8 * MIB, n * MIB, 0)
        ),
        e => panic!("{e:?}"),
    }
    assert!(err.to_string().contains("trim()"), "{err}");
    // Freed on another stream: the pool flushes caches before failing.
    let other = HostStream::new();
    for p in held.drain(..4) {
        pool.free(p, &other).unwrap();
    }
    for _ in 0..4 {
        held.push(pool.alloc(MIB, &s).unwrap());
    }
    for p in held {
        pool.free(p, &s).unwrap();
    }
    assert_eq!(pool.stats().in_use, 0);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let pool = pool(64 * MIB, 2 * MIB, usize::MAX);
    let s = HostStream::new();
    assert!(matches!(pool.alloc(0, &s), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        pool.alloc(usize::MAX, &s),
        Err(Error::PoolExhausted { .. })
    ));
    assert!(matches!(
        pool.alloc(65 * MIB, &s),
        Err(Error::PoolExhausted { .. })
    ));
    let p = pool.alloc(4096, &s).unwrap();
    let span = pool.alloc(3 * MIB, &s).unwrap();
    for bad in [1, p + 256, span + 64 * KIB as u64, u64::MAX] {
        assert!(pool.free(bad, &s).is_err(), "{bad:#x}");
    }
    // As `cudaFree(NULL)`: nothing to do, and no error.
    pool.free(0, &s).unwrap();
    pool.free_after(0, &[&s]).unwrap();
    assert!(pool.free_after(p, &[]).is_err(), "no stream to free after");
    pool.free(p, &s).unwrap();
    assert!(pool.free(p, &s).is_err(), "double free");
    pool.free(span, &s).unwrap();
    assert!(pool.free(span, &s).is_err(), "double free of a span");
    let st = pool.stats();
    assert_eq!((st.bad_frees, st.allocs, st.frees, st.in_use), (6, 2, 2, 0));
}

#[test]
fn threads_with_their_own_streams_keep_their_blocks_apart() {
    let pool = pool(512 * MIB, 4 * MIB, usize::MAX);
    let workers: Vec<_> = (0..8u64)
        .map(|t| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let s = HostStream::new();
                let mut live = Vec::new();
                for i in 0..1_500u64 {
                    let size = 256 + ((t * 7919 + i * 104_729) % (64 * KIB as u64)) as usize;
                    let p = pool.alloc(size, &s).unwrap();
                    fill(&pool, p, size, t << 32 | i).unwrap();
                    live.push((p, size, t << 32 | i));
                    if i % 3 == 2 {
                        let (p, size, seed) = live.swap_remove((i as usize * 13) % live.len());
                        check(&pool, p, size, seed).unwrap();
                        pool.free(p, &s).unwrap();
                    }
                }
                for (p, size, seed) in live {
                    check(&pool, p, size, seed).unwrap();
                    pool.free(p, &s).unwrap();
                }
                pool.release_stream(&s).unwrap();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let st = pool.stats();
    assert_eq!(
        (st.allocs, st.frees, st.in_use, st.bad_frees),
        (12_000, 12_000, 0, 0)
    );
    assert!(
        st.cached_per_stream.is_empty(),
        "released streams are forgotten"
    );
    assert!(st.peak_in_use > 0);
}

#[test]
fn buffers_copy_in_stream_order_and_check_bounds() {
    let pool = pool(64 * MIB, 2 * MIB, usize::MAX);
    let s = HostStream::new();
    let data: Vec<u32> = (0..10_000).collect();
    let buf = DeviceBuffer::from_host(&pool, &data, &s).unwrap();
    assert_eq!(buf.to_vec().unwrap(), data);
    assert_eq!(
        s.work(),
        2,
        "one copy in, one copy out, on the buffer's stream"
    );
    let mut small = [0u32; 4];
    buf.copy_to_host(&mut small).unwrap();
    assert_eq!(small, [0, 1, 2, 3]);
    assert!(buf.copy_from_host(&vec![0u32; 10_001]).is_err());
    assert!(DeviceBuffer::<u64, _>::new(&pool, usize::MAX, &s).is_err());
    drop(buf);
    assert_eq!(pool.stats().in_use, 0);
}

#[test]
fn a_logged_pool_writes_rows_that_read_back() {
    let pool = pool(64 * MIB, 2 * MIB, usize::MAX);
    let path = std::env::temp_dir().join(format!("cuheap-logic-{}.csv", std::process::id()));
    let logged = Logged::to_file(pool, &path).unwrap();
    let s = HostStream::new();
    let a = logged.allocate(1000, &s).unwrap();
    let b = logged.allocate(5 * MIB, &s).unwrap();
    logged.deallocate(a, &s).unwrap();
    assert!(logged.allocate(0, &s).is_err());
    assert!(logged.deallocate(a, &s).is_err());
    logged.deallocate(b, &s).unwrap();
    drop(logged);
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        text.starts_with("Thread,Time,Action,Pointer,Size,Stream\n"),
        "{text}"
    );
    let rows = read_trace(&text).unwrap();
    let got: Vec<(Action, u64, usize)> = rows.iter().map(|r| (r.action, r.ptr, r.size)).collect();
    assert_eq!(
        got,
        vec![
            (Action::Allocate, a, 1000),
            (Action::Allocate, b, 5 * MIB),
            (Action::Free, a, 1000),
            (Action::AllocateFailure, 0, 0),
            (Action::Free, b, 5 * MIB),
        ]
    );
    assert!(rows.iter().all(|r| r.stream == s.id() as u64));
}

/// Writes (or, with `verify`, checks) `seed`'s pattern over a block: all of
/// it up to 64 KiB, else 256 bytes at the start of every 64 KiB page and
/// at the end, so that any two overlapping blocks share a written byte.
fn mark(
    pool: &Pool<HostBackend>,
    ptr: u64,
    len: usize,
    seed: u64,
    verify: bool,
) -> Result<(), String> {
    let piece = if len <= 64 * KIB { len } else { 256 };
    let mut at: Vec<usize> = (0..len).step_by(64 * KIB).collect();
    if at.last().is_some_and(|&last| len - piece >= last + piece) {
        at.push(len - piece);
    }
    for off in at {
        let (p, n, s) = (ptr + off as u64, piece.min(len - off), seed ^ off as u64);
        if verify {
            check(pool, p, n, s)?;
        } else {
            fill(pool, p, n, s).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// A new user's workload: eight threads with their own streams allocate
/// blocks of 256 B to 4 MiB (log-uniform), fill them and hand them to the
/// next thread, which checks and frees them on its own stream; 20,000
/// blocks in all. No block overlaps another, and the memory the pool maps
/// stays within a bound of the peak in use (the blocks freed on one stream
/// and needed on another go back to the heap, where spans of different
/// sizes coalesce, instead of the pool growing).
#[test]
fn blocks_handed_between_threads_keep_memory_close_to_the_peak_in_use() {
    const THREADS: usize = 8;
    const BLOCKS: usize = 20_000 / THREADS;
    let pool = pool(4096 * MIB, 2 * MIB, usize::MAX);
    let live = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| std::sync::mpsc::sync_channel::<(u64, usize, u64)>(16))
        .unzip();
    let workers: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(t, rx)| {
            let (pool, live, peak) = (pool.clone(), live.clone(), peak.clone());
            let next = senders[(t + 1) % THREADS].clone();
            std::thread::spawn(move || -> Result<(), String> {
                let s = HostStream::new();
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                let (mut sent, mut received) = (0, 0);
                let take = |rx: &std::sync::mpsc::Receiver<(u64, usize, u64)>,
                            block: bool|
                 -> Result<bool, String> {
                    let got = if block {
                        rx.recv().ok()
                    } else {
                        rx.try_recv().ok()
                    };
                    let Some((p, len, seed)) = got else {
                        return Ok(false);
                    };
                    mark(&pool, p, len, seed, true)?;
                    let bytes = pool.size_of(p).map_err(|e| e.to_string())? as u64;
                    s.enqueue(); // the check's kernel
                    pool.free(p, &s).map_err(|e| e.to_string())?;
                    live.fetch_sub(bytes, Ordering::SeqCst);
                    Ok(true)
                };
                while sent < BLOCKS {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    // 2^8 .. 2^22 bytes, log-uniform.
                    let len = (256.0 * (2f64).powf((rng >> 11) as f64 / (1u64 << 53) as f64 * 14.0))
                        as usize;
                    let p = pool.alloc(len, &s).map_err(|e| e.to_string())?;
                    let bytes = pool.size_of(p).map_err(|e| e.to_string())? as u64;
                    let now = live.fetch_add(bytes, Ordering::SeqCst) + bytes;
                    peak.fetch_max(now, Ordering::SeqCst);
                    let seed = (t as u64) << 32 | sent as u64;
                    mark(&pool, p, len, seed, false)?;
                    s.enqueue(); // the fill's kernel
                                 // Never block on a full channel: the next thread may be
                                 // waiting on ours.
                    let mut item = (p, len, seed);
                    loop {
                        match next.try_send(item) {
                            Ok(()) => break,
                            Err(std::sync::mpsc::TrySendError::Full(back)) => item = back,
                            Err(e) => return Err(e.to_string()),
                        }
                        while take(&rx, false)? {
                            received += 1;
                        }
                        std::thread::yield_now();
                    }
                    sent += 1;
                    while take(&rx, false)? {
                        received += 1;
                    }
                }
                drop(next);
                while received < BLOCKS && take(&rx, true)? {
                    received += 1;
                }
                Ok(())
            })
        })
        .collect();
    drop(senders);
    let results: Vec<Result<(), String>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    // The first thread to fail closes its channel and fails the others.
    if let Some(e) = results
        .iter()
        .flat_map(|r| r.as_ref().err())
        .min_by_key(|e| e.contains("closed"))
    {
        panic!("{e}");
    }
    let st = pool.stats();
    let peak = peak.load(Ordering::SeqCst) as usize;
    assert_eq!(
        (st.allocs, st.frees, st.in_use, st.bad_frees),
        (20_000, 20_000, 0, 0)
    );
    let ratio = st.reserved as f64 / peak as f64;
    println!(
        "mapped {} MiB for a peak of {} MiB in use: {ratio:.2}x ({} grows, {} retires)",
        st.reserved / MIB,
        peak / MIB,
        st.grows,
        st.retires
    );
    // The ratio depends on how the threads interleave: 2.0-2.8x in
    // runs on 2 to 16 cores (the pool once mapped 14.6x here). The bound
    // holds whatever the interleaving and still catches that regression.
    assert!(ratio <= 3.2, "{ratio:.2}x: {st:?}");
}

/// Blocks allocated on one stream and freed on another are counted on two
/// caches; the pool's sampled peak still follows what is in use. Before
/// caches folded their counts by bytes too, allocations of 3 MiB on A and
/// frees on B sampled a peak of 192 MiB (A folded 64 allocations first),
/// and 100 blocks of 1 MiB alive at once sampled 64 MiB (the last 36 were
/// never folded before their frees). Each of the caches involved (A's,
/// B's and the thread's caches of both) leaves a few MiB unfolded at most
/// (2 MiB or twice a block for a stream's, its bound and a block for a
/// thread's), hence the bounds.
#[test]
fn the_peak_in_use_follows_blocks_freed_on_another_stream() {
    for len in [3 * MIB, 512 * KIB] {
        let pool = pool(1024 * MIB, 2 * MIB, usize::MAX);
        let (a, b) = (HostStream::new(), HostStream::new());
        for _ in 0..1000 {
            let p = pool.alloc(len, &a).unwrap();
            pool.free(p, &b).unwrap();
        }
        let st = pool.stats();
        assert!(
            st.peak_in_use >= len && st.peak_in_use <= len + 8 * MIB,
            "{len} bytes alive at most: sampled peak {}",
            st.peak_in_use
        );
        let live: Vec<u64> = (0..100).map(|_| pool.alloc(MIB, &a).unwrap()).collect();
        for p in live {
            pool.free(p, &b).unwrap();
        }
        let st = pool.stats();
        assert!(
            st.peak_in_use >= 92 * MIB && st.peak_in_use <= 108 * MIB,
            "100 MiB alive at most: sampled peak {}",
            st.peak_in_use
        );
        assert_eq!(st.in_use, 0);
    }
}

/// Blocks the heap serves (no cache holds their size) are counted in the
/// thread's cache; its count still folds at once past a few MiB, so the
/// sampled peak follows blocks allocated on one stream and freed on
/// another even when no growth folds the caches on the way.
#[test]
fn the_peak_follows_blocks_the_heap_served_with_no_growth() {
    for len in [MIB, 512 * KIB] {
        let pool = pool(1024 * MIB, 256 * MIB, usize::MAX);
        let (a, b) = (HostStream::new(), HostStream::new());
        let live: Vec<u64> = (0..60).map(|_| pool.alloc(len, &a).unwrap()).collect();
        for p in live {
            pool.free(p, &b).unwrap();
        }
        let st = pool.stats();
        assert_eq!(st.grows, 1, "the first mapping only: {st:?}");
        let want = 60 * len;
        assert!(
            st.peak_in_use + 4 * MIB >= want && st.peak_in_use <= want + 8 * MIB,
            "{want} bytes alive at most: sampled peak {}",
            st.peak_in_use
        );
    }
}

/// The pool's bound on cached bytes holds for a stream whose allocations
/// the heap serves: every so many calls the pool checks it and sheds.
#[test]
fn the_cache_bound_holds_while_the_heap_serves_a_stream() {
    let cfg = PoolConfig {
        initial: 256 * MIB,
        chunk: 2 * MIB,
        cache_limit: 16 * MIB,
        ..PoolConfig::new(1024 * MIB)
    };
    let pool = host_pool(cfg);
    let a = HostStream::new();
    let big: Vec<u64> = (0..16).map(|_| pool.alloc(4 * MIB, &a).unwrap()).collect();
    for p in big {
        pool.free(p, &a).unwrap();
    }
    let small: Vec<u64> = (0..1000).map(|_| pool.alloc(256, &a).unwrap()).collect();
    let st = pool.stats();
    assert!(
        st.cached() <= 16 * MIB + 4 * MIB,
        "{} MiB cached over a bound of 16: {st:?}",
        st.cached() / MIB
    );
    for p in small {
        pool.free(p, &a).unwrap();
    }
}

/// A stream's cached bytes as the pool reports them.
fn cached_on(pool: &Pool<HostBackend>, s: &HostStream) -> usize {
    (pool.stats().cached_per_stream.iter())
        .find(|c| c.0 == s.id())
        .map_or(0, |c| c.1)
}

/// `n` blocks of 2 MiB (past the threads' caches: every call reaches the
/// stream's cache) allocated and freed on `s`, then pairs of one block
/// allocated and freed until `s`'s cache has seen `calls` calls.
fn cache_on(pool: &Pool<HostBackend>, s: &HostStream, n: usize, calls: usize) {
    let blocks: Vec<u64> = (0..n).map(|_| pool.alloc(2 * MIB, s).unwrap()).collect();
    for p in blocks {
        pool.free(p, s).unwrap();
    }
    for _ in 0..calls.saturating_sub(2 * n) / 2 {
        let p = pool.alloc(2 * MIB, s).unwrap();
        pool.free(p, s).unwrap();
    }
}

/// A stream that stops making calls, whose cache is well under every
/// bound, still gives its blocks back to the heap while another stream
/// works: the working stream's cache looks at the idle one now and then
/// and halves it each time. Streams that both work keep their caches.
/// On a pool that checks capture, a stream being captured is passed
/// over (shedding it would record an event into the capture).
#[test]
fn an_idle_streams_cache_goes_back_to_the_heap() {
    for capture_check in [false, true] {
        let cfg = PoolConfig {
            initial: 64 * MIB,
            chunk: 2 * MIB,
            capture_check,
            ..PoolConfig::new(256 * MIB)
        };
        let pool = host_pool(cfg);
        let (a, b) = (HostStream::new(), HostStream::new());
        cache_on(&pool, &a, 8, 64);
        assert_eq!(cached_on(&pool, &a), 16 * MIB);
        // Both at work: neither sheds.
        let retires = pool.stats().retires;
        for _ in 0..64 * 16 {
            for s in [&a, &b] {
                let p = pool.alloc(2 * MIB, s).unwrap();
                pool.free(p, s).unwrap();
            }
        }
        let st = pool.stats();
        assert_eq!(st.retires, retires, "a shed while both worked: {st:?}");
        assert_eq!(cached_on(&pool, &a), 16 * MIB);
        // `a` idle, and being captured: passed over where capture is
        // checked.
        if capture_check {
            a.begin_capture();
            let records = pool.backend().counts().records;
            cache_on(&pool, &b, 1, 64 * 16);
            assert_eq!(cached_on(&pool, &a), 16 * MIB, "shed during a capture");
            assert_eq!(pool.backend().counts().records, records);
            a.end_capture();
        }
        // `a` idle: its cache goes, `b` keeps its own.
        let mapped = pool.stats().reserved;
        cache_on(&pool, &b, 1, 64 * 16);
        assert_eq!(cached_on(&pool, &a), 0, "capture_check {capture_check}");
        assert_eq!(cached_on(&pool, &b), 2 * MIB);
        // Back in the heap, for `b` (with no growth).
        let blocks: Vec<u64> = (0..16).map(|_| pool.alloc(2 * MIB, &b).unwrap()).collect();
        assert_eq!(pool.stats().reserved, mapped);
        for p in blocks {
            pool.free(p, &b).unwrap();
        }
    }
}

/// The looks at idle streams go on when the working stream's calls are
/// counted in its thread's cache: blocks of 64 KiB allocated from the
/// heap on a thread that caches the stream (and freed on another) reach
/// the stream's cache only for the check every 64 of them, and each check
/// still looks at the next other cache.
#[test]
fn a_stream_served_through_its_threads_cache_still_looks_at_idle_ones() {
    let cfg = PoolConfig {
        initial: 64 * MIB,
        chunk: 2 * MIB,
        ..PoolConfig::new(256 * MIB)
    };
    let pool = host_pool(cfg);
    let (a, b, c, d) = (
        HostStream::new(),
        HostStream::new(),
        HostStream::new(),
        HostStream::new(),
    );
    cache_on(&pool, &a, 8, 64);
    cache_on(&pool, &c, 8, 64);
    assert_eq!(cached_on(&pool, &a) + cached_on(&pool, &c), 32 * MIB);
    // The thread gets a cache of `b` (its first allocation on `b` makes
    // it).
    let p = pool.alloc(64 * KIB, &b).unwrap();
    pool.free(p, &b).unwrap();
    let p = pool.alloc(64 * KIB, &b).unwrap();
    pool.free(p, &d).unwrap();
    for _ in 0..64 {
        // Freed on `d`: `b`'s next blocks come from the heap again.
        let blocks: Vec<u64> = (0..64).map(|_| pool.alloc(64 * KIB, &b).unwrap()).collect();
        for p in blocks {
            pool.free(p, &d).unwrap();
        }
    }
    assert_eq!(cached_on(&pool, &a), 0, "a: {:?}", pool.stats());
    assert_eq!(cached_on(&pool, &c), 0, "c: {:?}", pool.stats());
}

/// The bound on all caches together holds with the streams that filled
/// them idle: a stream that finds the total past the bound sheds half of
/// its own cache, then half of each other's until the total is back
/// under, not only its own.
#[test]
fn the_bound_on_all_caches_holds_over_idle_streams() {
    let cfg = PoolConfig {
        initial: 64 * MIB,
        chunk: 2 * MIB,
        cache_limit: 16 * MIB,
        ..PoolConfig::new(256 * MIB)
    };
    let pool = host_pool(cfg);
    let streams: Vec<HostStream> = (0..4).map(|_| HostStream::new()).collect();
    for s in &streams {
        // 12 MiB each, reported at the 64th call.
        cache_on(&pool, s, 6, 64);
        let st = pool.stats();
        assert!(
            st.cached() <= 16 * MIB,
            "{} MiB cached over a bound of 16: {st:?}",
            st.cached() / MIB
        );
    }
}

/// Streams that only the pool still holds are let go without
/// `release_stream`: their caches are retired (their blocks reused once
/// their work is done) and their counters kept.
#[test]
fn dropped_streams_are_forgotten_and_their_blocks_reused() {
    let pool = pool(256 * MIB, 2 * MIB, usize::MAX);
    let mut freed = Vec::new();
    for _ in 0..64 {
        let s = HostStream::new();
        let p = pool.alloc(MIB, &s).unwrap();
        s.enqueue();
        pool.free(p, &s).unwrap();
        freed.push(p);
    }
    // A new stream makes the pool sweep: at most the last stream (which the
    // thread's hint may still name) is left.
    let s = HostStream::new();
    let p = pool.alloc(4096, &s).unwrap();
    let st = pool.stats();
    assert!(
        st.cached_per_stream.len() <= 2,
        "{:?}",
        st.cached_per_stream
    );
    assert_eq!((st.allocs, st.frees), (65, 64), "counters kept");
    // Each stream's megabyte came back to the heap once the stream was
    // gone, for the next stream: the pool never held 64 of them.
    assert!(st.reserved <= 8 * MIB, "{} MiB mapped", st.reserved / MIB);
    let distinct: std::collections::HashSet<u64> = freed.iter().copied().collect();
    assert!(distinct.len() < 8, "{} distinct blocks", distinct.len());
    assert!(s.waits().is_empty(), "no device wait");
    pool.free(p, &s).unwrap();
    // Nothing was lost on the way: everything trims away.
    assert_eq!(pool.trim(0).unwrap(), 2 * MIB);
}

/// A program that drops streams and then keeps to the streams it has
/// (no new stream, the pool never short) gets the dropped ones' caches
/// back at its next trim: the pool lets go of them there too.
#[test]
fn a_trim_forgets_dropped_streams() {
    let pool = pool(256 * MIB, 2 * MIB, usize::MAX);
    let keep = HostStream::new();
    let q = pool.alloc(4096, &keep).unwrap();
    for _ in 0..16 {
        let s = HostStream::new();
        let p = pool.alloc(MIB, &s).unwrap();
        pool.free(p, &s).unwrap();
    }
    // The last stream was seen before the sweep of a new stream: it is
    // still tracked, and more with it whichever came last.
    assert!(pool.stats().cached_per_stream.len() >= 2);
    pool.trim(usize::MAX).unwrap();
    let st = pool.stats();
    assert_eq!(
        st.cached_per_stream.iter().map(|c| c.0).collect::<Vec<_>>(),
        vec![<HostBackend as cuheap_host::backend::Backend>::stream_id(
            &keep
        )],
        "only the stream still held"
    );
    assert_eq!((st.allocs, st.frees), (17, 16), "counters kept");
    pool.free(q, &keep).unwrap();
}

/// A stream's cache holds at most its bound: past it, the largest blocks
/// go back to the heap behind the stream's guard. The same stream reuses
/// their memory at once, in another size; another stream gets it only
/// ordered after the freeing stream's work (a device-side wait), and with
/// no wait once that work is done.
#[test]
fn a_full_cache_sheds_blocks_that_other_streams_wait_for() {
    let cfg = PoolConfig {
        initial: 2 * MIB,
        chunk: 2 * MIB,
        stream_cache_limit: 8 * MIB,
        ..PoolConfig::new(256 * MIB)
    };
    let pool = host_pool(cfg);
    let (a, b) = (HostStream::new(), HostStream::new());
    let blocks: Vec<u64> = (0..12).map(|_| pool.alloc(MIB, &a).unwrap()).collect();
    a.enqueue();
    a.hold(); // a kernel on A still uses the blocks
    a.enqueue();
    for &p in &blocks {
        pool.free(p, &a).unwrap();
    }
    let freed_at = a.work();
    let st = pool.stats();
    let on_a = st.cached_per_stream.iter().map(|c| c.1).sum::<usize>();
    assert!(on_a <= 8 * MIB, "cache bound kept: {on_a}");
    assert_eq!((st.in_use, st.retired), (0, 0), "shed to the heap");
    assert!(st.retires >= 1);
    // A reuses what it shed at once, in another size (the heap coalesced
    // the 1 MiB blocks), with no wait and no growth.
    let mapped = st.reserved;
    let two = pool.alloc(2 * MIB, &a).unwrap();
    assert!(blocks.iter().any(|&p| p >= two && p < two + 2 * MIB as u64));
    assert_eq!(pool.stats().reserved, mapped, "no growth");
    assert!(a.waits().is_empty());
    pool.free(two, &a).unwrap();
    // B may have that memory only after A's work: a wait on A, on the
    // device, covering the work that used the blocks.
    let c = pool.alloc(4 * MIB, &b).unwrap();
    if blocks.iter().any(|&p| p >= c && p < c + 4 * MIB as u64) {
        assert!(
            b.waits()
                .iter()
                .any(|w| w.stream == a.id() && w.work >= freed_at),
            "reused before A's work, unordered: {:?}",
            b.waits()
        );
    }
    assert_eq!(pool.backend().counts().event_syncs, 0, "no host wait");
    // Once A's work is done, B takes the rest with no wait at all.
    a.finish();
    let waits = b.waits().len();
    let grows = pool.stats().grows;
    let mut got = Vec::new();
    while pool.stats().grows == grows {
        got.push(pool.alloc(MIB, &b).unwrap());
    }
    assert!(got.len() >= 8, "{} MiB before growing", got.len());
    assert_eq!(
        b.waits().len(),
        waits,
        "no wait once A's work is done: {:?}",
        b.waits()
    );
    pool.free(c, &b).unwrap();
    for p in got {
        pool.free(p, &b).unwrap();
    }
}

/// A buffer used on a second stream is not reused, on any stream, before
/// both streams finish the work enqueued before its drop: with the device
/// full, the pool must wait for them on the host first; once they are
/// done, no wait at all.
#[test]
fn a_buffer_used_on_another_stream_waits_for_both() {
    let pool = pool(64 * MIB, 2 * MIB, 2 * MIB);
    let (own, other, third) = (HostStream::new(), HostStream::new(), HostStream::new());
    for finished_first in [false, true] {
        let mut buf = DeviceBuffer::<u8, _>::new(&pool, 2 * MIB, &own).unwrap();
        let ptr = buf.ptr();
        buf.record_stream(&other).unwrap();
        buf.record_stream(&other).unwrap(); // once is enough
        buf.record_stream(&own).unwrap(); // its own stream is always waited for
        other.enqueue();
        other.hold(); // a kernel on the other stream still reads it
        let work = other.enqueue();
        drop(buf);
        assert_eq!(pool.stats().retired, 2 * MIB);
        if finished_first {
            other.finish();
        }
        let syncs = pool.backend().counts().event_syncs;
        // The only 2 MiB of the device are in the buffer.
        let p = pool.alloc(2 * MIB, &third).unwrap();
        assert_eq!(p, ptr);
        let waited = pool.backend().counts().event_syncs > syncs;
        assert_eq!(waited, !finished_first, "host wait only while the work ran");
        assert!(third.waits().is_empty());
        assert!(other.work() >= work);
        other.finish();
        pool.free(p, &third).unwrap();
        pool.trim(0).unwrap();
    }
}

/// Frees deferred past a capture of their own stream, with all caches
/// past their bound: counted at once, and no check sheds the stream's
/// cache (its guard would be recorded into the capture).
#[test]
fn frees_during_a_capture_of_their_stream_record_nothing_into_it() {
    let cfg = PoolConfig {
        initial: 16 * MIB,
        chunk: 2 * MIB,
        capture_check: true,
        cache_limit: 0,
        ..PoolConfig::new(64 * MIB)
    };
    let pool = host_pool(cfg);
    let s = HostStream::new();
    let blocks: Vec<u64> = (0..128)
        .map(|_| pool.alloc(64 * KIB, &s).unwrap())
        .collect();
    // Cached on `s`'s own cache (past the threads' caches), past a bound
    // of 0.
    for p in [
        pool.alloc(2 * MIB, &s).unwrap(),
        pool.alloc(2 * MIB, &s).unwrap(),
    ] {
        pool.free(p, &s).unwrap();
    }
    assert_eq!(pool.stats().cached(), 4 * MIB);
    s.begin_capture();
    let records = pool.backend().counts().records;
    for &p in &blocks {
        pool.free_after_capture(p, &[&s]).unwrap();
    }
    assert_eq!(
        pool.backend().counts().records,
        records,
        "recorded into the capture"
    );
    let st = pool.stats();
    assert_eq!((st.in_use, st.retired), (0, 128 * 64 * KIB), "{st:?}");
    s.end_capture();
    // The next free after the capture frees the deferred ones (each
    // retired behind an event).
    let p = pool.alloc(64 * KIB, &s).unwrap();
    pool.free_after_capture(p, &[&s]).unwrap();
    assert!(pool.backend().counts().records > records + 128);
    assert_eq!(pool.stats().in_use, 0);
}

/// On a pool with `capture_check`, a buffer dropped while a stream it
/// recorded is being captured is not freed into the capture (no event is
/// recorded on the capturing stream): it stays in use until a later call
/// finds the capture over, then waits for both streams as any recorded
/// buffer does. On a graph's pool, `record_stream` of another stream is
/// refused.
#[test]
fn a_recorded_buffer_dropped_during_a_capture_is_freed_after_it() {
    let cfg = PoolConfig {
        initial: 4 * MIB,
        chunk: 2 * MIB,
        capture_check: true,
        ..PoolConfig::new(64 * MIB)
    };
    let pool = Arc::new(host_pool(cfg));
    let (own, other) = (HostStream::new(), HostStream::new());
    let mut buf = DeviceBuffer::<u8, _>::new(&pool, MIB, &own).unwrap();
    let ptr = buf.ptr();
    buf.record_stream(&other).unwrap();
    other.begin_capture();
    let records = pool.backend().counts().records;
    drop(buf);
    assert_eq!(
        pool.backend().counts().records,
        records,
        "nothing recorded into the capture"
    );
    // Freed as far as the caller goes, held by the pool meanwhile.
    assert!(pool.size_of(ptr).is_err());
    assert!(
        pool.free_after_capture(ptr, &[&own, &other]).is_err(),
        "a second free"
    );
    let st = pool.stats();
    assert_eq!(st.bad_frees, 1);
    // Out of use, and held as returning: the snapshot says the same.
    assert_eq!((st.in_use, st.retired), (0, MIB), "{st:?}");
    let snap = pool.snapshot();
    assert_eq!((snap.in_use, snap.retired), (0, MIB));
    let (live, held, _) = snap.page_bytes();
    assert_eq!(live, 0, "pages of live blocks");
    assert!(held >= MIB, "{held} bytes of pages held");
    assert!(
        snap.pages.iter().any(|r| matches!(
            *r,
            PageRun::Span { offset, holder: Holder::Returning, .. }
                if snap.base + offset as u64 == ptr
        )),
        "the block drawn as returning"
    );
    let q = pool.alloc(MIB, &own).unwrap();
    assert_ne!(q, ptr, "handed out during the capture");
    // Still capturing: a reclaim leaves it.
    pool.trim(usize::MAX).unwrap();
    let st = pool.stats();
    assert_eq!(
        (st.in_use, st.retired),
        (MIB, MIB),
        "freed during the capture"
    );
    other.end_capture();
    pool.trim(usize::MAX).unwrap();
    let st = pool.stats();
    assert_eq!(
        (st.in_use, st.retired),
        (MIB, 0),
        "not freed after the capture"
    );
    assert!(
        pool.backend().counts().records >= records + 2,
        "an event on each stream"
    );
    pool.free(q, &own).unwrap();
    // A foreign pointer is refused at once, capture or not.
    other.begin_capture();
    assert!(pool.free_after_capture(0x1234, &[&own, &other]).is_err());
    other.end_capture();
    // A graph's pool serves one stream.
    let gp = Arc::new(graph_pool());
    let mut b = DeviceBuffer::<u8, _>::new(&gp, 4096, &own).unwrap();
    b.record_stream(&own).unwrap();
    let e = b.record_stream(&other).unwrap_err();
    assert!(e.to_string().contains("graph's pool"), "{e}");
}

/// A stream dropped while its work still runs: its cached block goes back
/// to the heap when the pool lets the stream go, and another stream that
/// takes it is ordered after that work (a wait on the device), also after
/// the pool forgot the stream.
#[test]
fn a_dropped_streams_blocks_wait_for_its_running_work() {
    let pool = pool(256 * MIB, 2 * MIB, usize::MAX);
    let s = HostStream::new();
    let sid = s.id();
    let p = pool.alloc(MIB, &s).unwrap();
    s.enqueue();
    s.hold(); // a kernel still reads the block
    let used = s.enqueue();
    pool.free(p, &s).unwrap();
    drop(s); // its work never finishes here
    let t = HostStream::new();
    let got: Vec<u64> = (0..8).map(|_| pool.alloc(MIB, &t).unwrap()).collect();
    assert_eq!(
        pool.stats().cached_per_stream.len(),
        1,
        "the dropped stream is forgotten"
    );
    if got.contains(&p) {
        assert!(
            t.waits().iter().any(|w| w.stream == sid && w.work >= used),
            "reused while the dropped stream's work ran, unordered: {:?}",
            t.waits()
        );
    }
    assert_eq!(pool.backend().counts().event_syncs, 0, "no host wait");
    for q in got {
        pool.free(q, &t).unwrap();
    }
    // Trim unmaps only memory whose work is done: it waits for the
    // forgotten stream's guard on the host first.
    pool.trim(0).unwrap();
    assert!(
        pool.backend().counts().event_syncs > 0,
        "trim waited for the dropped stream"
    );
    assert_eq!(pool.stats().retired, 0);
}

/// A pool of 2 MiB in all (one chunk, mapped at creation) whose stream
/// caches hold at most 64 KiB: what a stream frees past that is shed.
fn two_mib_pool() -> Pool<HostBackend> {
    let cfg = PoolConfig {
        initial: 2 * MIB,
        chunk: 2 * MIB,
        stream_cache_limit: 64 * KIB,
        ..PoolConfig::new(2 * MIB)
    };
    Pool::with_backend(HostBackend::new(64 * KIB, 2 * MIB), cfg).unwrap()
}

/// `n` blocks of `size` bytes allocated on `on`.
fn blocks_of(pool: &Pool<HostBackend>, n: usize, size: usize, on: &HostStream) -> Vec<u64> {
    (0..n).map(|_| pool.alloc(size, on).unwrap()).collect()
}

/// Holds `on`'s work from now on, enqueues a kernel that uses `blocks`,
/// then frees them on `on` (past the cache bound they are shed); returns
/// that kernel's work count.
fn free_under_held_work(pool: &Pool<HostBackend>, on: &HostStream, blocks: &[u64]) -> u64 {
    on.hold();
    let used = on.enqueue();
    for &p in blocks {
        pool.free(p, on).unwrap();
    }
    used
}

/// A pool with a 64 KiB cache bound, 2 MiB of memory in all, and A's work
/// held: what A sheds is the only memory left.
fn full_pool_with_shed_blocks() -> (Arc<Pool<HostBackend>>, HostStream, Vec<u64>, u64) {
    let pool = Arc::new(two_mib_pool());
    let a = HostStream::new();
    let blocks = blocks_of(&pool, 32, 64 * KIB, &a);
    // A kernel on A still uses every block.
    let used = free_under_held_work(&pool, &a, &blocks);
    assert!(pool.stats().retires >= 1, "the cache shed");
    (pool, a, blocks, used)
}

/// Shed memory goes to another stream only with a device-side wait for
/// the shedding stream's work, and to the shedding stream itself at once,
/// in another size.
#[test]
fn shed_memory_reaches_another_stream_only_after_the_shedders_work() {
    let (pool, a, blocks, used) = full_pool_with_shed_blocks();
    // A: a 1 MiB span over its own shed blocks, no wait.
    let big = pool.alloc(MIB, &a).unwrap();
    assert!(blocks.contains(&big));
    assert!(a.waits().is_empty());
    // B: the other half of the memory, after A's work.
    let b = HostStream::new();
    let got = pool.alloc(MIB, &b).unwrap();
    assert!(blocks.contains(&got) && got != big);
    assert_eq!(
        b.waits(),
        vec![Recorded {
            stream: a.id(),
            work: used
        }],
        "B must wait for A's work on the device"
    );
    assert_eq!(pool.backend().counts().event_syncs, 0, "no host wait");
    a.finish();
}

/// A stream that takes memory another stream shed waits for that
/// stream's work on the device once, not per block: afterwards the shed
/// is older than what it has seen. (Size-class pages are packed low, into
/// the memory A shed.)
#[test]
fn a_stream_waits_once_for_memory_another_shed() {
    let pool = pool(256 * MIB, 2 * MIB, usize::MAX);
    let (a, b) = (HostStream::new(), HostStream::new());
    let blocks: Vec<u64> = (0..80).map(|_| pool.alloc(MIB, &a).unwrap()).collect();
    a.hold();
    a.enqueue();
    for p in blocks {
        pool.free(p, &a).unwrap(); // past the cache bound: sheds
    }
    assert!(pool.stats().retires >= 1);
    let mut held = Vec::new();
    for _ in 0..100 {
        held.push(pool.alloc(4 * KIB, &b).unwrap());
    }
    for _ in 0..20 {
        held.push(pool.alloc(MIB, &b).unwrap());
    }
    assert_eq!(
        b.waits(),
        vec![Recorded {
            stream: a.id(),
            work: 1
        }],
        "one device-side wait for A's work"
    );
    assert_eq!(pool.backend().counts().event_syncs, 0, "no host wait");
    a.finish();
}

/// A stream that sheds sees its own guard at once, but only when no other
/// stream's guard is newer than what it has seen: A sheds after B, and a
/// block over both sheds still waits for B's work; once A has waited
/// (and shed again), B's next shed makes it wait again, for B's new work.
#[test]
fn shedding_after_another_stream_still_waits_for_its_shed() {
    let pool = two_mib_pool();
    let (a, b) = (HostStream::new(), HostStream::new());
    // Half of the memory each; each stream's work holds its half.
    let sixteen = |on: &HostStream| blocks_of(&pool, 16, 64 * KIB, on);
    let (on_a, on_b) = (sixteen(&a), sixteen(&b));
    let b_used = free_under_held_work(&pool, &b, &on_b);
    free_under_held_work(&pool, &a, &on_a); // after B's shed
    let retires = pool.stats().retires;
    assert!(retires >= 2, "both caches shed: {retires}");
    let whole = pool.alloc(2 * MIB, &a).unwrap();
    assert_eq!(
        a.waits(),
        vec![Recorded {
            stream: b.id(),
            work: b_used
        }],
        "A's own shed came last, yet B's memory needs B's work"
    );
    // A sheds the whole again: it has seen B's guard, so its own is seen
    // at once. B takes it back (after A's work), holds new work and sheds
    // again: A waits for that new work.
    a.finish();
    pool.free(whole, &a).unwrap();
    let b_used = free_under_held_work(&pool, &b, &sixteen(&b));
    b.enqueue();
    let whole = pool.alloc(2 * MIB, &a).unwrap();
    assert_eq!(
        a.waits().last(),
        Some(&Recorded {
            stream: b.id(),
            work: b_used
        }),
        "B's second shed is newer than what A has seen: {:?}",
        a.waits()
    );
    assert_eq!(pool.backend().counts().event_syncs, 0, "no host wait");
    b.finish();
    pool.free(whole, &a).unwrap();
}

/// A forgotten stream's guard (an orphan, its work still running) keeps
/// a stream that sheds after it from seeing its own guard at once: a
/// block over both sheds waits for the forgotten stream's work.
#[test]
fn shedding_after_a_forgotten_stream_still_waits_for_its_work() {
    let pool = two_mib_pool();
    let (s, t) = (HostStream::new(), HostStream::new());
    let sixteen = |on: &HostStream| blocks_of(&pool, 16, 64 * KIB, on);
    let (on_s, on_t) = (sixteen(&s), sixteen(&t));
    let s_used = free_under_held_work(&pool, &s, &on_s);
    // S's cache shed everything: no host wait, and its guard is an orphan.
    pool.release_stream(&s).unwrap();
    assert_eq!(pool.backend().counts().event_syncs, 0, "no host wait");
    for p in on_t {
        pool.free(p, &t).unwrap(); // T sheds after S was forgotten
    }
    let whole = pool.alloc(2 * MIB, &t).unwrap();
    assert_eq!(
        t.waits(),
        vec![Recorded {
            stream: s.id(),
            work: s_used
        }],
        "T shed after S was forgotten, yet S's memory needs S's work"
    );
    s.finish();
    pool.free(whole, &t).unwrap();
}

/// A pool of 2 MiB chunks, one mapped at first, whose stream caches hold
/// at most 64 KiB (a larger block is shed to the heap at its free).
fn shedding_pool() -> Pool<HostBackend> {
    let cfg = PoolConfig {
        initial: 2 * MIB,
        chunk: 2 * MIB,
        stream_cache_limit: 64 * KIB,
        ..PoolConfig::new(256 * MIB)
    };
    host_pool(cfg)
}

/// Trim unmaps memory that shed blocks were in only once their work is
/// done: a host wait first.
#[test]
fn trim_waits_for_the_work_of_shed_blocks() {
    let pool = shedding_pool();
    let a = HostStream::new();
    let blocks: Vec<u64> = (0..8).map(|_| pool.alloc(MIB, &a).unwrap()).collect();
    a.hold();
    a.enqueue(); // a kernel on A still uses every block
    for p in blocks {
        pool.free(p, &a).unwrap(); // shed at once: past the bound
    }
    assert_eq!(pool.stats().cached(), 0, "all shed to the heap");
    let before = pool.backend().counts().event_syncs;
    let mapped = pool.trim(0).unwrap();
    assert!(mapped < 8 * MIB, "trim unmapped the shed memory: {mapped}");
    assert!(
        pool.backend().counts().event_syncs > before,
        "trim did not wait for A"
    );
}

/// A graph's pool of 1 GiB with 8 MiB mapped up front.
fn graph_pool() -> Pool<HostBackend> {
    Pool::with_backend(
        HostBackend::new(2 * MIB, usize::MAX),
        PoolConfig::for_graph(1 << 30, 8 * MIB),
    )
    .unwrap()
}

/// What a captured stream may see: a pool made with
/// `PoolConfig::for_graph`, used from one stream, records, waits for and
/// queries no event and never waits on the host, while blocks freed
/// during the capture serve later allocations (same addresses) and the
/// pool grows. The same calls on an ordinary pool (bounded caches) do
/// record events: the setting is what keeps the capture valid.
#[test]
fn a_graph_pool_on_one_stream_touches_no_event() {
    let run = |cfg: PoolConfig| {
        let pool = Pool::with_backend(HostBackend::new(2 * MIB, usize::MAX), cfg).unwrap();
        let s = HostStream::new();
        let before = pool.backend().counts();
        let mut live = Vec::new();
        let mut reused = 0;
        for round in 0..200usize {
            let size = [256usize, 4 * KIB, 300 * KIB, 4 * MIB][round % 4];
            let p = pool.alloc(size, &s).unwrap();
            live.push(p);
            if round % 3 == 2 {
                // Free two, then ask for the size of the first again.
                let a = live.swap_remove(round % live.len());
                let size_a = pool.size_of(a).unwrap();
                pool.free(a, &s).unwrap();
                let b = live.swap_remove(0);
                pool.free(b, &s).unwrap();
                let c = pool.alloc(size_a, &s).unwrap();
                reused += usize::from(c == a || c == b);
                live.push(c);
            }
        }
        for p in live.drain(..) {
            pool.free(p, &s).unwrap();
        }
        let after = pool.backend().counts();
        (after, before, reused, pool.stats().grows)
    };
    let (after, before, reused, grows) = run(PoolConfig::for_graph(1 << 30, 8 * MIB));
    assert_eq!(
        (
            after.records - before.records,
            after.waits - before.waits,
            after.queries - before.queries,
            after.event_syncs - before.event_syncs,
            after.device_syncs - before.device_syncs
        ),
        (0, 0, 0, 0, 0),
        "a graph pool touched an event"
    );
    assert!(
        reused >= 60,
        "freed blocks serve the capture again ({reused})"
    );
    assert!(grows > 0, "the pool grew during the capture");
    let (after, before, _, _) = run(PoolConfig {
        initial: 8 * MIB,
        ..PoolConfig::new(1 << 30)
    });
    assert!(
        after.records > before.records,
        "an ordinary pool's bounded cache sheds behind events"
    );
    // Sealed once captured: no more allocations, frees still work.
    let pool = graph_pool();
    let s = HostStream::new();
    let p = pool.alloc(4096, &s).unwrap();
    pool.seal().unwrap();
    let e = pool.alloc(4096, &s).unwrap_err();
    assert!(e.to_string().contains("sealed"), "{e}");
    pool.free(p, &s).unwrap();
    let mapped = pool.stats().reserved;
    let e = pool.trim(0).unwrap_err();
    assert!(e.to_string().contains("sealed graph"), "{e}");
    assert_eq!(pool.stats().reserved, mapped, "nothing unmapped");
    assert_eq!(pool.synchronize().unwrap(), mapped, "no unmap asked: fine");
    // One stream only, no free_after.
    let other = HostStream::new();
    let e = pool.free(p, &other).unwrap_err();
    assert!(e.to_string().contains("serves one stream"), "{e}");
    let e = pool.free_after(p, &[&s]).unwrap_err();
    assert!(e.to_string().contains("free_after"), "{e}");
    // Only a graph's pool seals.
    let plain = Pool::with_backend(
        HostBackend::new(2 * MIB, usize::MAX),
        PoolConfig::new(1 << 30),
    )
    .unwrap();
    assert!(plain.seal().is_err());
    // `graph: true` alone makes the caches unbounded too.
    let loose = Pool::with_backend(
        HostBackend::new(2 * MIB, usize::MAX),
        PoolConfig {
            graph: true,
            initial: 8 * MIB,
            ..PoolConfig::new(1 << 30)
        },
    )
    .unwrap();
    let before = loose.backend().counts().records;
    let blocks: Vec<u64> = (0..40).map(|_| loose.alloc(4 * MIB, &s).unwrap()).collect();
    for b in blocks {
        loose.free(b, &s).unwrap(); // 160 MiB cached: past the default bound
    }
    assert_eq!(
        loose.backend().counts().records,
        before,
        "nothing shed behind an event"
    );
}

/// A graph's pool that served a capture seals itself once the capture
/// has ended, at its first call that finds the stream no longer in it
/// (not capturing, or in a second capture), with no call to `seal`: what
/// it would hand out next, the graph's replays use. Frees still work, and
/// a trim refuses as for a sealed pool. A graph's pool that never saw a
/// capture is not sealed by it.
#[test]
fn a_graph_pool_seals_itself_when_its_capture_ends() {
    let gp = graph_pool();
    let s = HostStream::new();
    let before = gp.alloc(4096, &s).unwrap();
    gp.free(before, &s).unwrap();
    s.begin_capture();
    let a = gp.alloc(4096, &s).unwrap();
    let b = gp.alloc(MIB, &s).unwrap();
    gp.free(a, &s).unwrap();
    s.end_capture();
    let e = gp.alloc(4096, &s).unwrap_err();
    assert!(e.to_string().contains("sealed"), "{e}");
    // The freed block of the capture was not handed out again either.
    let e = gp.alloc(MIB, &s).unwrap_err();
    assert!(e.to_string().contains("sealed"), "{e}");
    gp.free(b, &s).unwrap();
    assert_eq!(gp.stats().in_use, 0);
    // Frees after the end seal it as well.
    let gp = graph_pool();
    s.begin_capture();
    let a = gp.alloc(4096, &s).unwrap();
    s.end_capture();
    gp.free(a, &s).unwrap();
    assert!(
        gp.alloc(4096, &s).is_err(),
        "sealed by the free after the capture"
    );
    // A second capture with no call between the two: the first one's
    // blocks are not handed to it.
    let gp = graph_pool();
    s.begin_capture();
    let a = gp.alloc(MIB, &s).unwrap();
    gp.free(a, &s).unwrap();
    s.end_capture();
    s.begin_capture();
    let e = gp.alloc(MIB, &s).unwrap_err();
    assert!(e.to_string().contains("sealed"), "{e}");
    s.end_capture();
    // A trim after the capture, before any other call, unmaps nothing
    // its replays use: here 32 MiB past the 8 mapped up front, freed
    // during the capture. During the capture too, and the capture goes
    // on.
    let gp = graph_pool();
    s.begin_capture();
    let a = gp.alloc(32 * MIB, &s).unwrap();
    gp.free(a, &s).unwrap();
    let mapped = gp.stats().reserved;
    assert!(mapped > 8 * MIB, "grew");
    assert!(gp.trim(0).is_err());
    let b = gp.alloc(4096, &s).unwrap();
    gp.free(b, &s).unwrap();
    s.end_capture();
    assert!(gp.trim(0).is_err());
    assert_eq!(gp.stats().reserved, mapped);
    // A graph's pool that never served a capture trims.
    let gp = graph_pool();
    let a = gp.alloc(32 * MIB, &s).unwrap();
    gp.free(a, &s).unwrap();
    assert!(gp.trim(0).unwrap() < 8 * MIB, "unmapped");
}

/// A pool with `capture_check` refuses a stream that is being captured
/// into a graph (its memory would be handed out again while the graph
/// uses it), and serves it again once the capture ends; without it the
/// calls go through.
#[test]
fn the_main_pool_refuses_a_capturing_stream() {
    // Off by default: the call goes through.
    let unchecked = pool(64 * MIB, 2 * MIB, usize::MAX);
    let s = HostStream::new();
    s.begin_capture();
    let q = unchecked.alloc(4096, &s).unwrap();
    unchecked.free(q, &s).unwrap();
    s.end_capture();
    let cfg = PoolConfig {
        initial: 2 * MIB,
        chunk: 2 * MIB,
        capture_check: true,
        ..PoolConfig::new(64 * MIB)
    };
    let pool = host_pool(cfg);
    let p = pool.alloc(4096, &s).unwrap();
    s.begin_capture();
    let e = pool.alloc(4096, &s).unwrap_err();
    assert!(e.to_string().contains("being captured"), "{e}");
    let e = pool.free(p, &s).unwrap_err();
    assert!(e.to_string().contains("being captured"), "{e}");
    assert!(pool.free_after(p, &[&s]).is_err());
    s.end_capture();
    pool.free(p, &s).unwrap();
    assert_eq!(
        pool.stats().bad_frees,
        0,
        "the refused frees were not counted as bad"
    );
}

/// A span no free run fits, while a whole free chunk lies between blocks
/// in use: the growth moves that chunk's memory to the end instead of
/// taking new memory, after waiting for the work of the stream that shed
/// the block there; the hole is never handed out; the snapshot leaves
/// the hole out; and trim gives every chunk but the first back.
#[test]
fn a_whole_free_chunk_between_blocks_moves_to_the_end() {
    let pool = shedding_pool();
    let s = HostStream::new();
    let base = pool.base();
    let [x, y, z] = [0, 1, 2].map(|_| pool.alloc(2 * MIB, &s).unwrap());
    assert_eq!(
        [x, y, z].map(|p| p - base),
        [0, 2 * MIB as u64, 4 * MIB as u64]
    );
    s.enqueue(); // a kernel uses them
    pool.free(y, &s).unwrap(); // shed at once: past the bound
    assert_eq!(pool.stats().cached(), 0);
    let (syncs, created) = (
        pool.backend().counts().event_syncs,
        pool.backend().physical(),
    );
    let w = pool.alloc(4 * MIB, &s).unwrap();
    assert_eq!(w - base, 6 * MIB as u64, "at the end");
    let st = pool.stats();
    assert_eq!((st.moves, st.reserved), (1, 8 * MIB));
    assert_eq!(
        pool.backend().physical(),
        created + 2 * MIB,
        "one new chunk, one moved"
    );
    assert!(
        pool.backend().counts().event_syncs > syncs,
        "the shed's work awaited"
    );
    mark(&pool, w, 4 * MIB, 7, false).unwrap();
    mark(&pool, w, 4 * MIB, 7, true).unwrap();
    // The hole's pages are never handed out again.
    let v = pool.alloc(2 * MIB, &s).unwrap();
    assert_eq!(v - base, 10 * MIB as u64);
    let snap = pool.snapshot();
    snap.check().unwrap();
    assert!(
        snap.pages.iter().all(|r| r.offset() != 2 * MIB),
        "no page in the hole"
    );
    assert_eq!(snap.mapped, 10 * MIB);
    for p in [x, z, w, v] {
        pool.free(p, &s).unwrap();
    }
    assert_eq!(pool.trim(0).unwrap(), 2 * MIB);
    // The hole went with the end: its range is mapped again and serves.
    let after = pool.alloc(4 * MIB, &s).unwrap();
    assert_eq!(after - base, 0);
    mark(&pool, after, 4 * MIB, 9, false).unwrap();
    mark(&pool, after, 4 * MIB, 9, true).unwrap();
    pool.free(after, &s).unwrap();
}

/// Free chunks at the end stay where they are: the growth counts on them.
#[test]
fn the_free_tail_never_moves() {
    let pool = shedding_pool();
    let s = HostStream::new();
    let [x, y, z] = [0, 1, 2].map(|_| pool.alloc(2 * MIB, &s).unwrap());
    s.enqueue();
    pool.free(y, &s).unwrap();
    pool.free(z, &s).unwrap();
    let w = pool.alloc(6 * MIB, &s).unwrap();
    assert_eq!(w - pool.base(), 2 * MIB as u64);
    let st = pool.stats();
    assert_eq!((st.moves, st.reserved), (0, 8 * MIB));
    for p in [x, w] {
        pool.free(p, &s).unwrap();
    }
}

/// Once the range's end reaches the reservation's, the holes that moves
/// left are mapped again and serve: every byte of the reservation can be
/// handed out.
#[test]
fn holes_serve_again_once_the_range_is_used_up() {
    let cfg = PoolConfig {
        initial: 2 * MIB,
        chunk: 2 * MIB,
        stream_cache_limit: 64 * KIB,
        ..PoolConfig::new(32 * MIB)
    };
    let pool = host_pool(cfg);
    let s = HostStream::new();
    let [x, y, z] = [0, 1, 2].map(|_| pool.alloc(2 * MIB, &s).unwrap());
    s.enqueue();
    pool.free(y, &s).unwrap();
    let w = pool.alloc(4 * MIB, &s).unwrap();
    assert_eq!(pool.stats().moves, 1);
    let mut blocks = vec![x, z, w];
    while let Ok(p) = pool.alloc(2 * MIB, &s) {
        blocks.push(p);
    }
    let st = pool.stats();
    assert_eq!(
        (st.in_use, st.reserved),
        (32 * MIB, 32 * MIB),
        "the hole serves again"
    );
    let mut starts: Vec<u64> = blocks.iter().map(|p| p - pool.base()).collect();
    starts.sort();
    assert!(
        starts.contains(&(2 * MIB as u64)),
        "a block in the former hole"
    );
    for (i, p) in blocks.iter().enumerate() {
        let len = pool.size_of(*p).unwrap();
        mark(&pool, *p, len, i as u64, false).unwrap();
    }
    for (i, p) in blocks.iter().enumerate() {
        let len = pool.size_of(*p).unwrap();
        mark(&pool, *p, len, i as u64, true).unwrap();
        pool.free(*p, &s).unwrap();
    }
}

/// A pool of 16 MiB mapped (of 64 MiB) in 2 MiB chunks, and a stream.
fn sixteen_mib_in_2_mib_chunks() -> (Pool<HostBackend>, HostStream) {
    let cfg = PoolConfig {
        initial: 16 * MIB,
        chunk: 2 * MIB,
        ..PoolConfig::new(64 * MIB)
    };
    let pool = host_pool(cfg);
    (pool, HostStream::new())
}

/// A heap with almost no free page left takes blocks back from the
/// asking stream's cache (half of it) before it looks further, rather
/// than scavenging for each page while the cache holds free memory: the
/// next allocation of another size is served by what the cache gave
/// back, with no growth.
#[test]
fn a_nearly_full_heap_takes_back_half_of_the_asking_streams_cache() {
    let (pool, s) = sixteen_mib_in_2_mib_chunks();
    // Eight spans of 2 MiB (past the threads' caches) fill the heap.
    let blocks: Vec<u64> = (0..8).map(|_| pool.alloc(2 * MIB, &s).unwrap()).collect();
    let grows = pool.stats().grows;
    for &b in &blocks[..4] {
        pool.free(b, &s).unwrap();
    }
    assert_eq!(pool.stats().cached(), 8 * MIB, "freed blocks stay cached");
    // Another size: the cache has none, the heap no room.
    let small = pool.alloc(512 * KIB, &s).unwrap();
    let st = pool.stats();
    assert_eq!(
        st.grows, grows,
        "served from what the cache gave back: {st:?}"
    );
    assert_eq!(st.cached(), 4 * MIB, "half of the cache went back: {st:?}");
    pool.free(small, &s).unwrap();
    for &b in &blocks[4..] {
        pool.free(b, &s).unwrap();
    }
    assert_eq!(pool.stats().in_use, 0);
}

/// With a sixteenth of the heap free or more, a cache keeps what it holds:
/// an allocation of another size comes from the free pages.
#[test]
fn a_heap_with_room_leaves_the_caches_alone() {
    let (pool, s) = sixteen_mib_in_2_mib_chunks();
    // 12 of 16 MiB taken, 2 blocks of them then cached: 4 MiB stay free.
    let blocks: Vec<u64> = (0..6).map(|_| pool.alloc(2 * MIB, &s).unwrap()).collect();
    for &b in &blocks[..2] {
        pool.free(b, &s).unwrap();
    }
    let small = pool.alloc(512 * KIB, &s).unwrap();
    let st = pool.stats();
    assert_eq!(st.cached(), 4 * MIB, "the cache kept its blocks: {st:?}");
    assert_eq!(st.retires, 0, "{st:?}");
    pool.free(small, &s).unwrap();
    for &b in &blocks[2..] {
        pool.free(b, &s).unwrap();
    }
}

/// Placement 0 (first fit, and the GPU heaps' geometry: class pages of
/// about 256 blocks, up to 16 units) hands out distinct blocks whose data
/// stays, marks them live and catches double frees, as the default
/// placement does. (The pool rounds sizes to 256 bytes, so every class
/// it serves is a multiple of 256 bytes in either geometry: each block
/// has a live bit of its own, one per 256 bytes.)
#[test]
fn placement_0_keeps_blocks_apart_and_catches_double_frees() {
    let cfg = PoolConfig {
        placement: 0,
        ..PoolConfig::new(64 * MIB)
    };
    let pool = host_pool(cfg);
    let s = HostStream::new();
    for size in [300usize, 512, 4 * KIB, 40 * KIB] {
        let blocks: Vec<u64> = (0..1000).map(|_| pool.alloc(size, &s).unwrap()).collect();
        let distinct: std::collections::HashSet<u64> = blocks.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            blocks.len(),
            "{size} B: a block handed out twice"
        );
        for (i, &p) in blocks.iter().enumerate() {
            fill(&pool, p, size, i as u64).unwrap();
        }
        for (i, &p) in blocks.iter().enumerate() {
            check(&pool, p, size, i as u64).unwrap();
        }
        for &p in &blocks {
            pool.free(p, &s).unwrap();
        }
        for &p in blocks.iter().step_by(97) {
            assert!(pool.free(p, &s).is_err(), "{size} B: a double free passed");
        }
    }
    assert_eq!(pool.stats().in_use, 0);
}

/// Blocks of every class size between 16 KiB and 64 KiB, a thousand live
/// of each in turn: the pool maps at most an eighth more than they take
/// (class pages leave at most an eighth of a page past their last block)
/// and two chunks of slack. One 64 KiB unit a page would map 1.6x for
/// 40 KiB blocks.
#[test]
fn class_pages_of_large_blocks_waste_at_most_an_eighth() {
    for size in [16, 20, 24, 28, 32, 40, 48, 56, 64].map(|k| k * KIB) {
        let pool = pool(4096 * MIB, 2 * MIB, usize::MAX);
        let s = HostStream::new();
        let blocks: Vec<u64> = (0..1000).map(|_| pool.alloc(size, &s).unwrap()).collect();
        let (mapped, wanted) = (pool.stats().reserved, 1000 * size);
        assert!(
            mapped * 8 <= wanted * 9 + 16 * 2 * MIB,
            "{} KiB blocks: {mapped} bytes mapped for {wanted}",
            size / KIB
        );
        for p in blocks {
            pool.free(p, &s).unwrap();
        }
    }
}

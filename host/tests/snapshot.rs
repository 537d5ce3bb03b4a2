//! A picture of a pool's memory, over [`HostBackend`]: the snapshot's
//! page runs cover the mapped range and say who holds each page (live,
//! cached by which stream), its figures agree with the pool's statistics,
//! it reads back from JSON and draws; a replayed trace gives a timeline
//! and the pool at the trace's peak. No GPU needed.

use cuheap_host::snapshot::{replay, Holder, PageRun};
use cuheap_host::{read_trace, HostBackend, HostStream, Picture, Pool, PoolConfig, Snapshot};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn pool() -> Pool<HostBackend> {
    let cfg = PoolConfig {
        initial: 8 * MIB,
        chunk: 8 * MIB,
        ..PoolConfig::new(1 << 30)
    };
    Pool::with_backend(HostBackend::new(2 * MIB, 1 << 30), cfg).unwrap()
}

/// The run that holds `ptr`.
fn run_at(s: &Snapshot, ptr: u64) -> PageRun {
    let off = (ptr - s.base) as usize;
    *s.pages
        .iter()
        .find(|r| r.offset() <= off && off < r.offset() + r.pages() as usize * s.page_size)
        .unwrap_or_else(|| panic!("no run holds {ptr:#x}"))
}

#[test]
fn every_page_is_accounted_for_and_its_holder_named() {
    let pool = pool();
    let (a, b) = (HostStream::new(), HostStream::new());
    let span = pool.alloc(3 * 64 * KIB, &a).unwrap();
    let cached_span = pool.alloc(5 * 64 * KIB, &b).unwrap();
    let small: Vec<u64> = (0..10).map(|_| pool.alloc(1000, &a).unwrap()).collect();
    let big = pool.alloc(20 * MIB, &a).unwrap(); // past the first mapping
    pool.free(cached_span, &b).unwrap();
    for &p in &small[..4] {
        pool.free(p, &a).unwrap(); // cached on a
    }
    let s = pool.snapshot();
    s.check().unwrap();
    let st = pool.stats();
    assert_eq!((s.mapped, s.in_use), (st.reserved, st.in_use));
    assert_eq!(s.mappings.len(), 3, "8 MiB, then 16 MiB more in two chunks");
    assert_eq!(s.mappings.iter().map(|m| m.len).sum::<usize>(), s.mapped);

    match run_at(&s, span) {
        PageRun::Span { pages, holder, .. } => assert_eq!((pages, holder), (3, Holder::Live)),
        r => panic!("{r:?}"),
    }
    match run_at(&s, cached_span) {
        PageRun::Span { pages, holder, .. } => assert_eq!(
            (pages, holder),
            (
                5,
                Holder::Cached {
                    stream: b.id() as u64
                }
            )
        ),
        r => panic!("{r:?}"),
    }
    match run_at(&s, big) {
        PageRun::Span { pages, holder, .. } => assert_eq!((pages, holder), (320, Holder::Live)),
        r => panic!("{r:?}"),
    }
    // The ten small blocks share class pages: 6 live, 4 cached.
    let mut pages: Vec<PageRun> = small.iter().map(|&p| run_at(&s, p)).collect();
    pages.dedup();
    let (live, cached, used) = pages.iter().fold((0, 0, 0), |t, r| match *r {
        PageRun::Class {
            live, cached, used, ..
        } => (t.0 + live, t.1 + cached, t.2 + used),
        _ => panic!("{r:?}"),
    });
    assert_eq!((live, cached, used), (6, 4, 10));

    // The streams' caches, as the statistics have them.
    let mut by_stream: Vec<(u64, usize)> = s.streams.iter().map(|h| (h.stream, h.bytes)).collect();
    let mut want: Vec<(u64, usize)> = st
        .cached_per_stream
        .iter()
        .map(|&(id, bytes)| (id as u64, bytes))
        .collect();
    by_stream.sort();
    want.sort();
    assert_eq!(by_stream, want);
    assert_eq!(s.cached, want.iter().map(|w| w.1).sum::<usize>());
    let on = |st: &HostStream| {
        s.streams
            .iter()
            .find(|h| h.stream == st.id() as u64)
            .unwrap()
            .blocks
    };
    assert_eq!((on(&a), on(&b)), (4, 1));

    // JSON round trip, and the drawing.
    assert_eq!(Snapshot::from_json(&s.to_json()).unwrap(), s);
    let html = s.html("a <test> pool", None);
    assert!(html.contains("a &lt;test&gt; pool") && html.contains("<svg"));
    assert!(html.contains("span of 5 pages, cached by stream"));
    for p in small[4..].iter().chain([&span, &big]) {
        pool.free(*p, &a).unwrap();
    }
}

#[test]
fn a_snapshot_that_does_not_cover_the_range_is_refused() {
    let pool = pool();
    let s = HostStream::new();
    let p = pool.alloc(MIB, &s).unwrap();
    let good = pool.snapshot();
    assert!(
        Picture::from_json(&good.to_json()).is_ok(),
        "a bare snapshot reads"
    );
    let mut gap = good.clone();
    gap.pages.remove(0);
    assert!(gap.check().unwrap_err().to_string().contains("expected"));
    let mut short = good.clone();
    short.mapped += 64 * KIB;
    assert!(short.check().unwrap_err().to_string().contains("cover"));
    let e = Picture::from_json("{\"not\": 1}").unwrap_err();
    assert!(e.to_string().contains("not a pool snapshot"), "{e}");
    pool.free(p, &s).unwrap();
}

#[test]
fn a_replayed_trace_gives_a_timeline_and_the_pool_at_its_peak() {
    // Two streams; the peak (3 MiB + 5 KiB requested) is after call 4.
    let trace = "Thread,Time,Action,Pointer,Size,Stream\n\
        1,00:00:00.000001,allocate,0x1000,1048576,0x1\n\
        1,00:00:00.000002,allocate,0x2000,2097152,0x2\n\
        1,00:00:00.000003,allocate failure,0x0,99999999999,0x1\n\
        1,00:00:00.000004,allocate,0x3000,5120,0x1\n\
        1,00:00:00.000005,free,0x2000,2097152,0x2\n\
        1,00:00:00.000006,free,0x9999,64,0x2\n\
        1,00:00:00.000007,allocate,0x4000,4096,0x2\n\
        1,00:00:00.000008,free,0x1000,1048576,0x1\n";
    let events = read_trace(trace).unwrap();
    let pool = pool();
    let (timeline, at_peak) = replay(&pool, || Ok(HostStream::new()), &events, 100).unwrap();
    let calls: Vec<usize> = timeline.samples.iter().map(|s| s.call).collect();
    assert_eq!(calls, (1..=8).collect::<Vec<_>>());
    let requested: Vec<usize> = timeline.samples.iter().map(|s| s.requested).collect();
    let (m, k) = (MIB, KIB);
    assert_eq!(
        requested,
        [
            m,
            3 * m,
            3 * m,
            3 * m + 5 * k,
            m + 5 * k,
            m + 5 * k,
            m + 9 * k,
            9 * k
        ]
    );
    for s in &timeline.samples {
        assert!(s.in_use >= s.requested && s.mapped >= s.in_use, "{s:?}");
    }
    at_peak.check().unwrap();
    assert!(at_peak.in_use >= 3 * m + 5 * k);
    // Every block the replay made is freed at the end.
    assert_eq!(pool.stats().in_use, 0);
    let picture = Picture {
        title: "trace".into(),
        snapshot: at_peak,
        timeline: Some(timeline),
    };
    assert_eq!(Picture::from_json(&picture.to_json()).unwrap(), picture);
    assert!(picture.html().contains("Memory over the calls"));
}

/// Fewer samples than calls: each sample is the most since the one
/// before, so the peak shows whatever the spacing.
#[test]
fn a_sparse_timeline_keeps_the_peaks_between_its_samples() {
    let trace = "Thread,Time,Action,Pointer,Size,Stream\n\
        1,00:00:00.000001,allocate,0x1000,1048576,0x1\n\
        1,00:00:00.000002,allocate,0x2000,8388608,0x1\n\
        1,00:00:00.000003,free,0x2000,8388608,0x1\n\
        1,00:00:00.000004,free,0x1000,1048576,0x1\n\
        1,00:00:00.000005,allocate,0x3000,4096,0x1\n\
        1,00:00:00.000006,allocate,0x4000,4096,0x1\n";
    let events = read_trace(trace).unwrap();
    let pool = pool();
    let (timeline, at_peak) = replay(&pool, || Ok(HostStream::new()), &events, 2).unwrap();
    let got: Vec<(usize, usize, usize)> = timeline
        .samples
        .iter()
        .map(|s| (s.call, s.requested, s.in_use))
        .collect();
    assert_eq!(got, [(3, 9 * MIB, 9 * MIB), (6, 8 * KIB, 8 * KIB)]);
    assert!(timeline.samples[0].mapped >= 9 * MIB);
    assert_eq!(at_peak.in_use, 9 * MIB, "the snapshot is taken at call 2");
}

/// Sums over the page runs: bytes of live, cached and returning blocks.
fn sums(s: &Snapshot) -> (usize, usize, usize) {
    let (mut live, mut cached, mut returning) = (0, 0, 0);
    for r in &s.pages {
        match *r {
            PageRun::Class {
                block,
                used,
                live: l,
                cached: c,
                ..
            } => {
                live += l as usize * block;
                cached += c as usize * block;
                returning += (used - l - c) as usize * block;
            }
            PageRun::Span { pages, holder, .. } => {
                let bytes = pages as usize * s.page_size;
                match holder {
                    Holder::Live => live += bytes,
                    Holder::Cached { .. } => cached += bytes,
                    Holder::Returning => returning += bytes,
                }
            }
            PageRun::Free { .. } => {}
        }
    }
    (live, cached, returning)
}

/// Random calls on three streams (frees on the same stream, frees after
/// other streams' held work, dropped streams, trims): after each round
/// the page runs add up to the pool's own counts of bytes in use, cached
/// and returning, counted apart from the page map.
#[test]
fn page_runs_add_up_to_the_pools_counts() {
    let pool = pool();
    let mut streams: Vec<HostStream> = (0..3).map(|_| HostStream::new()).collect();
    let mut live: Vec<(u64, usize)> = Vec::new();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..40 {
        for _ in 0..100 {
            let r = next();
            let k = (r % 3) as usize;
            if live.len() < 20 || r % 5 < 3 {
                let size = [300usize, 4000, 70_000, 300_000][(r >> 8) as usize % 4];
                live.push((pool.alloc(size, &streams[k]).unwrap(), k));
            } else {
                let (p, _) = live.swap_remove((r >> 16) as usize % live.len());
                if r % 7 == 0 {
                    streams[k].hold();
                    pool.free_after(p, &[&streams[k]]).unwrap();
                } else {
                    pool.free(p, &streams[k]).unwrap();
                }
            }
        }
        let s = pool.snapshot();
        s.check().unwrap();
        let st = pool.stats();
        assert_eq!(
            sums(&s),
            (
                st.in_use,
                st.cached_per_stream.iter().map(|c| c.1).sum(),
                st.retired
            ),
            "round {round}"
        );
        if round % 10 == 9 {
            for st in &streams {
                st.finish();
            }
            streams[0] = HostStream::new(); // the old one is dropped
            pool.trim(0).unwrap();
        }
    }
    for (p, k) in live {
        pool.free(p, &streams[k]).unwrap();
    }
}

/// A span freed after a stream's work that is not done yet is returning,
/// not live or cached; a picture whose snapshot has a gap is refused, and
/// so is hostile JSON, without a panic.
#[test]
fn returning_blocks_and_bad_pictures() {
    let pool = pool();
    let s = HostStream::new();
    let p = pool.alloc(5 * 64 * KIB, &s).unwrap();
    s.hold();
    pool.free_after(p, &[&s]).unwrap();
    let snap = pool.snapshot();
    match run_at(&snap, p) {
        PageRun::Span { holder, .. } => assert_eq!(holder, Holder::Returning),
        r => panic!("{r:?}"),
    }
    s.finish();
    let mut gap = snap.clone();
    gap.pages.remove(0);
    let picture = Picture {
        title: "t".into(),
        snapshot: gap,
        timeline: None,
    };
    assert!(Picture::from_json(&picture.to_json()).is_err());
    let hostile = [
        r#"{"device":0,"base":0,"page_size":0,"reserved":0,"mapped":0,"mappings":[],"pages":[{"kind":"free","offset":0,"pages":1}],"streams":[],"in_use":0,"cached":0,"retired":0,"peak_in_use":0}"#,
        r#"{"device":0,"base":0,"page_size":4611686018427387904,"reserved":0,"mapped":0,"mappings":[],"pages":[{"kind":"free","offset":0,"pages":4}],"streams":[],"in_use":0,"cached":0,"retired":0,"peak_in_use":0}"#,
        r#"{"device":0,"base":0,"page_size":65536,"reserved":0,"mapped":65536,"mappings":[],"pages":[{"kind":"class","offset":0,"pages":1,"block":16,"capacity":4,"used":4,"live":4294967295,"cached":4294967295}],"streams":[],"in_use":0,"cached":0,"retired":0,"peak_in_use":0}"#,
        r#"{"device":0,"base":0,"page_size":4096,"reserved":0,"mapped":4294967295000,"mappings":[],"pages":[{"kind":"free","offset":0,"pages":4294967295}],"streams":[],"in_use":0,"cached":0,"retired":0,"peak_in_use":0}"#,
        r#"{"device":0,"base":0,"page_size":65536,"reserved":0,"mapped":65536,"mappings":[{"offset":0,"len":18446744073709551615}],"pages":[{"kind":"free","offset":0,"pages":1}],"streams":[],"in_use":0,"cached":0,"retired":0,"peak_in_use":0}"#,
    ];
    for h in hostile {
        assert!(Picture::from_json(h).is_err(), "{h}");
        // Drawn without a check, it still does not panic.
        if let Ok(s) = Snapshot::from_json(h) {
            let _ = s.svg();
        }
    }
}

/// A trace that allocates a pointer again without freeing it: the replay
/// frees its own block first, so in use follows the trace.
#[test]
fn a_pointer_allocated_twice_replaces_its_block() {
    let trace = "Thread,Time,Action,Pointer,Size,Stream\n\
        1,00:00:00.000001,allocate,0x1000,1048576,0x1\n\
        1,00:00:00.000002,allocate,0x1000,2097152,0x1\n\
        1,00:00:00.000003,free,0x1000,2097152,0x1\n";
    let events = read_trace(trace).unwrap();
    let pool = pool();
    let (timeline, _) = replay(&pool, || Ok(HostStream::new()), &events, 10).unwrap();
    let got: Vec<(usize, usize)> = timeline
        .samples
        .iter()
        .map(|s| (s.requested, s.in_use))
        .collect();
    assert_eq!(got, [(MIB, MIB), (2 * MIB, 2 * MIB), (0, 0)]);
    assert_eq!(pool.stats().in_use, 0);
}

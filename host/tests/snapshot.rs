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

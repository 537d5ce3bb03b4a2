//! `cuheap bench device`: one thread one allocation, on the GPU, for
//! cuheap, CUDA's device `malloc`/`free` and a warp-aggregated bump
//! pointer (the ceiling), in one process on the same GPU. Kernel shapes:
//! `pair` (alloc, write, fence, read back, free) and `alloc` then `free`
//! with an untimed whole-block fill and check between them. Times are CUDA
//! events around one launch: the median of `reps` runs after a warm-up.
//!
//! Then the churn case (cuheap alone): rounds of a kernel in which about
//! half of the threads, chosen by hash, check and free their block and
//! allocate another of mixed size; after each round, the heap's footprint
//! over the bytes the live blocks asked for.

use super::median;
use super::workload::{churn_case, thread_size};
use crate::kernels::Bench;
use crate::{DeviceHeap, Gpu, LaunchConfig, Result};
use cuheap_host::DeviceMemory;
use serde::Serialize;

/// One measured row.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub allocator: &'static str,
    pub shape: &'static str,
    pub threads: u32,
    /// Bytes per thread; 0 = mixed 16..=4096.
    pub size: u32,
    pub median_ms: f64,
    pub runs: usize,
    /// Allocations per second at the median.
    pub allocs_per_s: f64,
    /// Null allocations over all runs.
    pub nulls: u32,
    /// Wrong contents, overlap or misalignment, blocks not returned.
    pub errors: u32,
    /// Bytes of pages holding live blocks at the peak over bytes requested
    /// (cuheap alloc).
    pub memory_ratio: Option<f64>,
    /// All pages the heap holds (empty cached pages too) over bytes requested.
    pub footprint_ratio: Option<f64>,
}

/// A skipped measurement and why.
#[derive(Clone, Debug, Serialize)]
pub struct Skip {
    pub allocator: &'static str,
    pub threads: u32,
    pub size: u32,
    pub reason: String,
}

/// One round of the churn case.
#[derive(Clone, Debug, Serialize)]
pub struct ChurnRound {
    /// 0: every thread allocates; later rounds replace about half.
    pub round: u32,
    /// Threads (each holds one block).
    pub threads: u32,
    /// The round's launch (CUDA events).
    pub ms: f64,
    /// Bytes the live blocks asked for.
    pub live_bytes: u64,
    /// Pages the heap holds (cached empty ones too): `bytes_reserved`.
    pub footprint_bytes: u64,
    /// Pages holding at least one live block.
    pub live_page_bytes: u64,
    /// The most pages the heap has held so far.
    pub peak_bytes: u64,
    /// `footprint_bytes / live_bytes`.
    pub footprint_ratio: f64,
    /// `live_page_bytes / live_bytes`.
    pub live_pages_ratio: f64,
    /// Null allocations in the round.
    pub nulls: u32,
    /// Damaged blocks found in the round, and counts that disagree with
    /// the workload (blocks in use).
    pub errors: u32,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub device: String,
    pub heap_bytes: usize,
    /// Whether the cuheap heap looked at far SMs' lists ([`Config::far_lists`]).
    pub far_lists: bool,
    pub rows: Vec<Row>,
    pub skipped: Vec<Skip>,
    pub churn: Vec<ChurnRound>,
}

impl Report {
    /// One line per row with null allocations or errors.
    pub fn failures(&self) -> Vec<String> {
        let mut out = super::failed_rows(
            &self.rows,
            |r| (r.nulls, r.errors),
            |r| {
                format!(
                    "{} {} {} x {}",
                    r.allocator,
                    r.shape,
                    r.threads,
                    size_name(r.size)
                )
            },
        );
        out.extend(super::failed_rows(
            &self.churn,
            |r| (r.nulls, r.errors),
            |r| format!("cuheap churn round {}", r.round),
        ));
        out
    }
}

/// Benchmark settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub threads: Vec<u32>,
    pub sizes: Vec<u32>,
    pub large: (u32, u32),
    pub reps: usize,
    pub heap_bytes: usize,
    pub cuda_heap_bytes: usize,
    /// Skip CUDA malloc where its first run exceeds this (ms): it scales
    /// badly, and cases of minutes are not worth a table cell.
    pub cuda_budget_ms: f64,
    /// Run CUDA's device malloc too.
    pub cuda: bool,
    /// Threads and rounds of the churn case (0 rounds: none).
    pub churn: (u32, u32),
    /// The cuheap heap looks at far SMs' lists before it takes a fresh
    /// page ([`DeviceHeap::set_far_lists`]).
    pub far_lists: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            threads: vec![64 << 10, 1 << 20, 4 << 20],
            sizes: vec![16, 64, 256, 1024, 4096, 0],
            large: (4096, 256 << 10),
            reps: 7,
            heap_bytes: 20 << 30,
            cuda_heap_bytes: 4 << 30,
            cuda_budget_ms: 1500.0,
            cuda: true,
            churn: (1 << 20, 20),
            far_lists: false,
        }
    }
}

/// What every case launches with: the kernels, a pointer per thread of
/// the largest case, the two error counters, the bump cursor.
pub(super) struct Buffers {
    pub(super) kernels: Bench,
    pub(super) ptrs: DeviceMemory,
    pub(super) errors: DeviceMemory,
    cursor: DeviceMemory,
}

impl Buffers {
    /// For cases of up to `threads` threads.
    pub(super) fn new(gpu: &Gpu, threads: u32) -> Result<Buffers> {
        Ok(Buffers {
            kernels: Bench::new(gpu)?,
            ptrs: gpu.alloc_zeroed(threads as usize * 8)?,
            errors: gpu.alloc_zeroed(8)?,
            cursor: gpu.alloc_zeroed(8)?,
        })
    }

    /// `[nulls, damaged]` since the last call.
    pub(super) fn errors(&self) -> Result<[u32; 2]> {
        let mut e = [0u32; 2];
        self.errors.read(0, &mut e)?;
        self.errors.zero()?;
        Ok(e)
    }
}

fn expected_bytes(threads: u32, size: u32) -> u64 {
    (0..threads).map(|t| thread_size(t, size) as u64).sum()
}

/// Runs the whole device benchmark; `progress` is called once per step.
pub fn run(gpu: &Gpu, cfg: &Config, mut progress: impl FnMut(&str)) -> Result<Report> {
    // CUDA's heap limit must be set before the first kernel using malloc.
    gpu.set_malloc_heap_size(cfg.cuda_heap_bytes)?;
    let heap = DeviceHeap::new(gpu, cfg.heap_bytes)?;
    heap.set_far_lists(cfg.far_lists)?;
    let max_threads = cfg
        .threads
        .iter()
        .copied()
        .max()
        .unwrap_or(1)
        .max(cfg.large.0)
        .max(cfg.churn.0);
    let bufs = Buffers::new(gpu, max_threads)?;
    let bump = gpu.alloc_zeroed(cfg.heap_bytes)?;
    let info = gpu.info();
    let mut report = Report {
        device: format!(
            "{} ({} SMs, CUDA {}.{})",
            info.name,
            info.sms,
            info.driver_cuda_version / 1000,
            info.driver_cuda_version % 1000 / 10
        ),
        heap_bytes: heap.capacity(),
        far_lists: cfg.far_lists,
        ..Report::default()
    };
    let mut cases: Vec<(u32, u32)> = Vec::new();
    for &t in &cfg.threads {
        for &s in &cfg.sizes {
            cases.push((t, s));
        }
    }
    if cfg.sizes.len() > 1 {
        cases.push(cfg.large);
    }
    for &(t, s) in &cases {
        if expected_bytes(t, s) as f64 * 1.3 > heap.capacity() as f64 {
            report.skipped.push(Skip {
                allocator: "all",
                threads: t,
                size: s,
                reason: "does not fit the heap".into(),
            });
            continue;
        }
        progress(&format!("cuheap {t} x {}", size_name(s)));
        cuheap_case(gpu, &heap, &bufs, cfg, t, s, &mut report)?;
        progress(&format!("bump {t} x {}", size_name(s)));
        bump_case(gpu, &bump, &bufs, cfg, t, s, &mut report)?;
    }
    if cfg.churn.1 > 0 {
        progress("cuheap churn");
        report.churn = churn(gpu, &heap, &bufs, cfg.churn.0, cfg.churn.1, &mut progress)?;
    }
    // CUDA malloc last and smallest first: skip a size once a smaller case
    // with the same thread count already blew the budget.
    for &(t, s) in cases.iter().filter(|_| cfg.cuda) {
        progress(&format!("CUDA malloc {t} x {}", size_name(s)));
        if expected_bytes(t, s) as f64 * 1.1 > cfg.cuda_heap_bytes as f64 {
            report.skipped.push(Skip {
                allocator: "CUDA malloc",
                threads: t,
                size: s,
                reason: format!("needs more than its {} GiB heap", cfg.cuda_heap_bytes >> 30),
            });
            continue;
        }
        let blown = report.skipped.iter().any(|k| {
            k.allocator == "CUDA malloc"
                && k.reason.starts_with("over budget")
                && k.threads <= t
                && (k.size <= s || s == 0)
        });
        if blown {
            report.skipped.push(Skip {
                allocator: "CUDA malloc",
                threads: t,
                size: s,
                reason: "over budget (a smaller case already was)".into(),
            });
            continue;
        }
        cuda_case(gpu, &bufs, cfg, t, s, &mut report)?;
    }
    Ok(report)
}

/// Fills every thread's whole block with its id, then checks it (another
/// id means two live blocks overlapped) and its alignment: 16 bytes, and
/// natural alignment for power-of-two sizes when `natural` (cuheap's
/// promise). Failures go to `errors[1]`. Untimed.
///
/// # Safety
///
/// `ptrs` holds `n` pointers, each null or a live block of at least the
/// size thread `tid` asked for with `sz` (as after an alloc kernel of
/// `n` threads and size `sz`), and `errors` at least two `u32`s.
pub unsafe fn fill_and_check(
    kernels: &Bench,
    ptrs: &DeviceMemory,
    errors: &DeviceMemory,
    n: u32,
    sz: u32,
    natural: bool,
) -> Result<()> {
    let cfg = LaunchConfig::for_threads(n);
    // SAFETY: fill_blocks' and check_blocks' contracts are the caller's.
    unsafe {
        kernels.fill_blocks(&cfg, ptrs.as_ptr(), n, sz)?;
        kernels.check_blocks(&cfg, ptrs.as_ptr(), n, sz, natural as u32, errors.as_ptr())
    }
}

pub fn size_name(s: u32) -> String {
    match s {
        0 => "mixed".into(),
        s if s >= 1 << 20 && s.is_multiple_of(1 << 20) => format!("{} MiB", s >> 20),
        s if s >= 1024 && s.is_multiple_of(1024) => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

fn row(
    allocator: &'static str,
    shape: &'static str,
    t: u32,
    s: u32,
    mut ms: Vec<f64>,
    errs: [u32; 2],
) -> Row {
    let runs = ms.len();
    let m = median(&mut ms);
    Row {
        allocator,
        shape,
        threads: t,
        size: s,
        median_ms: m,
        runs,
        allocs_per_s: t as f64 / (m / 1e3),
        nulls: errs[0],
        errors: errs[1],
        memory_ratio: None,
        footprint_ratio: None,
    }
}

fn cuheap_case(
    gpu: &Gpu,
    heap: &DeviceHeap,
    b: &Buffers,
    cfg: &Config,
    t: u32,
    s: u32,
    report: &mut Report,
) -> Result<()> {
    let k = &b.kernels;
    let launch = LaunchConfig::for_threads(t);
    // Each case starts from an empty heap: its footprint is its own.
    // SAFETY: every launch so far was on the GPU's stream, the legacy
    // default stream that the reset runs on, and the last one was waited
    // for (reading the error counters synchronises).
    unsafe { heap.reset()? };
    // SAFETY: the heap outlives every launch of this case (it is dropped
    // after `run` synchronises), and so do `b.ptrs`, which holds pointers
    // for the largest case (>= t), and `b.errors`, two u32s. The alloc and
    // free launches below rely on the same.
    let pair = || unsafe { k.pair_cuheap(&launch, heap, t, s, b.errors.as_ptr()) };
    pair()?;
    gpu.sync()?;
    let mut times = Vec::new();
    for _ in 0..cfg.reps {
        times.push(gpu.time(pair)? as f64);
    }
    let mut errs = b.errors()?;
    let st = heap.stats()?;
    if !st.is_empty() {
        errs[1] += 1; // blocks lost across pair runs
    }
    report.rows.push(row("cuheap", "pair", t, s, times, errs));

    let (mut ta, mut tf) = (Vec::new(), Vec::new());
    let (mut ratio, mut footprint) = (0.0, 0.0);
    let mut check_errs = [0u32; 2];
    for rep in 0..=cfg.reps {
        // SAFETY: as for `pair`.
        let alloc =
            || unsafe { k.alloc_cuheap(&launch, heap, t, s, b.ptrs.as_ptr(), b.errors.as_ptr()) };
        let ms_a = gpu.time(alloc)? as f64;
        if rep == 1 {
            let st = heap.stats()?;
            let requested = expected_bytes(t, s) as f64;
            ratio = st.bytes_in_live_pages as f64 / requested;
            footprint = st.bytes_reserved as f64 / requested;
        }
        // SAFETY: `b.ptrs` holds the t blocks (or nulls) alloc_cuheap just made.
        unsafe { fill_and_check(k, &b.ptrs, &b.errors, t, s, true)? };
        // SAFETY: as for `pair`; the pointers are this heap's.
        let free = || unsafe { k.free_cuheap(&launch, heap, t, b.ptrs.as_ptr()) };
        let ms_f = gpu.time(free)? as f64;
        let e = b.errors()?;
        check_errs[0] += e[0];
        check_errs[1] += e[1];
        if rep > 0 {
            ta.push(ms_a);
            tf.push(ms_f);
        }
    }
    if !heap.stats()?.is_empty() {
        check_errs[1] += 1;
    }
    let mut a = row("cuheap", "alloc", t, s, ta, check_errs);
    a.memory_ratio = Some(ratio);
    a.footprint_ratio = Some(footprint);
    report.rows.push(a);
    report
        .rows
        .push(row("cuheap", "free", t, s, tf, check_errs));
    Ok(())
}

/// The churn case alone, as the benchmark runs it (see [`churn`]), on
/// `heap`, which it empties first.
///
/// # Safety
///
/// As for [`DeviceHeap::reset`]: no kernel that uses `heap` is running or
/// queued, on any stream.
pub unsafe fn run_churn(
    gpu: &Gpu,
    heap: &DeviceHeap,
    threads: u32,
    rounds: u32,
) -> Result<Vec<ChurnRound>> {
    let b = Buffers::new(gpu, threads)?;
    churn(gpu, heap, &b, threads, rounds, &mut |_| {})
}

/// The churn case: round 0 and `rounds` more of `churn_cuheap` with `t`
/// threads on an emptied heap, then a last launch that checks and frees
/// every block. Each round's nulls, damaged blocks and disagreeing counts
/// are its errors; the last launch's go to the last round.
fn churn(
    gpu: &Gpu,
    heap: &DeviceHeap,
    b: &Buffers,
    t: u32,
    rounds: u32,
    progress: &mut impl FnMut(&str),
) -> Result<Vec<ChurnRound>> {
    // SAFETY: as in `cuheap_case`: every earlier launch ran on this stream
    // and was waited for.
    unsafe { heap.reset()? };
    b.ptrs.zero()?;
    let launch = LaunchConfig::for_threads(t);
    // Each thread's block size now, 0 for none (after a null).
    let mut sizes = vec![0u64; t as usize];
    let mut out = Vec::new();
    for round in 0..=rounds {
        progress(&format!("cuheap churn round {round}"));
        // SAFETY: `b.ptrs` holds `t` pointers, each null or the block the
        // earlier rounds allocated for its thread; the heap and buffers
        // outlive the launch, which `time` waits for.
        let ms = gpu.time(|| unsafe {
            b.kernels
                .churn_cuheap(&launch, heap, t, round, b.ptrs.as_ptr(), b.errors.as_ptr())
        })? as f64;
        let mut ptrs = vec![0u64; t as usize];
        b.ptrs.read(0, &mut ptrs)?;
        for (tid, (size, &p)) in sizes.iter_mut().zip(&ptrs).enumerate() {
            let (swap, want) = churn_case(tid as u32, round);
            if swap {
                *size = if p == 0 { 0 } else { want as u64 };
            }
        }
        let [nulls, mut errors] = b.errors()?;
        let (st, k) = (heap.stats()?, heap.counts()?);
        let live = sizes.iter().filter(|&&s| s > 0).count() as u64;
        if k.in_use() != live || st.blocks() != live {
            errors += 1;
        }
        let live_bytes: u64 = sizes.iter().sum();
        let ratio = |x: u64| x as f64 / live_bytes.max(1) as f64;
        out.push(ChurnRound {
            round,
            threads: t,
            ms,
            live_bytes,
            footprint_bytes: k.bytes_reserved,
            live_page_bytes: st.bytes_in_live_pages,
            peak_bytes: k.peak_bytes_reserved,
            footprint_ratio: ratio(k.bytes_reserved),
            live_pages_ratio: ratio(st.bytes_in_live_pages),
            nulls,
            errors,
        });
    }
    // SAFETY: as for the rounds.
    unsafe {
        b.kernels.churn_cuheap(
            &launch,
            heap,
            t,
            u32::MAX,
            b.ptrs.as_ptr(),
            b.errors.as_ptr(),
        )?
    };
    gpu.sync()?;
    let [_, damaged] = b.errors()?;
    let lost = !heap.stats()?.is_empty() || heap.counts()?.in_use() != 0;
    if let Some(last) = out.last_mut() {
        last.errors += damaged + lost as u32;
    }
    Ok(out)
}

fn bump_case(
    gpu: &Gpu,
    bump: &DeviceMemory,
    b: &Buffers,
    cfg: &Config,
    t: u32,
    s: u32,
    report: &mut Report,
) -> Result<()> {
    let launch = LaunchConfig::for_threads(t);
    let mut times = Vec::new();
    for rep in 0..=cfg.reps {
        b.cursor.zero()?;
        // SAFETY: `bump` holds its `bytes()`, `b.cursor` a u64, `b.ptrs`
        // pointers for the largest case (>= t), `b.errors` two u32s; all
        // outlive the launch (dropped after `run` synchronises).
        let alloc = || unsafe {
            b.kernels.alloc_bump(
                &launch,
                bump.as_ptr(),
                bump.bytes() as u64,
                b.cursor.as_ptr(),
                t,
                s,
                b.ptrs.as_ptr(),
                b.errors.as_ptr(),
            )
        };
        let ms = gpu.time(alloc)? as f64;
        if rep > 0 {
            times.push(ms);
        }
    }
    // SAFETY: `b.ptrs` holds the t blocks (or nulls) of the last alloc_bump,
    // inside `bump`.
    unsafe { fill_and_check(&b.kernels, &b.ptrs, &b.errors, t, s, false)? };
    report
        .rows
        .push(row("bump (ceiling)", "alloc", t, s, times, b.errors()?));
    Ok(())
}

fn cuda_case(
    gpu: &Gpu,
    b: &Buffers,
    cfg: &Config,
    t: u32,
    s: u32,
    report: &mut Report,
) -> Result<()> {
    let k = &b.kernels;
    let launch = LaunchConfig::for_threads(t);
    // SAFETY: `b.ptrs` holds pointers for the largest case (>= t) and
    // `b.errors` two u32s, both outliving the launch. The alloc and free
    // launches below rely on the same; free_cuda gets the pointers
    // alloc_cuda just made, once.
    let pair = || unsafe { k.pair_cuda(&launch, t, s, b.errors.as_ptr()) };
    let first = gpu.time(pair)? as f64;
    if first > cfg.cuda_budget_ms {
        b.errors()?;
        report.skipped.push(Skip {
            allocator: "CUDA malloc",
            threads: t,
            size: s,
            reason: format!("over budget: one pair run took {first:.0} ms"),
        });
        return Ok(());
    }
    let mut times = Vec::new();
    for _ in 0..cfg.reps {
        times.push(gpu.time(pair)? as f64);
    }
    report
        .rows
        .push(row("CUDA malloc", "pair", t, s, times, b.errors()?));
    let (mut ta, mut tf) = (Vec::new(), Vec::new());
    let mut errs = [0u32; 2];
    for _ in 0..cfg.reps {
        // SAFETY: as for `pair`.
        let alloc = || unsafe { k.alloc_cuda(&launch, t, s, b.ptrs.as_ptr(), b.errors.as_ptr()) };
        ta.push(gpu.time(alloc)? as f64);
        // SAFETY: `b.ptrs` holds the t blocks (or nulls) alloc_cuda just made.
        unsafe { fill_and_check(k, &b.ptrs, &b.errors, t, s, false)? };
        // SAFETY: as for `pair`.
        let free = || unsafe { k.free_cuda(&launch, t, b.ptrs.as_ptr()) };
        tf.push(gpu.time(free)? as f64);
        let e = b.errors()?;
        errs[0] += e[0];
        errs[1] += e[1];
    }
    report
        .rows
        .push(row("CUDA malloc", "alloc", t, s, ta, errs));
    report.rows.push(row("CUDA malloc", "free", t, s, tf, errs));
    Ok(())
}

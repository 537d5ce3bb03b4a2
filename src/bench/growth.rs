//! Growth of the device heap, part of `cuheap bench device`:
//!
//! - between launches: [`DeviceHeap::grow`] by 1 GiB and 4 GiB, host
//!   wall time per GiB, beside `cuMemAlloc` of the same size;
//! - during a launch: 1M threads each allocate and keep 1 KiB (1 GiB
//!   live), on a heap that starts at 64 MiB with a growth service (on
//!   demand, and keeping memory ahead at 50% full), on a growable heap
//!   mapped big enough beforehand and on a fixed heap:
//!   CUDA events around the launch, every block filled and checked
//!   afterwards (untimed);
//! - a series of 32 launches that each keep 32 MiB more, from 64 MiB to
//!   1 GiB, served (on demand, and keeping memory ahead at 50% and 75%
//!   full) and mapped before, with the launches in which a thread waited
//!   for growth;
//! - what the machinery costs when no growth is needed: the pair kernel
//!   at 1M x 16 B on a served growable heap (on demand, and keeping
//!   memory ahead) against a fixed heap, runs interleaved;
//! - giving 1 GiB back: a trim on a stream ([`DeviceHeap::trim_on`]: its
//!   kernel, CUDA events; the unmapping into the bank, host wall time)
//!   beside the trim between launches and `cuMemFree` of the same bytes;
//! - growth in pieces ([`DeviceHeap::set_growth_piece`]), whole steps
//!   against pieces of 256, 32, 8 and 2 MiB: growing by 1 GiB between
//!   launches, the 1M x 1 KiB launch growing from 64 MiB, and what a trim
//!   gives back when the last 1/16 of its threads keep their blocks.

use super::device::{fill_and_check, Buffers};
use super::median;
use crate::{DeviceHeap, DevicePtr, Gpu, GrowthService, LaunchConfig, Reservation, Result};
use serde::Serialize;
use std::time::Instant;

/// One measured row.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub case: &'static str,
    pub allocator: String,
    pub median_ms: f64,
    pub runs: usize,
    /// Growth steps taken while the kernel ran, for threads that asked
    /// (median run).
    pub live_steps: u64,
    /// Growth steps a service that keeps memory ahead mapped with no
    /// thread asking (median run).
    pub ahead_steps: u64,
    /// Of a series of launches, those in which a thread waited for
    /// growth (median run); `None` for single launches.
    pub waited: Option<u32>,
    /// Heap capacity at the end, bytes.
    pub capacity: usize,
    pub nulls: u32,
    pub errors: u32,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub rows: Vec<Row>,
}

impl Report {
    /// One line per row with null allocations or errors.
    pub fn failures(&self) -> Vec<String> {
        super::failed_rows(
            &self.rows,
            |r| (r.nulls, r.errors),
            |r| format!("growth {} / {}", r.case, r.allocator),
        )
    }

    pub fn table(&self) -> String {
        let mut out = String::from(
            "| case | allocator | median ms | runs | growth steps asked by threads / mapped ahead | launches that waited | capacity at the end | nulls | errors |\n|---|---|---|---|---|---|---|---|---|\n",
        );
        for r in &self.rows {
            out += &format!(
                "| {} | {} | {:.3} | {} | {} / {} | {} | {} MiB | {} | {} |\n",
                r.case,
                r.allocator,
                r.median_ms,
                r.runs,
                r.live_steps,
                r.ahead_steps,
                r.waited.map_or("-".into(), |w| w.to_string()),
                r.capacity >> 20,
                r.nulls,
                r.errors
            );
        }
        out
    }
}

const KEEP_THREADS: u32 = 1 << 20;
const KEEP_SIZE: u32 = 1024;
const START: usize = 64 << 20;
/// Address space of the growable heaps: room for 1 GiB of 1 KiB blocks
/// and steps that double.
const RESERVE: usize = 4 << 30;

/// Runs every growth case `reps` times. CUDA's device malloc, whose heap
/// cannot grow, is measured in the in-kernel table of the same run (at
/// 1M x 1 KiB one pair run takes seconds).
pub fn run(gpu: &Gpu, reps: usize, mut progress: impl FnMut(&str)) -> Result<Report> {
    let b = Buffers::new(gpu, KEEP_THREADS)?;
    let mut report = Report::default();
    progress("growth between launches");
    between_launches(gpu, reps, &mut report)?;
    during_launch(gpu, &b, reps, &mut report, &mut progress)?;
    progress("a series of launches that grow the heap");
    series(gpu, &b, reps, &mut report)?;
    progress("growth machinery, no growth needed");
    no_growth_needed(gpu, &b, reps, &mut report)?;
    progress("giving memory back");
    give_back(gpu, &b, reps, &mut report)?;
    pieces(gpu, &b, reps, &mut report, &mut progress)?;
    Ok(report)
}

/// How a growable heap of a case is served while kernels run.
#[derive(Clone, Copy)]
enum Serve {
    No,
    /// [`DeviceHeap::serve`]: steps when threads ask.
    OnDemand,
    /// [`DeviceHeap::serve_ahead`] at this fill, in percent.
    Ahead(u32),
}

impl Serve {
    fn start(self, h: &DeviceHeap) -> Result<Option<GrowthService<'_>>> {
        match self {
            Serve::No => Ok(None),
            Serve::OnDemand => h.serve().map(Some),
            Serve::Ahead(fill) => h.serve_ahead(fill).map(Some),
        }
    }

    fn runs(self) -> bool {
        !matches!(self, Serve::No)
    }
}

fn row(case: &'static str, allocator: String, mut ms: Vec<f64>, capacity: usize) -> Row {
    Row {
        case,
        allocator,
        runs: ms.len(),
        median_ms: median(&mut ms),
        live_steps: 0,
        ahead_steps: 0,
        waited: None,
        capacity,
        nulls: 0,
        errors: 0,
    }
}

/// Host wall time of `DeviceHeap::grow` by 1 and 4 GiB on a fresh heap
/// (mapping and publishing the limit), per GiB, and of `cuMemAlloc` of
/// the same bytes.
fn between_launches(gpu: &Gpu, reps: usize, report: &mut Report) -> Result<()> {
    for gib in [1usize, 4] {
        let (mut grow, mut malloc) = (Vec::new(), Vec::new());
        let mut cap = 0;
        for _ in 0..reps {
            let h = DeviceHeap::growable(gpu, START, START + (gib << 30))?;
            let t = Instant::now();
            cap = h.grow(START + (gib << 30))?;
            grow.push(t.elapsed().as_secs_f64() * 1e3 / gib as f64);
            drop(h);
            let t = Instant::now();
            let m = gpu.alloc(gib << 30)?;
            malloc.push(t.elapsed().as_secs_f64() * 1e3 / gib as f64);
            drop(m);
        }
        let case = if gib == 1 {
            "grow by 1 GiB between launches, ms per GiB"
        } else {
            "grow by 4 GiB between launches, ms per GiB"
        };
        report
            .rows
            .push(row(case, "cuheap DeviceHeap::grow".into(), grow, cap));
        report.rows.push(row(
            case,
            "cudaMalloc (cuMemAlloc)".into(),
            malloc,
            gib << 30,
        ));
    }
    Ok(())
}

/// 1M threads keep 1 KiB each: growing from 64 MiB during the launch,
/// against heaps that are big enough from the start and CUDA malloc.
fn during_launch(
    gpu: &Gpu,
    b: &Buffers,
    reps: usize,
    report: &mut Report,
    progress: &mut impl FnMut(&str),
) -> Result<()> {
    let n = KEEP_THREADS;
    let cfg = LaunchConfig::for_threads(n);
    let case = "1M threads keep 1 KiB each (1 GiB live), one launch";
    let need = 2 << 30;
    // (name, bytes mapped at the start, growable, served)
    let heaps = [
        (
            "cuheap, growing from 64 MiB while the kernel runs",
            START,
            true,
            Serve::OnDemand,
        ),
        (
            "cuheap, growing from 64 MiB, memory kept ahead at 50% full",
            START,
            true,
            Serve::Ahead(50),
        ),
        (
            "cuheap, growable heap mapped to 2 GiB before",
            need,
            true,
            Serve::No,
        ),
        ("cuheap, fixed 2 GiB heap", need, false, Serve::No),
    ];
    for (name, start, growable, serve) in heaps {
        progress(name);
        let (mut ms, mut steps, mut ahead, mut errs, mut cap) =
            (Vec::new(), Vec::new(), Vec::new(), [0u32; 2], 0);
        for rep in 0..=reps {
            let h = keep_heap(gpu, start, growable)?;
            let svc = serve.start(&h)?;
            b.ptrs.zero()?;
            let before = h.growth_stats();
            // SAFETY: `b.ptrs` holds n pointers and `b.errors` two u32s;
            // the heap and both buffers outlive the launch, which
            // `gpu.time` waits for.
            let t = gpu.time(|| unsafe {
                b.kernels
                    .alloc_cuheap(&cfg, &h, n, KEEP_SIZE, b.ptrs.as_ptr(), b.errors.as_ptr())
            })?;
            let after = h.growth_stats();
            drop(svc);
            // SAFETY: `b.ptrs` holds the blocks the launch just made.
            let e = unsafe { check_kept(gpu, b, &h, n)? };
            errs[0] += e[0];
            errs[1] += e[1];
            if rep > 0 {
                ms.push(t as f64);
                steps.push((after.live_steps - before.live_steps) as f64);
                ahead.push((after.ahead_steps - before.ahead_steps) as f64);
            }
            cap = h.capacity();
        }
        if std::env::var_os("CUHEAP_GROWTH_TRACE").is_some() {
            // Growth varies from launch to launch: three of those.
            let traces = if serve.runs() { 3 } else { 1 };
            for _ in 0..traces {
                trace(gpu, b, name, start, growable, serve)?;
            }
        }
        let mut r = row(case, name.into(), ms, cap);
        r.live_steps = median(&mut steps) as u64;
        r.ahead_steps = median(&mut ahead) as u64;
        (r.nulls, r.errors) = (errs[0], errs[1]);
        report.rows.push(r);
    }
    Ok(())
}

/// Launches of [`SERIES_THREADS`] threads in a series.
const SERIES_LAUNCHES: u32 = 32;
/// Threads of each launch of the series, each keeping 1 KiB: 32 MiB a
/// launch, 1 GiB after the series.
const SERIES_THREADS: u32 = 1 << 15;
// The series keeps its blocks in the keep case's pointer buffer.
const _: () = assert!(SERIES_LAUNCHES * SERIES_THREADS <= KEEP_THREADS);

/// A series of launches that each keep 32 MiB more, from a 64 MiB heap
/// to 1 GiB, as a program whose output grows from kernel to kernel:
/// served, and on a heap mapped to 2 GiB before. Time: the sum of CUDA
/// events around each launch. Also counted: the launches in which a
/// thread waited for growth. Every block is checked afterwards.
fn series(gpu: &Gpu, b: &Buffers, reps: usize, report: &mut Report) -> Result<()> {
    let (n, k) = (SERIES_THREADS, SERIES_LAUNCHES);
    let cfg = LaunchConfig::for_threads(n);
    let case = "32 launches keep 32 MiB more each (1 KiB per thread, 1 GiB at the end)";
    // (name, bytes mapped at the start, served)
    let heaps = [
        (
            "cuheap, growing from 64 MiB while the kernels run",
            START,
            Serve::OnDemand,
        ),
        (
            "cuheap, growing from 64 MiB, memory kept ahead at 50% full",
            START,
            Serve::Ahead(50),
        ),
        (
            "cuheap, growing from 64 MiB, memory kept ahead at 75% full",
            START,
            Serve::Ahead(75),
        ),
        (
            "cuheap, growable heap mapped to 2 GiB before",
            2 << 30,
            Serve::No,
        ),
    ];
    for (name, start, serve) in heaps {
        let (mut ms, mut waited, mut steps, mut ahead, mut errs, mut cap) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), [0u32; 2], 0);
        for rep in 0..=reps {
            let h = keep_heap(gpu, start, true)?;
            let svc = serve.start(&h)?;
            b.ptrs.zero()?;
            let (mut total, mut waits) = (0.0, 0u32);
            for launch in 0..k {
                let before = h.growth_waits()?;
                let ptrs = DevicePtr::from_raw(
                    b.ptrs.as_ptr::<*mut u8>().addr() + (launch * n) as u64 * 8,
                );
                // SAFETY: `ptrs` is n of the pointers of `b.ptrs` (which
                // holds k * n), `b.errors` two u32s; the heap and both
                // buffers outlive the launch, which `gpu.time` waits for.
                total += gpu.time(|| unsafe {
                    b.kernels
                        .alloc_cuheap(&cfg, &h, n, KEEP_SIZE, ptrs, b.errors.as_ptr())
                })? as f64;
                waits += u32::from(h.growth_waits()? > before);
            }
            let g = h.growth_stats();
            drop(svc);
            // SAFETY: `b.ptrs` holds the k * n blocks the launches made.
            let e = unsafe { check_kept(gpu, b, &h, n * k)? };
            errs[0] += e[0];
            errs[1] += e[1];
            if rep > 0 {
                ms.push(total);
                waited.push(waits as f64);
                steps.push(g.live_steps as f64);
                ahead.push(g.ahead_steps as f64);
            }
            cap = h.capacity();
        }
        let mut r = row(case, name.into(), ms, cap);
        r.live_steps = median(&mut steps) as u64;
        r.ahead_steps = median(&mut ahead) as u64;
        r.waited = Some(median(&mut waited) as u32);
        (r.nulls, r.errors) = (errs[0], errs[1]);
        report.rows.push(r);
    }
    Ok(())
}

/// After keep launches on `h`: fills and checks the `n` blocks in
/// `b.ptrs` (untimed) and counts the blocks `h` holds. Returns
/// `[nulls, errors]`, a heap that holds other than `n` blocks counting as
/// one error.
///
/// # Safety
///
/// `b.ptrs` holds `n` pointers, each null or a live block of `KEEP_SIZE`
/// bytes from `h`, and no launch that uses them runs.
unsafe fn check_kept(gpu: &Gpu, b: &Buffers, h: &DeviceHeap, n: u32) -> Result<[u32; 2]> {
    // SAFETY: forwarded from the caller.
    unsafe { fill_and_check(&b.kernels, &b.ptrs, &b.errors, n, KEEP_SIZE, true)? };
    gpu.sync()?;
    let [nulls, errors] = b.errors()?;
    let st = h.stats()?;
    Ok([
        nulls,
        errors + u32::from(st.blocks() + st.spans != n as u64),
    ])
}

/// A heap for the keep case: `start` bytes mapped, growable (in a
/// reservation of [`RESERVE`]) or fixed.
fn keep_heap(gpu: &Gpu, start: usize, growable: bool) -> Result<DeviceHeap> {
    if growable {
        DeviceHeap::growable(gpu, start, RESERVE)
    } else {
        DeviceHeap::new(gpu, start)
    }
}

/// `CUHEAP_GROWTH_TRACE=1`: one more launch of the keep case on a heap
/// made as in [`during_launch`], with the device clock read by each warp
/// before and after its allocation; prints, for each 0.1 ms of the launch
/// in which any warp started or ended, those warps and how long the
/// allocations of those that started took (to find where a launch that
/// grows spends its time).
fn trace(
    gpu: &Gpu,
    b: &Buffers,
    name: &str,
    start: usize,
    growable: bool,
    serve: Serve,
) -> Result<()> {
    let n = KEEP_THREADS;
    let warps = n.div_ceil(32) as usize;
    let clock = gpu.alloc_zeroed(warps * 16)?;
    let h = keep_heap(gpu, start, growable)?;
    let svc = serve.start(&h)?;
    b.ptrs.zero()?;
    // SAFETY: `b.ptrs` holds n pointers, `b.errors` two u32s and `clock`
    // two words per warp; all outlive the launch, which `gpu.time` waits
    // for.
    let ms = gpu.time(|| unsafe {
        b.kernels.alloc_cuheap_traced(
            &LaunchConfig::for_threads(n),
            &h,
            n,
            KEEP_SIZE,
            b.ptrs.as_ptr(),
            b.errors.as_ptr(),
            clock.as_ptr(),
        )
    })?;
    drop(svc);
    // SAFETY: `b.ptrs` holds the blocks the launch just made.
    let e = unsafe { check_kept(gpu, b, &h, n)? };
    let mut t = vec![0u64; warps * 2];
    clock.read(0, &mut t)?;
    // Every warp wrote both words (the clock is never 0), in order.
    let clocks: Vec<[u64; 2]> = t.chunks(2).map(|w| [w[0], w[1]]).collect();
    if clocks.iter().any(|&[a, b]| a == 0 || b < a) {
        return Err(crate::Error::InvalidArgument(format!(
            "growth trace of {name}: a warp wrote no clock or a clock that runs back"
        )));
    }
    let t0 = clocks.iter().map(|w| w[0]).min().unwrap_or(0);
    let end = clocks.iter().map(|w| w[1]).max().unwrap_or(0);
    eprintln!(
        "TRACE {name}: {ms:.3} ms by events, {:.3} ms first warp start to last warp end, nulls {}, errors {}, growth {:?}",
        (end - t0) as f64 / 1e6,
        e[0],
        e[1],
        h.growth_stats()
    );
    const BIN: u64 = 100_000;
    let bins = ((end - t0) / BIN + 1) as usize;
    let mut started = vec![Vec::new(); bins];
    let mut ended = vec![0u32; bins];
    for [a, b] in clocks {
        started[((a - t0) / BIN) as usize].push((b - a) as f64 / 1e3);
        ended[((b - t0) / BIN) as usize] += 1;
    }
    eprintln!("TRACE ms | warps started | warps ended | alloc us of the started: median / p99 / max | over 20 us");
    for (i, (mut d, e)) in started.into_iter().zip(ended).enumerate() {
        if d.is_empty() && e == 0 {
            continue;
        }
        let slow = d.iter().filter(|&&x| x > 20.0).count();
        d.sort_by(f64::total_cmp);
        let at = |q: f64| {
            d.get(((d.len() as f64 - 1.0) * q) as usize)
                .copied()
                .unwrap_or(0.0)
        };
        eprintln!(
            "TRACE {:.1} | {} | {} | {:.1} / {:.1} / {:.1} | {}",
            i as f64 * BIN as f64 / 1e6,
            d.len(),
            e,
            at(0.5),
            at(0.99),
            at(1.0),
            slow
        );
    }
    Ok(())
}

/// The pair kernel at 1M x 16 B on a fixed heap and on a growable heap
/// with a service running (memory enough from the start), interleaved.
fn no_growth_needed(gpu: &Gpu, b: &Buffers, reps: usize, report: &mut Report) -> Result<()> {
    let (n, size) = (1u32 << 20, 16u32);
    let cfg = LaunchConfig::for_threads(n);
    let fixed = DeviceHeap::new(gpu, 1 << 30)?;
    let growable = DeviceHeap::growable(gpu, 1 << 30, RESERVE)?;
    let svc = growable.serve()?;
    let ahead = DeviceHeap::growable(gpu, 1 << 30, RESERVE)?;
    let svc_ahead = ahead.serve_ahead(75)?;
    let heaps = [&fixed, &growable, &ahead];
    let mut ms = [Vec::new(), Vec::new(), Vec::new()];
    for rep in 0..=reps * 3 {
        for (i, h) in heaps.iter().enumerate() {
            // SAFETY: `b.errors` holds two u32s; the heaps and the buffer
            // outlive the launch, which `gpu.time` waits for.
            let t =
                gpu.time(|| unsafe { b.kernels.pair_cuheap(&cfg, h, n, size, b.errors.as_ptr()) })?;
            if rep > 0 {
                ms[i].push(t as f64);
            }
        }
    }
    drop(svc);
    drop(svc_ahead);
    let e = b.errors()?;
    let case = "pair 1M x 16 B, no growth needed";
    let names = [
        "cuheap, fixed heap",
        "cuheap, growable heap with its service",
        "cuheap, growable heap with its service keeping memory ahead at 75% full",
    ];
    for ((name, h), t) in names.into_iter().zip(heaps).zip(ms) {
        let mut r = row(case, name.into(), t, h.capacity());
        r.nulls = e[0];
        r.errors = e[1] + u32::from(!h.stats()?.is_empty());
        report.rows.push(r);
    }
    Ok(())
}

/// Giving 1 GiB back, per GiB: a heap in a shared reservation grown by
/// 1 GiB, filled by 960K x 1 KiB blocks and emptied (both untimed), then
/// trimmed to 64 MiB on a stream ([`DeviceHeap::trim_on`]): CUDA events
/// around the trim's kernel (retiring the empty pages, fencing the step),
/// then the host's wall time to unmap the step into the bank
/// ([`DeviceHeap::finish_trims`]); or trimmed between launches
/// ([`DeviceHeap::trim`]: host wall time, the metadata copied both ways).
/// Beside them `cuMemFree` of 1 GiB (host wall time). A trim that gives
/// back less than the step counts as an error.
fn give_back(gpu: &Gpu, b: &Buffers, reps: usize, report: &mut Report) -> Result<()> {
    let n = KEEP_THREADS / 16 * 15;
    let cfg = LaunchConfig::for_threads(n);
    let step = 1usize << 30;
    let res = Reservation::new(gpu.context(), 2 * RESERVE)?;
    let (mut kernel, mut unmap, mut between, mut free) = (vec![], vec![], vec![], vec![]);
    let mut errs = [0u32; 2];
    // One heap each way, grown again every run (the bank's memory).
    let heaps = [
        DeviceHeap::growable_in(gpu, &res, START, RESERVE)?,
        DeviceHeap::growable_in(gpu, &res, START, RESERVE)?,
    ];
    for rep in 0..=reps {
        for (h, on_stream) in heaps.iter().zip([true, false]) {
            h.grow(START + step)?;
            // SAFETY: `b.ptrs` holds n pointers and `b.errors` two u32s;
            // the heap and both buffers outlive the launches, waited for.
            unsafe {
                b.kernels.alloc_cuheap(
                    &cfg,
                    h,
                    n,
                    KEEP_SIZE,
                    b.ptrs.as_ptr(),
                    b.errors.as_ptr(),
                )?;
                b.kernels.free_cuheap(&cfg, h, n, b.ptrs.as_ptr())?;
            }
            gpu.sync()?;
            let [nulls, errors] = b.errors()?;
            let back = if on_stream {
                let t = gpu.time(|| h.trim_on(gpu, gpu.stream(), START))?;
                let host = Instant::now();
                let back = h.finish_trims(true)?;
                if rep > 0 {
                    kernel.push(t as f64);
                    unmap.push(host.elapsed().as_secs_f64() * 1e3);
                }
                back
            } else {
                let cap = h.capacity();
                let host = Instant::now();
                // SAFETY: every launch on the heap was waited for above.
                let left = unsafe { h.trim(START) }?;
                if rep > 0 {
                    between.push(host.elapsed().as_secs_f64() * 1e3);
                }
                cap - left
            };
            errs[0] += nulls;
            errs[1] += errors + u32::from(back != step);
        }
        let m = gpu.alloc(step)?;
        let host = Instant::now();
        drop(m);
        if rep > 0 {
            free.push(host.elapsed().as_secs_f64() * 1e3);
        }
    }
    let case = "give 1 GiB back (heap emptied first), ms per GiB";
    let rows = [
        (
            "cuheap trim_on: its kernel on the stream (CUDA events)",
            kernel,
        ),
        ("cuheap trim_on: unmapping into the bank (host)", unmap),
        ("cuheap trim between launches (host)", between),
        ("cudaFree (cuMemFree, host)", free),
    ];
    for (i, (name, ms)) in rows.into_iter().enumerate() {
        let mut r = row(case, name.into(), ms, START);
        if i < 3 {
            (r.nulls, r.errors) = (errs[0], errs[1]);
        }
        report.rows.push(r);
    }
    Ok(())
}

/// Pieces [`pieces`] compares: `None`, a heap as made (one mapping per
/// step, no upkeep kernels: a trim stops at the last step in use);
/// `Some(0)`, one mapping per step with the upkeep kernels loaded (a trim
/// also gives back free steps before it); else pieces of that many bytes.
const PIECES: [Option<usize>; 6] = [
    None,
    Some(0),
    Some(256 << 20),
    Some(32 << 20),
    Some(8 << 20),
    Some(2 << 20),
];

/// Growth in pieces against whole steps, for each of [`PIECES`]: a fresh
/// heap grows by 1 GiB between launches (host wall time per GiB); a
/// heap growing from 64 MiB while 1M threads keep 1 KiB each (served on
/// demand, CUDA events; every block filled and checked); then the first
/// 15/16 of those threads' blocks are freed and a trim between launches
/// keeps 64 MiB at least: the memory mapped after it (the capacity
/// column) and its host time. The 64 MiB of blocks the last threads keep
/// are checked after the trim; a damaged one counts as an error.
fn pieces(
    gpu: &Gpu,
    b: &Buffers,
    reps: usize,
    report: &mut Report,
    progress: &mut impl FnMut(&str),
) -> Result<()> {
    let n = KEEP_THREADS;
    let cfg = LaunchConfig::for_threads(n);
    let freed = n / 16 * 15;
    for piece in PIECES {
        let name = match piece {
            None => "cuheap, one mapping per step, as made".to_string(),
            Some(0) => "cuheap, one mapping per step, upkeep kernels loaded".to_string(),
            Some(p) => format!("cuheap, pieces of {} MiB", p >> 20),
        };
        let set = |h: &DeviceHeap| piece.map_or(Ok(0), |p| h.set_growth_piece(gpu, p));
        progress(&format!("growth and give-back, {name}"));
        let (mut grow, mut launch, mut steps, mut trim, mut left) =
            (vec![], vec![], vec![], vec![], vec![]);
        let (mut errs, mut cap, mut grown) = ([0u32; 2], 0, 0);
        for rep in 0..=reps {
            let h = DeviceHeap::growable(gpu, START, START + (1 << 30))?;
            set(&h)?;
            let t = Instant::now();
            cap = h.grow(START + (1 << 30))?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            drop(h);
            let h = keep_heap(gpu, START, true)?;
            set(&h)?;
            let svc = h.serve()?;
            b.ptrs.zero()?;
            let before = h.growth_stats();
            // SAFETY: as in `during_launch`.
            let t = gpu.time(|| unsafe {
                b.kernels
                    .alloc_cuheap(&cfg, &h, n, KEEP_SIZE, b.ptrs.as_ptr(), b.errors.as_ptr())
            })?;
            let after = h.growth_stats();
            svc.stop()?;
            grown = h.capacity();
            // SAFETY: `b.ptrs` holds the blocks the launch just made.
            let e = unsafe { check_kept(gpu, b, &h, n)? };
            // SAFETY: `b.ptrs` holds n live blocks of the heap; the first
            // `freed` go, the launch is waited for.
            unsafe {
                let first = LaunchConfig::for_threads(freed);
                b.kernels.free_cuheap(&first, &h, freed, b.ptrs.as_ptr())?;
            }
            gpu.sync()?;
            let host = Instant::now();
            // SAFETY: every launch on the heap was waited for.
            let kept = unsafe { h.trim(START) }?;
            let trim_ms = host.elapsed().as_secs_f64() * 1e3;
            // The last threads' blocks, filled by `check_kept`, still hold
            // their data.
            let mut ptrs = vec![0u64; n as usize];
            b.ptrs.read(0, &mut ptrs)?;
            ptrs[..freed as usize].fill(0);
            b.ptrs.write(0, &ptrs)?;
            // SAFETY: `b.ptrs` holds the live blocks (or nulls), 1 KiB each.
            unsafe {
                b.kernels.check_blocks(
                    &cfg,
                    b.ptrs.as_ptr(),
                    n,
                    KEEP_SIZE,
                    1,
                    b.errors.as_ptr(),
                )?;
                b.kernels.free_cuheap(&cfg, &h, n, b.ptrs.as_ptr())?;
            }
            gpu.sync()?;
            let [_, damaged] = b.errors()?;
            errs[0] += e[0];
            errs[1] += e[1] + damaged;
            if rep > 0 {
                grow.push(ms);
                launch.push(t as f64);
                steps.push((after.live_steps - before.live_steps) as f64);
                trim.push(trim_ms);
                left.push(kept as f64);
            }
        }
        report.rows.push(row(
            "grow by 1 GiB between launches, by mapping, ms per GiB",
            name.clone(),
            grow,
            cap,
        ));
        let mut r = row(
            "1M threads keep 1 KiB each (1 GiB live), one launch, by mapping",
            format!("{name}, growing from 64 MiB while the kernel runs"),
            launch,
            grown,
        );
        r.live_steps = median(&mut steps) as u64;
        (r.nulls, r.errors) = (errs[0], errs[1]);
        report.rows.push(r);
        let kept = median(&mut left) as usize;
        report.rows.push(row(
            "the same, then the first 15/16 freed and a trim (capacity: what it keeps)",
            name,
            trim,
            kept,
        ));
    }
    Ok(())
}

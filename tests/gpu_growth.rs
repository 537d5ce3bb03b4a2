//! The device heap growing while a kernel runs: a growth service maps
//! memory for threads that find the heap short, every block is filled
//! and checked, blocks from before the growth stay valid, and a heap that
//! cannot grow enough gives counted nulls in bounded time, never a hang.

mod common;
use common::*;
use cuheap::{DeviceHeap, DevicePtr, LaunchConfig};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The tests of this file run one at a time, whatever `--test-threads`
/// says: kernels of two tests that wait for growth on one GPU at the
/// same time time out (all six failed together on an H100 80 GB with the
/// default test threads, `docs/gpu-tests-6921926-h100.txt`; see
/// Limitations in the README).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static GPU: Mutex<()> = Mutex::new(());
    GPU.lock().unwrap_or_else(|p| p.into_inner())
}

/// 1M threads keep 1 KiB each (1 GiB) from a heap that starts at 32 MiB
/// (32x less): one launch, no null, every block checked; blocks a kernel
/// made before the growth keep their addresses and contents.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn one_launch_grows_the_heap_32x_and_every_block_checks() {
    let _one = one_at_a_time();
    let gpu = gpu();
    let h = DeviceHeap::growable(&gpu, 32 << 20, 4 << 30).unwrap();
    let svc = h.serve().unwrap();
    // Before: 64K threads take 256 B each (16 MiB) and fill their blocks.
    let early = Bufs::new(&gpu, 64 << 10);
    alloc(&gpu, &h, &early, 64 << 10, 256);
    assert_eq!(early.take_errors(), [0, 0]);
    let early_ptrs = early.ptrs(64 << 10);
    let n = 1u32 << 20;
    let b = Bufs::new(&gpu, n);
    let t = Instant::now();
    alloc(&gpu, &h, &b, n, 1024);
    let wall = t.elapsed();
    let g = h.growth_stats();
    let s = h.stats().unwrap();
    let why = h.growth_refusal();
    assert_eq!(
        b.take_errors(),
        [0, 0],
        "nulls while growing: {s:?} {g:?} {why:?}"
    );
    assert!(g.live_steps >= 3, "{g:?}");
    assert!(h.capacity() >= 1 << 30, "capacity {}", h.capacity());
    assert_eq!(s.blocks(), n as u64 + (64 << 10), "{s:?}");
    assert_eq!(s.failed_allocs, 0);
    assert!(
        s.grow_requests >= g.live_steps && s.grow_requests < 1000,
        "{s:?}"
    );
    assert_eq!(s.grow_timeouts, 0, "a thread waited for the host in vain");
    fill_check(&gpu, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0], "blocks overlap after growth");
    // The early blocks: same addresses (nothing moved), still theirs.
    assert_eq!(early.ptrs(64 << 10), early_ptrs);
    fill_check(&gpu, &early, 64 << 10, 256);
    assert_eq!(early.take_errors(), [0, 0], "an early block was damaged");
    svc.stop().unwrap();
    free(&gpu, &h, &b, n);
    free(&gpu, &h, &early, 64 << 10);
    let s = h.stats().unwrap();
    assert!(s.is_empty(), "blocks not returned");
    println!(
        "1M x 1 KiB from 32 MiB in one launch: {:?} wall, {} steps to {} MiB, {} requests, {:.0} us mapping per step",
        wall,
        g.live_steps,
        h.capacity() >> 20,
        s.grow_requests,
        g.nanos as f64 / 1e3 / g.steps as f64
    );
}

/// Spans and mixed sizes grow the heap too (the random stress kernel on
/// a 16 MiB start), and the heap checks out afterwards.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn mixed_sizes_and_spans_grow_while_running() {
    let _one = one_at_a_time();
    let gpu = gpu();
    let h = DeviceHeap::growable(&gpu, 16 << 20, 8 << 30).unwrap();
    let _svc = h.serve().unwrap();
    let n = 256u32 << 10;
    let b = Bufs::new(&gpu, n);
    // Size 0 is the mixed workload (16 B to 4 KiB); then 64 KiB + 1 spans.
    alloc(&gpu, &h, &b, n, 0);
    assert_eq!(b.take_errors(), [0, 0]);
    fill_check(&gpu, &b, n, 0);
    assert_eq!(b.take_errors(), [0, 0]);
    let spans = Bufs::new(&gpu, 8 << 10);
    alloc(&gpu, &h, &spans, 8 << 10, (64 << 10) + 1);
    assert_eq!(spans.take_errors(), [0, 0], "span nulls while growing");
    fill_check(&gpu, &spans, 8 << 10, (64 << 10) + 1);
    assert_eq!(spans.take_errors(), [0, 0]);
    assert!(h.growth_stats().live_steps >= 2, "{:?}", h.growth_stats());
    free(&gpu, &h, &b, n);
    free(&gpu, &h, &spans, 8 << 10);
    assert!(h.stats().unwrap().is_empty());
}

/// A reservation of 128 MiB cannot hold 1 GiB: the kernel ends (no
/// hang), the threads the heap could not serve get null, each counted;
/// the blocks it did hand out check.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_heap_that_cannot_grow_enough_gives_counted_nulls_promptly() {
    let _one = one_at_a_time();
    let gpu = gpu();
    let h = DeviceHeap::growable(&gpu, 16 << 20, 128 << 20).unwrap();
    let svc = h.serve().unwrap();
    let n = 1u32 << 20;
    let b = Bufs::new(&gpu, n);
    let t = Instant::now();
    alloc(&gpu, &h, &b, n, 1024);
    let wall = t.elapsed();
    println!("a 128 MiB reservation asked for 1 GiB: {wall:?}");
    let [nulls, damaged] = b.take_errors();
    let s = h.stats().unwrap();
    assert!(nulls > n / 2, "{nulls} nulls");
    assert_eq!(damaged, 0);
    assert_eq!(s.failed_allocs, nulls as u64);
    assert_eq!(h.capacity(), 128 << 20, "{s:?}");
    // A full reservation is known on the device: nobody waited in vain.
    assert_eq!(s.grow_timeouts, 0, "{s:?}");
    fill_check(&gpu, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    svc.stop().unwrap();
    free(&gpu, &h, &b, n);
    assert!(h.stats().unwrap().is_empty());
    println!("refused past 128 MiB: {nulls} nulls in {wall:?}");
}

/// A service that keeps memory ahead maps a step once the heap's fill
/// passes its mark, with no thread asking: a kernel that fills 40 MiB of
/// a 64 MiB heap never waits, the service then maps the next step, and a
/// second kernel that takes the heap past 64 MiB finds it mapped and
/// does not wait either. Every block checks. Fills out of 1..=99 and
/// fixed heaps are refused.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_service_that_keeps_memory_ahead_maps_before_threads_run_short() {
    let _one = one_at_a_time();
    let gpu = gpu();
    let start = 64usize << 20;
    let h = DeviceHeap::growable(&gpu, start, 1 << 30).unwrap();
    assert!(h.serve_ahead(0).is_err() && h.serve_ahead(100).is_err());
    let svc = h.serve_ahead(50).unwrap();
    let n = 40u32 << 10; // 40 MiB of 1 KiB blocks
    let first = Bufs::new(&gpu, n);
    alloc(&gpu, &h, &first, n, 1024);
    assert_eq!(first.take_errors(), [0, 0]);
    // The service reads the fill at least every millisecond; a step is
    // 64 MiB. (A bound, not a timing: it only keeps a broken service from
    // hanging the test.)
    let t = Instant::now();
    while h.growth_stats().ahead_steps == 0 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let g = h.growth_stats();
    assert!(g.ahead_steps >= 1 && g.live_steps == 0, "{g:?}");
    assert!(h.capacity() >= 2 * start, "capacity {}", h.capacity());
    let second = Bufs::new(&gpu, n);
    alloc(&gpu, &h, &second, n, 1024);
    assert_eq!(second.take_errors(), [0, 0]);
    let (s, g) = (h.stats().unwrap(), h.growth_stats());
    assert_eq!(s.grow_waits, 0, "a thread waited: {s:?} {g:?}");
    assert_eq!(s.grow_requests, 0, "a thread asked: {s:?} {g:?}");
    assert_eq!(g.live_steps, 0, "{g:?}");
    assert_eq!(s.blocks(), 2 * n as u64, "{s:?}");
    fill_check(&gpu, &first, n, 1024);
    fill_check(&gpu, &second, n, 1024);
    assert_eq!(first.take_errors(), [0, 0]);
    assert_eq!(second.take_errors(), [0, 0]);
    svc.stop().unwrap();
    free(&gpu, &h, &first, n);
    free(&gpu, &h, &second, n);
    assert!(h.stats().unwrap().is_empty());
    let fixed = DeviceHeap::new(&gpu, 4 << 20).unwrap();
    assert!(fixed.serve_ahead(50).is_err());
    println!(
        "kept ahead at 50%: {} steps ahead to {} MiB, none asked",
        g.ahead_steps,
        h.capacity() >> 20
    );
}

/// What a heap's growth did, for a test's output: its capacity, the
/// service's steps, its last refusal, and the heap's growth counts.
fn growth_report(h: &DeviceHeap) -> String {
    let (s, g) = (h.stats().unwrap(), h.growth_stats());
    format!(
        "{} MiB, {g:?}, refusal {:?}, requests {} waits {} timeouts {} refusals {} failed {}",
        h.capacity() >> 20,
        h.growth_refusal(),
        s.grow_requests,
        s.grow_waits,
        s.grow_timeouts,
        s.grow_refusals,
        s.failed_allocs
    )
}

/// 1M threads of mixed sizes (16 B to 4 KiB, about 2 GiB) from 64 MiB
/// in one launch, on a fresh heap and on one served only after it ran
/// short without a service, grew between launches and was trimmed back
/// (what a CUDA C++ program does through the C API): no null, every
/// block checked, both times.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_heap_served_after_growth_and_a_trim_grows_in_the_launch() {
    let _one = one_at_a_time();
    let gpu = gpu();
    let start = 64usize << 20;
    let n = 1u32 << 20;
    let b = Bufs::new(&gpu, n);
    let served_launch = |h: &DeviceHeap, what: &str| {
        let svc = h.serve().unwrap();
        let t = Instant::now();
        alloc(&gpu, h, &b, n, 0);
        let wall = t.elapsed();
        let e = b.take_errors();
        let report = growth_report(h);
        println!("{what}: {wall:?}, {} nulls, {report}", e[0]);
        assert_eq!(e, [0, 0], "{what}: {report}");
        fill_check(&gpu, &b, n, 0);
        assert_eq!(b.take_errors(), [0, 0], "{what}: blocks overlap");
        svc.stop().unwrap();
        free(&gpu, h, &b, n);
        assert!(h.stats().unwrap().is_empty(), "{what}");
    };
    let fresh = DeviceHeap::growable(&gpu, start, 4 << 30).unwrap();
    served_launch(&fresh, "fresh heap");
    drop(fresh);
    let h = DeviceHeap::growable(&gpu, start, 4 << 30).unwrap();
    alloc(&gpu, &h, &b, n, 0);
    let short = h.stats().unwrap();
    assert!(
        b.take_errors()[0] > 0 && short.failed_bytes > 0,
        "{short:?}"
    );
    free(&gpu, &h, &b, n);
    let grown = h
        .grow(h.capacity() + 2 * short.failed_bytes as usize)
        .unwrap();
    alloc(&gpu, &h, &b, n, 0);
    assert_eq!(b.take_errors(), [0, 0], "grown to {} MiB", grown >> 20);
    free(&gpu, &h, &b, n);
    // SAFETY: every launch on this heap was waited for.
    let trimmed = unsafe { h.trim(0) }.unwrap();
    assert!(trimmed < grown, "{trimmed} of {grown}");
    served_launch(&h, "served after a trim");
}

/// The CUDA C++ side of [`cuda_cpp_kernels_grow_the_module_heap_in_the_launch`],
/// carried by the test executable (it may run far from the source tree).
const GROW_CU: &str = include_str!("capi/grow.cu");

/// CUDA C++ kernels that allocate through the C ABI's `cuheap_malloc`
/// (the module's heap, installed) grow a served heap from 64 MiB in one
/// launch, as Rust kernels do: 1M threads, every warp in nine classes
/// (16 B to 4 KiB, each block filled whole), the same with one word
/// written, and 1 KiB each; no null, every block checked.
///
/// And the rule's other side: a host that waits in a synchronous copy
/// queued behind the launch (`cudaMemcpy` right after it) holds up the
/// service's driver calls until the kernel ends, so its waiting threads
/// time out. Once one of them has, the others short at that limit give
/// up at once: the launch ends with its nulls counted and every block it
/// got intact, at most one timeout per resident thread and limit. (Before
/// that, each wave of threads waited out the timeout: on an H100 80 GB
/// 1,062,156 timeouts, 64 s; `docs/growth-behind-a-sync-copy-h100.txt`.)
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_cpp_kernels_grow_the_module_heap_in_the_launch() {
    let _one = one_at_a_time();
    let ptx = nvcc_ptx("grow", GROW_CU);
    let gpu = cuheap::open_linked(&[&ptx]).unwrap();
    type Args = (u32, u32, DevicePtr<u64>, DevicePtr<u32>);
    let fill = gpu.kernel::<Args>("grow_fill").unwrap();
    let check = gpu.kernel::<Args>("grow_check_free").unwrap();
    let n = 1u32 << 20;
    let ptrs = gpu.alloc_zeroed(n as usize * 8).unwrap();
    let errors = gpu.alloc_zeroed(8).unwrap();
    let mut failed = Vec::new();
    // The host waits for the launch with a context synchronise before it
    // reads anything, or (`by_copy`) reads at once with a synchronous
    // copy to pageable memory on the legacy default stream, queued behind
    // the kernel, as `cudaMemcpy` right after a launch does.
    for (mode, by_copy) in [(0u32, false), (1, false), (2, false), (0, true)] {
        let h = DeviceHeap::growable(&gpu, 64 << 20, 4 << 30).unwrap();
        h.install(&gpu).unwrap();
        let svc = h.serve().unwrap();
        let args = (n, mode, ptrs.as_ptr(), errors.as_ptr());
        let t = Instant::now();
        // SAFETY: `ptrs` holds n pointers and `errors` two u32s; they and
        // the installed heap outlive the launch, which is waited for.
        unsafe { fill.launch(&LaunchConfig::for_threads(n), args) }.unwrap();
        if !by_copy {
            gpu.sync().unwrap();
        }
        let mut e = [0u32; 2];
        errors.read(0, &mut e).unwrap();
        let wall = t.elapsed();
        println!(
            "C++ mode {mode}, waited by copy {by_copy}: {wall:?}, {} nulls, {}",
            e[0],
            growth_report(&h)
        );
        let (s, g) = (h.stats().unwrap(), h.growth_stats());
        assert_eq!(s.failed_allocs, e[0] as u64, "mode {mode}: nulls uncounted");
        // SAFETY: as above.
        unsafe { check.launch(&LaunchConfig::for_threads(n), args) }.unwrap();
        gpu.sync().unwrap();
        let mut after = [0u32; 2];
        errors.read(0, &mut after).unwrap();
        errors.zero().unwrap();
        svc.stop().unwrap();
        if by_copy {
            // Every limit the kernel saw (one per step, and the first)
            // costs at most one timeout per thread resident at once.
            let resident = gpu.info().sms as u64 * 2048;
            let bound = resident * (g.steps + 1);
            assert!(
                s.grow_timeouts <= bound,
                "{} timeouts over {bound}",
                s.grow_timeouts
            );
            assert_eq!(after[1], 0, "mode {mode} by copy: damaged blocks");
        } else if e[0] != 0 || after[1] != 0 {
            failed.push((mode, e[0], after[1]));
        }
        assert!(h.stats().unwrap().is_empty(), "mode {mode}: blocks left");
    }
    assert!(failed.is_empty(), "(mode, nulls, damaged): {failed:?}");
}

/// Without a service a growable heap behaves as before: nulls, counted,
/// and `run_growing` grows between launches; a second service on one
/// heap is refused; a fixed heap has none.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn service_rules() {
    let _one = one_at_a_time();
    let gpu = gpu();
    let h = DeviceHeap::growable(&gpu, 4 << 20, 4 << 30).unwrap();
    let n = 64u32 << 10;
    let b = Bufs::new(&gpu, n);
    alloc(&gpu, &h, &b, n, 1024);
    assert!(b.take_errors()[0] > 0, "a 4 MiB heap served 64 MiB");
    free(&gpu, &h, &b, n);
    let svc = h.serve().unwrap();
    assert!(h.serve().is_err(), "two services on one heap");
    b.ptrs.zero().unwrap();
    alloc(&gpu, &h, &b, n, 1024);
    let e = b.take_errors();
    let (s, g) = (h.stats().unwrap(), (h.growth_stats(), h.growth_refusal()));
    svc.stop().unwrap();
    assert_eq!(e, [0, 0], "{s:?} {g:?}");
    free(&gpu, &h, &b, n);
    // After a reset the service keeps serving.
    let svc = h.serve().unwrap();
    // SAFETY: every launch on this heap was waited for.
    unsafe { h.reset() }.unwrap();
    let big = Bufs::new(&gpu, 1 << 20);
    alloc(&gpu, &h, &big, 1 << 20, 1024);
    let e = big.take_errors();
    let (s, g) = (h.stats().unwrap(), (h.growth_stats(), h.growth_refusal()));
    svc.stop().unwrap();
    assert_eq!(e, [0, 0], "{s:?} {g:?}");
    free(&gpu, &h, &big, 1 << 20);
    let fixed = DeviceHeap::new(&gpu, 4 << 20).unwrap();
    assert!(fixed.serve().is_err());
}

/// `trim` after the blocks are freed gives the grown memory back
/// (`cuMemGetInfo` shows it), never a step that holds a live block
/// (those blocks still check afterwards), and the heap grows again; 100
/// cycles of growing by 256 MiB, filling, freeing and trimming leak
/// nothing.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn trim_gives_memory_back_and_grow_shrink_cycles_leak_nothing() {
    let _one = one_at_a_time();
    let gpu = gpu();
    let start = 64usize << 20;
    let h = DeviceHeap::growable(&gpu, start, 8 << 30).unwrap();
    let n = 1u32 << 20;
    let b = Bufs::new(&gpu, n);
    let svc = h.serve().unwrap();
    alloc(&gpu, &h, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    let grown = h.capacity();
    assert!(grown >= 1 << 30, "{grown}");
    // Free the even threads' blocks, keep the odd ones.
    let all = b.ptrs(n);
    let (even, odd): (Vec<u64>, Vec<u64>) = all
        .iter()
        .enumerate()
        .map(|(i, &p)| if i % 2 == 0 { (p, 0) } else { (0, p) })
        .unzip();
    b.ptrs.write(0, &even).unwrap();
    free(&gpu, &h, &b, n);
    b.ptrs.write(0, &odd).unwrap();
    // SAFETY: every launch on this heap was waited for.
    let kept = unsafe { h.trim(start) }.unwrap();
    assert!(kept > start, "trim unmapped steps that hold live blocks");
    fill_check(&gpu, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0], "a live block was damaged by trim");
    free(&gpu, &h, &b, n);
    svc.stop().unwrap();
    let before = gpu.mem_info().unwrap().0;
    // SAFETY: as above.
    let after_trim = unsafe { h.trim(start) }.unwrap();
    let freed = gpu.mem_info().unwrap().0.saturating_sub(before);
    assert_eq!(after_trim, start);
    assert!(h.stats().unwrap().is_empty());
    assert!(
        freed >= (kept - start) / 4 * 3,
        "trim unmapped {} MiB, cuMemGetInfo shows {} MiB back",
        (kept - start) >> 20,
        freed >> 20
    );
    // Grow, fill, free, trim: 100 times; the free memory comes back.
    let base = gpu.mem_info().unwrap().0;
    let m = 64u32 << 10;
    for cycle in 0..100 {
        h.grow(start + (256 << 20)).unwrap();
        alloc(&gpu, &h, &b, m, 1024);
        fill_check(&gpu, &b, m, 1024);
        assert_eq!(b.take_errors(), [0, 0], "cycle {cycle}");
        free(&gpu, &h, &b, m);
        // SAFETY: as above.
        assert_eq!(unsafe { h.trim(start) }.unwrap(), start, "cycle {cycle}");
    }
    let end = gpu.mem_info().unwrap().0;
    assert!(
        end + (8 << 20) >= base,
        "100 cycles lost {} MiB",
        (base - end) >> 20
    );
    assert!(h.stats().unwrap().is_empty());
    println!(
        "trim: {} MiB grown, {} MiB kept with half the blocks live, {} MiB back after all were freed; 100 cycles: free memory {} -> {} MiB",
        grown >> 20,
        kept >> 20,
        freed >> 20,
        base >> 20,
        end >> 20
    );
}

/// One reservation for the host pool and the device heap: a kernel grows
/// the heap while it runs (1M threads keep 1 KiB, from 64 MiB), frees
/// it all, the heap is trimmed into the reservation's bank, and a host
/// allocation of 512 MiB maps that memory (no new device memory); the
/// pool frees and trims, and the heap grows into what the pool gave
/// back, again while a kernel runs. Every block checks; at the end the
/// bank goes back and `cuMemGetInfo` shows the memory back.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn memory_freed_by_a_kernel_serves_a_host_allocation_and_the_reverse() {
    let _one = one_at_a_time();
    use cuheap::{Pool, PoolConfig, Reservation};
    let gpu = gpu();
    let free_at_start = gpu.mem_info().unwrap().0;
    let res = Reservation::new(gpu.context(), 64 << 30).unwrap();
    let cfg = PoolConfig {
        initial: 32 << 20,
        chunk: 32 << 20,
        ..PoolConfig::new(16 << 30)
    };
    let pool = Pool::shared(&res, cfg).unwrap();
    let start = 64usize << 20;
    let h = DeviceHeap::growable_in(&gpu, &res, start, 16 << 30).unwrap();
    let n = 1u32 << 20;
    let b = Bufs::new(&gpu, n);

    // A kernel grows the heap while it runs, then everything is freed.
    let svc = h.serve().unwrap();
    alloc(&gpu, &h, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    fill_check(&gpu, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    free(&gpu, &h, &b, n);
    svc.stop().unwrap();
    let grown = h.capacity();
    assert!(grown >= 1 << 30, "{grown}");

    // Trimmed, the heap's memory goes to the bank, where the pool maps it.
    // SAFETY: every launch on this heap was waited for.
    assert_eq!(unsafe { h.trim(start) }.unwrap(), start);
    let s = res.stats();
    assert_eq!(s.banked, grown - start, "{s:?}");
    assert_eq!(
        (pool.stats().banked, pool.stats().device_heap_mapped),
        (s.banked, start)
    );
    let stream = gpu.context().new_stream().unwrap();
    let size = 512usize << 20;
    let p = host_block_from_the_bank(&gpu, &pool, &res, &stream, size, 0xA5A5_A5A5);
    let pool_mapped = pool.stats().reserved;

    // The reverse: the pool frees and trims into the bank, and the heap
    // grows into that memory while a kernel runs.
    pool.free(p, &stream).unwrap();
    pool.trim(0).unwrap();
    let s = res.stats();
    assert_eq!(s.banked, pool_mapped - (32 << 20), "{s:?}");
    let (created, reused) = (s.created, s.reused);
    let svc = h.serve().unwrap();
    alloc(&gpu, &h, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    fill_check(&gpu, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    svc.stop().unwrap();
    let s = res.stats();
    let again = h.capacity() - start;
    assert!(
        s.reused - reused >= size,
        "the heap mapped little of the bank: {s:?}"
    );
    assert!(
        s.created - created <= again.saturating_sub(s.reused - reused),
        "{s:?}"
    );
    free(&gpu, &h, &b, n);

    // All back to the device.
    // SAFETY: as above.
    unsafe { h.trim(0) }.unwrap();
    pool.trim(0).unwrap();
    let released = res.release();
    drop(h);
    drop(pool);
    res.release();
    let s = res.stats();
    drop(res);
    let free_at_end = gpu.mem_info().unwrap().0;
    assert!(
        free_at_end + (16 << 20) >= free_at_start,
        "{} MiB free at the start, {} at the end: {s:?}",
        free_at_start >> 20,
        free_at_end >> 20
    );
    println!(
        "one reservation: the heap grew to {} MiB in a launch, a 512 MiB host allocation reused its memory (created {} MiB in all, reused {} MiB), the heap grew again into the pool's; {} MiB released at the end, free memory {} -> {} MiB",
        grown >> 20,
        s.created >> 20,
        s.reused >> 20,
        released >> 20,
        free_at_start >> 20,
        free_at_end >> 20
    );
}

/// Allocates `size` bytes from `pool` on `stream`, fills them with
/// `pattern` and checks them with kernels on that stream, and asserts the
/// reservation created no memory for it (the pool mapped what the bank
/// held). Returns the block, for the caller to free.
fn host_block_from_the_bank(
    gpu: &cuheap::Gpu,
    pool: &cuheap::Pool,
    res: &cuheap::Reservation,
    stream: &std::sync::Arc<cuheap::cudarc::driver::CudaStream>,
    size: usize,
    pattern: u32,
) -> u64 {
    use cuheap::{DevicePtr, LaunchConfig};
    let created = res.stats().created;
    let p = pool.alloc(size, stream).unwrap();
    let k = kernels(gpu);
    let errors = gpu.alloc_zeroed(4).unwrap();
    let words = (size / 4) as u32;
    let launch = LaunchConfig::for_threads(256 * 1024).on(stream);
    // SAFETY: `p` is a live block of `words` u32s until the caller frees
    // it, on `stream`, after these kernels; `errors` holds a u32.
    unsafe {
        k.spin_fill(&launch, DevicePtr::from_raw(p), words, pattern, 0)
            .unwrap();
        k.check_fill(
            &launch,
            DevicePtr::from_raw(p),
            words,
            pattern,
            1,
            errors.as_ptr(),
        )
        .unwrap();
    }
    let mut e = [0u32];
    errors.read_on(0, &mut e, stream).unwrap();
    assert_eq!(
        e[0], 0,
        "the host allocation's memory did not hold its data"
    );
    let s = res.stats();
    assert_eq!(
        s.created, created,
        "the host allocation made new memory: {s:?}"
    );
    assert!(s.reused >= size, "{s:?}");
    p
}

/// Waits until `state[0]` counts `n` holders (read on `stream`, which
/// runs beside them).
fn wait_for_holders(
    state: &cuheap::host::DeviceMemory,
    n: u32,
    stream: &cuheap::cudarc::driver::CudaStream,
) {
    let t = Instant::now();
    loop {
        let mut s = [0u32; 2];
        state.read_on(0, &mut s, stream).unwrap();
        if s[0] == n {
            return;
        }
        assert!(
            t.elapsed().as_secs() < 30,
            "{} of {n} holders started",
            s[0]
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A trim on a stream gives the heap's free steps back while a kernel on
/// another stream holds blocks of the heap: the memory reaches the bank
/// and serves a host allocation (no new memory) while that kernel still
/// runs; its blocks keep their contents and it takes new ones, never in
/// the hole; growth then maps the hole again (its pages unfenced) and a
/// kernel fills it; `trim` and `reset` between launches drop holes at the
/// end.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn memory_goes_back_to_the_pool_while_a_kernel_holds_blocks_of_the_heap() {
    let _one = one_at_a_time();
    use cuheap::{LaunchConfig, Pool, PoolConfig, Reservation};
    let gpu = gpu();
    let k = kernels(&gpu);
    let res = Reservation::new(gpu.context(), 64 << 30).unwrap();
    let cfg = PoolConfig {
        initial: 32 << 20,
        chunk: 32 << 20,
        ..PoolConfig::new(16 << 30)
    };
    let pool = Pool::shared(&res, cfg).unwrap();
    let start = 64usize << 20;
    let h = DeviceHeap::growable_in(&gpu, &res, start, 4 << 30).unwrap();
    let (held, work) = (
        gpu.context().new_stream().unwrap(),
        gpu.context().new_stream().unwrap(),
    );

    // 8,192 threads take a 1 KiB block each and hold it until told.
    let holders = 8192u32;
    let state = gpu.alloc_zeroed(8).unwrap();
    let held_errors = gpu.alloc_zeroed(8).unwrap();
    let on_held = LaunchConfig::for_threads(holders).on(&held);
    // SAFETY: the heap, `state` (two u32s, the second written below) and
    // `held_errors` (two u32s) outlive the launch, waited for below.
    unsafe {
        k.hold_blocks(
            &on_held,
            &h,
            holders,
            1024,
            state.as_ptr(),
            held_errors.as_ptr(),
        )
        .unwrap()
    };
    wait_for_holders(&state, holders, &work);

    // Meanwhile the heap grows to 1 GiB, and a kernel on another stream
    // takes 512 MiB of it and frees it; a trim queued after it.
    assert_eq!(h.grow(1 << 30).unwrap(), 1 << 30);
    let n = 512 * 1024;
    let b = Bufs::new(&gpu, n);
    let on_work = LaunchConfig::for_threads(n).on(&work);
    // SAFETY: `b` holds n pointers and two counters; the heap and `b`
    // outlive the launches, waited for below.
    unsafe {
        b.kernels
            .alloc_cuheap(&on_work, &h, n, 1024, b.ptrs.as_ptr(), b.errors.as_ptr())
            .unwrap();
        b.kernels
            .free_cuheap(&on_work, &h, n, b.ptrs.as_ptr())
            .unwrap();
    }
    h.trim_on(&gpu, &work, start).unwrap();
    work.synchronize().unwrap();
    let mut e = [0u32; 2];
    b.errors.read_on(0, &mut e, &work).unwrap();
    assert_eq!(e, [0, 0], "nulls and bad blocks of the 512 MiB kernel");
    let back = h.finish_trims(false).unwrap();
    assert_eq!(back, (1 << 30) - start, "the grown step went back");
    assert_eq!(h.capacity(), start);
    let s = res.stats();
    assert_eq!(s.banked, back, "{s:?}");
    let stats = h.stats().unwrap();
    assert_eq!(
        stats.page_count as usize,
        start / cuheap::core::PAGE_SIZE,
        "the hole's pages are not counted"
    );

    // The pool maps that memory and its block holds data, while the
    // holders still run (they wait for `state[1]`).
    let size = 512usize << 20;
    let p = host_block_from_the_bank(&gpu, &pool, &res, &work, size, 0x5A5A_5A5A);
    let mut st = [0u32; 2];
    state.read_on(0, &mut st, &work).unwrap();
    assert_eq!(st, [holders, 0], "the holders still wait");
    pool.free(p, &work).unwrap();

    // The holders go on: their blocks kept their contents, and each takes
    // and checks a second block.
    state.write_on(4, &[1u32], &work).unwrap();
    held.synchronize().unwrap();
    let mut he = [0u32; 2];
    held_errors.read_on(0, &mut he, &held).unwrap();
    assert_eq!(he, [0, 0], "nulls and bad blocks of the holders");

    // Growth maps the hole again; a kernel takes 768 MiB, all checked.
    assert_eq!(h.grow(1 << 30).unwrap(), 1 << 30);
    let n = 768 * 1024;
    let b = Bufs::new(&gpu, n);
    alloc(&gpu, &h, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    fill_check(&gpu, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    let base = h.handle().data;
    let in_hole = b
        .ptrs(n)
        .iter()
        .filter(|&&p| p >= base + start as u64)
        .count();
    assert!(
        in_hole > n as usize / 2,
        "{in_hole} blocks where the hole was"
    );
    free(&gpu, &h, &b, n);

    // Trimmed on a stream again, then between launches: holes at the end
    // go, and the heap grows over their pages again.
    h.trim_on(&gpu, &work, start).unwrap();
    assert_eq!(h.finish_trims(true).unwrap(), (1 << 30) - start);
    // SAFETY: every launch on this heap was waited for.
    assert_eq!(unsafe { h.trim(start) }.unwrap(), start);
    // A hole at the end again, then a reset. (Growth maps a banked
    // piece whole: the 960 MiB the last trim gave back.)
    let grown = h.grow(512 << 20).unwrap();
    assert!(grown >= 512 << 20, "{grown}");
    alloc(&gpu, &h, &b, 1024, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    free(&gpu, &h, &b, 1024);
    h.trim_on(&gpu, &work, start).unwrap();
    assert_eq!(h.finish_trims(true).unwrap(), grown - start);
    // SAFETY: as above.
    unsafe { h.reset() }.unwrap();
    assert_eq!(h.capacity(), start);
    let cap = h.capacity();
    let svc = h.serve().unwrap();
    alloc(&gpu, &h, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    fill_check(&gpu, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    svc.stop().unwrap();
    free(&gpu, &h, &b, n);
    println!(
        "trim on a stream: {} MiB back to the bank while a kernel held 8 MiB of the heap; the pool reused it (created {} MiB in all); after a reset the heap had {} MiB and grew to {} MiB in a launch",
        back >> 20,
        res.stats().created >> 20,
        cap >> 20,
        h.capacity() >> 20
    );
}

/// Twenty rounds of growth, a kernel that fills and frees the growth,
/// and a trim on a stream: each gives the growth back, the next maps
/// the memory the last gave back (no new memory after the first round),
/// and the holes never use up the heap's range (4x one round's growth).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn rounds_of_growth_and_trims_on_a_stream_leak_nothing() {
    let _one = one_at_a_time();
    use cuheap::Reservation;
    let gpu = gpu();
    let res = Reservation::new(gpu.context(), 16 << 30).unwrap();
    let start = 64usize << 20;
    let h = DeviceHeap::growable_in(&gpu, &res, start, 2 << 30).unwrap();
    let stream = gpu.context().new_stream().unwrap();
    let n = 384 * 1024;
    let b = Bufs::new(&gpu, n);
    let mut created = Vec::new();
    for round in 0..20 {
        assert_eq!(h.grow(512 << 20).unwrap(), 512 << 20, "round {round}");
        alloc(&gpu, &h, &b, n, 1024);
        assert_eq!(b.take_errors(), [0, 0], "round {round}");
        fill_check(&gpu, &b, n, 1024);
        assert_eq!(b.take_errors(), [0, 0], "round {round}");
        free(&gpu, &h, &b, n);
        h.trim_on(&gpu, &stream, start).unwrap();
        assert_eq!(
            h.finish_trims(true).unwrap(),
            (512 << 20) - start,
            "round {round}"
        );
        assert_eq!(h.capacity(), start, "round {round}");
        created.push(res.stats().created);
    }
    assert!(
        created.windows(2).all(|w| w[0] == w[1]),
        "new memory after the first round: {created:?}"
    );
    let s = res.stats();
    assert_eq!(s.heap_mapped, start, "{s:?}");
    println!("20 rounds of growth to 512 MiB and trims on a stream: {s:?}");
}

/// A trim on a stream whose last step still holds blocks gives back the
/// free step before it (a hole between mappings); growth from the host
/// finishes a trim that was not finished yet, maps memory into the hole
/// again and unfences its pages before it returns: blocks are taken
/// there at once, and every block checks.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn growth_maps_a_hole_between_steps_again() {
    let _one = one_at_a_time();
    use cuheap::Reservation;
    let gpu = gpu();
    let res = Reservation::new(gpu.context(), 16 << 30).unwrap();
    let start = 64usize << 20;
    let h = DeviceHeap::growable_in(&gpu, &res, start, 4 << 30).unwrap();
    assert_eq!(h.grow(256 << 20).unwrap(), 256 << 20);
    assert_eq!(h.grow(1 << 30).unwrap(), 1 << 30);
    let base = h.handle().data;
    let (middle, last) = (base + start as u64, base + (256u64 << 20));
    // Fill most of the heap; keep the blocks of the last step, free the rest.
    let n = 900 * 1024;
    let b = Bufs::new(&gpu, n);
    alloc(&gpu, &h, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    fill_check(&gpu, &b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    let ptrs = b.ptrs(n);
    let kept: Vec<u64> = ptrs
        .iter()
        .map(|&p| if p >= last { p } else { 0 })
        .collect();
    let freed: Vec<u64> = ptrs
        .iter()
        .map(|&p| if p >= last { 0 } else { p })
        .collect();
    assert!(kept.iter().any(|&p| p != 0) && freed.iter().any(|&p| p >= middle));
    b.ptrs.write(0, &freed).unwrap();
    free(&gpu, &h, &b, n);
    // The last step is in use: only the middle one (192 MiB) goes.
    let stream = gpu.context().new_stream().unwrap();
    h.trim_on(&gpu, &stream, start).unwrap();
    stream.synchronize().unwrap();
    // Not finished yet: `grow` finishes it, then maps the hole again.
    assert_eq!(h.grow(1 << 30).unwrap(), 1 << 30);
    let s = res.stats();
    assert!(
        s.reused >= 192 << 20,
        "the hole took the banked step: {s:?}"
    );
    assert_eq!(s.banked, 0, "{s:?}");
    // Blocks come from the hole's pages at once (more than the rest of
    // the heap holds); all check, and the kept blocks keep their data.
    let outside = ((1usize << 30) - (192 << 20)) / 1024 - kept.iter().filter(|&&p| p != 0).count();
    let m = 256 * 1024;
    let c = Bufs::new(&gpu, m);
    alloc(&gpu, &h, &c, m, 1024);
    assert_eq!(c.take_errors(), [0, 0]);
    fill_check(&gpu, &c, m, 1024);
    assert_eq!(c.take_errors(), [0, 0]);
    let in_hole = c
        .ptrs(m)
        .iter()
        .filter(|&&p| p >= middle && p < last)
        .count();
    assert!(
        in_hole > 0 && in_hole + outside >= m as usize,
        "{in_hole} blocks in the refilled hole, room for {outside} outside it"
    );
    b.ptrs.write(0, &kept).unwrap();
    let check = cuheap::LaunchConfig::for_threads(n);
    let errors = gpu.alloc_zeroed(8).unwrap();
    // SAFETY: `b.ptrs` holds the kept blocks (or nulls), each 1 KiB and
    // live, filled by the check above; `errors` holds two u32s.
    unsafe {
        b.kernels
            .check_blocks(&check, b.ptrs.as_ptr(), n, 1024, 1, errors.as_ptr())
            .unwrap()
    };
    gpu.sync().unwrap();
    let mut e = [0u32; 2];
    errors.read(0, &mut e).unwrap();
    assert_eq!(e[1], 0, "kept blocks lost their data");
    free(&gpu, &h, &b, n);
    free(&gpu, &h, &c, m);
    println!("a hole of 192 MiB between steps in use was mapped again: {in_hole} of {m} blocks there; {s:?}");
}

/// A heap that grows in pieces gives back every piece no block uses, the
/// pieces before the last one in use included, between launches and on a
/// stream; one that grows in whole steps keeps a step with one live block.
/// 1M threads fill 1 GiB of 1 KiB blocks, one block in every fourth piece
/// stays: the memory kept is exactly the pieces those blocks are in; the
/// kept blocks keep their data; growth maps the holes again and blocks
/// land there; after all is freed the heap trims back to its start.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_heap_grown_in_pieces_gives_back_the_pieces_no_block_uses() {
    let _one = one_at_a_time();
    let gpu = gpu();
    for (piece, on_stream) in [(0, false), (8 << 20, false), (8 << 20, true)] {
        pieces_case(&gpu, piece, on_stream);
    }
}

fn pieces_case(gpu: &cuheap::Gpu, piece: usize, on_stream: bool) {
    let (start, step) = (64usize << 20, 1usize << 30);
    let h = DeviceHeap::growable(gpu, start, 2 << 30).unwrap();
    assert_eq!(h.set_growth_piece(gpu, piece).unwrap(), piece);
    assert_eq!(h.growth_piece(), piece);
    assert_eq!(h.grow(start + step).unwrap(), start + step);
    let n = 1u32 << 20;
    let b = Bufs::new(gpu, n);
    alloc_and_check(gpu, &h, &b, n);
    // The step's mappings: pieces, or the whole step.
    let len = if piece == 0 { step } else { piece };
    let step_at = h.handle().data + start as u64;
    let piece_of = |p: u64| (p >= step_at).then(|| ((p - step_at) / len as u64) as usize);
    // Keep the first block found in every fourth piece; free the rest.
    let ptrs = b.ptrs(n);
    let mut pinned = std::collections::BTreeSet::new();
    let kept: Vec<u64> = ptrs
        .iter()
        .map(|&p| match piece_of(p) {
            Some(k) if k % 4 == 0 && pinned.insert(k) => p,
            _ => 0,
        })
        .collect();
    let freed: Vec<u64> = ptrs
        .iter()
        .zip(&kept)
        .map(|(&p, &k)| if k == 0 { p } else { 0 })
        .collect();
    b.ptrs.write(0, &freed).unwrap();
    free(gpu, &h, &b, n);
    let before = gpu.mem_info().unwrap().0;
    let left = if on_stream {
        let stream = gpu.context().new_stream().unwrap();
        h.trim_on(gpu, &stream, start).unwrap();
        stream.synchronize().unwrap();
        h.finish_trims(true).unwrap();
        h.capacity()
    } else {
        // SAFETY: every launch on this heap was waited for.
        unsafe { h.trim(start) }.unwrap()
    };
    let back = gpu.mem_info().unwrap().0.saturating_sub(before);
    let expected = start + pinned.len() * len;
    assert_eq!(
        left,
        expected,
        "pieces of {} MiB: {} hold a live block",
        len >> 20,
        pinned.len()
    );
    assert!(
        back >= (start + step - left) / 4 * 3,
        "{} MiB unmapped, cuMemGetInfo shows {} MiB back",
        (start + step - left) >> 20,
        back >> 20
    );
    // The kept blocks keep their data (checked against the first fill).
    b.ptrs.write(0, &kept).unwrap();
    check_kept(gpu, &b, n);
    // Growth maps the holes again; new blocks land there and check.
    assert_eq!(h.grow(start + step).unwrap(), start + step);
    let m = 512u32 << 10;
    let c = Bufs::new(gpu, m);
    alloc_and_check(gpu, &h, &c, m);
    if piece != 0 {
        let in_holes = (c.ptrs(m).iter())
            .filter(|&&p| piece_of(p).is_some_and(|k| !pinned.contains(&k)))
            .count();
        assert!(in_holes > 0, "no block in a piece mapped again");
    }
    check_kept(gpu, &b, n);
    free(gpu, &h, &b, n);
    free(gpu, &h, &c, m);
    // SAFETY: as above.
    assert_eq!(unsafe { h.trim(start) }.unwrap(), start);
    assert!(h.stats().unwrap().is_empty());
    println!(
        "pieces of {} MiB ({}): {} of {} hold a live block, {} MiB kept, {} MiB back",
        len >> 20,
        if on_stream { "trim_on" } else { "trim" },
        pinned.len(),
        step / len,
        left >> 20,
        back >> 20
    );
}

/// 1 KiB blocks for `n` threads, filled and checked: no null, no damage.
fn alloc_and_check(gpu: &cuheap::Gpu, h: &DeviceHeap, b: &Bufs, n: u32) {
    alloc(gpu, h, b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
    fill_check(gpu, b, n, 1024);
    assert_eq!(b.take_errors(), [0, 0]);
}

/// Checks, without filling them again, the 1 KiB blocks (or nulls) that
/// `b.ptrs` holds for `n` threads against the fill of their index.
fn check_kept(gpu: &cuheap::Gpu, b: &Bufs, n: u32) {
    let cfg = LaunchConfig::for_threads(n);
    // SAFETY: the caller's `b.ptrs` holds live 1 KiB blocks (or nulls)
    // filled for their index; `b.errors` holds two u32s.
    unsafe {
        b.kernels
            .check_blocks(&cfg, b.ptrs.as_ptr(), n, 1024, 1, b.errors.as_ptr())
            .unwrap()
    };
    gpu.sync().unwrap();
    assert_eq!(b.take_errors(), [0, 0], "a kept block lost its data");
}

/// Growth in pieces that runs past the device's memory is an
/// `OutOfMemory` error, not a short success: the pieces it mapped before
/// stay mapped and usable (blocks there check), and a trim gives them all
/// back (`cuMemGetInfo` shows it).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn growth_in_pieces_past_the_device_is_an_error_and_keeps_what_it_mapped() {
    let _one = one_at_a_time();
    let gpu = gpu();
    let start = 64usize << 20;
    let idle = gpu.mem_info().unwrap().0;
    let max = (idle + (4 << 30)).next_multiple_of(1 << 30);
    let h = DeviceHeap::growable(&gpu, start, max).unwrap();
    assert_eq!(h.set_growth_piece(&gpu, 1 << 30).unwrap(), 1 << 30);
    let err = h.grow(max).unwrap_err();
    assert!(
        matches!(err, cuheap::Error::OutOfMemory { .. }),
        "growth past the device: {err}"
    );
    let cap = h.capacity();
    assert!(
        cap > start + (idle >> 1) && cap < max,
        "{} MiB mapped of {} MiB asked, {} MiB were free",
        cap >> 20,
        max >> 20,
        idle >> 20
    );
    // Blocks from the pieces it mapped: 1M threads of 4 KiB (4 GiB).
    let n = 1u32 << 20;
    let b = Bufs::new(&gpu, n);
    alloc(&gpu, &h, &b, n, 4096);
    assert_eq!(b.take_errors(), [0, 0]);
    fill_check(&gpu, &b, n, 4096);
    assert_eq!(b.take_errors(), [0, 0]);
    free(&gpu, &h, &b, n);
    let before = gpu.mem_info().unwrap().0;
    // SAFETY: every launch on this heap was waited for.
    assert_eq!(unsafe { h.trim(start) }.unwrap(), start);
    let back = gpu.mem_info().unwrap().0.saturating_sub(before);
    assert!(
        back + (1 << 30) >= cap - start,
        "{} MiB unmapped, {} MiB back",
        (cap - start) >> 20,
        back >> 20
    );
    println!(
        "growth past the device in 1 GiB pieces: {err}; {} MiB mapped of {} MiB free before",
        cap >> 20,
        idle >> 20
    );
}

/// While a growth service runs, a trim between launches leaves no hole
/// (the service would map past it): only what lies at the end goes. Once
/// the service stops, the free pieces before the last one in use go too.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_trim_punches_no_hole_while_a_service_runs() {
    let _one = one_at_a_time();
    let gpu = gpu();
    let (start, step) = (64usize << 20, 512usize << 20);
    let h = DeviceHeap::growable(&gpu, start, 2 << 30).unwrap();
    h.set_growth_piece(&gpu, 8 << 20).unwrap();
    assert_eq!(h.grow(start + step).unwrap(), start + step);
    let n = 512u32 << 10;
    let b = Bufs::new(&gpu, n);
    alloc_and_check(&gpu, &h, &b, n);
    // Keep the step's lowest and highest blocks: its first and last pieces.
    let step_at = h.handle().data + start as u64;
    let ptrs = b.ptrs(n);
    let lo = *ptrs.iter().filter(|&&p| p >= step_at).min().unwrap();
    let hi = *ptrs.iter().max().unwrap();
    let piece = |p: u64| ((p - step_at) >> 23) as usize;
    assert!(piece(hi) > piece(lo), "blocks in one piece only");
    let kept: Vec<u64> = (ptrs.iter())
        .map(|&p| if p == lo || p == hi { p } else { 0 })
        .collect();
    let freed: Vec<u64> = (ptrs.iter().zip(&kept))
        .map(|(&p, &k)| if k == 0 { p } else { 0 })
        .collect();
    b.ptrs.write(0, &freed).unwrap();
    free(&gpu, &h, &b, n);
    let svc = h.serve().unwrap();
    // SAFETY: every launch on this heap was waited for (the service
    // runs no kernel).
    let serving = unsafe { h.trim(start) }.unwrap();
    // Free pieces past the last block's go (no hole); none before it.
    let to_last = start + (piece(hi) + 1) * (8 << 20);
    assert_eq!(serving, to_last, "a hole while the service ran");
    svc.stop().unwrap();
    // SAFETY: as above.
    let stopped = unsafe { h.trim(start) }.unwrap();
    assert_eq!(
        stopped,
        start + 2 * (8 << 20),
        "the first and last pieces stay"
    );
    b.ptrs.write(0, &kept).unwrap();
    check_kept(&gpu, &b, n);
    free(&gpu, &h, &b, n);
    // SAFETY: as above.
    assert_eq!(unsafe { h.trim(start) }.unwrap(), start);
    assert!(h.stats().unwrap().is_empty());
}

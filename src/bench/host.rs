//! `cuheap bench host`: allocation calls from the CPU, in one process, for
//! the cuheap pool, `cuMemAlloc`/`cuMemFree` (cudaMalloc/cudaFree) and
//! `cuMemAllocAsync`/`cuMemFreeAsync` on the device's default pool with its
//! release threshold raised to the maximum (warm). Host clocks around each
//! call; p50/p99 of per-call times, throughput for the threaded cases.
//! A failed call stops a latency case with its error; the threaded cases
//! count only completed pairs and report failed calls in `failures`.

use crate::host::{Backend, CudaBackend, Pool, PoolConfig, Resource};
use crate::kernels::Bench;
use crate::{DevicePtr, Error, Gpu, LaunchConfig, Result};
use cudarc::driver::{result, sys, CudaStream};
use serde::Serialize;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

/// Per-call latencies of one allocator on one case, in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    pub allocator: &'static str,
    pub case: String,
    pub alloc_p50_us: f64,
    pub alloc_p99_us: f64,
    pub free_p50_us: f64,
    pub free_p99_us: f64,
}

/// Completed alloc + free pairs per second over threads.
#[derive(Clone, Debug, Serialize)]
pub struct Throughput {
    pub allocator: &'static str,
    pub case: String,
    pub threads: usize,
    pub pairs_per_s: f64,
    /// Allocations and frees that returned an error: not work done, and a
    /// run with any fails (`cuheap bench` exits with an error).
    pub failures: u64,
    /// The threads' CPU time (user and system) over their time in the
    /// loop, averaged: under 1 when they sleep (a lock, the driver).
    pub cpu_share: f64,
    /// Times a thread gave up its core waiting, per thread (voluntary
    /// context switches: a contended lock sleeps).
    pub waits_per_thread: f64,
    /// For runs with each thread pinned to a core: how many threads the
    /// kernel let pin (`None`: the threads were not pinned).
    pub pinned: Option<usize>,
    /// For pinned runs, the physical cores the threads were spread over
    /// (fewer than the threads: some share one).
    pub pinned_cores: usize,
    /// Other physical cores kept busy meanwhile, each by a thread that
    /// runs the ceiling's loop ([`PrivateLists`]: pinned, outside the
    /// measure), so that a lone thread runs beside as many working cores
    /// as in the runs of more threads.
    pub busy_cores: usize,
    /// The measured threads' cores ([`core_rates`], read by all of them
    /// together right before the start, and by each right after its loop;
    /// per rate, the median over threads of their mean). If a lone row
    /// beats the rows of eight at the same rates, the gap is the
    /// allocator's; if it also reads higher rates, part of the gap is the
    /// host's.
    pub core: CoreRates,
}

/// What the calling thread's core gives it now, by two dependent chains
/// of register arithmetic, each the fastest of three tries (a try the
/// kernel interrupts reads low; the whole probe about 0.4 ms); 0 on other
/// architectures than x86-64.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CoreRates {
    /// The clock in GHz: 64-bit multiplies, each waiting for the one
    /// before (so another hardware thread on the core barely moves it),
    /// at three cycles each (Intel's cores since Nehalem, AMD's since
    /// Zen; a core where they take longer reads low).
    pub ghz: f64,
    /// Billions a second of additions of a constant, each to the one
    /// before: a core may fold these as it renames them, several a cycle,
    /// so this rate follows the share of the core's front end the thread
    /// gets (lower while another hardware thread, of this machine or of
    /// its host's other guests, uses the core).
    pub adds: f64,
}

impl CoreRates {
    /// Both rates, each the median over `xs`.
    fn median_of(xs: &[CoreRates]) -> CoreRates {
        let mut ghz: Vec<f64> = xs.iter().map(|x| x.ghz).collect();
        let mut adds: Vec<f64> = xs.iter().map(|x| x.adds).collect();
        CoreRates {
            ghz: super::median(&mut ghz),
            adds: super::median(&mut adds),
        }
    }

    /// The mean of two readings.
    fn mean(self, other: CoreRates) -> CoreRates {
        CoreRates {
            ghz: (self.ghz + other.ghz) / 2.0,
            adds: (self.adds + other.adds) / 2.0,
        }
    }

    /// "3.01 / 5.20", or "-" for a rate that could not be read.
    fn shown(self) -> String {
        let one = |v: f64| match v > 0.0 {
            true => format!("{v:.2}"),
            false => "-".into(),
        };
        format!("{} / {}", one(self.ghz), one(self.adds))
    }
}

/// The calling core's [`CoreRates`].
fn core_rates() -> CoreRates {
    #[cfg(target_arch = "x86_64")]
    {
        /// Loop turns of a try, eight operations each.
        const TURNS: u64 = 1 << 14;
        /// Cycles a multiply takes, the one it depends on done.
        const LATENCY: u64 = 3;
        // Operations a nanosecond of the fastest of three tries of `run`.
        let best = |run: &dyn Fn(u64, u64) -> u64| {
            let mut best = 0.0f64;
            for _ in 0..3 {
                let began = Instant::now();
                std::hint::black_box(run(std::hint::black_box(1), TURNS));
                let ns = began.elapsed().as_nanos().max(1) as f64;
                best = best.max((8 * TURNS) as f64 / ns);
            }
            best
        };
        // A closure that runs `n` turns of eight `$op`s, each on the
        // result of the one before, in `x`.
        macro_rules! chain {
            ($op:literal $(, $name:ident = $value:expr)?) => {
                |mut x: u64, mut n: u64| {
                    // SAFETY: register arithmetic only: no memory, no
                    // stack, and the registers written are declared so.
                    unsafe {
                        std::arch::asm!(
                            "2:", $op, $op, $op, $op, $op, $op, $op, $op, "dec {n}", "jnz 2b",
                            x = inout(reg) x,
                            n = inout(reg) n,
                            $($name = in(reg) $value,)?
                            options(nomem, nostack),
                        );
                    }
                    x ^ n
                }
            };
        }
        let multiplies = chain!("imul {x}, {one}", one = std::hint::black_box(1u64));
        let adds = chain!("add {x}, 1");
        CoreRates {
            ghz: LATENCY as f64 * best(&multiplies),
            adds: best(&adds),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        CoreRates::default()
    }
}

/// One CPU of each physical core this process may run on, in order (the
/// lowest allowed of the core's hardware threads; every allowed CPU where
/// the topology cannot be read).
fn own_cores() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; the call writes at most
    // its size.
    let allowed = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect::<Vec<_>>()
    };
    // The lowest allowed CPU among `c`'s hardware threads (a list such
    // as "0,64" or "0-1"), if the topology can be read.
    let first_allowed_sibling = |c: usize| -> Option<usize> {
        let path = format!("/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list");
        let list = std::fs::read_to_string(path).ok()?;
        let mut siblings = Vec::new();
        for part in list.trim().split(',') {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            siblings.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?);
        }
        siblings.into_iter().filter(|s| allowed.contains(s)).min()
    };
    (allowed.iter().copied())
        .filter(|&c| first_allowed_sibling(c).is_none_or(|f| f == c))
        .collect()
}

/// Pins the calling thread to `cpu`; false if the kernel refuses.
fn pin_to(cpu: usize) -> bool {
    // SAFETY: as in `own_cores`; `cpu` < CPU_SETSIZE (from that set).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// CPU time and voluntary context switches of the calling thread so far.
#[derive(Clone, Copy, Default)]
struct ThreadUsage {
    cpu_s: f64,
    waits: u64,
}

impl ThreadUsage {
    #[cfg(not(target_os = "linux"))]
    fn now() -> ThreadUsage {
        ThreadUsage::default() // RUSAGE_THREAD is Linux's
    }

    #[cfg(target_os = "linux")]
    fn now() -> ThreadUsage {
        // SAFETY: an all-zero `rusage` is valid; getrusage fills it.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: RUSAGE_THREAD with a valid out pointer.
        if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) } != 0 {
            return ThreadUsage::default();
        }
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        ThreadUsage {
            cpu_s: secs(u.ru_utime) + secs(u.ru_stime),
            waits: u.ru_nvcsw as u64,
        }
    }
}

/// Device memory an allocator held for a workload, against what the
/// workload had allocated at its peak.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryUse {
    pub allocator: &'static str,
    pub case: String,
    /// The most bytes (as requested) allocated and not yet freed at once.
    pub peak_requested_bytes: u64,
    /// The most device memory the allocator held during the run (the
    /// cuheap pool: bytes mapped; `cudaMallocAsync`: its pool's reserved
    /// high-water mark).
    pub reserved_bytes: u64,
    /// Failed calls and blocks whose contents were wrong: a run with any
    /// fails.
    pub failures: u64,
}

impl MemoryUse {
    /// What the allocator held over the peak in use.
    pub fn held_over_peak(&self) -> f64 {
        self.reserved_bytes as f64 / self.peak_requested_bytes.max(1) as f64
    }
}

/// The mean cost of one call with no clock read per call: alloc + free
/// pairs timed as a batch (median over batches).
#[derive(Clone, Debug, Serialize)]
pub struct LoopCost {
    pub allocator: &'static str,
    pub case: String,
    pub ns_per_call: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct HostReport {
    pub device: String,
    /// p50 of reading the host clock twice with nothing between, in ns:
    /// part of every per-call latency.
    pub clock_ns: f64,
    pub latency: Vec<Latency>,
    /// Single sizes in a loop ([`LoopCost`]).
    pub loops: Vec<LoopCost>,
    pub throughput: Vec<Throughput>,
    pub memory: Vec<MemoryUse>,
    /// Cases run for two allocators in alternating rounds.
    pub alternating: Vec<Alternating>,
}

/// A case run for two allocators in alternating rounds
/// ([`mixed_alternating`]).
#[derive(Clone, Debug, Serialize)]
pub struct Alternating {
    pub case: String,
    pub allocators: [&'static str; 2],
    /// Per round, each allocator's figure (the case names it: a p50 in
    /// microseconds, or a mean in nanoseconds).
    pub rounds: Vec<[f64; 2]>,
    /// Per round, the core of the thread that runs it read right before
    /// the first allocator's round ([`core_rates`]; the thread is not
    /// pinned).
    pub cores: Vec<CoreRates>,
}

impl Alternating {
    /// Per round, the second allocator's p50 over the first's.
    pub fn ratios(&self) -> Vec<f64> {
        self.rounds.iter().map(|[a, b]| b / a).collect()
    }
}

/// The three allocators behind one interface: the host crate's
/// [`Resource`] (what the trace adaptor wraps too), with a name.
pub trait Alloc: Resource<Stream = Arc<CudaStream>> {
    fn name(&self) -> &'static str;
    /// Called before a stream the allocator saw is destroyed.
    fn release(&self, _stream: &Arc<CudaStream>) {}
}

fn driver(what: &'static str, r: sys::CUresult) -> Result<()> {
    r.result().map_err(|source| Error::Driver { what, source })
}

pub(crate) struct Sync_;
impl Resource for Sync_ {
    type Stream = Arc<CudaStream>;
    fn allocate(&self, size: usize, _: &Arc<CudaStream>) -> Result<u64> {
        // SAFETY: plain allocation, freed by `deallocate`.
        unsafe { result::malloc_sync(size) }.map_err(|source| Error::Driver {
            what: "cuMemAlloc",
            source,
        })
    }
    fn deallocate(&self, p: u64, _: &Arc<CudaStream>) -> Result<()> {
        // SAFETY: `p` came from cuMemAlloc.
        unsafe { result::free_sync(p) }.map_err(|source| Error::Driver {
            what: "cuMemFree",
            source,
        })
    }
    fn stream_id(s: &Arc<CudaStream>) -> usize {
        CudaBackend::stream_id(s)
    }
}
impl Alloc for Sync_ {
    fn name(&self) -> &'static str {
        "cudaMalloc"
    }
}

/// `cuMemAllocAsync`/`cuMemFreeAsync` on the current context's device.
pub struct Async;
impl Resource for Async {
    type Stream = Arc<CudaStream>;
    fn allocate(&self, size: usize, s: &Arc<CudaStream>) -> Result<u64> {
        let mut p = 0;
        // SAFETY: out-parameter; stream-ordered allocation on a live stream.
        driver("cuMemAllocAsync", unsafe {
            sys::cuMemAllocAsync(&mut p, size, s.cu_stream())
        })?;
        Ok(p)
    }
    fn deallocate(&self, p: u64, s: &Arc<CudaStream>) -> Result<()> {
        // SAFETY: `p` came from cuMemAllocAsync.
        driver("cuMemFreeAsync", unsafe {
            sys::cuMemFreeAsync(p, s.cu_stream())
        })
    }
    fn stream_id(s: &Arc<CudaStream>) -> usize {
        CudaBackend::stream_id(s)
    }
}
impl Alloc for Async {
    fn name(&self) -> &'static str {
        "cudaMallocAsync"
    }
}

impl Alloc for Pool {
    fn name(&self) -> &'static str {
        "cuheap pool"
    }
}

/// The Rust pool with the C API pool's settings and history (a fresh
/// pool of the device's memory, through the same single sizes and loops
/// before its threads): its threads tell what the boundary costs from
/// what the pool's state does.
pub struct FreshPool(Pool);

impl Resource for FreshPool {
    type Stream = Arc<CudaStream>;
    fn allocate(&self, size: usize, s: &Arc<CudaStream>) -> Result<u64> {
        self.0.alloc(size, s)
    }
    fn deallocate(&self, p: u64, s: &Arc<CudaStream>) -> Result<()> {
        self.0.free(p, s)
    }
    fn stream_id(s: &Arc<CudaStream>) -> usize {
        CudaBackend::stream_id(s)
    }
}

impl Alloc for FreshPool {
    fn name(&self) -> &'static str {
        "cuheap pool, C API's settings and history"
    }
    fn release(&self, stream: &Arc<CudaStream>) {
        let _ = self.0.release_stream(stream);
    }
}

type PoolCreate = unsafe extern "C" fn(*const u8, *mut *mut c_void) -> i32;
type PoolAlloc = unsafe extern "C" fn(*mut c_void, usize, sys::CUstream, *mut *mut c_void) -> i32;
type PoolFree = unsafe extern "C" fn(*mut c_void, *mut c_void, sys::CUstream) -> i32;
type PoolDestroy = unsafe extern "C" fn(*mut c_void) -> i32;
type PoolRelease = unsafe extern "C" fn(*mut c_void, sys::CUstream) -> i32;

/// The pool through its C API (`libcuheap.so`, loaded at run time), as a
/// C or C++ program calls it: the same pool, plus what the boundary
/// costs.
pub struct CApiPool {
    pool: *mut c_void,
    alloc: PoolAlloc,
    free: PoolFree,
    destroy: PoolDestroy,
    release: PoolRelease,
    _lib: libloading::Library,
}

// SAFETY: the C API's pool is thread-safe (a `Pool` behind a pointer).
unsafe impl Send for CApiPool {}
// SAFETY: as above.
unsafe impl Sync for CApiPool {}

impl CApiPool {
    /// `libcuheap.so` from `CUHEAP_LIB`, else beside the executable
    /// (`target/release`), else in `../lib`; `None` if there is none.
    pub fn find() -> Option<std::path::PathBuf> {
        if let Some(p) = std::env::var_os("CUHEAP_LIB") {
            return Some(p.into());
        }
        let exe = std::env::current_exe().ok()?;
        let dir = exe.parent()?;
        [dir.join("libcuheap.so"), dir.join("../lib/libcuheap.so")]
            .into_iter()
            .find(|p| p.exists())
    }

    /// A pool with default settings on the current context's device.
    pub fn load(path: &std::path::Path) -> Result<CApiPool> {
        let bad = |e: libloading::Error| {
            Error::InvalidArgument(format!("loading {}: {e}", path.display()))
        };
        // SAFETY: loading cuheap's own library, whose initialisers are Rust's.
        let lib = unsafe { libloading::Library::new(path) }.map_err(bad)?;
        // SAFETY: the symbols have these signatures (include/cuheap.h).
        let (create, alloc, free, destroy, release) = unsafe {
            (
                *lib.get::<PoolCreate>(b"cuheap_pool_create").map_err(bad)?,
                *lib.get::<PoolAlloc>(b"cuheap_pool_alloc").map_err(bad)?,
                *lib.get::<PoolFree>(b"cuheap_pool_free").map_err(bad)?,
                *lib.get::<PoolDestroy>(b"cuheap_pool_destroy")
                    .map_err(bad)?,
                *lib.get::<PoolRelease>(b"cuheap_pool_release_stream")
                    .map_err(bad)?,
            )
        };
        let mut pool = std::ptr::null_mut();
        // SAFETY: NULL config (defaults) and a valid out pointer.
        let rc = unsafe { create(std::ptr::null(), &mut pool) };
        if rc != 0 {
            return Err(Error::InvalidArgument(format!(
                "cuheap_pool_create returned {rc}"
            )));
        }
        Ok(CApiPool {
            pool,
            alloc,
            free,
            destroy,
            release,
            _lib: lib,
        })
    }
}

impl CApiPool {
    /// What the boundary alone costs: `cuheap_pool_free(pool, NULL,
    /// stream)` in a loop (the entry point's guard and error handling,
    /// the pool's handle checked, no stream lookup and no pool work).
    fn boundary(&self, s: &Arc<CudaStream>, calls: usize) -> Result<LoopCost> {
        let mut per_call = Vec::with_capacity(7);
        for _ in 0..7 {
            let t = Instant::now();
            for _ in 0..calls {
                // SAFETY: a live pool; NULL is a documented no-op.
                let rc = unsafe { (self.free)(self.pool, std::ptr::null_mut(), s.cu_stream()) };
                if rc != 0 {
                    return Err(Error::InvalidArgument(format!(
                        "cuheap_pool_free(NULL) returned {rc}"
                    )));
                }
            }
            per_call.push(t.elapsed().as_nanos() as f64 / calls as f64);
        }
        Ok(LoopCost {
            allocator: self.name(),
            case: "free(NULL): the boundary alone".into(),
            ns_per_call: pct(&mut per_call, 0.5),
        })
    }
}

impl Drop for CApiPool {
    fn drop(&mut self) {
        // SAFETY: created by `load`, destroyed once; the library is loaded.
        unsafe { (self.destroy)(self.pool) };
    }
}

impl Resource for CApiPool {
    type Stream = Arc<CudaStream>;
    fn allocate(&self, size: usize, s: &Arc<CudaStream>) -> Result<u64> {
        let mut p = std::ptr::null_mut();
        // SAFETY: a live pool, a live stream of its context, an out pointer.
        match unsafe { (self.alloc)(self.pool, size, s.cu_stream(), &mut p) } {
            0 => Ok(p as u64),
            rc => Err(Error::InvalidArgument(format!(
                "cuheap_pool_alloc returned {rc}"
            ))),
        }
    }
    fn deallocate(&self, p: u64, s: &Arc<CudaStream>) -> Result<()> {
        // SAFETY: as above; `p` came from this pool.
        match unsafe { (self.free)(self.pool, p as *mut c_void, s.cu_stream()) } {
            0 => Ok(()),
            rc => Err(Error::InvalidArgument(format!(
                "cuheap_pool_free returned {rc}"
            ))),
        }
    }
    fn stream_id(s: &Arc<CudaStream>) -> usize {
        CudaBackend::stream_id(s)
    }
}

impl Alloc for CApiPool {
    fn name(&self) -> &'static str {
        "cuheap pool, C API"
    }
    fn release(&self, stream: &Arc<CudaStream>) {
        // SAFETY: a live pool and a live stream it saw.
        unsafe { (self.release)(self.pool, stream.cu_stream()) };
    }
}

pub(crate) fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

pub(crate) fn us(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// Raises the default pool's release threshold to the maximum (CUDA keeps
/// freed memory instead of returning it at each synchronisation).
pub(crate) fn warm_async_pool(gpu: &Gpu) -> Result<()> {
    let pool = default_mem_pool(gpu)?;
    let mut max = u64::MAX;
    // SAFETY: the attribute takes a pointer to a u64.
    driver("cuMemPoolSetAttribute", unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut max as *mut u64 as *mut _,
        )
    })
}

fn single_size(a: &dyn Alloc, s: &Arc<CudaStream>, size: usize, n: usize) -> Result<Latency> {
    // Warm-up: the first calls map memory.
    for _ in 0..8 {
        let p = a.allocate(size, s)?;
        a.deallocate(p, s)?;
    }
    let (mut ta, mut tf) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t = Instant::now();
        let p = a.allocate(size, s)?;
        ta.push(us(t));
        let t = Instant::now();
        a.deallocate(p, s)?;
        tf.push(us(t));
    }
    Ok(Latency {
        allocator: a.name(),
        case: super::device::size_name(size as u32),
        alloc_p50_us: pct(&mut ta, 0.5),
        alloc_p99_us: pct(&mut ta, 0.99),
        free_p50_us: pct(&mut tf, 0.5),
        free_p99_us: pct(&mut tf, 0.99),
    })
}

/// `pairs` alloc + free pairs of `size` timed as one batch, seven
/// times: the median batch's mean per call.
fn in_a_loop(a: &dyn Alloc, s: &Arc<CudaStream>, size: usize, pairs: usize) -> Result<LoopCost> {
    for _ in 0..8 {
        let p = a.allocate(size, s)?;
        a.deallocate(p, s)?;
    }
    let mut per_call = Vec::with_capacity(7);
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..pairs {
            let p = a.allocate(size, s)?;
            a.deallocate(p, s)?;
        }
        per_call.push(t.elapsed().as_nanos() as f64 / (2 * pairs) as f64);
    }
    Ok(LoopCost {
        allocator: a.name(),
        case: super::device::size_name(size as u32),
        ns_per_call: pct(&mut per_call, 0.5),
    })
}

/// p50 of two clock reads with nothing between, in ns.
fn clock_floor() -> f64 {
    let mut t: Vec<f64> = (0..100_000)
        .map(|_| {
            let t = Instant::now();
            us(t) * 1e3
        })
        .collect();
    pct(&mut t, 0.5)
}

/// The benchmark's random numbers (xorshift64).
pub fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// 10,000 live blocks of 256 B..1 MiB: allocate all, free all; three
/// rounds, the last two timed.
fn mixed(a: &dyn Alloc, s: &Arc<CudaStream>) -> Result<Latency> {
    let sizes = mixed_sizes();
    let (mut ta, mut tf) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let (a_us, f_us) = mixed_round(a, s, &sizes)?;
        if round > 0 {
            ta.extend(a_us);
            tf.extend(f_us);
        }
    }
    Ok(Latency {
        allocator: a.name(),
        case: "mixed 256 B..1 MiB, 10,000 live".into(),
        alloc_p50_us: pct(&mut ta, 0.5),
        alloc_p99_us: pct(&mut ta, 0.99),
        free_p50_us: pct(&mut tf, 0.5),
        free_p99_us: pct(&mut tf, 0.99),
    })
}

/// The mixed case's sizes: 10,000 of 256 B..1 MiB, the same every run.
fn mixed_sizes() -> Vec<usize> {
    let mut rng = 0x1234_5678_9abc_def0u64;
    (0..10_000)
        .map(|_| 256 + (xorshift(&mut rng) % (1 << 20)) as usize)
        .collect()
}

/// One round of the mixed case: every size allocated (all live at the
/// end), then every block freed, then the stream synchronised. Returns
/// each allocation's and each free's time in microseconds.
fn mixed_round(
    a: &dyn Alloc,
    s: &Arc<CudaStream>,
    sizes: &[usize],
) -> Result<(Vec<f64>, Vec<f64>)> {
    let (mut ta, mut tf) = (Vec::with_capacity(sizes.len()), Vec::new());
    let mut live = Vec::with_capacity(sizes.len());
    for &sz in sizes {
        let t = Instant::now();
        live.push(a.allocate(sz, s)?);
        ta.push(us(t));
    }
    tf.reserve(live.len());
    for p in live {
        let t = Instant::now();
        a.deallocate(p, s)?;
        tf.push(us(t));
    }
    s.synchronize().map_err(|source| Error::Driver {
        what: "cuStreamSynchronize",
        source,
    })?;
    Ok((ta, tf))
}

/// Rounds of [`mixed_alternating`].
const ALTERNATING_ROUNDS: usize = 9;

/// A round of the mixed case with no clock per call: the allocations
/// timed as a whole. Returns the mean time of an allocation in
/// nanoseconds.
fn mixed_round_whole(a: &dyn Alloc, s: &Arc<CudaStream>, sizes: &[usize]) -> Result<f64> {
    let mut live = Vec::with_capacity(sizes.len());
    let t = Instant::now();
    for &sz in sizes {
        live.push(a.allocate(sz, s)?);
    }
    let ns = t.elapsed().as_secs_f64() * 1e9 / sizes.len() as f64;
    for p in live {
        a.deallocate(p, s)?;
    }
    s.synchronize().map_err(|source| Error::Driver {
        what: "cuStreamSynchronize",
        source,
    })?;
    Ok(ns)
}

/// The mixed case for two allocators in alternating rounds (a warm-up
/// round each first), so that both meet the same moment of the host. Each
/// round runs `a` then `b` with a clock around each call (their
/// allocation p50s, in microseconds), then `a` then `b` timed whole (the
/// mean allocation, in nanoseconds, with no clock per call: the clock's
/// tens of nanoseconds weigh on the faster one only). A failed call is
/// returned as the error (and ends the host benchmark).
fn mixed_alternating(
    a: &dyn Alloc,
    b: &dyn Alloc,
    s: &Arc<CudaStream>,
) -> Result<[Alternating; 2]> {
    let sizes = mixed_sizes();
    mixed_round(a, s, &sizes)?;
    mixed_round(b, s, &sizes)?;
    let (mut p50s, mut means) = (Vec::new(), Vec::new());
    let (mut cores, mut cores_whole) = (Vec::new(), Vec::new());
    for _ in 0..ALTERNATING_ROUNDS {
        cores.push(core_rates());
        let (mut ta, _) = mixed_round(a, s, &sizes)?;
        let (mut tb, _) = mixed_round(b, s, &sizes)?;
        p50s.push([pct(&mut ta, 0.5), pct(&mut tb, 0.5)]);
        cores_whole.push(core_rates());
        let ma = mixed_round_whole(a, s, &sizes)?;
        let mb = mixed_round_whole(b, s, &sizes)?;
        means.push([ma, mb]);
    }
    let case = "mixed 256 B..1 MiB, 10,000 live, alternating rounds";
    Ok([
        Alternating {
            case: format!("{case}: alloc p50, us (a clock around each call)"),
            allocators: [a.name(), b.name()],
            rounds: p50s,
            cores,
        },
        Alternating {
            case: format!("{case}: mean ns per alloc (no clock per call)"),
            allocators: [a.name(), b.name()],
            rounds: means,
            cores: cores_whole,
        },
    ])
}

/// `n` new streams of the GPU's context.
fn new_streams(gpu: &Gpu, n: usize) -> Result<Vec<Arc<CudaStream>>> {
    (0..n)
        .map(|_| gpu.context().new_stream())
        .collect::<std::result::Result<_, _>>()
        .map_err(|source| Error::Driver {
            what: "cuStreamCreate",
            source,
        })
}

/// One thread of the threads case on its own stream: `pairs` allocations
/// of 256 B..64 KiB (drawn from `thread`'s seed), each followed, once 64
/// blocks are live, by the free of a random live one; then the rest
/// freed. Returns (pairs completed at their free, failed calls).
pub fn thread_pairs<R: Resource + ?Sized>(
    a: &R,
    s: &R::Stream,
    thread: usize,
    pairs: usize,
) -> (u64, u64) {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ thread as u64;
    let mut live: Vec<u64> = Vec::with_capacity(64);
    // A pair completes at its free.
    let (mut completed, mut failures) = (0u64, 0u64);
    let mut free = |p| match a.deallocate(p, s) {
        Ok(()) => completed += 1,
        Err(_) => failures += 1,
    };
    let mut failed_allocs = 0;
    for _ in 0..pairs {
        let sz = 256 + (xorshift(&mut rng) % (64 << 10)) as usize;
        match a.allocate(sz, s) {
            Ok(p) => live.push(p),
            Err(_) => failed_allocs += 1,
        }
        if live.len() >= 64 {
            let i = (xorshift(&mut rng) as usize) % live.len();
            free(live.swap_remove(i));
        }
    }
    live.into_iter().for_each(&mut free);
    (completed, failures + failed_allocs)
}

/// `name`'s value in MiB, as bytes, if the environment sets it (the
/// host models' settings); panics on a value that is not a number.
pub fn env_mib(name: &str) -> Option<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.parse::<usize>().expect("MiB") << 20)
}

/// The host models' cache bounds: `CACHE_LIMIT_MIB` and
/// `STREAM_CACHE_LIMIT_MIB` replace `cfg`'s where the environment sets
/// them.
pub fn cache_limits_from_env(cfg: &mut PoolConfig) {
    cfg.cache_limit = env_mib("CACHE_LIMIT_MIB").unwrap_or(cfg.cache_limit);
    cfg.stream_cache_limit = env_mib("STREAM_CACHE_LIMIT_MIB").unwrap_or(cfg.stream_cache_limit);
}

/// The threads case's ceiling: each thread's own lists of free blocks,
/// one per 256-byte size, with no lock, no atomic and nothing shared
/// between threads, and no memory behind the addresses (a size's
/// addresses are counted up from `size << 44`, per thread: two threads
/// may hand out the same address, so blocks must not move between
/// them). What the host's cores make of the case's loop alone: an
/// allocator that shares nothing scales no better on the same machine.
pub struct PrivateLists<S>(std::marker::PhantomData<fn(&S)>);

impl<S> Default for PrivateLists<S> {
    fn default() -> Self {
        PrivateLists(std::marker::PhantomData)
    }
}

thread_local! {
    /// [`PrivateLists`]: the last address handed out, and the lists.
    static PRIVATE: std::cell::RefCell<(u64, Vec<Vec<u64>>)> =
        const { std::cell::RefCell::new((0, Vec::new())) };
}

/// Where [`PrivateLists`] keeps a block's size (in 256-byte units).
const PRIVATE_SIZE_SHIFT: u32 = 44;

impl<S> Resource for PrivateLists<S> {
    type Stream = S;
    fn allocate(&self, size: usize, _: &S) -> Result<u64> {
        let units = size.div_ceil(256) as u64;
        if units == 0 || units >= 1 << (64 - PRIVATE_SIZE_SHIFT) {
            return Err(Error::InvalidArgument(format!(
                "private lists: {size} bytes"
            )));
        }
        Ok(PRIVATE.with_borrow_mut(|(last, lists)| {
            match lists.get_mut(units as usize).and_then(|l| l.pop()) {
                Some(p) => p,
                None => {
                    *last = (*last + 1) & ((1 << PRIVATE_SIZE_SHIFT) - 1);
                    units << PRIVATE_SIZE_SHIFT | *last
                }
            }
        }))
    }
    fn deallocate(&self, p: u64, _: &S) -> Result<()> {
        let units = (p >> PRIVATE_SIZE_SHIFT) as usize;
        if units == 0 {
            return Err(Error::InvalidArgument(format!("private lists: {p:#x}")));
        }
        PRIVATE.with_borrow_mut(|(_, lists)| {
            if lists.len() <= units {
                lists.resize_with(units + 1, Vec::new);
            }
            lists[units].push(p);
        });
        Ok(())
    }
    fn stream_id(_: &S) -> usize {
        0
    }
}

impl Alloc for PrivateLists<Arc<CudaStream>> {
    fn name(&self) -> &'static str {
        "thread-private lists (nothing shared: the host's ceiling)"
    }
}

/// The cores of a pinned row, from `cores` (the physical cores the
/// process may use, [`own_cores`]) with the first `threads + busy` of them
/// turned left by `first`: the core of each measured thread (in turn
/// where there are fewer cores than threads; none without cores), and
/// the busy workers' (up to `busy`, the cores after the measured threads'
/// while any are left). A row of eight with no turn takes the first
/// eight cores; a lone thread beside seven busy ones takes the `first`-th
/// of those eight, and the workers the other seven.
fn row_cores(
    cores: &[usize],
    threads: usize,
    busy: usize,
    first: usize,
) -> (Vec<usize>, Vec<usize>) {
    let mut cores = cores.to_vec();
    let span = (threads + busy).min(cores.len());
    if span > 0 {
        cores[..span].rotate_left(first % span);
    }
    let measured = match cores.is_empty() {
        true => Vec::new(),
        false => (0..threads).map(|t| cores[t % cores.len()]).collect(),
    };
    let workers = cores[threads.min(cores.len())..span].to_vec();
    (measured, workers)
}

/// `threads` host threads, each with its own stream, alloc/free pairs of
/// 256 B..64 KiB with up to 64 live per thread ([`thread_pairs`]); with
/// `pin`, thread `t` runs on the `t`-th physical core the process may use
/// ([`own_cores`]; fewer cores than threads: they are shared in turn),
/// and up to `busy` more threads work on the cores after those while
/// the measured threads run ([`Throughput::busy_cores`]; as many as
/// there are cores left). `first` turns the cores the measured and busy
/// threads take between them ([`row_cores`]), so that lone rows beside
/// busy cores take another core each turn.
fn threaded(
    gpu: &Gpu,
    a: &dyn Alloc,
    threads: usize,
    pairs: usize,
    pin: bool,
    busy: usize,
    first: usize,
) -> Result<Throughput> {
    let streams = new_streams(gpu, threads)?;
    // The measured threads read their cores together, then start
    // together with the main thread.
    let (probe, barrier) = (Barrier::new(threads), Barrier::new(threads + 1));
    let (done, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let all_cores = if pin { own_cores() } else { Vec::new() };
    let (cores, workers) = row_cores(&all_cores, threads, busy, first);
    let (working, stop) = (AtomicU64::new(0), AtomicBool::new(false));
    let pinned_threads = AtomicU64::new(0);
    // Per thread: CPU seconds, seconds in the loop, voluntary switches.
    let usage = Mutex::new((0.0f64, 0.0f64, 0u64));
    // Per thread: its cores' rates, when its loop began and ended.
    type Span = (CoreRates, Instant, Instant);
    let spans: Mutex<Vec<Span>> = Mutex::new(Vec::with_capacity(threads));
    let ready = AtomicU64::new(0);
    /// Stops the busy workers when dropped, also when the measure panics:
    /// the scope waits for every thread it spawned.
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let sampler = std::thread::scope(|sc| {
        let stop_workers = Stop(&stop);
        for &core in &workers {
            let (working, stop, ready) = (&working, &stop, &ready);
            sc.spawn(move || {
                let pinned = pin_to(core);
                working.fetch_add(pinned as u64, Ordering::Relaxed);
                ready.fetch_add(1, Ordering::Release);
                // A worker the kernel did not pin stops at once: it could
                // land on a measured thread's core. A pinned one works,
                // not a pause loop (which may let a virtual machine's
                // host take the core back, and a core that waits draws
                // less power than one that works, either leaving the
                // measured one more of its core than the rows of eight
                // get).
                let ceiling = PrivateLists::<()>::default();
                while pinned && !stop.load(Ordering::Relaxed) {
                    std::hint::black_box(thread_pairs(&ceiling, &(), core, 4096));
                }
            });
        }
        // The workers are pinned and working before the measure starts.
        while ready.load(Ordering::Acquire) < workers.len() as u64 {
            std::thread::yield_now();
        }
        let mut measured = Vec::with_capacity(threads);
        for (t, s) in streams.iter().enumerate() {
            let (probe, barrier, done, failed, usage, spans, ctx) = (
                &probe,
                &barrier,
                &done,
                &failed,
                &usage,
                &spans,
                gpu.context(),
            );
            let (cores, pinned_threads) = (&cores, &pinned_threads);
            measured.push(sc.spawn(move || {
                if cores.get(t).is_some_and(|&c| pin_to(c)) {
                    pinned_threads.fetch_add(1, Ordering::Relaxed);
                }
                // A thread without the context fails its calls, and they are counted.
                let _ = ctx.bind_to_thread();
                probe.wait();
                let core_before = core_rates();
                barrier.wait();
                let (began, before) = (Instant::now(), ThreadUsage::now());
                let (completed, failures) = thread_pairs(a, s, t, pairs);
                let (ended, after) = (Instant::now(), ThreadUsage::now());
                // Read after the loop's end is taken, so not in the
                // measure (the last thread's reading is taken with the
                // others done).
                let core = core_before.mean(core_rates());
                (spans.lock().unwrap_or_else(|p| p.into_inner())).push((core, began, ended));
                let mut u = usage.lock().unwrap_or_else(|p| p.into_inner());
                u.0 += after.cpu_s - before.cpu_s;
                u.1 += (ended - began).as_secs_f64();
                u.2 += after.waits - before.waits;
                done.fetch_add(completed, Ordering::Relaxed);
                failed.fetch_add(failures, Ordering::Relaxed);
            }));
        }
        // With CUHEAP_BENCH_PROFILE=DIR, the runs of 1 and 8 threads are
        // sampled (what eight lose against one, function by function).
        let sampler = match std::env::var_os("CUHEAP_BENCH_PROFILE") {
            Some(dir) if threads == 8 || threads == 1 => {
                let started = std::fs::create_dir_all(&dir)
                    .map_err(|e| Error::InvalidArgument(format!("CUHEAP_BENCH_PROFILE: {e}")))
                    .and_then(|()| super::sampler::Sampler::start(997));
                match started {
                    Ok(s) => Some((s, dir)),
                    Err(e) => {
                        eprintln!("cuheap bench host: not sampled: {e}");
                        None
                    }
                }
            }
            _ => None,
        };
        barrier.wait();
        for m in measured {
            // A measured thread that panicked fails the benchmark, as the
            // scope would (the workers stop first).
            m.join().expect("a measured thread panicked");
        }
        drop(stop_workers);
        sampler
    });
    let spans = spans.into_inner().unwrap_or_else(|p| p.into_inner());
    // From the first thread's start of its loop to the last one's end.
    let secs = match (
        spans.iter().map(|&(_, began, _)| began).min(),
        spans.iter().map(|&(_, _, ended)| ended).max(),
    ) {
        (Some(began), Some(ended)) => (ended - began).as_secs_f64().max(1e-9),
        _ => f64::NAN,
    };
    // The workers that ran (a worker the kernel did not pin stops).
    let busy_cores = working.into_inner() as usize;
    if let Some((s, dir)) = sampler {
        let mut name: String = a
            .name()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        if busy_cores > 0 {
            name += "-busy";
        }
        let file = |k: usize| match k {
            1 => format!("profile-{name}-{threads}.txt"),
            k => format!("profile-{name}-{threads}-{k}.txt"),
        };
        let mut path = std::path::PathBuf::from(&dir).join(file(1));
        for k in 2.. {
            if !path.exists() {
                break;
            }
            path = std::path::PathBuf::from(&dir).join(file(k));
        }
        s.finish(
            &path,
            &format!("{}: {threads} threads, own stream each", a.name()),
        )?;
    }
    let (cpu, wall, waits) = usage.into_inner().unwrap_or_else(|p| p.into_inner());
    let pinned_ok = pinned_threads.into_inner() as usize;
    for s in &streams {
        a.release(s);
    }
    Ok(Throughput {
        allocator: a.name(),
        case: "256 B..64 KiB, own stream per thread".into(),
        threads,
        pairs_per_s: done.into_inner() as f64 / secs,
        failures: failed.into_inner(),
        cpu_share: cpu / wall.max(f64::MIN_POSITIVE),
        waits_per_thread: waits as f64 / threads as f64,
        pinned: pin.then_some(pinned_ok),
        pinned_cores: if pin {
            all_cores.len().min(pinned_ok)
        } else {
            0
        },
        busy_cores,
        core: CoreRates::median_of(&spans.iter().map(|&(core, ..)| core).collect::<Vec<_>>()),
    })
}

/// Two streams with kernels in flight: allocate and fill on A, free on A,
/// allocate the same size on B and fill, free on B. Per-iteration host time.
fn producer_consumer(gpu: &Gpu, a: &dyn Alloc, iters: usize) -> Result<Latency> {
    let [sa, sb]: [Arc<CudaStream>; 2] = new_streams(gpu, 2)?.try_into().expect("two streams");
    let words = (1u32 << 20) / 4;
    let k = Bench::new(gpu)?;
    let (mut ta, mut tf) = (Vec::new(), Vec::new());
    for i in 0..iters + 8 {
        let t = Instant::now();
        let p = a.allocate(1 << 20, &sa)?;
        let dt_a = us(t);
        // SAFETY: the block holds `words` u32s and is freed on the same
        // stream after the kernel.
        unsafe {
            k.spin_fill(
                &LaunchConfig::for_threads(64 * 1024).on(&sa),
                DevicePtr::from_raw(p),
                words,
                i as u32,
                0,
            )?
        };
        let t = Instant::now();
        a.deallocate(p, &sa)?;
        let dt_f = us(t);
        let t = Instant::now();
        let q = a.allocate(1 << 20, &sb)?;
        let dt_b = us(t);
        // SAFETY: as above, on B.
        unsafe {
            k.spin_fill(
                &LaunchConfig::for_threads(64 * 1024).on(&sb),
                DevicePtr::from_raw(q),
                words,
                !(i as u32),
                0,
            )?
        };
        a.deallocate(q, &sb)?;
        if i >= 8 {
            ta.push(dt_a + dt_b);
            tf.push(dt_f);
        }
    }
    sa.synchronize().map_err(|source| Error::Driver {
        what: "cuStreamSynchronize",
        source,
    })?;
    sb.synchronize().map_err(|source| Error::Driver {
        what: "cuStreamSynchronize",
        source,
    })?;
    Ok(Latency {
        allocator: a.name(),
        case: "producer/consumer 1 MiB, free on A, alloc on B (both allocs)".into(),
        alloc_p50_us: pct(&mut ta, 0.5),
        alloc_p99_us: pct(&mut ta, 0.99),
        free_p50_us: pct(&mut tf, 0.5),
        free_p99_us: pct(&mut tf, 0.99),
    })
}

/// The default memory pool of the context's device (`cudaMallocAsync`'s).
fn default_mem_pool(gpu: &Gpu) -> Result<sys::CUmemoryPool> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    gpu.context()
        .bind_to_thread()
        .map_err(|source| Error::Driver {
            what: "cuCtxSetCurrent",
            source,
        })?;
    // SAFETY: out-parameter for the context's device.
    driver("cuDeviceGetDefaultMemPool", unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, gpu.context().ordinal() as i32)
    })?;
    Ok(pool)
}

/// Reads (with `reset`, first trims the pool and resets) the default
/// pool's reserved high-water mark.
pub(crate) fn async_reserved_high(gpu: &Gpu, reset: bool) -> Result<u64> {
    let pool = default_mem_pool(gpu)?;
    let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH;
    let mut v = 0u64;
    if reset {
        // SAFETY: a live pool; nothing of it is in use between cases.
        driver("cuMemPoolTrimTo", unsafe { sys::cuMemPoolTrimTo(pool, 0) })?;
        // SAFETY: the attribute takes a pointer to a u64 (0 resets it).
        driver("cuMemPoolSetAttribute", unsafe {
            sys::cuMemPoolSetAttribute(pool, attr, &mut v as *mut u64 as *mut _)
        })?;
    }
    // SAFETY: as above, read.
    driver("cuMemPoolGetAttribute", unsafe {
        sys::cuMemPoolGetAttribute(pool, attr, &mut v as *mut u64 as *mut _)
    })?;
    Ok(v)
}

/// Pairs per thread in the threads case for cuheap's pools (ten times
/// this for the ceiling): about a third of a second at their rates.
/// 200,000, what `cudaMallocAsync`'s rows still run (over seconds), took
/// the pools 30-40 ms, short enough for a moment of the host's to move a
/// row.
const CUHEAP_PAIRS: usize = 2_000_000;

/// The pinned rows of the threads case, `(threads, other cores kept
/// busy, the turn of the cores)`: one thread alone, eight, and one thread
/// while seven other cores work, five times each in turn. A lone core
/// may get more of itself than each of eight working ones (on the H100
/// 80 GB's host a lone thread ran at one of two rates from row to row;
/// on an H200's at one of two rates at the same clock): eight threads
/// against the busy rows compare them beside as many working cores, the
/// median of five rows of each holds where one row runs at the other
/// rate (a row takes a fraction of a second), and the busy rows' lone
/// thread takes another of the eight cores each turn.
const ONE_AND_EIGHT_PINNED: [(usize, usize, usize); 15] = {
    let mut rows = [(0, 0, 0); 15];
    let mut i = 0;
    while i < rows.len() {
        let turn = i / 3;
        rows[i] = match i % 3 {
            0 => (1, 0, 0),
            1 => (8, 0, 0),
            _ => (1, 7, turn),
        };
        i += 1;
    }
    rows
};

/// Threads of the hand-off case.
pub const HANDOFF_THREADS: usize = 8;

/// Blocks handed between threads: [`HANDOFF_THREADS`] threads with their
/// own streams allocate blocks of 256 B..4 MiB (log-uniform), fill them on
/// their stream and hand them to the next thread (up to 16 in flight per
/// pair), which checks them on its own stream and frees them there;
/// 20,000 blocks in all. Each thread first calls `enter` (binding a
/// context); `fill` and `check` say whether the memory took and kept the
/// byte. Returns the peak of requested bytes alive and the failures; the
/// caller reads what the allocator held. `seed` 0 is the benchmark's
/// draw. The benchmark runs it on the GPU, and `examples/handoff_model.rs`
/// on the pool over host memory.
pub fn handoff_threads<R: Resource + ?Sized>(
    a: &R,
    streams: &[R::Stream],
    seed: u64,
    enter: impl Fn() + Sync,
    fill: impl Fn(&R::Stream, u64, usize, u8) -> bool + Sync,
    check: impl Fn(&R::Stream, u64, usize, u8) -> bool + Sync,
) -> (u64, u64)
where
    R::Stream: Sync,
{
    const BLOCKS: usize = 20_000 / HANDOFF_THREADS;
    type Block = (u64, usize, u8);
    assert_eq!(streams.len(), HANDOFF_THREADS, "one stream per thread");
    let (live, peak, failed) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..HANDOFF_THREADS)
        .map(|_| std::sync::mpsc::sync_channel::<Block>(16))
        .unzip();
    std::thread::scope(|sc| {
        for (t, rx) in receivers.into_iter().enumerate() {
            let next = senders[(t + 1) % HANDOFF_THREADS].clone();
            let (s, live, peak, failed) = (&streams[t], &live, &peak, &failed);
            let (enter, fill, check) = (&enter, &fill, &check);
            sc.spawn(move || {
                enter();
                let fail = || failed.fetch_add(1, Ordering::Relaxed);
                // Checks and frees one received block, if there is one.
                let take = |block: bool| -> bool {
                    let got = if block {
                        rx.recv().ok()
                    } else {
                        rx.try_recv().ok()
                    };
                    let Some((p, len, byte)) = got else {
                        return false;
                    };
                    if !check(s, p, len, byte) {
                        fail();
                    }
                    match a.deallocate(p, s) {
                        Ok(()) => {
                            live.fetch_sub(len as u64, Ordering::Relaxed);
                        }
                        Err(_) => {
                            fail();
                        }
                    }
                    true
                };
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64 ^ seed;
                let mut received = 0;
                for i in 0..BLOCKS {
                    let u = (xorshift(&mut rng) >> 11) as f64 / (1u64 << 53) as f64;
                    let len = (256.0 * 2f64.powf(u * 14.0)) as usize;
                    let byte = (t * 31 + i) as u8 | 1;
                    let Ok(p) = a.allocate(len, s) else {
                        fail();
                        continue;
                    };
                    let now = live.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
                    peak.fetch_max(now, Ordering::Relaxed);
                    if !fill(s, p, len, byte) {
                        fail();
                    }
                    // Never block on a full channel: the next thread may be
                    // waiting on ours.
                    let mut item = (p, len, byte);
                    loop {
                        match next.try_send(item) {
                            Ok(()) => break,
                            Err(std::sync::mpsc::TrySendError::Full(back)) => item = back,
                            Err(_) => return,
                        }
                        while take(false) {
                            received += 1;
                        }
                        std::thread::yield_now();
                    }
                    while take(false) {
                        received += 1;
                    }
                }
                drop(next);
                while received < BLOCKS && take(true) {
                    received += 1;
                }
            });
        }
        drop(senders);
    });
    (peak.into_inner(), failed.into_inner())
}

/// [`handoff_threads`] on the GPU: each block filled with `cuMemsetD8`
/// and its first and last 64 bytes read back and checked.
fn handoff(gpu: &Gpu, a: &dyn Alloc) -> Result<(u64, u64)> {
    let streams = new_streams(gpu, HANDOFF_THREADS)?;
    let fill = |s: &Arc<CudaStream>, p: u64, len: usize, byte: u8| {
        // SAFETY: the block holds `len` bytes and stays live until the
        // receiver frees it, after this fill (waited for here).
        unsafe { result::memset_d8_async(p, byte, len, s.cu_stream()) }
            .and_then(|_| s.synchronize())
            .is_ok()
    };
    let check = |s: &Arc<CudaStream>, p: u64, len: usize, byte: u8| {
        let n = len.min(64);
        let (mut head, mut tail) = ([0u8; 64], [0u8; 64]);
        // SAFETY: both ranges lie in the live block of `len` bytes, whose
        // fill finished before it was sent; the stream is waited for
        // before the buffers are read.
        let read = unsafe {
            result::memcpy_dtoh_async(&mut head[..n], p, s.cu_stream()).and_then(|_| {
                result::memcpy_dtoh_async(&mut tail[..n], p + (len - n) as u64, s.cu_stream())
            })
        }
        .and_then(|_| s.synchronize());
        read.is_ok() && head[..n].iter().chain(&tail[..n]).all(|&b| b == byte)
    };
    // A thread without the context fails its calls, and they are counted.
    let enter = || {
        let _ = gpu.context().bind_to_thread();
    };
    let out = handoff_threads(a, &streams, 0, enter, fill, check);
    for s in &streams {
        s.synchronize().map_err(|source| Error::Driver {
            what: "cuStreamSynchronize",
            source,
        })?;
    }
    Ok(out)
}

/// Runs of the hand-off case per allocator: each run's threads meet
/// each other's calls at other moments, so what a run holds moves from
/// run to run (the CPU model spread 1.17-1.55 times its peak over 16
/// draws; every run uses the benchmark's draw, seed 0, so the spread is
/// the threads' timing alone); the table gives every run and their median.
pub const HANDOFF_RUNS: usize = 5;

/// The hand-off workload [`HANDOFF_RUNS`] times on a fresh cuheap pool
/// (mapped in 2 MiB steps from 2 MiB) and on `cudaMallocAsync`'s default
/// pool (trimmed first), in turn.
fn handoff_memory(gpu: &Gpu) -> Result<Vec<MemoryUse>> {
    let case = format!("hand-offs, {HANDOFF_THREADS} threads, 256 B..4 MiB");
    let mut rows = Vec::new();
    for _ in 0..HANDOFF_RUNS {
        let cfg = PoolConfig {
            initial: 2 << 20,
            chunk: 2 << 20,
            ..PoolConfig::new(gpu.info().memory_bytes / 4)
        };
        let pool = Pool::new(gpu.context(), cfg)?;
        let (peak, failures) = handoff(gpu, &pool)?;
        rows.push(MemoryUse {
            allocator: pool.name(),
            case: case.clone(),
            peak_requested_bytes: peak,
            reserved_bytes: pool.stats().reserved as u64,
            failures,
        });
        drop(pool);
        async_reserved_high(gpu, true)?;
        let (peak, failures) = handoff(gpu, &Async)?;
        rows.push(MemoryUse {
            allocator: Async.name(),
            case: case.clone(),
            peak_requested_bytes: peak,
            reserved_bytes: async_reserved_high(gpu, false)?,
            failures,
        });
    }
    Ok(rows)
}

/// Runs the host benchmark.
pub fn run(gpu: &Gpu, mut progress: impl FnMut(&str)) -> Result<HostReport> {
    warm_async_pool(gpu)?;
    let pool = Pool::new(gpu.context(), PoolConfig::new(gpu.info().memory_bytes / 2))?;
    let s = gpu.context().new_stream().map_err(|source| Error::Driver {
        what: "cuStreamCreate",
        source,
    })?;
    let capi = match CApiPool::find().map(|p| CApiPool::load(&p)) {
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            progress(&format!("the C API is not measured: {e}"));
            None
        }
        None => {
            progress("libcuheap.so not found: the C API is not measured");
            None
        }
    };
    let allocs: [&dyn Alloc; 3] = [&pool, &Async, &Sync_];
    let mut r = HostReport {
        device: gpu.info().name.clone(),
        clock_ns: clock_floor(),
        ..HostReport::default()
    };
    for size in [256usize, 64 << 10, 1 << 20, 16 << 20, 64 << 20] {
        for a in allocs {
            progress(&format!(
                "{} {}",
                a.name(),
                super::device::size_name(size as u32)
            ));
            let n = if a.name() == "cudaMalloc" {
                300
            } else {
                20_000
            };
            r.latency.push(single_size(a, &s, size, n)?);
        }
    }
    for size in [256usize, 64 << 10, 1 << 20] {
        for a in &allocs[..2] {
            progress(&format!(
                "{} {} in a loop",
                a.name(),
                super::device::size_name(size as u32)
            ));
            let pairs = if a.name() == "cuheap pool" {
                100_000
            } else {
                10_000
            };
            r.loops.push(in_a_loop(*a, &s, size, pairs)?);
        }
    }
    // The C API beside the pool it wraps: the single sizes and threads.
    if let Some(c) = &capi {
        for size in [256usize, 64 << 10, 1 << 20] {
            progress(&format!(
                "{} {}",
                c.name(),
                super::device::size_name(size as u32)
            ));
            r.latency.push(single_size(c, &s, size, 20_000)?);
            progress(&format!(
                "{} {} in a loop",
                c.name(),
                super::device::size_name(size as u32)
            ));
            r.loops.push(in_a_loop(c, &s, size, 100_000)?);
        }
        progress("the C API's boundary alone");
        r.loops.push(c.boundary(&s, 100_000)?);
        c.release(&s);
        for threads in [1, 4, 8, 8] {
            progress(&format!("{} {threads} threads", c.name()));
            r.throughput
                .push(threaded(gpu, c, threads, CUHEAP_PAIRS, false, 0, 0)?);
        }
        let fresh = FreshPool(Pool::new(
            gpu.context(),
            PoolConfig::new(gpu.info().memory_bytes),
        )?);
        for size in [256usize, 64 << 10, 1 << 20] {
            single_size(&fresh, &s, size, 20_000)?;
            in_a_loop(&fresh, &s, size, 100_000)?;
        }
        fresh.release(&s);
        for threads in [1, 8, 8] {
            progress(&format!("{} {threads} threads", fresh.name()));
            r.throughput
                .push(threaded(gpu, &fresh, threads, CUHEAP_PAIRS, false, 0, 0)?);
        }
    }
    for a in &allocs[..2] {
        progress(&format!("{} mixed", a.name()));
        r.latency.push(mixed(*a, &s)?);
        if a.name() == allocs[1].name() {
            progress("mixed, alternating rounds");
            r.alternating
                .extend(mixed_alternating(allocs[0], allocs[1], &s)?);
        }
        progress(&format!("{} producer/consumer", a.name()));
        r.latency.push(producer_consumer(gpu, *a, 2000)?);
        for threads in [1, 4, 8, 8] {
            progress(&format!("{} {threads} threads", a.name()));
            let pairs = if a.name() == "cuheap pool" {
                CUHEAP_PAIRS
            } else {
                200_000
            };
            r.throughput
                .push(threaded(gpu, *a, threads, pairs, false, 0, 0)?);
        }
    }
    // The pool again with each thread on a core of its own: the host's
    // scheduler out of the comparison.
    for (threads, busy, first) in ONE_AND_EIGHT_PINNED {
        progress(&format!("{} {threads} threads, pinned", allocs[0].name()));
        r.throughput.push(threaded(
            gpu,
            allocs[0],
            threads,
            CUHEAP_PAIRS,
            true,
            busy,
            first,
        )?);
    }
    // How far the host's cores scale the case's loop with nothing shared
    // (ten times the pool's pairs: each call is a few nanoseconds).
    let ceiling = PrivateLists::default();
    for threads in [1, 4, 8, 8] {
        progress(&format!("{} {threads} threads", ceiling.name()));
        r.throughput.push(threaded(
            gpu,
            &ceiling,
            threads,
            10 * CUHEAP_PAIRS,
            false,
            0,
            0,
        )?);
    }
    for (threads, busy, first) in ONE_AND_EIGHT_PINNED {
        progress(&format!("{} {threads} threads, pinned", ceiling.name()));
        r.throughput.push(threaded(
            gpu,
            &ceiling,
            threads,
            10 * CUHEAP_PAIRS,
            true,
            busy,
            first,
        )?);
    }
    s.synchronize().map_err(|source| Error::Driver {
        what: "cuStreamSynchronize",
        source,
    })?;
    progress("memory: hand-offs between threads");
    r.memory = handoff_memory(gpu)?;
    Ok(r)
}

/// Failed calls over the threaded and memory cases (see
/// [`Throughput::failures`], [`MemoryUse::failures`]).
pub fn failures(r: &HostReport) -> u64 {
    r.throughput.iter().map(|t| t.failures).sum::<u64>()
        + r.memory.iter().map(|m| m.failures).sum::<u64>()
}

pub fn table(r: &HostReport) -> String {
    let mut out = format!(
        "device: {}; host clock per call, microseconds (reading the clock twice takes {:.1} ns at p50: part of each figure)\n\n",
        r.device, r.clock_ns
    );
    out += "| case | allocator | alloc p50 | alloc p99 | free p50 | free p99 |\n|---|---|---|---|---|---|\n";
    for l in &r.latency {
        out += &format!(
            "| {} | {} | {:.3} | {:.3} | {:.3} | {:.3} |\n",
            l.case, l.allocator, l.alloc_p50_us, l.alloc_p99_us, l.free_p50_us, l.free_p99_us
        );
    }
    for alt in r.alternating.iter().filter(|a| !a.rounds.is_empty()) {
        let [a, b] = alt.allocators;
        out += &format!(
            "\n| {} | round | {a} | {b} | {b} / {a} | this thread's core before the pair of rounds: GHz / G adds/s |\n|---|---|---|---|---|---|\n",
            alt.case
        );
        for (i, ([x, y], q)) in alt.rounds.iter().zip(alt.ratios()).enumerate() {
            let clock = alt.cores.get(i).copied().unwrap_or_default().shown();
            out += &format!("| | {} | {x:.3} | {y:.3} | {q:.1}x | {clock} |\n", i + 1);
        }
        let mut q = alt.ratios();
        let (mid, lo, hi) = median_and_range(&mut q);
        out += &format!(
            "| | median of {} rounds | | | {mid:.1}x ({lo:.1}x-{hi:.1}x) | |\n",
            q.len()
        );
    }
    if !r.loops.is_empty() {
        out += "\n| single size, alloc + free pairs in a loop (no clock per call) | allocator | ns per call (median of 7 batches) |\n|---|---|---|\n";
        for l in &r.loops {
            out += &format!("| {} | {} | {:.1} |\n", l.case, l.allocator, l.ns_per_call);
        }
    }
    out += "\n| threads (own stream each) | allocator | M pairs/s | vs 1 thread (its rows' median) | failures | CPU time / time in the loop | voluntary waits per thread | core: GHz / G adds/s |\n|---|---|---|---|---|---|---|---|\n";
    for t in &r.throughput {
        let mut ones: Vec<f64> = (r.throughput.iter())
            .filter(|x| {
                x.allocator == t.allocator
                    && x.threads == 1
                    && x.pinned.is_some() == t.pinned.is_some()
                    && x.busy_cores == 0
            })
            .map(|x| x.pairs_per_s)
            .collect();
        let one = super::median(&mut ones);
        let mut allocator = match t.pinned {
            None => t.allocator.to_string(),
            Some(k) if k == t.threads && t.pinned_cores == t.threads => {
                format!("{}, pinned (a core each)", t.allocator)
            }
            Some(k) => format!(
                "{}, pinned ({k} of {} threads, on {} cores)",
                t.allocator, t.threads, t.pinned_cores
            ),
        };
        if t.busy_cores > 0 {
            allocator += &format!(", {} other cores busy", t.busy_cores);
        }
        let clock = t.core.shown();
        out += &format!(
            "| {} | {} | {:.2} | {:.2}x | {} | {:.2} | {:.0} | {clock} |\n",
            t.threads,
            allocator,
            t.pairs_per_s / 1e6,
            t.pairs_per_s / one,
            t.failures,
            t.cpu_share,
            t.waits_per_thread
        );
    }
    for (allocator, mut ratios, per_rate) in busy_ratios(r) {
        if ratios.is_empty() {
            continue; // no row of eight threads on eight cores
        }
        let shown: Vec<String> = ratios.iter().map(|q| format!("{q:.2}x")).collect();
        out += &format!(
            "\n{allocator}: eight pinned threads against one pinned thread with other cores busy \
             (the median of those rows): {}; the median of the {} rows of eight: {:.2}x\n",
            shown.join(", "),
            ratios.len(),
            super::median(&mut ratios)
        );
        for (what, mut q) in per_rate {
            let shown: Vec<String> = q.iter().map(|q| format!("{q:.2}x")).collect();
            out += &format!(
                "{allocator}: the same with each row's pairs a second divided by its {what}, \
                 for reference (the target's figure is the line above): {}; the median of the \
                 {} rows of eight: {:.2}x\n",
                shown.join(", "),
                q.len(),
                super::median(&mut q)
            );
        }
    }
    if !r.memory.is_empty() {
        out += "\n| memory case | allocator | peak requested MiB | held MiB | held / peak | failures |\n|---|---|---|---|---|---|\n";
        for m in &r.memory {
            out += &format!(
                "| {} | {} | {:.1} | {:.1} | {:.2}x | {} |\n",
                m.case,
                m.allocator,
                m.peak_requested_bytes as f64 / (1 << 20) as f64,
                m.reserved_bytes as f64 / (1 << 20) as f64,
                m.held_over_peak(),
                m.failures
            );
        }
        let mut allocators: Vec<&str> = Vec::new();
        for m in &r.memory {
            if !allocators.contains(&m.allocator) {
                allocators.push(m.allocator);
            }
        }
        for a in allocators {
            let mut q: Vec<f64> = (r.memory.iter())
                .filter(|m| m.allocator == a)
                .map(MemoryUse::held_over_peak)
                .collect();
            if q.len() > 1 {
                let (mid, lo, hi) = median_and_range(&mut q);
                out += &format!(
                    "\n{a}: held / peak, the median of {} runs: {mid:.2}x ({lo:.2}x-{hi:.2}x)",
                    q.len()
                );
            }
        }
        out.push('\n');
    }
    out
}

/// The median, least and greatest of a non-empty sample.
fn median_and_range(q: &mut [f64]) -> (f64, f64, f64) {
    let lo = q.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = q.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (super::median(q), lo, hi)
}

/// [`busy_ratios`]' answer for one allocator: its name, each row of
/// eight over the median of the lone busy rows, and the same over each
/// rate of [`CoreRates`] that every row has (named: each row's pairs a
/// second over that rate).
type BusyRatios = (&'static str, Vec<f64>, Vec<(&'static str, Vec<f64>)>);

/// Per allocator with pinned rows of one thread beside busy cores: each
/// pinned row of eight threads (a core each) over the median of those
/// rows, in the report's order.
fn busy_ratios(r: &HostReport) -> Vec<BusyRatios> {
    let mut out: Vec<BusyRatios> = Vec::new();
    for t in &r.throughput {
        if t.busy_cores == 0 || out.iter().any(|(a, ..)| *a == t.allocator) {
            continue;
        }
        let rows = |one: bool| {
            (r.throughput.iter())
                .filter(move |x| x.allocator == t.allocator && x.pinned.is_some())
                .filter(move |x| (x.threads == 1 && x.busy_cores > 0) == one)
                .filter(move |x| {
                    one || (x.threads == 8 && x.pinned == Some(8) && x.pinned_cores == 8)
                })
        };
        if rows(true).next().is_none() {
            continue; // busy rows of more than one thread only
        }
        // Each row of eight's figure over the median of the busy rows'.
        let ratios = |of: &dyn Fn(&Throughput) -> f64| -> Vec<f64> {
            let one = super::median(&mut rows(true).map(of).collect::<Vec<_>>());
            rows(false).map(|x| of(x) / one).collect()
        };
        let raw = ratios(&|x| x.pairs_per_s);
        // Over each row's rate of its core, where every row has it.
        type Probe = (&'static str, fn(&CoreRates) -> f64);
        let probes: [Probe; 2] = [
            ("core clock", |c| c.ghz),
            ("addition chain's rate", |c| c.adds),
        ];
        let mut per_rate = Vec::new();
        for (what, rate) in probes {
            if !rows(true).chain(rows(false)).all(|x| rate(&x.core) > 0.0) {
                continue;
            }
            per_rate.push((what, ratios(&|x| x.pairs_per_s / rate(&x.core))));
        }
        out.push((t.allocator, raw, per_rate));
    }
    out
}

/// The host report's chart: alloc p50 per case and allocator.
pub fn svg(r: &HostReport) -> String {
    let series = ["cuheap pool", "cudaMallocAsync", "cudaMalloc"];
    let mut cases: Vec<&str> = Vec::new();
    for l in &r.latency {
        if !cases.contains(&l.case.as_str()) {
            cases.push(&l.case);
        }
    }
    let groups: Vec<(String, Vec<Option<f64>>)> = cases
        .iter()
        .map(|c| {
            let vals = series
                .iter()
                .map(|a| {
                    r.latency
                        .iter()
                        .find(|l| l.case == *c && l.allocator == *a)
                        .map(|l| l.alloc_p50_us)
                })
                .collect();
            (c.split(',').next().unwrap_or(c).to_string(), vals)
        })
        .collect();
    super::report::bar_chart(
        &format!("Allocation call, p50: {}", r.device),
        "us",
        &series,
        &groups,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ceiling's lists hand out distinct addresses to live blocks,
    /// reuse a freed block for its size, refuse size 0 and foreign
    /// addresses, and run the threads case with no failure.
    #[test]
    fn private_lists_keep_live_blocks_apart_and_reuse_freed_ones() {
        let a = PrivateLists::<()>::default();
        let live: Vec<u64> = (1..=600)
            .map(|i| a.allocate(i * 100, &()).unwrap())
            .collect();
        let distinct: std::collections::HashSet<u64> = live.iter().copied().collect();
        assert_eq!(distinct.len(), live.len());
        a.deallocate(live[299], &()).unwrap();
        assert_eq!(a.allocate(300 * 100, &()).unwrap(), live[299]);
        assert!(a.allocate(0, &()).is_err());
        assert!(a.deallocate(12345, &()).is_err());
        assert_eq!(thread_pairs(&a, &(), 3, 10_000), (10_000, 0));
    }

    #[test]
    fn memory_rows_show_the_ratio_and_their_failures_fail_the_run() {
        let mut r = HostReport {
            device: "test".into(),
            ..HostReport::default()
        };
        r.memory.push(MemoryUse {
            allocator: "cuheap pool",
            case: "hand-offs".into(),
            peak_requested_bytes: 80 << 20,
            reserved_bytes: 120 << 20,
            failures: 0,
        });
        let t = table(&r);
        assert!(
            t.contains("| hand-offs | cuheap pool | 80.0 | 120.0 | 1.50x | 0 |"),
            "{t}"
        );
        assert!(!t.contains("the median of"), "one run, no median: {t}");
        for held in [100, 132] {
            r.memory.push(MemoryUse {
                reserved_bytes: held << 20,
                ..r.memory[0].clone()
            });
        }
        let t = table(&r);
        assert!(
            t.contains("cuheap pool: held / peak, the median of 3 runs: 1.50x (1.25x-1.65x)"),
            "{t}"
        );
        assert_eq!(failures(&r), 0);
        r.memory[0].failures = 2;
        assert_eq!(failures(&r), 2);
    }

    /// Eight pinned threads are shown against the lone pinned thread and,
    /// apart, against the median of the lone rows beside busy cores.
    #[test]
    fn busy_rows_are_labelled_and_eight_threads_are_compared_with_them() {
        let row = |threads, pairs_per_s, busy_cores| Throughput {
            allocator: "cuheap pool",
            case: "256 B..64 KiB, own stream per thread".into(),
            threads,
            pairs_per_s,
            failures: 0,
            cpu_share: 1.0,
            waits_per_thread: 0.0,
            pinned: Some(threads),
            pinned_cores: threads,
            busy_cores,
            core: CoreRates {
                ghz: if threads == 1 { 4.0 } else { 3.0 },
                adds: 6.0,
            },
        };
        let mut r = HostReport {
            device: "test".into(),
            ..HostReport::default()
        };
        r.throughput = vec![
            row(1, 10e6, 0),
            row(8, 60e6, 0),
            row(1, 8e6, 7),
            row(1, 9e6, 7),
            row(8, 51e6, 0),
        ];
        // Per cycle: eight at 3 GHz against lone rows at 4; per addition
        // (the same rate in every row) as they are.
        let per_cycle = [60.0 / 3.0 / (8.5 / 4.0), 51.0 / 3.0 / (8.5 / 4.0)];
        let raw = [60.0 / 8.5, 6.0];
        let close = |a: &[f64], b: &[f64]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
        };
        let got = busy_ratios(&r);
        assert_eq!(got.len(), 1, "{got:?}");
        let (allocator, ratios, per_rate) = &got[0];
        assert_eq!(*allocator, "cuheap pool");
        assert!(close(ratios, &raw), "{got:?}");
        let names: Vec<&str> = per_rate.iter().map(|(what, _)| *what).collect();
        assert_eq!(names, ["core clock", "addition chain's rate"]);
        assert!(close(&per_rate[0].1, &per_cycle), "{got:?}");
        assert!(close(&per_rate[1].1, &raw), "{got:?}");
        let t = table(&r);
        assert!(
            t.contains("| 8 | cuheap pool, pinned (a core each) | 60.00 | 6.00x |"),
            "{t}"
        );
        assert!(
            t.contains(
                "| 1 | cuheap pool, pinned (a core each), 7 other cores busy | 8.00 | 0.80x |"
            ),
            "{t}"
        );
        assert!(
            t.contains("(the median of those rows): 7.06x, 6.00x; the median of the 2 rows of eight: 6.53x"),
            "{t}"
        );
        assert!(
            t.contains("divided by its core clock, for reference (the target's figure is the line above): 9.41x, 8.00x; the median of the 2 rows of eight: 8.71x"),
            "{t}"
        );
        assert!(
            t.contains("divided by its addition chain's rate, for reference (the target's figure is the line above): 7.06x, 6.00x; the median of the 2 rows of eight: 6.53x"),
            "{t}"
        );
        assert!(t.contains("| 0 | 1.00 | 0 | 3.00 / 6.00 |"), "{t}");
        // A row with no clock: no line per cycle, and a dash.
        r.throughput[2].core.ghz = 0.0;
        let t = table(&r);
        assert!(!t.contains("divided by its core clock"), "{t}");
        assert!(t.contains("divided by its addition chain's rate"), "{t}");
        assert!(
            t.contains("busy | 8.00 | 0.80x | 0 | 1.00 | 0 | - / 6.00 |"),
            "{t}"
        );
        // With no row of eight threads on eight cores, no line of them.
        r.throughput.retain(|x| x.threads == 1);
        assert!(!table(&r).contains("rows of eight"), "{}", table(&r));
    }

    /// The core probe reads rates a core can give on x86-64: a chain the
    /// compiler or the core skipped would read thousands of GHz (and none
    /// elsewhere).
    #[test]
    fn the_core_probe_reads_rates_a_core_can_give() {
        let c = core_rates();
        for v in [c.ghz, c.adds] {
            match cfg!(target_arch = "x86_64") {
                true => assert!(v.is_finite() && v > 0.0 && v < 100.0, "{c:?}"),
                false => assert_eq!(v, 0.0),
            }
        }
        assert_eq!(CoreRates::default().shown(), "- / -");
    }

    /// Measured threads and busy workers never share a core; rows of
    /// eight keep the first eight cores; each turn of a lone busy row
    /// takes another of them; few cores or none do not panic.
    #[test]
    fn row_cores_keep_measured_and_busy_threads_apart() {
        let cores: Vec<usize> = (0..16).map(|c| 2 * c).collect();
        assert_eq!(row_cores(&cores, 8, 0, 0), (cores[..8].to_vec(), vec![]));
        for turn in 0..8 {
            let (measured, workers) = row_cores(&cores, 1, 7, turn);
            assert_eq!(measured, [cores[turn]]);
            assert_eq!(workers.len(), 7);
            let mut all = [measured, workers].concat();
            all.sort_unstable();
            assert_eq!(all, cores[..8], "turn {turn}");
        }
        assert_eq!(row_cores(&cores, 1, 0, 3), (vec![cores[0]], vec![]));
        // Fewer cores than threads: shared in turn, no workers.
        assert_eq!(row_cores(&[5, 7], 4, 7, 0), (vec![5, 7, 5, 7], vec![]));
        assert_eq!(
            row_cores(&[5, 7, 9, 11], 1, 7, 1),
            (vec![7], vec![9, 11, 5])
        );
        assert_eq!(row_cores(&[], 8, 7, 2), (vec![], vec![]));
        assert_eq!(row_cores(&[3], 1, 7, 4), (vec![3], vec![]));
    }

    #[test]
    fn own_cores_are_allowed_distinct_and_one_per_core() {
        let cores = own_cores();
        assert!(!cores.is_empty());
        assert!(
            cores.windows(2).all(|w| w[0] < w[1]),
            "in order, no CPU twice: {cores:?}"
        );
        // SAFETY: as in `own_cores`.
        let allowed = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set),
                0
            );
            set
        };
        for &c in &cores {
            // SAFETY: `c` < CPU_SETSIZE.
            let ok = unsafe { libc::CPU_ISSET(c, &allowed) };
            assert!(ok, "cpu {c} is not allowed");
            // No other listed CPU is one of its hardware threads.
            let path = format!("/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list");
            if let Ok(list) = std::fs::read_to_string(path) {
                for part in list.trim().split(',') {
                    let (a, b) = part.split_once('-').unwrap_or((part, part));
                    let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
                    let others = cores.iter().filter(|&&d| d != c && (a..=b).contains(&d));
                    assert_eq!(
                        others.count(),
                        0,
                        "cpu {c} shares its core with a listed CPU"
                    );
                }
            }
        }
    }

    #[test]
    fn alternating_rounds_show_each_ratio_and_their_median() {
        let mut r = HostReport {
            device: "test".into(),
            ..HostReport::default()
        };
        r.alternating.push(Alternating {
            case: "mixed".into(),
            allocators: ["pool", "async"],
            rounds: vec![[0.2, 2.0], [0.1, 1.5], [0.3, 2.4]],
            cores: [3.1, 2.0, 0.0]
                .map(|ghz| CoreRates { ghz, adds: 5.0 })
                .to_vec(),
        });
        let t = table(&r);
        assert!(
            t.contains("| | 2 | 0.100 | 1.500 | 15.0x | 2.00 / 5.00 |"),
            "{t}"
        );
        assert!(
            t.contains("| | 3 | 0.300 | 2.400 | 8.0x | - / 5.00 |"),
            "{t}"
        );
        assert!(
            t.contains("| | median of 3 rounds | | | 10.0x (8.0x-15.0x) | |"),
            "{t}"
        );
        r.alternating[0].rounds.clear();
        assert!(!table(&r).contains("median of"));
    }
}

//! The host pool: stream-ordered device memory.
//!
//! - Blocks come from a `cuheap-core` heap whose metadata lives in host
//!   memory and whose pages are device addresses in a [`Region`]: size
//!   classes up to 64 KiB, spans of whole 64 KiB pages above (the page map
//!   coalesces free neighbours), no list scans.
//! - Each stream has a cache of blocks freed on it, by size ([`cache`]):
//!   reuse on the same stream is immediate, because stream order already
//!   puts the new user after the old one. In front of it, each thread has
//!   a small cache per stream ([`local`]) that its allocations and frees
//!   of up to 1 MiB reach with no lock.
//! - Caches are bounded, per stream and in all, threads' caches included
//!   (a thread's also per thread: see [`PoolConfig::stream_cache_limit`]
//!   and [`PoolConfig::cache_limit`]). A cache past its bound,
//!   and the cache of a stream no one else holds any more, *sheds* its
//!   largest blocks straight back to the heap behind the stream's guard
//!   ([`guard`]): the same stream reuses that memory at once, in any size
//!   and shape; another stream that gets it first waits, on the device,
//!   for the shedding stream's work up to the shed. The host never waits
//!   for this. (If no guard can be recorded the blocks are *retired*
//!   instead: they wait with an event until the work is done, checked
//!   without waiting; [`Pool::free_after`] uses that path.)
//! - When the heap (as mapped now) has no room, the pool first takes back
//!   retired blocks whose work is done; then another stream's cached
//!   blocks of the same size, by recording a pooled event on the owner
//!   stream and making itself wait on it (the device orders the two, the
//!   host never waits); then every cache sheds. Only then does it map
//!   more memory, so memory that is cached but idle is reused before the
//!   pool grows.
//! - When mapping more fails, the caches are returned to the heap (waiting
//!   for their streams' events) before an out-of-memory error is
//!   returned.
//! - Pages past the mapped memory are fenced in the heap's page map, so
//!   no allocation can land there whatever limit it read; trim fences a
//!   mapping (a chunk, or a banked piece of a shared reservation; failing
//!   if any page of it is in use) before unmapping it.
//!
//! The pool runs on any [`Backend`]: the CUDA driver by default, host
//! memory in tests.

mod buffer;
mod cache;
mod graph;
mod guard;
mod live;
mod local;
mod snapshot;
mod stats;

pub use buffer::DeviceBuffer;
pub use stats::PoolStats;

use crate::backend::Backend;
use crate::driver::CudaBackend;
use crate::error::{Error, Result};
use crate::reclaim::EventPool;
use crate::share::Exported;
use crate::vmm::{Part, Region, Reservation};
use cache::{
    hinted, remember, thread_slot, with_hinted, Cache, Key, StreamCache, ALLOCS, CROSS, FREES, SAME,
};
use cudarc::driver::CudaContext;
use cuheap_core::heap::without_transit_wait;
use cuheap_core::size_class::PAGE_SIZE;
use cuheap_core::{Heap, HeapHandle, Layout, Placement, MAX_CLASS_SIZE};
use guard::Guards;
use live::LiveBits;
use local::{install, with_local, Reach, LOCAL_BYTES, LOCAL_MAX_BLOCK, LOCAL_PER_KEY};
use stats::{BAD, FLUSHES, GROWS, MOVES, RETIRES};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, TryLockError};

/// Every block is at least this aligned (like `cudaMalloc`).
pub const ALIGN: usize = 256;
/// Slots of the backing heap (host threads take them in turn, see
/// `thread_slot`).
const SLOTS: u32 = 64;
/// Blocks taken from another stream's cache at once.
const STEAL_BATCH: usize = 32;
/// A stream folds its byte counter into the pool's every this many calls,
/// which is when the peak is sampled.
const FOLD_EVERY: u64 = 64;
/// A stream's cache folds its byte counter at once when it moves further
/// than this, or than twice the call's block, from zero. A block handed to
/// another thread or stream is counted in on one cache and out on
/// another, and caches fold at different times: with the count of calls
/// alone, eight threads handing blocks of up to 4 MiB around had the
/// pool's sum, and the peak sampled from it, at 0.9 GB for 50 MiB in use.
/// A thread that allocates and frees one size in turn never reaches it
/// (one fold per call cost 13-15% at 16 MiB and 64 MiB on an H100 80 GB's
/// host, `docs/ab-pool-peak-h100.txt`). A thread's cache gains blocks only
/// from frees into it and folds when it spills some, so its count stays
/// between minus what it holds and what it held when it last folded
/// (within its bound, 2 MiB, and a block); the allocations the heap
/// serves that it counts (`Pool::alloc_on`) fold by bytes, as a stream's.
const FOLD_BYTES: i64 = 2 << 20;
/// A thread's cache reports its bytes to the pool's count of cached bytes
/// at a fold only when they moved this many or more since it last did:
/// alloc and free pairs on a thread leave that shared counter alone (it
/// is then only read), and the count is off the truth by less than this
/// much per thread's cache.
const REPORT_SLACK: usize = 64 << 10;

/// Whether a cache whose counter is `net` after a call on a block of
/// `bytes` folds it now ([`FOLD_BYTES`]).
#[inline]
fn fold_now(net: i64, bytes: i64) -> bool {
    net.unsigned_abs() > FOLD_BYTES.max(2 * bytes.abs()) as u64
}
/// An idle stream's cache ([`Pool::visit_others`]) sheds half of its
/// blocks at each look, and all of them under this many bytes.
const IDLE_FLOOR: usize = 1 << 20;
/// [`Pool::keep_headroom`] sheds a stream's cache when fewer than one page
/// in `HEADROOM` is free.
const HEADROOM: u32 = 16;

/// Pool settings.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Bytes one stream's cache may hold: past it, the largest blocks are
    /// shed (back to the heap, see the module's documentation) until half
    /// of it stays. In front of it, each thread using the stream holds up
    /// to 2 MiB of the stream's blocks (less if this limit or
    /// `cache_limit` is lower), for at most 8 streams a thread; the pool
    /// takes those back when it is short, trims, or lets go of the
    /// stream, and a thread's go to its streams when it exits.
    pub stream_cache_limit: usize,
    /// Bytes all caches may hold together, the threads' caches included
    /// (each counted to within 64 KiB). It is checked every 64 calls of a
    /// thread on a stream and every 64 calls that reach a stream's cache.
    /// A thread's cache that finds all caches past it sends half of its
    /// blocks to its stream's cache (at that free or its next one). A
    /// stream's cache that finds the streams' caches past it (a thread's
    /// cannot be reached from a stream) sheds half of its blocks, then the
    /// other streams' caches shed half each until they are back under. A
    /// thread that makes no more calls keeps what its caches hold (the
    /// bounds of `stream_cache_limit`) until the pool is short, trims,
    /// lets go of the stream, or the thread exits.
    pub cache_limit: usize,
    /// Address space reserved up front; the pool never holds more.
    pub reserve: usize,
    /// Physical memory mapped at creation.
    pub initial: usize,
    /// Mapping unit (rounded to the device's granularity, usually 2 MiB;
    /// 2 MiB by default): a growth maps what it needs in chunks, one
    /// mapping each, and a chunk is what moves, whole, when a growth finds
    /// whole free chunks between blocks in use ([`PoolStats::moves`]).
    pub chunk: usize,
    /// Bytes [`Pool::synchronize`] leaves mapped (CUDA's release threshold).
    pub release_threshold: usize,
    /// How the heap places blocks ([`Placement`] bits). The default, best
    /// fit for spans, size-class pages packed low and small class pages
    /// (one 64 KiB unit for most classes, so a thread's current page per
    /// class holds little unused memory), keeps the memory mapped close to
    /// what is in use for blocks of many sizes; it also hands a stream memory that
    /// another stream freed a moment ago sooner, with a wait for that
    /// stream's work on the device. 0 spreads threads over the heap, first
    /// fit from each one's own part, with the GPU heaps' 256-block pages.
    pub placement: u64,
    /// Create memory that other processes can map
    /// ([`Pool::export_block`]). [`Pool::new`] then makes its memory
    /// with a POSIX file descriptor handle; a pool on another backend
    /// needs one that shares ([`Backend::shares`]).
    pub shareable: bool,
    /// A graph's pool ([`PoolConfig::for_graph`], which sets this): it
    /// serves one stream, the first it sees (others are refused), with
    /// unbounded caches whatever the limits above say; short of memory
    /// it puts its cached blocks straight back into its heap, with no
    /// event (stream order alone orders their reuse), and grows. Its
    /// allocation and free paths record, wait for and query no event
    /// and never wait on the host; `free_after` is refused.
    pub graph: bool,
    /// Refuse a stream that is being captured into a CUDA graph, with an
    /// error that says to use a graph's pool: one `cuStreamIsCapturing`
    /// per allocation and free (off by default: tens of nanoseconds a
    /// call on an H100; the C API's framework pools turn it on). Without
    /// it, a block allocated and freed during a capture goes back to the
    /// pool while the graph's replays still use it.
    pub capture_check: bool,
}

impl PoolConfig {
    /// A pool that may grow to `reserve` bytes.
    pub fn new(reserve: usize) -> PoolConfig {
        PoolConfig {
            reserve,
            initial: 64 << 20,
            chunk: 2 << 20,
            release_threshold: usize::MAX,
            stream_cache_limit: 64 << 20,
            cache_limit: 256 << 20,
            placement: Placement::BEST_FIT_SPANS
                | Placement::CLASS_PAGES_LOW
                | Placement::SMALL_CLASS_PAGES,
            shareable: false,
            graph: false,
            capture_check: false,
        }
    }

    /// Settings for a pool that serves the allocations of one CUDA graph
    /// while it is captured: a graph's own pool, as PyTorch keeps one per
    /// captured graph. Allocate and free on the capturing stream through
    /// it (it serves that one stream: see [`PoolConfig::graph`]); the
    /// graph's kernels keep the addresses they were captured with, and
    /// replays reuse them. A block freed during the capture serves later
    /// allocations of the capture with no event: the pool records, waits
    /// for and queries no event and never waits on the host, which a
    /// capture forbids. [`Pool::seal`] it when the capture ends (a pool
    /// that served a capture also seals itself at its first call that
    /// finds the stream no longer in that capture, and refuses to trim):
    /// its memory then serves no one else, so no replay's memory is
    /// handed out while the graph lives; drop the pool once the graph is
    /// destroyed (after its last replay, as for any memory) and the
    /// memory goes back to the device (or to the bank of its
    /// [`Reservation`]). Map what the graph needs up front (`initial`):
    /// growth during a capture maps memory, which the driver may refuse
    /// there. A pool with [`PoolConfig::capture_check`] refuses a
    /// capturing stream. [`Pool::tie_to_graph`] gives the pool to the
    /// graph instead: it then goes when the graph, the executables made
    /// from it afterwards and their launches are gone.
    pub fn for_graph(reserve: usize, initial: usize) -> PoolConfig {
        PoolConfig {
            initial,
            graph: true,
            ..PoolConfig::new(reserve)
        }
    }
}

/// A free after several streams that waits for a capture on one of them
/// to end: the block (its live bit cleared), its key, the streams.
type Deferred<B> = (u64, Key, Vec<<B as Backend>::Stream>);

/// Host metadata of the backing heap (zeroed, 128-byte aligned).
struct HostMeta {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: only reached through `Heap` views (atomics).
unsafe impl Send for HostMeta {}
// SAFETY: as above.
unsafe impl Sync for HostMeta {}

impl HostMeta {
    fn zeroed(bytes: usize) -> Result<HostMeta> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 128)
            .map_err(|_| Error::InvalidArgument("pool metadata layout".into()))?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::InvalidArgument(
                "no host memory for the pool's metadata".into(),
            ));
        }
        Ok(HostMeta { ptr, layout })
    }
}

impl Drop for HostMeta {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `HostMeta::zeroed`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Stream-ordered device memory. Thread-safe; share it with `Arc`.
pub struct Pool<B: Backend = CudaBackend> {
    // Drop order: the region (device memory) after everything using it.
    caches: RwLock<HashMap<usize, Arc<StreamCache<B>>>>,
    live: LiveBits,
    id: u64,
    events: EventPool<B>,
    handle: HeapHandle,
    /// The heap's view of `handle`, made once: `'static` stands for the
    /// pool's life (`_meta` and `region` below), and [`Pool::heap`] lends
    /// it for `&self`'s.
    view: Heap<'static, u64>,
    _meta: HostMeta,
    region: Region<B>,
    /// Held while the mapping changes (grow, trim).
    grow_lock: Mutex<()>,
    /// Pages below the mapped end that moves left fenced and unmapped
    /// (the region's holes): not free, though no block counts them.
    hole_pages: AtomicU64,
    /// Counters of streams the pool no longer tracks (`release_stream`).
    forgotten_counts: Mutex<[u64; 4]>,
    /// Blocks waiting for their streams before they go back to the heap.
    retired: Mutex<Vec<Retired<B>>>,
    /// Frees after several streams that wait for a capture on one of them
    /// to end ([`Pool::free_after_capture`]).
    deferred: Mutex<Vec<Deferred<B>>>,
    /// What streams shed went to the heap at once; others wait for it.
    guards: Guards<B>,
    /// Bytes of the blocks in `retired`.
    retired_bytes: Own<AtomicUsize>,
    /// Bytes in all caches, the threads' included, as last reported by
    /// each (within [`REPORT_SLACK`] for a thread's).
    cached_bytes: Own<AtomicUsize>,
    /// The threads' caches' part of `cached_bytes`.
    local_cached: Arc<AtomicUsize>,
    stream_cache_limit: usize,
    cache_limit: usize,
    /// Bytes a thread's cache of one stream holds at most ([`local`]).
    local_limit: usize,
    /// [`PoolConfig::graph`].
    graph: bool,
    /// [`PoolConfig::shareable`]: other processes may map its memory at
    /// the same offsets, so it never moves.
    shareable: bool,
    /// A graph's pool after [`Pool::seal`]: it allocates no more.
    sealed: std::sync::atomic::AtomicBool,
    /// The capture a graph's pool served (its id; 0 before): the first
    /// call that finds the stream no longer in it (not capturing, or in
    /// another capture) seals the pool, and trim refuses from then on.
    capture: AtomicU64,
    /// The one stream a graph's pool serves (the first it saw).
    graph_stream: std::sync::OnceLock<usize>,
    /// Neither a graph's pool nor one with [`PoolConfig::capture_check`]:
    /// calls reach the thread's cache first, with no check of the stream.
    plain: bool,
    release_threshold: usize,
    /// Bytes in use as of the last fold of the streams' `net` counters.
    folded: Own<AtomicI64>,
    peak: Own<AtomicUsize>,
    counts: Own<[AtomicU64; 5]>,
}

/// A counter that threads update, on cache lines of its own: the fields
/// every call reads (the heap's handle, the limits) stay on lines no
/// update invalidates.
#[repr(align(128))]
#[derive(Default)]
struct Own<T>(T);

impl<T> std::ops::Deref for Own<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Freed blocks on their way back to the heap: they go once every event
/// has completed (the work of the streams that used them, up to the free).
struct Retired<B: Backend> {
    events: Vec<B::Event>,
    blocks: Vec<u64>,
    bytes: usize,
}

static POOL_IDS: AtomicU64 = AtomicU64::new(1);

impl Pool<CudaBackend> {
    /// A pool on `ctx`'s device (with shareable memory when
    /// `cfg.shareable`).
    pub fn new(ctx: &Arc<CudaContext>, cfg: PoolConfig) -> Result<Pool> {
        let backend = if cfg.shareable {
            CudaBackend::shareable(ctx)?
        } else {
            CudaBackend::new(ctx)
        };
        Pool::with_backend(backend, cfg)
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        self.backend().context()
    }
}

impl Pool<CudaBackend> {
    /// A pool on `res`'s device whose memory comes from `res` (see
    /// [`Pool::in_reservation`]).
    pub fn shared(res: &Arc<Reservation>, cfg: PoolConfig) -> Result<Pool> {
        Pool::in_reservation(res, cfg)
    }
}

impl<B: Backend> Pool<B> {
    /// A pool on `backend`, with an address range of its own.
    pub fn with_backend(backend: B, cfg: PoolConfig) -> Result<Pool<B>> {
        let chunk = Pool::<B>::chunk_of(&cfg)?;
        Pool::on_region(Region::with_backend(backend, cfg.reserve, chunk)?, cfg)
    }

    /// A pool whose address range (`cfg.reserve` bytes) is carved from
    /// `res` and whose physical memory is `res`'s: what device heaps of
    /// the same reservation gave back is mapped before new memory is
    /// created, and the memory this pool trims is banked for them (the
    /// reservation gives its bank back to the device on
    /// [`Reservation::release`]). [`PoolStats`] counts the device heaps'
    /// memory and the bank too.
    pub fn in_reservation(res: &Arc<Reservation<B>>, cfg: PoolConfig) -> Result<Pool<B>> {
        let chunk = Pool::<B>::chunk_of(&cfg)?;
        Pool::on_region(Region::within(res, Part::Pool, cfg.reserve, chunk)?, cfg)
    }

    /// Whole pages per chunk: the heap needs a page-aligned base, and a
    /// region is chunk-aligned.
    fn chunk_of(cfg: &PoolConfig) -> Result<usize> {
        if cfg.reserve < PAGE_SIZE {
            return Err(Error::InvalidArgument(format!(
                "pool reserve of {} bytes",
                cfg.reserve
            )));
        }
        cfg.chunk
            .max(1)
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or_else(|| Error::InvalidArgument(format!("pool chunk of {} bytes", cfg.chunk)))
    }

    fn on_region(region: Region<B>, cfg: PoolConfig) -> Result<Pool<B>> {
        if cfg.shareable && !region.backend().shares() {
            return Err(Error::InvalidArgument(
                "PoolConfig::shareable needs a backend that creates shareable memory \
                 (CudaBackend::shareable, or a reservation on one)"
                    .into(),
            ));
        }
        if !region.base().is_multiple_of(PAGE_SIZE as u64) {
            return Err(Error::InvalidArgument(format!(
                "reservation at {:#x} is not {PAGE_SIZE}-byte aligned",
                region.base()
            )));
        }
        let pages = (region.reserved() / PAGE_SIZE).min(u32::MAX as usize / 2) as u32;
        let layout = Layout::new(pages, SLOTS);
        // With room for the index of free runs that best fit reads.
        let meta = HostMeta::zeroed(layout.meta_bytes + layout.run_index_bytes())?;
        let handle = HeapHandle {
            meta: meta.ptr as usize as u64,
            data: region.base(),
            page_count: pages,
            slots: SLOTS,
        };
        // SAFETY: `meta` is zeroed host memory of the layout's size with
        // room for the index (16-byte aligned), `region.base()` is
        // page-aligned (checked above) and reserves `pages` pages; both
        // live as long as the pool, which holds them, and only the
        // pool's views touch the metadata. The view is lent out only for
        // the pool's borrows ([`Pool::heap`]); it computes device
        // addresses and never touches them.
        let view = unsafe { Heap::from_handle(&handle) };
        let pool = Pool {
            caches: RwLock::new(HashMap::new()),
            live: LiveBits::new(pages as usize, handle.data),
            id: POOL_IDS.fetch_add(1, Ordering::Relaxed),
            events: EventPool::default(),
            handle,
            view,
            _meta: meta,
            region,
            grow_lock: Mutex::new(()),
            hole_pages: AtomicU64::new(0),
            forgotten_counts: Mutex::new([0; 4]),
            retired: Mutex::new(Vec::new()),
            deferred: Mutex::new(Vec::new()),
            guards: Guards::new(pages as usize),
            retired_bytes: Own(AtomicUsize::new(0)),
            cached_bytes: Own(AtomicUsize::new(0)),
            local_cached: Arc::default(),
            stream_cache_limit: if cfg.graph {
                usize::MAX
            } else {
                cfg.stream_cache_limit
            },
            cache_limit: if cfg.graph {
                usize::MAX
            } else {
                cfg.cache_limit
            },
            local_limit: LOCAL_BYTES.min(cfg.stream_cache_limit).min(cfg.cache_limit),
            graph: cfg.graph,
            shareable: cfg.shareable,
            plain: !cfg.graph && !cfg.capture_check,
            graph_stream: std::sync::OnceLock::new(),
            sealed: std::sync::atomic::AtomicBool::new(false),
            capture: AtomicU64::new(0),
            release_threshold: cfg.release_threshold,
            folded: Own(AtomicI64::new(0)),
            peak: Own(AtomicUsize::new(0)),
            counts: Default::default(),
        };
        // Nothing is mapped yet: every page is fenced.
        let heap = pool.heap();
        if !heap.fence(0, pages) {
            return Err(Error::InvalidArgument("pool metadata not empty".into()));
        }
        heap.set_limit(1);
        heap.set_placement(cfg.placement);
        if cfg.placement & Placement::BEST_FIT_SPANS != 0 {
            // SAFETY: the metadata has room for the index (above), and no
            // one else has the pool yet.
            unsafe { heap.index_runs() };
        }
        pool.grow(cfg.initial.max(1))?;
        Ok(pool)
    }

    pub fn backend(&self) -> &B {
        self.region.backend()
    }

    /// The handle of the backing `cuheap-core` heap: its metadata is host
    /// memory of this pool, its data the pool's device addresses. For
    /// tools and tests that inspect the page map; valid while the pool
    /// lives. Read through it; a view that changes the page map must be a
    /// `Heap` (which uses the pool's index of free runs and its lock), not
    /// a bare `PageMap` over the words.
    pub fn heap_handle(&self) -> HeapHandle {
        self.handle
    }

    /// Address space reserved (the most the pool can map).
    pub fn reservation(&self) -> usize {
        self.region.reserved()
    }

    /// Bytes of physical memory mapped now (as [`PoolStats::reserved`],
    /// without the scan [`Pool::stats`] makes).
    pub fn mapped(&self) -> usize {
        self.region.mapped()
    }

    /// Lets kernels on device `peer` read and write the pool's blocks:
    /// every block, those mapped now and those of memory the pool maps
    /// later, as `cudaMemPoolSetAccess` does for a stream-ordered pool.
    /// Granting the pool's own device, or a device granted before, does
    /// nothing. A device that does not exist, or that the driver says has
    /// no peer path to the pool's device, is an
    /// [`Error::InvalidArgument`] that names it. A grant the driver
    /// refuses on a mapping is undone (see [`Region::grant_access`] for
    /// the case where undoing fails too).
    ///
    /// Work on `peer` orders itself after the pool's streams as any
    /// cross-device work does: with events (the pool's stream order
    /// covers the pool's device only).
    pub fn grant_access(&self, peer: i32) -> Result<()> {
        self.region.grant_access(peer)
    }

    /// Takes device `peer`'s access to the pool away, from all memory
    /// mapped now and later. A device never granted does nothing; the
    /// pool's own device is an [`Error::InvalidArgument`]. A revoke the
    /// driver refuses part-way leaves `peer` listed, with access to the
    /// mappings not yet revoked; call again to finish it.
    ///
    /// # Safety
    ///
    /// No work on `peer`, queued or running, uses the pool's memory (it
    /// would fault).
    pub unsafe fn revoke_access(&self, peer: i32) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.region.revoke_access(peer) }
    }

    /// The devices besides the pool's own granted access, in grant order.
    pub fn peers(&self) -> Vec<i32> {
        self.region.peers()
    }

    /// Whether this is a graph's pool ([`PoolConfig::for_graph`]).
    pub fn is_graph_pool(&self) -> bool {
        self.graph
    }

    /// Ends a graph's pool's allocations once its graph is captured
    /// ([`PoolConfig::for_graph`]): every later [`Pool::alloc`] and
    /// [`Pool::trim`] that would unmap is an error, so the memory the
    /// graph's replays use (blocks freed during the capture included)
    /// goes to no one else while the pool lives. Frees still work. Any
    /// other pool is an [`Error::InvalidArgument`].
    pub fn seal(&self) -> Result<()> {
        if !self.graph {
            return Err(Error::InvalidArgument(
                "seal of a pool that is not a graph's (PoolConfig::for_graph)".into(),
            ));
        }
        self.sealed.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Shares the live block at `ptr` with another process (see
    /// [`crate::share`]): the handles of the mappings under it, which
    /// [`Exported::send`] passes over a Unix socket. The other process
    /// reaches the whole of those mappings. Keep the block allocated
    /// while it is used there. A pool whose memory is not shareable
    /// ([`PoolConfig::shareable`]), or a pointer that is not a live block
    /// of this pool, is an [`Error::InvalidArgument`]; a handle the
    /// driver refuses is its [`Error::Driver`].
    pub fn export_block(&self, ptr: u64) -> Result<Exported<B>> {
        let heap = self.heap();
        match heap.block_at(ptr as usize) {
            Ok(b) if self.live.is_set(&heap, ptr, b.class.is_none()) => self.export(ptr, b.size),
            _ => Err(Error::InvalidArgument(format!(
                "export of {ptr:#x}: not a live block of this pool"
            ))),
        }
    }

    /// Shares all the memory the pool has mapped now, from its base (as
    /// [`Pool::export_block`]): the other process sees every block at
    /// the same offset from [`Imported::ptr`] as from
    /// [`Pool::base`] here.
    pub fn export_mapped(&self) -> Result<Exported<B>> {
        self.export(self.region.base(), self.region.end())
    }

    /// The pool's first address: blocks lie at offsets from it.
    pub fn base(&self) -> u64 {
        self.region.base()
    }

    fn export(&self, at: u64, len: usize) -> Result<Exported<B>> {
        // `shareable` also keeps the memory from moving (a shareable
        // backend alone does not): an importer's offsets stay right.
        if !self.shareable || !self.backend().shares() {
            return Err(Error::InvalidArgument(
                "this pool's memory cannot go to another process: create it with \
                 PoolConfig { shareable: true, .. } (CUHEAP_POOL_SHAREABLE in C)"
                    .into(),
            ));
        }
        self.region.share((at - self.region.base()) as usize, len)
    }

    #[inline]
    fn heap(&self) -> Heap<'_, u64> {
        self.view
    }

    /// A block of `size` bytes from the heap as it is now, for an attempt
    /// the pool follows with more work of its own (reclaim, steal, grow):
    /// the heap's last-resort scan does not wait for free blocks in
    /// transit between its threads ([`without_transit_wait`]), which with
    /// more threads than cores can take a time slice. The pool's last try
    /// before it reports exhaustion waits ([`Pool::last_try`]).
    fn heap_block_now(&self, size: usize, slot: u32) -> Option<u64> {
        let heap = self.heap();
        // A span's search on an indexed heap (the default) never waits: no
        // thread-local setting to change and restore. Without an index
        // it waits for claims under way (see `Heap::counts_in_map`).
        let p = match size <= MAX_CLASS_SIZE || !heap.counts_in_map() {
            true => without_transit_wait(|| heap.alloc(size, slot)),
            false => heap.alloc(size, slot),
        };
        p.ok().map(|p| p as usize as u64)
    }

    /// The heap as it is now, then growth, then [`Pool::last_try`]: the
    /// end of every search for fresh memory.
    fn heap_then_grow(&self, size: usize, slot: u32) -> Result<u64> {
        match self.heap_block_now(size, slot) {
            Some(p) => Ok(p),
            None => match self.grow_and_alloc(size, slot) {
                Some(p) => Ok(p),
                None => self.last_try(size, slot),
            },
        }
    }

    /// The last try for `size` bytes once the pool can neither reclaim nor
    /// grow: the heap's scan waits for free blocks in transit (up to its
    /// bound) before the pool reports exhaustion.
    fn last_try(&self, size: usize, slot: u32) -> Result<u64> {
        self.heap()
            .alloc(size, slot)
            .map(|p| p as usize as u64)
            .map_err(|_| self.exhausted(size))
    }

    fn bump(&self, which: usize) {
        self.counts[which].fetch_add(1, Ordering::Relaxed);
    }

    fn cache(&self, owner: &B::Stream) -> Arc<StreamCache<B>> {
        let id = B::stream_id(owner);
        if let Some(c) = hinted::<B>(self.id, id) {
            return c;
        }
        let found = self
            .caches
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned();
        let c = match found {
            Some(c) => c,
            None => {
                // A new stream: a good time to let go of dropped ones.
                self.sweep();
                self.caches
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(id)
                    .or_insert_with(|| Arc::new(StreamCache::new(owner, self.local_cached.clone())))
                    .clone()
            }
        };
        remember(self.id, Some(&c));
        c
    }

    /// Runs `f` on `owner`'s cache: the one this thread's hint lends when
    /// it names `owner` (no reference count moves), else [`Pool::cache`]'s.
    #[inline]
    fn with_cache<R>(&self, owner: &B::Stream, f: impl FnOnce(&StreamCache<B>) -> R) -> R {
        let mut f = Some(f);
        let lent = with_hinted::<B, _>(self.id, B::stream_id(owner), |c| {
            f.take().expect("called once")(c)
        });
        match lent {
            Some(r) => r,
            None => f.take().expect("not called")(&self.cache(owner)),
        }
    }

    /// Folds a stream's byte counter into the pool's and samples the peak.
    fn fold(&self, net: &mut i64) {
        let now = (self.folded.fetch_add(*net, Ordering::Relaxed) + *net).max(0) as usize;
        *net = 0;
        // A load first: most folds set no new peak, and a read-only line
        // stays shared between the threads' cores.
        if now > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// Counts one call on a stream's cache; now and then folds its bytes
    /// in use and its cached bytes into the pool's, and sheds half of
    /// the cache when the streams' caches are past the bound on all
    /// caches ([`Pool::report_and_bound`]).
    fn account(&self, sc: &StreamCache<B>, c: &mut Cache<B::Event>, which: usize, bytes: i64) {
        c.counts[which] += 1;
        c.net += bytes;
        c.touched = true;
        if (c.counts[ALLOCS] + c.counts[FREES]).is_multiple_of(FOLD_EVERY) {
            self.fold(&mut c.net);
            self.report_and_bound(sc, c);
        } else if fold_now(c.net, bytes) {
            self.fold(&mut c.net);
        }
    }

    /// Reports `sc`'s cached bytes (its lock is `c`) and, with the
    /// streams' caches past the bound on all caches
    /// ([`Pool::streams_over`]), sheds half of `sc`'s; then looks at
    /// other streams' caches ([`Pool::visit_others`]).
    fn report_and_bound(&self, sc: &StreamCache<B>, c: &mut Cache<B::Event>) {
        self.report(c);
        if self.streams_over() {
            self.shed(sc, c, c.bytes / 2);
        }
        if !self.graph {
            // Its own count of looks: the calls its threads' caches serve
            // do not reach its counts.
            c.looks += 1;
            self.visit_others(sc.id, (c.looks + sc.serial) as usize);
        }
    }

    /// What a stream's cache does for the others every [`FOLD_EVERY`]
    /// calls that reach it (`turn` counts them), so that the bound on all
    /// caches holds and idle streams' caches go back to the heap even
    /// when the streams that hold them make no call:
    /// - with the streams' caches together still past the bound on all
    ///   caches ([`Pool::streams_over`]), each other cache sheds half of
    ///   its blocks (all of them under [`IDLE_FLOOR`]), until the total
    ///   is back under;
    /// - else it looks at one other cache, the next in its turn: one that
    ///   no call reached since the last look sheds half of its blocks
    ///   (all of them under [`IDLE_FLOOR`]), so an idle stream's cache
    ///   halves at each look. With every stream looking in its turn, a
    ///   cache is looked at about once per [`FOLD_EVERY`] calls of an
    ///   average stream: a stream that makes fewer calls than that keeps
    ///   little.
    ///
    /// Each other cache's lock is only tried, never waited for (the
    /// caller holds its own), and so is the map of caches: the statistics
    /// and a snapshot hold it while they wait for each stream's lock, so
    /// a stream's lock holder queued behind a sweep waiting for the map
    /// would close a cycle. A stream being captured is passed over on a
    /// pool that checks capture (its shed would record an event into the
    /// capture).
    fn visit_others(&self, own: usize, turn: usize) {
        let caches = match self.caches.try_read() {
            Ok(c) => c,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let over = || self.streams_over();
        let visit = |other: &StreamCache<B>, idle_only: bool| {
            let Some(mut c) = other.try_lock() else {
                return;
            };
            if (idle_only && std::mem::take(&mut c.touched)) || c.bytes == 0 {
                return;
            }
            // A driver call: only for a cache about to shed.
            if !self.plain && !matches!(self.backend().is_capturing(&other.stream), Ok(false)) {
                return;
            }
            let keep = if c.bytes > IDLE_FLOOR { c.bytes / 2 } else { 0 };
            self.shed(other, &mut c, keep);
        };
        if over() {
            let others: Vec<_> = caches.values().filter(|o| o.id != own).cloned().collect();
            drop(caches);
            for other in others {
                if !over() {
                    break;
                }
                visit(&other, false);
            }
            return;
        }
        let others = caches.len() - usize::from(caches.contains_key(&own));
        let next = match others {
            0 => return,
            n => caches
                .values()
                .filter(|o| o.id != own)
                .nth(turn % n)
                .cloned(),
        };
        drop(caches);
        if let Some(other) = next {
            visit(&other, true);
        }
    }

    /// Whether the streams' caches alone are past the bound on all caches:
    /// what a stream's check sheds for (threads' caches shed their own,
    /// and an idle thread's cannot be reached from a stream).
    fn streams_over(&self) -> bool {
        let all = self.cached_bytes.load(Ordering::Relaxed);
        all.saturating_sub(self.local_cached.load(Ordering::Relaxed)) > self.cache_limit
    }

    /// Brings the pool's counts of cached bytes up to date with a thread's
    /// cache `m`.
    fn report_local(&self, m: &mut Cache<()>) {
        if m.bytes >= m.reported {
            let up = m.bytes - m.reported;
            self.local_cached.fetch_add(up, Ordering::Relaxed);
            self.cached_bytes.fetch_add(up, Ordering::Relaxed);
        } else {
            let down = m.reported - m.bytes;
            self.cached_bytes.fetch_sub(down, Ordering::Relaxed);
            self.local_cached.fetch_sub(down, Ordering::Relaxed);
        }
        m.reported = m.bytes;
    }

    /// Brings the pool's count of cached bytes up to date with `c`.
    fn report(&self, c: &mut Cache<B::Event>) {
        if c.bytes >= c.reported {
            self.cached_bytes
                .fetch_add(c.bytes - c.reported, Ordering::Relaxed);
        } else {
            self.cached_bytes
                .fetch_sub(c.reported - c.bytes, Ordering::Relaxed);
        }
        c.reported = c.bytes;
    }

    /// Gives the largest blocks of `sc`'s cache back to the heap until at
    /// most `keep` bytes stay: at once, behind the stream's guard (see
    /// [`guard`]), so its own stream reuses the memory in any size and
    /// other streams wait for its work on the device; retired (back once
    /// an event completes) if no guard can be recorded; still cached if
    /// no event can be recorded at all.
    fn shed(&self, sc: &StreamCache<B>, c: &mut Cache<B::Event>, keep: usize) {
        let blocks = c.shed(keep);
        if !blocks.is_empty() {
            let guarded = self.guards.publish(
                self.backend(),
                &self.events,
                sc.serial,
                &sc.stream,
                &sc.seen,
            );
            if let Ok(gen) = guarded {
                self.bump(RETIRES);
                let heap = self.heap();
                for &p in &blocks {
                    let (size, whole) = heap
                        .block_at(p as usize)
                        .map_or((1, false), |b| (b.size, b.class.is_none()));
                    let (from, to) = self.units_of(p, size);
                    self.guards.stamp(from, to, gen, whole);
                }
                self.guards.before_frees();
                heap.free_all(blocks.iter().map(|&p| p as usize as *mut u8), thread_slot());
                if sc.released.load(Ordering::Acquire) {
                    // Forgotten meanwhile: the guard must not outlive it
                    // as a live one.
                    self.guards.orphan(sc.serial);
                }
            } else if let Err(blocks) = self.retire(&[&sc.stream], blocks) {
                self.recache(c, blocks);
            }
        }
        self.report(c);
    }

    /// The 64 KiB units (pages of the page map) that `size` bytes at `p`
    /// cover.
    fn units_of(&self, p: u64, size: usize) -> (usize, usize) {
        let off = (p - self.handle.data) as usize;
        (off / PAGE_SIZE, (off + size.max(1)).div_ceil(PAGE_SIZE))
    }

    /// Puts blocks back into a cache (their keys from the page map).
    fn recache(&self, c: &mut Cache<B::Event>, blocks: Vec<u64>) {
        let heap = self.heap();
        for p in blocks {
            if let Ok(b) = heap.block_at(p as usize) {
                c.push(Key::of_block(&b), p);
            }
        }
    }

    /// Sends freed blocks back to the heap once the work enqueued so far
    /// on each of `streams` is done: records an event on each, then
    /// [`Pool::reclaim`] frees them when every event has completed. On an
    /// error the blocks are handed back.
    fn retire(
        &self,
        streams: &[&B::Stream],
        blocks: Vec<u64>,
    ) -> std::result::Result<(), Vec<u64>> {
        if blocks.is_empty() {
            return Ok(());
        }
        let backend = self.backend();
        let mut events = Vec::with_capacity(streams.len());
        for s in streams {
            let recorded = self
                .events
                .get(backend)
                .and_then(|e| backend.record(&e, s).map(|_| e));
            match recorded {
                Ok(e) => events.push(e),
                Err(_) => {
                    events.into_iter().for_each(|e| self.events.put(e));
                    return Err(blocks);
                }
            }
        }
        let heap = self.heap();
        let bytes = blocks
            .iter()
            .filter_map(|&p| heap.block_at(p as usize).ok())
            .map(|b| Key::of_block(&b).bytes())
            .sum();
        self.retired_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.bump(RETIRES);
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Retired {
                events,
                blocks,
                bytes,
            });
        Ok(())
    }

    /// Frees to the heap the retired blocks whose events have completed
    /// (with `wait`, waits on the host for every one first). Returns the
    /// bytes freed.
    fn reclaim(&self, wait: bool) -> Result<usize> {
        self.free_deferred();
        let backend = self.backend();
        let mut done = Vec::new();
        let mut failed = None;
        {
            let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
            let mut i = 0;
            while i < retired.len() {
                let ready = retired[i].events.iter().try_fold(true, |all, e| {
                    if wait {
                        backend.synchronize(e).map(|_| all)
                    } else {
                        backend.query(e).map(|d| all && d)
                    }
                });
                match ready {
                    Ok(true) => done.push(retired.swap_remove(i)),
                    Ok(false) => i += 1,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
        }
        let blocks = done.iter().flat_map(|r| &r.blocks);
        self.heap()
            .free_all(blocks.map(|&p| p as usize as *mut u8), thread_slot());
        let mut bytes = 0;
        for r in done {
            r.events.into_iter().for_each(|e| self.events.put(e));
            bytes += r.bytes;
        }
        self.retired_bytes.fetch_sub(bytes, Ordering::Relaxed);
        match failed {
            Some(e) => Err(e),
            None => Ok(bytes),
        }
    }

    /// Moves the blocks of `sc`'s threads' caches into it (see
    /// [`local`]); with `end`, ends those caches (their threads make new
    /// ones), as when the pool lets go of the stream.
    fn gather(&self, sc: &StreamCache<B>, end: bool) {
        sc.each_local(|l, m| {
            let mut c = sc.lock();
            sc.moves.fetch_add(1, Ordering::Release);
            if sc.take_in(m, &mut c) {
                c.dirty = true;
            }
            if fold_now(c.net, 0) {
                // Its calls may all reach the threads' caches.
                self.fold(&mut c.net);
            }
            if c.bytes > self.stream_cache_limit {
                self.shed(sc, &mut c, self.stream_cache_limit / 2);
            }
            self.report(&mut c);
            if end {
                l.kill();
            }
        });
    }

    /// Retires every stream's cache, with its threads' caches.
    fn retire_all(&self) {
        for sc in self.all_caches() {
            self.gather(&sc, false);
            let mut c = sc.lock();
            if c.bytes > 0 {
                self.shed(&sc, &mut c, 0);
            }
        }
    }

    fn all_caches(&self) -> Vec<Arc<StreamCache<B>>> {
        self.caches
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Forgets the streams that no one but the pool holds any more: their
    /// caches are retired (an event recorded on each stream before the
    /// pool lets go of it) and their counters kept.
    fn sweep(&self) {
        let gone: Vec<Arc<StreamCache<B>>> = {
            let mut caches = self.caches.write().unwrap_or_else(|p| p.into_inner());
            let ids: Vec<usize> = caches
                .iter()
                .filter(|(_, sc)| B::is_last_handle(&sc.stream))
                .map(|(&id, _)| id)
                .collect();
            ids.iter().filter_map(|id| caches.remove(id)).collect()
        };
        for sc in gone {
            sc.released.store(true, Ordering::Release);
            self.gather(&sc, true);
            let mut c = sc.lock();
            self.shed(&sc, &mut c, 0);
            if c.bytes > 0 {
                // No event could be recorded: wait on the host instead.
                drop(c);
                let flushed = self.flush(&sc);
                c = sc.lock();
                if flushed.is_err() {
                    // The blocks cannot go yet: keep the cache (and its
                    // stream) for a later sweep.
                    drop(c);
                    self.keep(sc);
                    continue;
                }
            }
            self.forget(&sc, &mut c);
        }
    }

    /// Puts back a cache that could not be forgotten.
    fn keep(&self, sc: Arc<StreamCache<B>>) {
        sc.released.store(false, Ordering::Release);
        self.caches
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(sc.id)
            .or_insert(sc);
    }

    /// Keeps a forgotten stream's counters and bytes in the pool's.
    fn forget(&self, sc: &StreamCache<B>, c: &mut Cache<B::Event>) {
        self.guards.orphan(sc.serial);
        if let Some(e) = c.event.take() {
            self.events.put(e);
        }
        self.report(c);
        self.keep_counts(c);
    }

    /// Moves a cache's counters and bytes in use into the pool's (a
    /// cache being forgotten). Under the cache's lock; harmless twice.
    fn keep_counts(&self, c: &mut Cache<B::Event>) {
        self.fold(&mut c.net);
        let mut f = self
            .forgotten_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for (t, v) in f.iter_mut().zip(c.counts) {
            *t += v;
        }
        c.counts = [0; 4];
    }

    /// Counts a call on `sc`, whose lock `c` is; a cache let go of
    /// meanwhile (whose counts `forget` may have taken already) passes
    /// them to the pool's at once.
    fn account_call(&self, sc: &StreamCache<B>, c: &mut Cache<B::Event>, which: usize, bytes: i64) {
        self.account(sc, c, which, bytes);
        if sc.released.load(Ordering::Acquire) {
            self.keep_counts(c);
        }
    }

    /// Allocates `size` bytes for use on `stream` (256-byte aligned). The
    /// pool keeps a handle to `stream` while it caches blocks freed on it;
    /// once that handle is the last one, the pool retires the cache and
    /// lets the stream go (when it next sees a new stream or runs short).
    /// Size 0 is an [`Error::InvalidArgument`]; a size the pool cannot
    /// serve is [`Error::PoolExhausted`].
    #[inline]
    pub fn alloc(&self, size: usize, stream: &B::Stream) -> Result<u64> {
        // A plain pool (no graph, no capture check) tries the thread's
        // cache first: a block found there was served before, so its size
        // is one the pool serves.
        if self.plain && (1..=LOCAL_MAX_BLOCK).contains(&size) {
            if let Some(key) = Key::of(size) {
                let hit = self.pop_local(key, stream);
                if let Reach::Done(Some(p)) = hit {
                    return self.hand_out(p, key);
                }
                return self.alloc_past_local(size, stream, Some((key, hit)));
            }
        }
        self.alloc_past_local(size, stream, None)
    }

    /// A block of `key` from this thread's cache of `stream`, counted.
    #[inline(always)]
    fn pop_local(&self, key: Key, stream: &B::Stream) -> Reach<Option<u64>> {
        with_local::<B, _>(self.id, B::stream_id(stream), |m| {
            let p = m.pop(key)?;
            m.counts[SAME] += 1;
            self.count_local(m, ALLOCS, key.bytes() as i64);
            Some(p)
        })
    }

    /// [`Pool::alloc`] with its checks, past the thread's cache (which
    /// `tried` says was tried already, with `size`'s key, and what it
    /// held).
    #[inline(never)]
    fn alloc_past_local(
        &self,
        size: usize,
        stream: &B::Stream,
        tried: Option<(Key, Reach<Option<u64>>)>,
    ) -> Result<u64> {
        if size == 0 {
            return Err(Error::InvalidArgument("allocation of 0 bytes".into()));
        }
        self.check_stream(stream)?;
        if self.graph && self.sealed.load(Ordering::Relaxed) {
            return Err(Error::InvalidArgument(
                "this pool serves a captured graph and is sealed: its memory is the graph's".into(),
            ));
        }
        let (key, tried) = match tried {
            Some((key, hit)) => (Some(key), Some(hit)),
            None => (Key::of(size), None),
        };
        let key = match key {
            Some(k) if k.bytes() <= self.region.reserved() => k,
            _ => return Err(self.exhausted(size)),
        };
        let (mut absent, mut local) = (false, false);
        if !self.graph && key.bytes() <= LOCAL_MAX_BLOCK {
            match tried.unwrap_or_else(|| self.pop_local(key, stream)) {
                Reach::Done(Some(p)) => return self.hand_out(p, key),
                Reach::Done(None) => local = true,
                Reach::Busy => {}
                Reach::Absent => absent = true,
            }
        }
        if absent {
            let own = self.cache(stream);
            install(self.id, &own);
            return self.alloc_on(&own, key, false);
        }
        self.with_cache(stream, |own| self.alloc_on(own, key, local))
    }

    /// [`Pool::alloc`] past the thread's cache, on `own`'s cache and then
    /// the heap. With `local` (the thread has a cache of `own`'s stream),
    /// a block from the heap is counted there, with no lock.
    fn alloc_on(&self, own: &StreamCache<B>, key: Key, local: bool) -> Result<u64> {
        // Its own cache first, counted under the same lock.
        if own.may_hold(key) {
            let mut c = own.lock();
            if let Some(p) = c.pop(key) {
                c.counts[SAME] += 1;
                self.account_call(own, &mut c, ALLOCS, key.bytes() as i64);
                drop(c);
                return self.hand_out(p, key);
            }
        }
        let (ptr, how) = self.find(own, key)?;
        // A block the heap just handed out is always found and not live.
        let broken = || Error::InvalidArgument(format!("pool state broken at {ptr:#x}"));
        let heap = self.heap();
        // A span key's block is a span of the key's pages (spans of one
        // page are cached under a class key), so only a class key's block
        // is looked up: the heap may have served it as a one-page span.
        let (size, span) = match key {
            Key::Span(_) => {
                debug_assert!(heap
                    .block_at(ptr as usize)
                    .is_ok_and(|b| b.class.is_none() && b.size == key.bytes()));
                (key.bytes(), true)
            }
            Key::Class(_) => {
                let b = heap.block_at(ptr as usize).map_err(|_| broken())?;
                (b.size, b.class.is_none())
            }
        };
        if how.is_none() {
            // From the heap: after the work of streams that shed it.
            let (from, to) = self.units_of(ptr, size);
            let ordered =
                self.guards
                    .order(self.backend(), own.serial, &own.stream, &own.seen, from, to);
            if let Err(e) = ordered {
                let _ = self.heap().free(ptr as usize as *mut u8, thread_slot());
                return Err(e);
            }
        }
        let marked = match how {
            // Handed out by the heap just now: no other thread has it.
            None => self.live.set_fresh(&heap, ptr, span),
            Some(_) => self.live.set(&heap, ptr, span),
        };
        if !marked {
            return Err(broken());
        }
        // Counted in the thread's cache if it has one: the stream cache's
        // lock is two locked instructions, and on x86 the first of them
        // waits for the heap's stores just made (their lines mostly miss).
        // As the locked way's `account` does, the count folds at once past
        // `FOLD_BYTES` (the sampled peak follows blocks freed elsewhere),
        // and every `FOLD_EVERY` calls the stream's cached bytes are
        // reported and the pool's bound on them checked (under the lock
        // then).
        if how.is_none() && local {
            let bytes = key.bytes() as i64;
            let counted = with_local::<B, _>(self.id, own.id, |m| {
                self.count_local(m, ALLOCS, bytes);
                if fold_now(m.net, bytes) {
                    self.fold(&mut m.net);
                }
                (m.counts[ALLOCS] + m.counts[FREES]).is_multiple_of(FOLD_EVERY)
            });
            if let Reach::Done(check) = counted {
                if check {
                    self.report_and_bound(own, &mut own.lock());
                }
                return Ok(ptr);
            }
        }
        let mut c = own.lock();
        if let Some(how) = how {
            c.counts[how] += 1;
        }
        self.account_call(own, &mut c, ALLOCS, key.bytes() as i64);
        Ok(ptr)
    }

    /// Counts a call on a thread's cache; every [`FOLD_EVERY`] calls folds
    /// its bytes in use into the pool's (and samples the peak), reports
    /// its cached bytes (past [`REPORT_SLACK`]) and checks the bound on
    /// all caches: past it, the thread's free (that one or the next)
    /// sends half of its cache to its stream's (`Cache::over`).
    #[inline]
    fn count_local(&self, m: &mut Cache<()>, which: usize, bytes: i64) {
        m.counts[which] += 1;
        m.net += bytes;
        if (m.counts[ALLOCS] + m.counts[FREES]).is_multiple_of(FOLD_EVERY) {
            self.fold(&mut m.net);
            if m.bytes.abs_diff(m.reported) >= REPORT_SLACK {
                self.report_local(m);
            }
            m.over = self.cached_bytes.load(Ordering::Relaxed) > self.cache_limit;
        }
    }

    /// Marks a block cached under `key` live and hands it out: a block
    /// under a page is marked from its address alone.
    #[inline]
    fn hand_out(&self, ptr: u64, key: Key) -> Result<u64> {
        let heap = self.heap();
        let span = self.live.is_span(&heap, ptr, key.bytes());
        match self.live.set(&heap, ptr, span) {
            true => Ok(ptr),
            false => Err(Error::InvalidArgument(format!(
                "pool state broken at {ptr:#x}"
            ))),
        }
    }

    /// A block of `key` for `own`'s stream, whose cache had none a
    /// moment ago, and how it was reused (if it was): the heap as mapped
    /// now, then retired blocks whose work is done, then its stream's
    /// threads' caches, then other streams' caches (a device-side wait),
    /// then idle caches and more memory.
    fn find(&self, own: &StreamCache<B>, key: Key) -> Result<(u64, Option<usize>)> {
        self.keep_headroom(own);
        let from_heap = || self.heap_block_now(key.bytes(), thread_slot());
        if let Some(p) = from_heap() {
            return Ok((p, None));
        }
        // A failed query is not this allocation's failure: steal or grow
        // instead.
        if self.reclaim(false).unwrap_or(0) > 0 {
            if let Some(p) = from_heap() {
                return Ok((p, None));
            }
        }
        // The stream's other threads' blocks need no wait: before another
        // stream's.
        self.gather(own, false);
        if let Some(p) = own.lock().pop(key) {
            return Ok((p, Some(SAME)));
        }
        if let Some(p) = self.steal(own, key)? {
            return Ok((p, Some(CROSS)));
        }
        Ok((self.fresh(key)?, None))
    }

    /// Frees a block on `stream`: later work on `stream` may reuse it at
    /// once; other streams only after the device finishes `stream`'s work
    /// up to now. Freeing 0 does nothing (as `cudaFree(NULL)`). Pointers
    /// this pool did not hand out (or already freed) are refused with an
    /// error and counted.
    #[inline]
    pub fn free(&self, ptr: u64, stream: &B::Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        self.check_stream(stream)?;
        let key = self.release_live(ptr)?;
        let kept = match !self.graph && key.bytes() <= LOCAL_MAX_BLOCK {
            true => with_local::<B, _>(self.id, B::stream_id(stream), |m| {
                let held = m.push(key, ptr);
                self.count_local(m, FREES, -(key.bytes() as i64));
                match m.over || held > LOCAL_PER_KEY || m.bytes > self.local_limit {
                    true => Some(self.spill_local(m, key)),
                    false => None,
                }
            }),
            false => Reach::Busy,
        };
        match kept {
            Reach::Done(None) => Ok(()),
            kept => self.free_past_local(ptr, key, stream, kept),
        }
    }

    /// The blocks a thread's cache past a bound lets go of (it just took
    /// one of `key`): half of `key`'s past [`LOCAL_PER_KEY`], the largest
    /// past its bytes' bound, and (`Cache::over`: all caches together
    /// past theirs at its last check) the largest half, for its stream's
    /// cache.
    #[cold]
    #[inline(never)]
    fn spill_local(&self, m: &mut Cache<()>, key: Key) -> Vec<(Key, u64)> {
        let over = std::mem::take(&mut m.over);
        let mut out = Vec::new();
        if m.len(key) > LOCAL_PER_KEY {
            m.take_each(key, LOCAL_PER_KEY / 2, |k, p| out.push((k, p)));
        }
        let keep = match over {
            true => m.bytes / 2,
            false => self.local_limit / 2,
        };
        if m.bytes > self.local_limit || over {
            m.shed_each(keep, |k, p| out.push((k, p)));
        }
        // Blocks leave uncounted: see `FOLD_BYTES`.
        self.fold(&mut m.net);
        self.report_local(m);
        out
    }

    /// [`Pool::free`] past the thread's cache: the blocks its cache let go
    /// of (`kept` is `Done(Some(_))`: the block freed is there) go to the
    /// stream's cache; else the block does (and with `Absent` the thread
    /// gets a cache of the stream).
    #[inline(never)]
    fn free_past_local(
        &self,
        ptr: u64,
        key: Key,
        stream: &B::Stream,
        kept: Reach<Option<Vec<(Key, u64)>>>,
    ) -> Result<()> {
        let absent = match kept {
            Reach::Done(spilled) => {
                let spilled = spilled.unwrap_or_default();
                if !spilled.is_empty() {
                    self.to_stream_cache(stream, |own, c| {
                        own.moves.fetch_add(1, Ordering::Release);
                        for (k, p) in spilled {
                            c.push(k, p);
                        }
                        self.report(c);
                        if self.streams_over() {
                            self.report_and_bound(own, c);
                        }
                    });
                }
                return Ok(());
            }
            Reach::Busy => false,
            Reach::Absent => true,
        };
        self.to_stream_cache(stream, |own, c| {
            c.push(key, ptr);
            self.account(own, c, FREES, -(key.bytes() as i64));
        });
        if absent {
            install(self.id, &self.cache(stream));
        }
        Ok(())
    }

    /// Puts blocks freed on `stream` into its cache (`put`, which counts
    /// them), then sheds if the cache is past its bound.
    fn to_stream_cache(
        &self,
        stream: &B::Stream,
        put: impl FnOnce(&StreamCache<B>, &mut Cache<B::Event>),
    ) {
        let mut put = Some(put);
        loop {
            let put_here = self.with_cache(stream, |own| {
                let mut c = own.lock();
                // A cache `release_stream` took away meanwhile is flushed
                // once, under this lock: a block pushed after that would
                // stay there.
                if own.released.load(Ordering::Acquire) {
                    return false;
                }
                if let Some(put) = put.take() {
                    put(own, &mut c);
                }
                c.dirty = true;
                if c.bytes > self.stream_cache_limit {
                    self.shed(own, &mut c, self.stream_cache_limit / 2);
                }
                true
            });
            if put_here {
                return;
            }
            remember::<B>(self.id, None);
        }
    }

    /// Frees a block used on several streams: it goes back to the heap
    /// (not to a cache) once the device has finished the work enqueued so
    /// far on every stream in `streams` (the stream it was allocated for
    /// among them), checked without a host wait. Freeing 0 does nothing;
    /// other pointers are checked as by [`Pool::free`].
    pub fn free_after(&self, ptr: u64, streams: &[&B::Stream]) -> Result<()> {
        self.free_deferred();
        self.free_after_now(ptr, streams)
    }

    /// [`Pool::free_after`], except that on a pool with
    /// [`PoolConfig::capture_check`] a free after a stream being captured
    /// into a graph (which such a pool refuses: it would record an event
    /// into the capture) waits until none of `streams` is capturing, as
    /// PyTorch's allocator defers a recorded stream's events past a
    /// capture: the block is freed at once as far as the caller goes (a
    /// second free is refused, and [`PoolStats::in_use`] no longer counts
    /// it) but stays held, counted in [`PoolStats::retired`], until a
    /// later `free_after`, a reclaim (the pool short of memory) or a
    /// [`Pool::trim`] finds the capture over, then goes as `free_after`
    /// frees it. Its events then cover the streams' work up to that
    /// point, not a graph's replays: memory a captured graph uses must
    /// live as long as the graph, as with any allocator. What
    /// [`DeviceBuffer`]'s drop calls.
    pub fn free_after_capture(&self, ptr: u64, streams: &[&B::Stream]) -> Result<()> {
        if self.plain || self.graph || ptr == 0 || streams.is_empty() {
            return self.free_after(ptr, streams);
        }
        let mut capturing = false;
        for s in streams {
            if self.backend().is_capturing(s)? {
                capturing = true;
                break;
            }
        }
        // Freed now as far as the caller goes: a foreign or freed pointer
        // is its error at once, and a second free of this one is refused.
        let key = self.release_live(ptr)?;
        if !capturing {
            // Earlier deferred frees whose captures ended go first (not
            // during a capture: each would ask the driver again).
            self.free_deferred();
            // Every stream checked above: as `free_after` goes on.
            return self.free_released_after(ptr, key, streams);
        }
        // Out of use now, and returning (as a retired block is) until the
        // capture ends: the statistics and a snapshot agree meanwhile.
        // Counted with no bound check: a shed of the stream's cache would
        // record its guard into the capture.
        self.count_free_in_capture(key, streams[0]);
        self.retired_bytes.fetch_add(key.bytes(), Ordering::Relaxed);
        let streams = streams.iter().map(|&s| s.clone()).collect();
        self.deferred
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((ptr, key, streams));
        Ok(())
    }

    /// Frees the deferred frees ([`Pool::free_after_capture`]) whose
    /// streams are no longer capturing.
    fn free_deferred(&self) {
        let waiting = {
            let mut d = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
            if d.is_empty() {
                return;
            }
            std::mem::take(&mut *d)
        };
        let backend = self.backend();
        let (ready, wait): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|(_, _, ss)| {
            ss.iter()
                .all(|s| matches!(backend.is_capturing(s), Ok(false)))
        });
        if !wait.is_empty() {
            self.deferred
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(wait);
        }
        for (ptr, key, streams) in ready {
            let streams: Vec<&B::Stream> = streams.iter().collect();
            // Counted as freed already; `retire` counts it returning again.
            self.retired_bytes.fetch_sub(key.bytes(), Ordering::Relaxed);
            // An error here is the device's (no event, no host wait): the
            // block is then never reused, as in `free_after`.
            let _ = self.retire_or_wait(ptr, &streams);
        }
    }

    /// [`Pool::free_after`] with no deferred frees first.
    fn free_after_now(&self, ptr: u64, streams: &[&B::Stream]) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        if streams.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "free of {ptr:#x} after no stream"
            )));
        }
        if self.graph {
            return Err(Error::InvalidArgument(
                "free_after in a graph's pool: it would record an event; free on its stream".into(),
            ));
        }
        for s in streams {
            self.check_stream(s)?;
        }
        let key = self.release_live(ptr)?;
        self.free_released_after(ptr, key, streams)
    }

    /// The rest of [`Pool::free_after_now`] once `ptr`'s live bit is
    /// cleared (`key` its key; `streams` not empty).
    fn free_released_after(&self, ptr: u64, key: Key, streams: &[&B::Stream]) -> Result<()> {
        self.count_free(key, streams[0]);
        self.retire_or_wait(ptr, streams)
    }

    /// Counts the free of a block of `key` on `stream`'s cache.
    fn count_free(&self, key: Key, stream: &B::Stream) {
        let own = self.cache(stream);
        let mut c = own.lock();
        self.account_call(&own, &mut c, FREES, -(key.bytes() as i64));
    }

    /// Counts the free of a block of `key` on `stream`'s cache, which is
    /// being captured: as [`Pool::account_call`] does, with no bound
    /// check (its shed would record an event into the capture).
    fn count_free_in_capture(&self, key: Key, stream: &B::Stream) {
        let own = self.cache(stream);
        let mut c = own.lock();
        c.counts[FREES] += 1;
        c.net -= key.bytes() as i64;
        self.fold(&mut c.net);
        if own.released.load(Ordering::Acquire) {
            self.keep_counts(&mut c);
        }
    }

    /// Retires the freed (and counted) block at `ptr` until the work
    /// enqueued so far on each of `streams` is done.
    fn retire_or_wait(&self, ptr: u64, streams: &[&B::Stream]) -> Result<()> {
        if self.retire(streams, vec![ptr]).is_err() {
            // No event could be recorded: wait for the streams on the host.
            // If that fails too the block is not known to be idle and is
            // never reused (the device is in an error state).
            for s in streams {
                self.wait_on_host(s)?;
            }
            let _ = self.heap().free(ptr as usize as *mut u8, thread_slot());
        }
        Ok(())
    }

    /// Bytes of the block at `ptr` (its class or span size, at least what
    /// was asked for). A pointer that is not a live block's start
    /// (freed, cached, interior, foreign) is an error.
    pub fn size_of(&self, ptr: u64) -> Result<usize> {
        let heap = self.heap();
        match heap.block_at(ptr as usize) {
            Ok(b) if self.live.is_set(&heap, ptr, b.class.is_none()) => Ok(b.size),
            _ => Err(Error::InvalidArgument(format!(
                "{ptr:#x} is not a live block of this pool"
            ))),
        }
    }

    /// A graph's pool serves the one stream it saw first; another pool
    /// with [`PoolConfig::capture_check`] refuses a stream being captured
    /// into a graph (its memory would be handed out again while the graph
    /// still uses it).
    #[inline(always)]
    fn check_stream(&self, stream: &B::Stream) -> Result<()> {
        match self.plain {
            true => Ok(()),
            false => self.check_stream_now(stream),
        }
    }

    /// [`Pool::check_stream`] for a pool that checks streams.
    #[inline(never)]
    fn check_stream_now(&self, stream: &B::Stream) -> Result<()> {
        let id = B::stream_id(stream);
        if self.graph {
            let pinned = *self.graph_stream.get_or_init(|| id);
            if pinned != id {
                return Err(Error::InvalidArgument(format!(
                    "a graph's pool serves one stream (the capture's, {pinned:#x}), not {id:#x}"
                )));
            }
            // A capture that ended seals the pool even if no one called
            // `seal`: what it would hand out next, the graph's replays use
            // (and so would a second capture's kernels).
            let now = self.backend().capture_id(stream)?.unwrap_or(0);
            let served =
                match self
                    .capture
                    .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => now,
                    Err(first) => first,
                };
            if served != 0 && served != now {
                self.sealed.store(true, Ordering::Relaxed);
            }
        } else if self.backend().is_capturing(stream)? {
            return Err(Error::InvalidArgument(format!(
                "stream {id:#x} is being captured into a CUDA graph: allocate and free on it \
                 through a graph's pool (PoolConfig::for_graph), whose memory stays the graph's"
            )));
        }
        Ok(())
    }

    /// Clears a block's live bit; the key it was served by.
    #[inline]
    fn release_live(&self, ptr: u64) -> Result<Key> {
        let heap = self.heap();
        match heap.block_at(ptr as usize) {
            Ok(b) if self.live.clear(&heap, ptr, b.class.is_none()) => Ok(Key::of_block(&b)),
            _ => {
                self.bump(BAD);
                Err(Error::InvalidArgument(format!(
                    "free of {ptr:#x}: not a live block of this pool"
                )))
            }
        }
    }

    /// Takes blocks of `key` from another stream's cache: records (or
    /// reuses) an event on that stream and makes ours wait for it.
    fn steal(&self, own: &StreamCache<B>, key: Key) -> Result<Option<u64>> {
        let others: Vec<Arc<StreamCache<B>>> = self
            .caches
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|c| c.id != own.id)
            .cloned()
            .collect();
        let backend = self.backend();
        for other in others {
            // Its threads' blocks too: the pool is short.
            self.gather(&other, false);
            let mut c = other.lock();
            let taken = c.take(key, STEAL_BATCH);
            let Some((&first, rest)) = taken.split_first() else {
                continue;
            };
            self.report(&mut c);
            if c.dirty || c.event.is_none() {
                let e = match c.event.take().map_or_else(|| self.events.get(backend), Ok) {
                    Ok(e) => e,
                    Err(err) => {
                        c.extend(key, taken);
                        self.report(&mut c);
                        return Err(err);
                    }
                };
                let recorded = backend.record(&e, &other.stream);
                c.event = Some(e);
                if let Err(err) = recorded {
                    c.extend(key, taken);
                    self.report(&mut c);
                    return Err(err);
                }
                c.dirty = false;
            }
            // Work already done needs no wait.
            if let Some(e) = c
                .event
                .as_ref()
                .filter(|e| !backend.query(e).unwrap_or(false))
            {
                if let Err(err) = backend.wait(&own.stream, e) {
                    c.extend(key, taken);
                    self.report(&mut c);
                    return Err(err);
                }
            }
            drop(c);
            if !rest.is_empty() {
                let mut mine = own.lock();
                if own.released.load(Ordering::Acquire) {
                    // Swept or released meanwhile: the cache is forgotten,
                    // so the blocks go back through its stream's work (which
                    // now includes the wait on `other`).
                    if let Err(blocks) = self.retire(&[&own.stream], rest.to_vec()) {
                        mine.extend(key, blocks);
                    }
                } else {
                    mine.extend(key, rest.to_vec());
                    // An event recorded on our stream before this point does
                    // not cover the wait just enqueued: the next steal from
                    // us must record a new one.
                    mine.dirty = true;
                    self.report(&mut mine);
                }
            }
            return Ok(Some(first));
        }
        Ok(None)
    }

    /// A block from the heap: retire the idle caches, grow the mapping,
    /// then return the caches to the heap, before giving up.
    fn fresh(&self, key: Key) -> Result<u64> {
        let (size, slot) = (key.bytes(), thread_slot());
        if let Some(p) = self.heap_block_now(size, slot) {
            return Ok(p);
        }
        if self.graph {
            return self.fresh_for_graph(size, slot);
        }
        // Cached memory goes back to the heap first (behind the guards of
        // the streams that shed it).
        self.sweep();
        self.retire_all();
        self.reclaim(false)?;
        if let Some(p) = self.heap_block_now(size, slot) {
            return Ok(p);
        }
        if let Some(p) = self.grow_and_alloc(size, slot) {
            return Ok(p);
        }
        // Under pressure: every cache back to the heap, then one more try
        // (growing again: a trim may have taken memory meanwhile).
        self.flush_all()?;
        self.reclaim(true)?;
        self.heap().scavenge();
        self.heap_then_grow(size, slot)
    }

    /// Grows the mapping and allocates, holding `grow_lock` throughout so
    /// that no trim unmaps the new memory first. Under the lock, the
    /// caches go back to the heap once more first (not in a graph's
    /// pool). A span first gets only
    /// what the free pages at the end of the mapping lack (at least a
    /// chunk); if other threads took those pages meanwhile, the
    /// mapping grows again by the whole size. A class block gets its size
    /// plus 16 pages, for the page its class needs. For a span, whole free
    /// chunks between blocks in use move to the end first
    /// ([`Pool::move_free_mappings`]), so the growth takes that much less
    /// new memory.
    fn grow_and_alloc(&self, size: usize, slot: u32) -> Option<u64> {
        let _g = self.grow_lock.lock().unwrap_or_else(|p| p.into_inner());
        let heap = self.heap();
        if let Some(p) = self.heap_block_now(size, slot) {
            return Some(p); // another thread grew it
        }
        if !self.graph {
            // What the caches gathered since this thread gave them back
            // (in `fresh`, or since the last growth), before the wait for
            // this lock: other threads' frees meanwhile. Eight threads
            // handing blocks to each other with no GPU work between calls
            // mapped 2.1-2.3x their peak in use without this, 1.65-1.75x
            // with it (`docs/pool-grow-retires-caches-h200.txt`).
            self.retire_all();
            let _ = self.reclaim(false);
            if let Some(p) = self.heap_block_now(size, slot) {
                return Some(p);
            }
        }
        for whole in [false, true] {
            if whole && self.region.end() >= self.region.reserved() {
                // The range is used up: what moved away maps back.
                self.fill_holes();
                if let Some(p) = self.heap_block_now(size, slot) {
                    return Some(p);
                }
            }
            let need = if size <= MAX_CLASS_SIZE {
                size + 16 * PAGE_SIZE
            } else if whole {
                size
            } else {
                size.saturating_sub(heap.free_tail() as usize * PAGE_SIZE)
            };
            let need = need.max(self.region.chunk());
            if size > MAX_CLASS_SIZE {
                self.move_free_mappings(need);
            }
            let end = self.region.end();
            // A partial growth still opens what it mapped: try the heap.
            let _ = self.grow(end + need);
            if let Some(p) = self.heap_block_now(size, slot) {
                return Some(p);
            }
        }
        None
    }

    /// Moves whole free mappings below the end, up to `need` bytes, to
    /// the end for the growth that follows, so that a span whose size no
    /// free run has takes no new memory while whole mappings lie free
    /// between blocks in use. Each is fenced (no allocation can take its
    /// pages), the work of the streams that shed blocks into the heap is
    /// awaited on the host (the guards), and it is unmapped: its range
    /// stays fenced, a hole, and its memory is mapped again at the end
    /// (`Region::punch`). Nothing moves in a pool whose memory other
    /// processes may map (their offsets would change), in a graph's pool,
    /// or once the range's end would pass the middle of the reservation
    /// (growth goes on from there to the reservation's end, and then fills
    /// the holes: [`Pool::fill_holes`]). The free pages at the end, which
    /// the growth counts on, never move. Returns the bytes moved. Callers
    /// hold `grow_lock`.
    fn move_free_mappings(&self, need: usize) -> usize {
        if self.graph || self.shareable {
            return 0;
        }
        let heap = self.heap();
        let mappings = self.region.mappings();
        let Some(&(last, _)) = mappings.last() else {
            return 0;
        };
        let page = |bytes: usize| (bytes / PAGE_SIZE) as u32;
        let tail = (heap.limit() - heap.free_tail()) as usize * PAGE_SIZE;
        let mut fenced = Vec::new();
        let mut bytes = 0;
        for &(at, len) in &mappings {
            if at == last || at + len > tail || bytes >= need {
                break;
            }
            if heap.fence(page(at), page(at + len)) {
                fenced.push((at, len));
                bytes += len;
            }
        }
        let unfence = |fenced: &[(usize, usize)]| {
            for &(at, len) in fenced {
                // SAFETY: fenced above by this call, under `grow_lock`.
                unsafe { heap.unfence(page(at), page(at + len)) };
            }
        };
        let room = self.region.reserved() / 2;
        if fenced.is_empty()
            || self.region.end() + bytes.max(need) > room
            || self.guards.synchronize_all(self.backend()).is_err()
        {
            unfence(&fenced);
            return 0;
        }
        let mut moved = 0;
        for &(at, len) in &fenced {
            // SAFETY: every page of the mapping is fenced (none in use,
            // none can be handed out) and stays so; the guards' work is
            // done, and blocks freed into the heap otherwise had their
            // streams' work done first.
            match unsafe { self.region.punch(at) } {
                Ok(_) => moved += len,
                Err(_) => unfence(&[(at, len)]),
            }
        }
        if moved > 0 {
            self.bump(MOVES);
        }
        self.count_holes();
        moved
    }

    /// Counts the region's holes for [`Pool::keep_headroom`]. Callers hold
    /// `grow_lock`.
    fn count_holes(&self) {
        let bytes: usize = self.region.holes().iter().map(|&(_, len)| len).sum();
        self.hole_pages
            .store((bytes / PAGE_SIZE) as u64, Ordering::Relaxed);
    }

    /// Maps memory into every hole again and opens their pages: the
    /// range's end has reached the reservation's, so the address space
    /// that moves left behind serves again. Callers hold `grow_lock`.
    fn fill_holes(&self) {
        let heap = self.heap();
        let (filled, _) = self.region.fill_holes();
        for (at, len) in filled {
            let (from, to) = ((at / PAGE_SIZE) as u32, ((at + len) / PAGE_SIZE) as u32);
            // SAFETY: a hole's pages were fenced by `move_free_mappings`
            // and stayed so (nothing else fences or unfences pages below
            // the end); the caller holds `grow_lock`.
            unsafe { heap.unfence(from, to) };
        }
        self.count_holes();
    }

    /// Maps memory until the mapped prefix reaches `bytes` (or the
    /// reservation's end), then opens the new pages: unfence, then raise
    /// the limit. What was mapped before a failure is opened too. Callers
    /// hold `grow_lock` or own the pool exclusively.
    fn grow(&self, bytes: usize) -> Result<()> {
        let before = (self.region.end() / PAGE_SIZE) as u32;
        let grown = self.region.grow_to(bytes.min(self.region.reserved()));
        let after = (self.region.end() / PAGE_SIZE) as u32;
        if after > before {
            let heap = self.heap();
            // SAFETY: pages past the mapped end are fenced by this pool
            // alone (at creation and by trim), and the caller holds
            // `grow_lock`, so no trim fences them meanwhile.
            unsafe { heap.unfence(before, after) };
            heap.set_limit(after);
            self.bump(GROWS);
        }
        grown.map(|_| ())
    }

    /// When fewer than 1/[`HEADROOM`] of the heap's pages are free, sheds
    /// half of `own`'s cache into the heap (behind its stream's guard, as
    /// a cache past its bound does), if it holds a chunk or more. Free
    /// means not taken by a class page or a span and not in a hole; a
    /// class page with free blocks counts as taken, so a heap whose
    /// pages are partly used may shed though it could still serve some
    /// sizes. A heap
    /// mapped to its last pages finds a page only by scavenging every
    /// slot's lists, for each page it needs, while the caches hold the
    /// free blocks, and a pool that keeps finding one that way never
    /// grows: on 16 cores, eight threads on a fresh pool of 64 MiB made
    /// 14-25 M pairs/s, on one of 256 MiB 41
    /// (`docs/threads-model-16-cores.txt`). Two atomic loads when the heap
    /// has room. Not in a graph's pool, whose blocks serve its capture.
    fn keep_headroom(&self, own: &StreamCache<B>) {
        if self.graph {
            return;
        }
        let heap = self.heap();
        let limit = heap.limit();
        let taken = heap.counters().units_taken.load(Ordering::Relaxed)
            + self.hole_pages.load(Ordering::Relaxed);
        if (limit as u64).saturating_sub(taken) >= (limit / HEADROOM) as u64 {
            return;
        }
        let mut c = own.lock();
        if c.bytes >= self.region.chunk() {
            let keep = c.bytes / 2;
            self.shed(own, &mut c, keep);
        }
    }

    fn exhausted(&self, requested: usize) -> Error {
        let (s, largest) = self.stats_and_largest();
        Error::PoolExhausted {
            requested,
            reserved: s.reserved,
            in_use: s.in_use,
            cached: s.cached(),
            largest_free: largest,
            limit: self.region.reserved(),
        }
    }

    /// [`Pool::fresh`] for a graph's pool: cached blocks straight back
    /// into the heap (stream order alone orders their reuse), then
    /// growth; no event, no host wait.
    fn fresh_for_graph(&self, size: usize, slot: u32) -> Result<u64> {
        let heap = self.heap();
        for sc in self.all_caches() {
            let blocks = self.take_cached(&sc);
            heap.free_all(blocks.iter().map(|&p| p as usize as *mut u8), slot);
        }
        heap.scavenge();
        self.heap_then_grow(size, slot)
    }

    /// Returns every stream's cache to the heap, waiting (on the host) for
    /// each stream's work up to now. Used under memory pressure, by
    /// [`Pool::trim`] and [`Pool::release_stream`].
    fn flush_all(&self) -> Result<()> {
        for sc in self.all_caches() {
            self.flush(&sc)?;
        }
        Ok(())
    }

    /// Takes every block of `sc`'s cache (none: the cache is left as it
    /// is); the blocks are the caller's to free.
    fn take_cached(&self, sc: &StreamCache<B>) -> Vec<u64> {
        let mut c = sc.lock();
        if c.bytes == 0 {
            return Vec::new();
        }
        c.dirty = false;
        let blocks = c.drain();
        self.report(&mut c);
        blocks
    }

    fn flush(&self, sc: &StreamCache<B>) -> Result<()> {
        // A stream being let go of ends its threads' caches too.
        self.gather(sc, sc.released.load(Ordering::Acquire));
        let blocks = self.take_cached(sc);
        if blocks.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.wait_on_host(&sc.stream) {
            // Not known to be idle: the blocks stay cached on their stream,
            // and the next steal must record a new event.
            let mut c = sc.lock();
            c.dirty = true;
            self.recache(&mut c, blocks);
            self.report(&mut c);
            return Err(e);
        }
        self.heap()
            .free_all(blocks.iter().map(|&p| p as usize as *mut u8), thread_slot());
        self.bump(FLUSHES);
        Ok(())
    }

    /// Blocks the host until the work enqueued on `stream` so far is done
    /// (a pooled event recorded there).
    fn wait_on_host(&self, stream: &B::Stream) -> Result<()> {
        let backend = self.backend();
        let e = self.events.get(backend)?;
        let waited = backend
            .record(&e, stream)
            .and_then(|_| backend.synchronize(&e));
        self.events.put(e);
        waited
    }

    /// Waits for `stream`, returns its cache to the heap and forgets the
    /// stream now. Not needed before dropping a stream: the pool lets go
    /// of streams it alone holds by itself, without a host wait.
    pub fn release_stream(&self, stream: &B::Stream) -> Result<()> {
        let id = B::stream_id(stream);
        let sc = self
            .caches
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if let Some(sc) = sc {
            sc.released.store(true, Ordering::Release);
            if let Err(e) = self.flush(&sc) {
                self.keep(sc);
                return Err(e);
            }
            self.forget(&sc, &mut sc.lock());
        }
        remember::<B>(self.id, None);
        Ok(())
    }

    /// Waits for every stream, lets go of the streams no one else holds
    /// any more, frees what waited for a capture to end
    /// ([`Pool::free_after_capture`]), returns all caches to the heap and
    /// unmaps physical memory from the end, a mapping at a time, until at most
    /// `keep` bytes stay mapped (at least the first mapping). Memory in
    /// use is never unmapped: each mapping is first fenced in the page
    /// map, which fails if any of its pages is in use, so no allocation
    /// can take a page of it while it goes. The memory goes back to the
    /// device, or, in a shared [`Reservation`] ([`Pool::in_reservation`]),
    /// to its bank. Returns the bytes mapped afterwards.
    ///
    /// # Time complexity
    ///
    /// O(pages of the chunks unmapped + cached blocks).
    ///
    /// A sealed graph's pool ([`Pool::seal`]) refuses: the memory its
    /// graph's replays use is all freed, as the capture left it, and
    /// must stay mapped while the graph lives (drop the pool after the
    /// graph instead).
    pub fn trim(&self, keep: usize) -> Result<usize> {
        // A pool that served a capture refuses as a sealed one: its
        // capture's blocks are the graph's, freed or not, even if no call
        // has sealed it since the capture ended (and while it runs).
        if self.graph
            && (self.sealed.load(Ordering::Relaxed) || self.capture.load(Ordering::Relaxed) != 0)
        {
            let mapped = self.region.mapped();
            if keep >= mapped {
                return Ok(mapped); // nothing to unmap
            }
            return Err(Error::InvalidArgument(
                "trim of a sealed graph's pool: its graph's replays use the memory; drop the pool \
                 after the graph to give it back"
                    .into(),
            ));
        }
        // Streams dropped since the pool last looked go first, with
        // their caches.
        self.sweep();
        self.flush_all()?;
        self.reclaim(true)?;
        let heap = self.heap();
        heap.scavenge();
        let _g = self.grow_lock.lock().unwrap_or_else(|p| p.into_inner());
        let chunk = self.region.chunk();
        let mut mapped = self.region.mapped();
        // Whole mappings from the end (a chunk each, or a piece of the
        // bank), the first one kept.
        while let Some((start, len)) = self.region.last_extent() {
            if mapped <= keep.max(chunk) || start == 0 {
                break;
            }
            let (from, to) = (
                (start / PAGE_SIZE) as u32,
                ((start + len) / PAGE_SIZE) as u32,
            );
            if !heap.fence(from, to) {
                break; // a page of the last mapping is in use
            }
            // Blocks shed into the mapping went back to the heap with no
            // wait: their streams' work must be done before it goes.
            if let Err(e) = self.guards.synchronize_all(self.backend()) {
                // SAFETY: fenced just above by this trim, under `grow_lock`.
                unsafe { heap.unfence(from, to) };
                return Err(e);
            }
            // SAFETY: every page of the mapping is fenced: none is in use
            // and none can be handed out (the invariant `fence` gives).
            match unsafe { self.region.shrink_to(start) } {
                Ok(m) => mapped = m,
                Err(e) => {
                    // SAFETY: fenced just above by this trim, under `grow_lock`.
                    unsafe { heap.unfence(from, to) };
                    return Err(e);
                }
            }
            // Holes before the mapping went with it: their pages stay
            // fenced, past the end.
            heap.set_limit((self.region.end() / PAGE_SIZE) as u32);
        }
        self.count_holes();
        Ok(mapped)
    }

    /// CUDA's release-threshold behaviour: trim to the configured threshold.
    pub fn synchronize(&self) -> Result<usize> {
        self.trim(self.release_threshold)
    }
}

impl<B: Backend> Drop for Pool<B> {
    fn drop(&mut self) {
        // Threads' caches of this pool end (their threads drop them on
        // their next call to any pool, or when they exit).
        for sc in self.all_caches() {
            sc.each_local(|l, m| {
                m.drain();
                l.kill();
            });
        }
        // Work still queued may use pool memory: wait before unmapping.
        let _ = self.backend().synchronize_device();
    }
}

//! The host pool: stream-ordered device memory.
//!
//! - Blocks come from a `cuheap-core` heap whose metadata lives in host
//!   memory and whose pages are device addresses in a [`VmmRegion`]: size
//!   classes up to 64 KiB, spans of whole 64 KiB pages above (the page map
//!   coalesces free neighbours), no list scans.
//! - Each stream has a cache of blocks freed on it, by size: reuse on the
//!   same stream is immediate, because stream order already puts the new
//!   user after the old one.
//! - When the heap (as mapped now) has no room, another stream takes
//!   cached blocks by recording a pooled event on the owner stream and
//!   making itself wait on it (`cuStreamWaitEvent`): the GPU orders the
//!   two, the host never waits. Only then does the pool map more memory.
//! - When the heap is full the region maps more memory; when that fails,
//!   the caches are returned to the heap (waiting for their streams'
//!   events) before an out-of-memory error is returned.

use crate::error::{Error, Result};
use crate::reclaim::{Event, EventPool};
use crate::vmm::VmmRegion;
use cudarc::driver::{sys, CudaContext, CudaStream};
use cuheap_core::size_class::{class_of, class_size, PAGE_SIZE};
use cuheap_core::{BlockInfo, Heap, HeapHandle, Layout, MAX_CLASS_SIZE};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Every block is at least this aligned (like `cudaMalloc`).
pub const ALIGN: usize = 256;
/// Slots of the backing heap (host threads hash onto them).
const SLOTS: u32 = 64;
/// Blocks taken from another stream's cache at once.
const STEAL_BATCH: usize = 32;

/// Pool settings.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Address space reserved up front; the pool never holds more.
    pub reserve: usize,
    /// Physical memory mapped at creation.
    pub initial: usize,
    /// Mapping unit (rounded to the device's granularity, usually 2 MiB).
    pub chunk: usize,
    /// Bytes [`Pool::synchronize`] leaves mapped (CUDA's release threshold).
    pub release_threshold: usize,
    /// Log every alloc and free to this CSV file (`thread,time_ns,action,
    /// ptr,size,stream`), for `cuheap replay`.
    pub log: Option<std::path::PathBuf>,
}

impl PoolConfig {
    /// A pool that may grow to `reserve` bytes.
    pub fn new(reserve: usize) -> PoolConfig {
        PoolConfig {
            reserve,
            initial: 64 << 20,
            chunk: 32 << 20,
            release_threshold: usize::MAX,
            log: None,
        }
    }
}

/// A snapshot of a pool.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolStats {
    /// Bytes of physical memory mapped.
    pub reserved: usize,
    /// Bytes handed out and not freed (block sizes).
    pub in_use: usize,
    /// Largest `in_use` seen; sampled every 64 calls per stream.
    pub peak_in_use: usize,
    /// Bytes freed and cached, per stream (handle as an integer).
    pub cached_per_stream: Vec<(usize, usize)>,
    /// 1 - largest free run / free bytes of the mapped heap (0 = none).
    pub fragmentation: f64,
    pub allocs: u64,
    pub frees: u64,
    /// Blocks reused on the stream that freed them.
    pub same_stream_reuse: u64,
    /// Blocks taken from another stream's cache (with an event wait).
    pub cross_stream_reuse: u64,
    pub grows: u64,
    pub flushes: u64,
    pub bad_frees: u64,
}

/// Live bits: one per block a page can hold at [`ALIGN`] (256 per 64 KiB
/// unit; larger pages hold at most 256 blocks too), indexed by the page
/// [`Heap::block_at`] returns. A block's bit is set while a caller holds
/// it, so a second free finds it clear: no shared table on the call path,
/// and blocks of one page (mostly one thread's) share one cache line.
struct LiveBits(Vec<AtomicU64>);

const LIVE_WORDS_PER_PAGE: usize = 4;

impl LiveBits {
    fn new(pages: usize) -> LiveBits {
        LiveBits(
            (0..pages * LIVE_WORDS_PER_PAGE)
                .map(|_| AtomicU64::new(0))
                .collect(),
        )
    }

    fn at(&self, b: &BlockInfo) -> (&AtomicU64, u64) {
        let i = b.index as usize;
        debug_assert!(
            i < 64 * LIVE_WORDS_PER_PAGE,
            "pool classes hold at most 256 blocks a page"
        );
        (
            &self.0[b.page as usize * LIVE_WORDS_PER_PAGE + i / 64],
            1 << (i % 64),
        )
    }

    /// Marks a block live; false if it already was.
    fn set(&self, b: &BlockInfo) -> bool {
        let (w, m) = self.at(b);
        w.fetch_or(m, Ordering::AcqRel) & m == 0
    }

    /// Marks a block free; false if it was not live.
    fn clear(&self, b: &BlockInfo) -> bool {
        let (w, m) = self.at(b);
        w.fetch_and(!m, Ordering::AcqRel) & m != 0
    }
}

/// Where a block's size comes from: a class, or a span of pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Class(u32),
    Span(u32),
}

impl Key {
    fn of(size: usize) -> Key {
        let size = size.div_ceil(ALIGN) * ALIGN;
        match class_of(size) {
            Some(c) => Key::Class(c),
            None => Key::Span(size.div_ceil(PAGE_SIZE) as u32),
        }
    }

    fn bytes(self) -> usize {
        match self {
            Key::Class(c) => class_size(c) as usize,
            Key::Span(p) => p as usize * PAGE_SIZE,
        }
    }
}

/// Blocks freed on one stream, by size, and that stream's counters (kept
/// here, under the lock the call holds anyway, so that threads with their
/// own streams share no counter).
#[derive(Default)]
struct Cache {
    classes: Vec<Vec<u64>>,
    spans: HashMap<u32, Vec<u64>>,
    bytes: usize,
    /// Blocks were freed since `event` was last recorded.
    dirty: bool,
    event: Option<Event>,
    /// Bytes allocated minus bytes freed through this stream.
    net: i64,
    counts: [u64; 4],
}

impl Cache {
    fn list(&mut self, key: Key) -> &mut Vec<u64> {
        match key {
            Key::Class(c) => {
                if self.classes.is_empty() {
                    self.classes = (0..cuheap_core::CLASS_COUNT).map(|_| Vec::new()).collect();
                }
                &mut self.classes[c as usize]
            }
            Key::Span(p) => self.spans.entry(p).or_default(),
        }
    }

    fn drain(&mut self) -> Vec<u64> {
        let mut all: Vec<u64> = self.classes.iter_mut().flat_map(std::mem::take).collect();
        all.extend(self.spans.drain().flat_map(|(_, v)| v));
        self.bytes = 0;
        all
    }
}

struct StreamCache {
    /// Held so the stream outlives the blocks cached for it: an event is
    /// recorded on it whenever another stream takes them.
    _keep_alive: Arc<CudaStream>,
    stream: sys::CUstream,
    cache: Mutex<Cache>,
    /// Set by `release_stream`: threads holding this cache must look again.
    released: std::sync::atomic::AtomicBool,
}

// SAFETY: the stream handle is only passed to the driver; the cache is behind a mutex.
unsafe impl Send for StreamCache {}
// SAFETY: as above.
unsafe impl Sync for StreamCache {}

impl StreamCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Host metadata of the backing heap (zeroed, 128-byte aligned).
struct HostMeta {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: only reached through `Heap` views (atomics).
unsafe impl Send for HostMeta {}
// SAFETY: as above.
unsafe impl Sync for HostMeta {}

impl Drop for HostMeta {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `Pool::new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Stream-ordered device memory. Thread-safe; share it with `Arc`.
pub struct Pool {
    // Drop order: the region (device memory) after everything using it.
    caches: RwLock<HashMap<usize, Arc<StreamCache>>>,
    live: LiveBits,
    id: u64,
    events: EventPool,
    handle: HeapHandle,
    _meta: HostMeta,
    region: VmmRegion,
    ctx: Arc<CudaContext>,
    grow_lock: Mutex<()>,
    /// Counters of streams the pool no longer tracks (`release_stream`).
    forgotten_counts: Mutex<[u64; 4]>,
    release_threshold: usize,
    log: Option<Mutex<EventLog>>,
    /// Bytes in use as of the last fold of the streams' `net` counters.
    folded: AtomicI64,
    peak: AtomicUsize,
    counts: [AtomicU64; 3],
}

// Per-stream counters (`Cache::counts`).
const ALLOCS: usize = 0;
const FREES: usize = 1;
const SAME: usize = 2;
const CROSS: usize = 3;
// Pool-wide counters (`Pool::counts`): rare events.
const GROWS: usize = 0;
const FLUSHES: usize = 1;
const BAD: usize = 2;
/// A stream folds its byte counter into the pool's every this many calls,
/// which is when the peak is sampled.
const FOLD_EVERY: u64 = 64;

static POOL_IDS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The last (pool, stream) this thread used and its cache: skips the
    /// pool's stream table on repeated calls.
    static LAST: std::cell::RefCell<Option<(u64, usize, Arc<StreamCache>)>> = const { std::cell::RefCell::new(None) };
}

thread_local! {
    /// This thread's slot in the backing heap: a hash of its id, computed once.
    static SLOT: u32 = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::thread::current().id().hash(&mut h);
        h.finish() as u32
    };
}

fn thread_slot() -> u32 {
    SLOT.with(|s| *s)
}

impl Pool {
    /// A pool on `ctx`'s device.
    pub fn new(ctx: &Arc<CudaContext>, cfg: PoolConfig) -> Result<Pool> {
        if cfg.reserve < PAGE_SIZE {
            return Err(Error::InvalidArgument(format!(
                "pool reserve of {} bytes",
                cfg.reserve
            )));
        }
        let region = VmmRegion::new(ctx, cfg.reserve, cfg.chunk)?;
        let pages = (region.reserved() / PAGE_SIZE).min(u32::MAX as usize / 2) as u32;
        let layout = Layout::new(pages, SLOTS);
        let alloc_layout = std::alloc::Layout::from_size_align(layout.meta_bytes, 128)
            .map_err(|_| Error::InvalidArgument("pool metadata layout".into()))?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(alloc_layout) };
        if ptr.is_null() {
            return Err(Error::InvalidArgument(
                "no host memory for the pool's metadata".into(),
            ));
        }
        let meta = HostMeta {
            ptr,
            layout: alloc_layout,
        };
        let handle = HeapHandle {
            meta: ptr as usize as u64,
            data: region.base(),
            page_count: pages,
            slots: SLOTS,
        };
        let pool = Pool {
            caches: RwLock::new(HashMap::new()),
            live: LiveBits::new(pages as usize),
            id: POOL_IDS.fetch_add(1, Ordering::Relaxed),
            events: EventPool::default(),
            handle,
            _meta: meta,
            region,
            ctx: ctx.clone(),
            grow_lock: Mutex::new(()),
            forgotten_counts: Mutex::new([0; 4]),
            release_threshold: cfg.release_threshold,
            log: match &cfg.log {
                Some(path) => Some(Mutex::new(EventLog::create(path)?)),
                None => None,
            },
            folded: AtomicI64::new(0),
            peak: AtomicUsize::new(0),
            counts: Default::default(),
        };
        pool.heap().set_limit(1);
        pool.grow(cfg.initial.max(1))?;
        Ok(pool)
    }

    fn heap(&self) -> Heap<'_, u64> {
        // SAFETY: `handle.meta` is this pool's zeroed host metadata sized by
        // `Layout`, `handle.data` the reserved region (64 KiB aligned: the
        // reservation is chunk-aligned); both live as long as `self`. The
        // heap only computes device addresses, it never touches them.
        unsafe { Heap::from_handle(&self.handle) }
    }

    fn bump(&self, which: usize) {
        self.counts[which].fetch_add(1, Ordering::Relaxed);
    }

    fn cache(&self, owner: &Arc<CudaStream>) -> Arc<StreamCache> {
        let stream = owner.cu_stream();
        let id = stream as usize;
        let hit = LAST.with(|l| match &*l.borrow() {
            Some((pool, s, c))
                if *pool == self.id && *s == id && !c.released.load(Ordering::Acquire) =>
            {
                Some(c.clone())
            }
            _ => None,
        });
        if let Some(c) = hit {
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
            None => self
                .caches
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .entry(id)
                .or_insert_with(|| {
                    Arc::new(StreamCache {
                        _keep_alive: owner.clone(),
                        stream,
                        cache: Mutex::new(Cache::default()),
                        released: std::sync::atomic::AtomicBool::new(false),
                    })
                })
                .clone(),
        };
        LAST.with(|l| *l.borrow_mut() = Some((self.id, id, c.clone())));
        c
    }

    /// Folds a stream's byte counter into the pool's and samples the peak.
    fn fold(&self, c: &mut Cache) {
        let now = self.folded.fetch_add(c.net, Ordering::Relaxed) + c.net;
        c.net = 0;
        self.peak.fetch_max(now.max(0) as usize, Ordering::Relaxed);
    }

    /// Counts one call on a stream's cache and folds its bytes now and then.
    fn account(&self, c: &mut Cache, which: usize, bytes: i64) {
        c.counts[which] += 1;
        c.net += bytes;
        if (c.counts[ALLOCS] + c.counts[FREES]).is_multiple_of(FOLD_EVERY) {
            self.fold(c);
        }
    }

    /// Allocates `size` bytes for use on `stream` (256-byte aligned). The
    /// pool keeps `stream` alive while it caches blocks freed on it
    /// ([`Pool::release_stream`] lets it go).
    pub fn alloc(&self, size: usize, stream: &Arc<CudaStream>) -> Result<u64> {
        self.alloc_raw(size, stream)
    }

    /// [`Pool::alloc`] on a raw stream handle.
    fn alloc_raw(&self, size: usize, stream: &Arc<CudaStream>) -> Result<u64> {
        if size == 0 {
            return Err(Error::InvalidArgument("allocation of 0 bytes".into()));
        }
        if size > self.region.reserved() {
            return Err(self.exhausted(size));
        }
        let key = Key::of(size);
        let own = self.cache(stream);
        // Own cache, then the heap as mapped now, then other streams'
        // caches (a GPU-side wait), then more memory.
        let (ptr, how) = match self.take_cached(&own, key) {
            Some(p) => (p, Some(SAME)),
            None => match self.heap().alloc(key.bytes(), thread_slot()) {
                Ok(p) => (p as usize as u64, None),
                Err(_) => match self.steal(&own, key)? {
                    Some(p) => (p, Some(CROSS)),
                    None => (self.fresh(key)?, None),
                },
            },
        };
        match self.heap().block_at(ptr as usize) {
            Ok(b) if self.live.set(&b) => {}
            // A block the heap just handed out is always found and not live.
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "pool state broken at {ptr:#x}"
                )))
            }
        }
        let mut c = own.lock();
        if let Some(how) = how {
            c.counts[how] += 1;
        }
        self.account(&mut c, ALLOCS, key.bytes() as i64);
        drop(c);
        self.record("alloc", ptr, size, own.stream);
        Ok(ptr)
    }

    /// Frees a block on `stream`: later work on `stream` may reuse it at
    /// once; other streams only after the GPU finishes `stream`'s work up
    /// to now. Pointers this pool did not hand out (or already freed) are
    /// refused with an error and counted.
    pub fn free(&self, ptr: u64, stream: &Arc<CudaStream>) -> Result<()> {
        self.free_raw(ptr, stream)
    }

    /// [`Pool::free`] with a raw stream handle.
    fn free_raw(&self, ptr: u64, stream: &Arc<CudaStream>) -> Result<()> {
        let key = match self.heap().block_at(ptr as usize) {
            Ok(b) if self.live.clear(&b) => match b.class {
                Some(c) => Key::Class(c),
                None => Key::Span((b.size / PAGE_SIZE) as u32),
            },
            _ => {
                self.bump(BAD);
                return Err(Error::InvalidArgument(format!(
                    "free of {ptr:#x}: not a live block of this pool"
                )));
            }
        };
        let own = self.cache(stream);
        let mut c = own.lock();
        c.list(key).push(ptr);
        c.bytes += key.bytes();
        c.dirty = true;
        self.account(&mut c, FREES, -(key.bytes() as i64));
        drop(c);
        self.record("free", ptr, key.bytes(), own.stream);
        Ok(())
    }

    fn record(&self, action: &str, ptr: u64, size: usize, stream: sys::CUstream) {
        if let Some(log) = &self.log {
            log.lock()
                .unwrap_or_else(|p| p.into_inner())
                .write(action, ptr, size, stream as usize);
        }
    }

    fn take_cached(&self, sc: &StreamCache, key: Key) -> Option<u64> {
        let mut c = sc.lock();
        let p = c.list(key).pop()?;
        c.bytes -= key.bytes();
        Some(p)
    }

    /// Takes blocks of `key` from another stream's cache: records (or
    /// reuses) an event on that stream and makes ours wait for it.
    fn steal(&self, own: &StreamCache, key: Key) -> Result<Option<u64>> {
        let others: Vec<Arc<StreamCache>> = self
            .caches
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|c| c.stream != own.stream)
            .cloned()
            .collect();
        for other in others {
            let mut c = other.lock();
            let list = c.list(key);
            if list.is_empty() {
                continue;
            }
            let n = list.len().min(STEAL_BATCH);
            let taken: Vec<u64> = list.split_off(list.len() - n);
            c.bytes -= n * key.bytes();
            if c.dirty || c.event.is_none() {
                let e = match c.event.take() {
                    Some(e) => e,
                    None => self.events.get()?,
                };
                e.record(other.stream)?;
                c.event = Some(e);
                c.dirty = false;
            }
            if let Some(e) = &c.event {
                e.wait_on(own.stream)?;
            }
            drop(c);
            let (first, rest) = taken
                .split_first()
                .map(|(f, r)| (*f, r.to_vec()))
                .unwrap_or((0, Vec::new()));
            if !rest.is_empty() {
                let mut mine = own.lock();
                mine.bytes += rest.len() * key.bytes();
                mine.list(key).extend(rest);
            }
            return Ok(Some(first));
        }
        Ok(None)
    }

    /// A block from the heap: grow the mapping, then return the caches to
    /// the heap, before giving up.
    fn fresh(&self, key: Key) -> Result<u64> {
        let heap = self.heap();
        let size = key.bytes();
        let slot = thread_slot();
        if let Ok(p) = heap.alloc(size, slot) {
            return Ok(p as usize as u64);
        }
        // Grow: at least the request plus a page per class page, or a chunk.
        let need = size
            + if size <= MAX_CLASS_SIZE {
                16 * PAGE_SIZE
            } else {
                0
            };
        let grown = {
            let _g = self.grow_lock.lock().unwrap_or_else(|p| p.into_inner());
            let mapped = self.region.mapped();
            self.grow(mapped + need.max(self.region.chunk()).max(mapped / 8))
                .is_ok()
        };
        if grown {
            if let Ok(p) = heap.alloc(size, slot) {
                return Ok(p as usize as u64);
            }
        }
        // Under pressure: every cache back to the heap, then one more try.
        self.flush_all()?;
        heap.scavenge();
        heap.alloc(size, slot)
            .map(|p| p as usize as u64)
            .map_err(|_| self.exhausted(size))
    }

    fn grow(&self, bytes: usize) -> Result<()> {
        let mapped = self.region.grow_to(bytes.min(self.region.reserved()))?;
        self.heap().set_limit((mapped / PAGE_SIZE) as u32);
        self.bump(GROWS);
        Ok(())
    }

    fn exhausted(&self, requested: usize) -> Error {
        let s = self.stats();
        let (_, largest) = self.free_space();
        Error::PoolExhausted {
            requested,
            reserved: s.reserved,
            in_use: s.in_use,
            cached: s.cached_per_stream.iter().map(|c| c.1).sum(),
            largest_free: largest,
            limit: self.region.reserved(),
        }
    }

    /// Returns every stream's cache to the heap, waiting (on the host) for
    /// each stream's work up to now. Used under memory pressure, by
    /// [`Pool::trim`] and [`Pool::release_stream`].
    fn flush_all(&self) -> Result<()> {
        let all: Vec<Arc<StreamCache>> = self
            .caches
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for sc in all {
            self.flush(&sc)?;
        }
        Ok(())
    }

    fn flush(&self, sc: &StreamCache) -> Result<()> {
        let blocks: Vec<u64> = {
            let mut c = sc.lock();
            if c.bytes == 0 {
                return Ok(());
            }
            c.dirty = false;
            c.drain()
        };
        let e = self.events.get()?;
        e.record(sc.stream)?;
        e.synchronize()?;
        self.events.put(e);
        let heap = self.heap();
        for p in blocks {
            let _ = heap.free(p as usize as *mut u8, thread_slot());
        }
        self.bump(FLUSHES);
        Ok(())
    }

    /// Waits for `stream`, returns its cache to the heap and forgets the
    /// stream. Call before destroying a stream the pool has seen.
    pub fn release_stream(&self, stream: &Arc<CudaStream>) -> Result<()> {
        let id = stream.cu_stream() as usize;
        let sc = self
            .caches
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if let Some(sc) = sc {
            sc.released.store(true, Ordering::Release);
            self.flush(&sc)?;
            let mut c = sc.lock();
            if let Some(e) = c.event.take() {
                self.events.put(e);
            }
            self.fold(&mut c);
            let mut f = self
                .forgotten_counts
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for (t, v) in f.iter_mut().zip(c.counts) {
                *t += v;
            }
        }
        LAST.with(|l| *l.borrow_mut() = None);
        Ok(())
    }

    /// Waits for `stream`, returns all caches to the heap and unmaps
    /// physical memory until at most `keep` bytes stay mapped (memory in
    /// use is never unmapped).
    pub fn trim(&self, keep: usize) -> Result<usize> {
        self.flush_all()?;
        let heap = self.heap();
        heap.scavenge();
        let _g = self.grow_lock.lock().unwrap_or_else(|p| p.into_inner());
        let chunk = self.region.chunk();
        let mut mapped = self.region.mapped();
        while mapped > keep.max(chunk) {
            let from = ((mapped - chunk) / PAGE_SIZE) as u32;
            // Stop new claims in the chunk, then check nobody holds a page there.
            heap.set_limit(from);
            if heap.any_in_use(from, (mapped / PAGE_SIZE) as u32) {
                heap.set_limit((mapped / PAGE_SIZE) as u32);
                break;
            }
            mapped = self.region.shrink_to(mapped - chunk)?;
        }
        heap.set_limit((mapped / PAGE_SIZE) as u32);
        Ok(mapped)
    }

    /// CUDA's release-threshold behaviour: trim to the configured threshold.
    pub fn synchronize(&self) -> Result<usize> {
        self.trim(self.release_threshold)
    }

    /// Free bytes of the mapped heap and its largest free run, in one pass.
    fn free_space(&self) -> (usize, usize) {
        let heap = self.heap();
        let (mut free, mut best, mut run) = (0usize, 0u32, 0u32);
        for p in 0..heap.limit() {
            if heap.any_in_use(p, p + 1) {
                run = 0;
            } else {
                free += 1;
                run += 1;
                best = best.max(run);
            }
        }
        (free * PAGE_SIZE, best as usize * PAGE_SIZE)
    }

    pub fn stats(&self) -> PoolStats {
        let mut cached_per_stream = Vec::new();
        let mut per_stream = [0u64; 4];
        let mut net = 0i64;
        for (id, sc) in self.caches.read().unwrap_or_else(|p| p.into_inner()).iter() {
            let c = sc.lock();
            cached_per_stream.push((*id, c.bytes));
            net += c.net;
            for (t, v) in per_stream.iter_mut().zip(c.counts) {
                *t += v;
            }
        }
        let (free_bytes, largest) = self.free_space();
        let c = |i: usize| self.counts[i].load(Ordering::Relaxed);
        let in_use = (self.folded.load(Ordering::Relaxed) + net).max(0) as usize;
        let gone = *self
            .forgotten_counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        PoolStats {
            reserved: self.region.mapped(),
            in_use,
            peak_in_use: self.peak.load(Ordering::Relaxed).max(in_use),
            cached_per_stream,
            fragmentation: if free_bytes == 0 {
                0.0
            } else {
                1.0 - largest as f64 / free_bytes as f64
            },
            allocs: per_stream[ALLOCS] + gone[ALLOCS],
            frees: per_stream[FREES] + gone[FREES],
            same_stream_reuse: per_stream[SAME] + gone[SAME],
            cross_stream_reuse: per_stream[CROSS] + gone[CROSS],
            grows: c(GROWS),
            flushes: c(FLUSHES),
            bad_frees: c(BAD),
        }
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Work still queued may use pool memory: wait before unmapping.
        let _ = self.ctx.synchronize();
    }
}

/// The alloc/free log: CSV lines `thread,time_ns,action,ptr,size,stream`.
struct EventLog {
    out: std::io::BufWriter<std::fs::File>,
    start: std::time::Instant,
}

impl EventLog {
    fn create(path: &std::path::Path) -> Result<EventLog> {
        use std::io::Write;
        let file = std::fs::File::create(path)
            .map_err(|e| Error::InvalidArgument(format!("event log {}: {e}", path.display())))?;
        let mut out = std::io::BufWriter::new(file);
        let _ = writeln!(out, "thread,time_ns,action,ptr,size,stream");
        Ok(EventLog {
            out,
            start: std::time::Instant::now(),
        })
    }

    fn write(&mut self, action: &str, ptr: u64, size: usize, stream: usize) {
        use std::io::Write;
        let t = self.start.elapsed().as_nanos();
        // A failed log write must not fail the allocation: the log is advisory.
        let _ = writeln!(
            self.out,
            "{:?},{t},{action},{ptr:#x},{size},{stream:#x}",
            std::thread::current().id()
        );
    }
}

/// One line of an event log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    pub thread: String,
    pub time_ns: u64,
    pub alloc: bool,
    pub ptr: u64,
    pub size: usize,
    pub stream: u64,
}

/// Parses an event log written by a pool with [`PoolConfig::log`].
pub fn parse_trace(text: &str) -> Result<Vec<TraceEvent>> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.rsplitn(6, ',').collect();
        let bad = || Error::InvalidArgument(format!("trace line {}: {line:?}", n + 1));
        if f.len() != 6 {
            return Err(bad());
        }
        // rsplitn yields the fields from the end.
        out.push(TraceEvent {
            thread: f[5].to_string(),
            time_ns: f[4].parse().map_err(|_| bad())?,
            alloc: match f[3] {
                "alloc" => true,
                "free" => false,
                _ => return Err(bad()),
            },
            ptr: hex(f[2]).ok_or_else(bad)?,
            size: f[1].parse().map_err(|_| bad())?,
            stream: hex(f[0]).ok_or_else(bad)?,
        });
    }
    Ok(out)
}

/// A typed device buffer from a [`Pool`], freed on its stream when dropped.
pub struct DeviceBuffer<T> {
    ptr: u64,
    len: usize,
    stream: Arc<CudaStream>,
    pool: Arc<Pool>,
    _t: std::marker::PhantomData<T>,
}

impl<T> DeviceBuffer<T> {
    /// Room for `len` values of `T` on `stream`.
    pub fn new(pool: &Arc<Pool>, len: usize, stream: &Arc<CudaStream>) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::InvalidArgument(format!("{len} elements overflow")))?;
        let ptr = pool.alloc(bytes.max(1), stream)?;
        Ok(DeviceBuffer {
            ptr,
            len,
            stream: stream.clone(),
            pool: pool.clone(),
            _t: std::marker::PhantomData,
        })
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // A buffer is freed once, by construction; an error cannot leave drop.
        let _ = self.pool.free(self.ptr, &self.stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_lines_round_trip() {
        let t = "thread,time_ns,action,ptr,size,stream\nThreadId(1),10,alloc,0x7f0000,256,0x55\nThreadId(1),20,free,0x7f0000,256,0x55\n";
        let e = parse_trace(t).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(
            e[0],
            TraceEvent {
                thread: "ThreadId(1)".into(),
                time_ns: 10,
                alloc: true,
                ptr: 0x7f0000,
                size: 256,
                stream: 0x55
            }
        );
        assert!(!e[1].alloc);
        assert!(parse_trace("h\nx,1,alloc,zz,1,0x1\n").is_err());
        assert!(parse_trace("h\nx,1,grab,0x1,1,0x1\n").is_err());
    }

    #[test]
    fn keys_round_to_256_and_cover_the_request() {
        for size in [
            1usize,
            16,
            255,
            256,
            257,
            1000,
            4096,
            65_536,
            65_537,
            1 << 20,
            (64 << 20) + 1,
        ] {
            let k = Key::of(size);
            assert!(k.bytes() >= size, "{size}");
            assert_eq!(
                k.bytes() % ALIGN,
                0,
                "{size} -> {k:?} is not a multiple of 256"
            );
        }
        assert_eq!(Key::of(64 << 20), Key::Span(1024));
    }
}

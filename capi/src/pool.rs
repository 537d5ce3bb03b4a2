//! `cuheap_pool_*`: the host pool on CUDA streams (`cudaStream_t` and
//! `CUstream` are the same handle).

use crate::{current_context, enter, entry, invalid, put, put_if, write_snapshot, Keep};
use cuheap_host::cudarc::driver::{sys, CudaContext, CudaStream};
use cuheap_host::{Context, CudaBackend, Exported, Imported, Pool, PoolConfig, PoolStats, Result};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Pool settings (`cuheap_pool_config_t`); a field left 0 takes its
/// default.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CuheapPoolConfig {
    /// Address space reserved up front; the pool never maps more. Default:
    /// the device's memory.
    pub reserve: usize,
    /// Memory mapped at creation. Default 64 MiB.
    pub initial: usize,
    /// Mapping unit (rounded to the device's granularity). Default 2 MiB.
    pub chunk: usize,
    /// Bytes one stream's cache may hold. Default 64 MiB.
    pub stream_cache_limit: usize,
    /// Bytes all streams' caches may hold together. Default 256 MiB.
    pub cache_limit: usize,
    /// `CUHEAP_POOL_SHAREABLE`: memory other processes can map
    /// (`cuheap_pool_export_block`); `CUHEAP_POOL_CHECK_CAPTURE`: refuse a
    /// capturing stream; `CUHEAP_POOL_GRAPH`: a graph's pool
    /// (`PoolConfig::for_graph`). Other bits are refused.
    pub flags: usize,
}

/// `cuheap_pool_config_t::flags`: memory other processes can map.
pub const CUHEAP_POOL_SHAREABLE: usize = 1;
/// `cuheap_pool_config_t::flags`: refuse a stream being captured into a
/// CUDA graph (`PoolConfig::capture_check`).
pub const CUHEAP_POOL_CHECK_CAPTURE: usize = 2;
/// `cuheap_pool_config_t::flags`: a graph's pool (`PoolConfig::graph`).
pub const CUHEAP_POOL_GRAPH: usize = 4;
/// Every flag.
const FLAGS: usize = CUHEAP_POOL_SHAREABLE | CUHEAP_POOL_CHECK_CAPTURE | CUHEAP_POOL_GRAPH;

impl CuheapPoolConfig {
    /// The pool's settings on a device of `memory` bytes.
    pub fn resolve(&self, memory: usize) -> PoolConfig {
        let mut cfg = PoolConfig::new(if self.reserve > 0 {
            self.reserve
        } else {
            memory
        });
        let pick = |v: usize, d: usize| if v > 0 { v } else { d };
        cfg.initial = pick(self.initial, cfg.initial).min(cfg.reserve);
        cfg.chunk = pick(self.chunk, cfg.chunk);
        cfg.stream_cache_limit = pick(self.stream_cache_limit, cfg.stream_cache_limit);
        cfg.cache_limit = pick(self.cache_limit, cfg.cache_limit);
        cfg.shareable = self.flags & CUHEAP_POOL_SHAREABLE != 0;
        cfg.capture_check = self.flags & CUHEAP_POOL_CHECK_CAPTURE != 0;
        cfg.graph = self.flags & CUHEAP_POOL_GRAPH != 0;
        cfg
    }
}

/// A snapshot of a pool (`cuheap_pool_stats_t`); see `PoolStats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CuheapPoolStats {
    /// Bytes of device memory mapped.
    pub reserved: u64,
    /// Bytes handed out and not freed (block sizes).
    pub in_use: u64,
    /// Largest `in_use` seen (sampled every 64 calls per stream).
    pub peak_in_use: u64,
    /// Bytes freed and cached on streams, or waiting for their streams.
    pub cached: u64,
    pub allocs: u64,
    pub frees: u64,
    /// Blocks reused on the stream that freed them.
    pub same_stream_reuse: u64,
    /// Blocks taken from another stream's cache (with a device-side wait).
    pub cross_stream_reuse: u64,
    /// Times the pool mapped more memory.
    pub grows: u64,
    /// Double, interior and foreign frees refused.
    pub bad_frees: u64,
}

impl From<&PoolStats> for CuheapPoolStats {
    fn from(s: &PoolStats) -> Self {
        CuheapPoolStats {
            reserved: s.reserved as u64,
            in_use: s.in_use as u64,
            peak_in_use: s.peak_in_use as u64,
            cached: s.cached() as u64,
            allocs: s.allocs,
            frees: s.frees,
            same_stream_reuse: s.same_stream_reuse,
            cross_stream_reuse: s.cross_stream_reuse,
            grows: s.grows,
            bad_frees: s.bad_frees,
        }
    }
}

/// A pool and the streams it has seen (`cuheap_pool_t`).
pub struct CuheapPool {
    /// Shared with the graphs the pool is tied to (`cuheap_pool_tie_to_graph`).
    pool: Arc<Pool>,
    ctx: Arc<CudaContext>,
    /// Never reused, so a thread's remembered stream of a destroyed pool
    /// never matches a new one.
    id: u64,
    /// Bumped by each `release_stream`: streams remembered by threads
    /// before it are looked up again.
    epoch: AtomicU64,
    /// One handle per stream the pool has seen: the pool keeps a stream's
    /// cache while someone else holds its handle, and these are the
    /// program's streams, alive until it says otherwise
    /// (`cuheap_pool_release_stream`).
    streams: Mutex<HashMap<usize, Arc<CudaStream>>>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// `CU_STREAM_PER_THREAD` / `cudaStreamPerThread`.
const PER_THREAD_STREAM: usize = 2;

/// (pool id, release epoch, raw handle, the pool's handle to it).
type Remembered = (u64, u64, usize, Arc<CudaStream>);

thread_local! {
    /// The stream this thread used last (pool id, release epoch, handle):
    /// the common case (a thread on one stream) finds it with no lock.
    static LAST_STREAM: RefCell<Option<Remembered>> = const { RefCell::new(None) };
}

impl CuheapPool {
    /// A pool in `ctx` (a primary context).
    pub fn new(ctx: Arc<CudaContext>, cfg: &CuheapPoolConfig) -> Result<CuheapPool> {
        let memory = ctx.total_mem().during("cuDeviceTotalMem")?;
        let pool = Arc::new(Pool::new(&ctx, cfg.resolve(memory))?);
        Ok(CuheapPool {
            pool,
            ctx,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            epoch: AtomicU64::new(0),
            streams: Mutex::new(HashMap::new()),
        })
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Runs `f` with the pool's handle to the program's stream `raw`. The
    /// per-thread default stream is refused: one handle names a different
    /// stream on each thread, so stream order cannot make reuse safe.
    fn with_stream<R>(
        &self,
        raw: sys::CUstream,
        f: impl FnOnce(&Arc<CudaStream>) -> Result<R>,
    ) -> Result<R> {
        let key = raw as usize;
        if key == PER_THREAD_STREAM {
            return invalid(
                "the per-thread default stream (cudaStreamPerThread) names another stream on each \
                 thread: pass the stream itself",
            );
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        LAST_STREAM.with(|last| {
            let mut last = last.borrow_mut();
            match &*last {
                Some((id, e, k, s)) if *id == self.id && *e == epoch && *k == key => f(s),
                _ => {
                    let s = self
                        .streams
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(key)
                        // SAFETY: `raw` is a stream of this pool's context
                        // (the caller's contract) that its owner keeps
                        // alive until `cuheap_pool_release_stream`; the
                        // wrapper never destroys it.
                        .or_insert_with(|| unsafe { self.ctx.wrap_borrowed_stream(raw) })
                        .clone();
                    let r = f(&s);
                    *last = Some((self.id, epoch, key, s));
                    r
                }
            }
        })
    }

    /// `size` bytes for work on `stream` (256-byte aligned).
    pub(crate) fn alloc(&self, size: usize, stream: sys::CUstream) -> Result<u64> {
        self.with_stream(stream, |s| self.pool.alloc(size, s))
    }

    /// Frees `ptr` on `stream` (0 does nothing).
    pub(crate) fn free(&self, ptr: u64, stream: sys::CUstream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        self.with_stream(stream, |s| self.pool.free(ptr, s))
    }

    /// Forgets `stream`: blocks cached on it go back to the pool once the
    /// device has finished its work.
    pub(crate) fn release_stream(&self, stream: sys::CUstream) -> Result<()> {
        let key = stream as usize;
        // Every thread looks its stream up again from now on.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let s = self
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        // SAFETY: as in `with_stream`: a stream of this context, alive.
        let s = s.unwrap_or_else(|| unsafe { self.ctx.wrap_borrowed_stream(stream) });
        self.pool.release_stream(&s)
    }
}

/// Creates a pool on the current device, in its primary context (the
/// CUDA runtime's): `int cuheap_pool_create(const cuheap_pool_config_t*
/// config, cuheap_pool_t** out)`. `config` may be NULL (defaults).
///
/// # Safety
///
/// `config` is NULL or points to a `cuheap_pool_config_t`; `out` is NULL
/// (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_pool_create(
    config: *const CuheapPoolConfig,
    out: *mut *mut CuheapPool,
) -> c_int {
    if !out.is_null() {
        // SAFETY: writable by the caller's contract.
        unsafe { out.write(std::ptr::null_mut()) };
    }
    entry("cuheap_pool_create", || {
        if out.is_null() {
            return invalid("out is NULL");
        }
        // SAFETY: NULL or a valid config (the caller's contract).
        let cfg = unsafe { config.as_ref() }.copied().unwrap_or_default();
        if cfg.flags & !FLAGS != 0 {
            return invalid(format!("pool flags {:#x}", cfg.flags));
        }
        let pool = CuheapPool::new(current_context()?, &cfg)?;
        // SAFETY: checked above; writable by the caller's contract.
        unsafe { put(out, Box::into_raw(Box::new(pool)), "out") }
    })
}

/// The pool behind a handle, or an error for NULL.
///
/// # Safety
///
/// `pool` is NULL or from `cuheap_pool_create` and not destroyed.
unsafe fn pool_ref<'a>(pool: *const CuheapPool) -> Result<&'a CuheapPool> {
    // SAFETY: the caller's contract.
    match unsafe { pool.as_ref() } {
        Some(p) => Ok(p),
        None => invalid("the pool is NULL"),
    }
}

/// Allocates `size` bytes (256-byte aligned) for work on `stream`:
/// `int cuheap_pool_alloc(cuheap_pool_t*, size_t size, cudaStream_t
/// stream, void** out)`. Work on `stream` may use the block at once; a
/// block the pool reuses from another stream is ordered after that
/// stream's work on the device (no host wait). Size 0 is
/// `CUHEAP_ERROR_INVALID`, no memory `CUHEAP_ERROR_OUT_OF_MEMORY`; `*out`
/// is NULL on any error.
///
/// # Safety
///
/// `pool` is NULL or a live pool; `stream` is a stream of the pool's
/// context, alive until `cuheap_pool_release_stream` (or the null, legacy
/// or per-thread stream); `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_pool_alloc(
    pool: *const CuheapPool,
    size: usize,
    stream: sys::CUstream,
    out: *mut *mut c_void,
) -> c_int {
    if !out.is_null() {
        // SAFETY: writable by the caller's contract.
        unsafe { out.write(std::ptr::null_mut()) };
    }
    enter("cuheap_pool_alloc", Keep::Lazy, || {
        // SAFETY: the caller's contract.
        let p = unsafe { pool_ref(pool) }?;
        if out.is_null() {
            return invalid("out is NULL");
        }
        let ptr = p.alloc(size, stream)?;
        // SAFETY: checked above.
        unsafe { out.write(ptr as *mut c_void) };
        Ok(())
    })
}

/// Frees a block on `stream`: `int cuheap_pool_free(cuheap_pool_t*, void*
/// ptr, cudaStream_t stream)`. Later work on `stream` may reuse it at
/// once, other streams after the device has finished `stream`'s work up
/// to now. NULL does nothing (as `cudaFree(NULL)`); a pointer that is not
/// a live block of this pool (a double or foreign free) is
/// `CUHEAP_ERROR_INVALID` and counted in `bad_frees`.
///
/// # Safety
///
/// As for `cuheap_pool_alloc`; no work queued after the free on other
/// streams than `stream` uses the block.
#[no_mangle]
pub unsafe extern "C" fn cuheap_pool_free(
    pool: *const CuheapPool,
    ptr: *mut c_void,
    stream: sys::CUstream,
) -> c_int {
    enter("cuheap_pool_free", Keep::Lazy, || {
        // SAFETY: the caller's contract.
        unsafe { pool_ref(pool) }?.free(ptr as u64, stream)
    })
}

/// Forgets a stream before the program destroys it: `int
/// cuheap_pool_release_stream(cuheap_pool_t*, cudaStream_t)`. Blocks
/// cached on it go back to the pool after the stream's work so far (the
/// host waits for it when the stream has cached blocks).
///
/// # Safety
///
/// As for `cuheap_pool_alloc`.
#[no_mangle]
pub unsafe extern "C" fn cuheap_pool_release_stream(
    pool: *const CuheapPool,
    stream: sys::CUstream,
) -> c_int {
    entry("cuheap_pool_release_stream", || {
        // SAFETY: the caller's contract.
        unsafe { pool_ref(pool) }?.release_stream(stream)
    })
}

/// Unmaps memory no block uses, keeping at least `keep` bytes mapped:
/// `int cuheap_pool_trim(cuheap_pool_t*, size_t keep, size_t* mapped)`.
/// Returns cached blocks to the pool and waits, on the host, for the work
/// that used the memory it unmaps. `*mapped` (if not NULL) gets the bytes
/// mapped afterwards.
///
/// # Safety
///
/// `pool` is NULL or a live pool; `mapped` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_pool_trim(
    pool: *const CuheapPool,
    keep: usize,
    mapped: *mut usize,
) -> c_int {
    entry("cuheap_pool_trim", || {
        // SAFETY: the caller's contract.
        let now = unsafe { pool_ref(pool) }?.pool.trim(keep)?;
        // SAFETY: NULL or writable (the caller's contract).
        unsafe { put_if(mapped, now) };
        Ok(())
    })
}

/// Ends a graph's pool's allocations once its graph is captured:
/// `int cuheap_pool_seal(cuheap_pool_t*)` (see `Pool::seal`).
///
/// # Safety
///
/// `pool` is NULL (refused) or a live pool.
#[no_mangle]
pub unsafe extern "C" fn cuheap_pool_seal(pool: *const CuheapPool) -> c_int {
    entry("cuheap_pool_seal", || {
        // SAFETY: the caller's contract.
        unsafe { pool_ref(pool) }?.pool.seal()
    })
}

/// Ties the pool's life to a graph's: `int
/// cuheap_pool_tie_to_graph(cuheap_pool_t*, void* graph)` with a
/// `CUgraph` / `cudaGraph_t` (see `Pool::tie_to_graph`). The pool's memory
/// stays while the graph, its executables or their launches remain,
/// whenever `cuheap_pool_destroy` is called.
///
/// # Safety
///
/// `pool` is NULL (refused) or a live pool; `graph` is NULL (refused) or a
/// live graph of the pool's context.
#[no_mangle]
pub unsafe extern "C" fn cuheap_pool_tie_to_graph(
    pool: *const CuheapPool,
    graph: *mut c_void,
) -> c_int {
    entry("cuheap_pool_tie_to_graph", || {
        // SAFETY: the caller's contract.
        let p = unsafe { pool_ref(pool) }?;
        // SAFETY: a live graph of the pool's context (the caller's
        // contract); NULL is refused by the pool.
        unsafe { p.pool.tie_to_graph(graph as sys::CUgraph) }
    })
}

/// Lets kernels on `device` read and write the pool's blocks, mapped now
/// and later: `int cuheap_pool_grant_access(cuheap_pool_t*, int device)`.
///
/// # Safety
///
/// `pool` is NULL (refused) or a live pool.
#[no_mangle]
pub unsafe extern "C" fn cuheap_pool_grant_access(pool: *const CuheapPool, device: c_int) -> c_int {
    entry("cuheap_pool_grant_access", || {
        // SAFETY: the caller's contract.
        unsafe { pool_ref(pool) }?.pool.grant_access(device)
    })
}

/// Takes `device`'s access to the pool away: `int
/// cuheap_pool_revoke_access(cuheap_pool_t*, int device)`.
///
/// # Safety
///
/// `pool` is NULL (refused) or a live pool, and no work on `device`,
/// queued or running, uses the pool's memory.
#[no_mangle]
pub unsafe extern "C" fn cuheap_pool_revoke_access(
    pool: *const CuheapPool,
    device: c_int,
) -> c_int {
    entry("cuheap_pool_revoke_access", || {
        // SAFETY: the caller's contract, forwarded.
        unsafe { pool_ref(pool)?.pool.revoke_access(device) }
    })
}

/// The pool's memory page by page (see `Pool::snapshot`): `int
/// cuheap_pool_snapshot(cuheap_pool_t*, char* json, size_t size, size_t*
/// needed, const char* html_path)`.
///
/// # Safety
///
/// `pool` is NULL (refused) or a live pool; the other pointers as
/// `write_snapshot` says.
#[no_mangle]
pub unsafe extern "C" fn cuheap_pool_snapshot(
    pool: *const CuheapPool,
    json: *mut c_char,
    size: usize,
    needed: *mut usize,
    html: *const c_char,
) -> c_int {
    entry("cuheap_pool_snapshot", || {
        // SAFETY: the caller's contract, forwarded.
        unsafe { write_snapshot(&pool_ref(pool)?.pool, json, size, needed, html) }
    })
}

/// Fills `*out` with the pool's statistics: `int
/// cuheap_pool_get_stats(cuheap_pool_t*, cuheap_pool_stats_t* out)`.
///
/// # Safety
///
/// `pool` is NULL or a live pool; `out` is NULL (refused) or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_pool_get_stats(
    pool: *const CuheapPool,
    out: *mut CuheapPoolStats,
) -> c_int {
    entry("cuheap_pool_get_stats", || {
        // SAFETY: the caller's contract.
        let s = unsafe { pool_ref(pool) }?.pool.stats();
        // SAFETY: NULL or writable.
        unsafe { put(out, CuheapPoolStats::from(&s), "out") }
    })
}

/// Destroys a pool: `int cuheap_pool_destroy(cuheap_pool_t*)`. Waits for
/// the device's work, then unmaps the pool's memory; blocks not freed are
/// gone with it. A pool tied to a graph (`cuheap_pool_tie_to_graph`)
/// stays until its graph goes: this drops the handle only. NULL does
/// nothing.
///
/// # Safety
///
/// `pool` is NULL or a live pool that no other thread uses, and no later
/// call names it.
#[no_mangle]
pub unsafe extern "C" fn cuheap_pool_destroy(pool: *mut CuheapPool) -> c_int {
    entry("cuheap_pool_destroy", || {
        if !pool.is_null() {
            // SAFETY: from `cuheap_pool_create` (Box::into_raw), destroyed
            // once (the caller's contract).
            drop(unsafe { Box::from_raw(pool) });
        }
        Ok(())
    })
}

/// A connected Unix socket the caller owns, borrowed for one call.
///
/// # Safety
///
/// `fd` is an open descriptor that stays open during the call.
unsafe fn borrow_socket(fd: c_int) -> Result<std::mem::ManuallyDrop<UnixStream>> {
    if fd < 0 {
        return invalid(format!("socket {fd}"));
    }
    // SAFETY: the caller's contract; never closed here (ManuallyDrop).
    Ok(std::mem::ManuallyDrop::new(unsafe {
        UnixStream::from_raw_fd(fd)
    }))
}

/// Sends the live block at `ptr` to the process at the other end of the
/// connected Unix stream socket `socket` (see `Pool::export_block`):
/// `int cuheap_pool_export_block(cuheap_pool_t*, const void* ptr, int
/// socket)`. The pool needs `CUHEAP_POOL_SHAREABLE`.
///
/// # Safety
///
/// `pool` is NULL (refused) or a live pool; `socket` is an open
/// descriptor (or negative, refused).
#[no_mangle]
pub unsafe extern "C" fn cuheap_pool_export_block(
    pool: *const CuheapPool,
    ptr: *const c_void,
    socket: c_int,
) -> c_int {
    entry("cuheap_pool_export_block", || {
        // SAFETY: the caller's contract.
        let pool = unsafe { pool_ref(pool) }?;
        // SAFETY: the caller's contract.
        let socket = unsafe { borrow_socket(socket) }?;
        pool.pool.export_block(ptr as u64)?.send(&socket)
    })
}

/// Memory another process exported, mapped here (`cuheap_import_t`).
pub struct CuheapImport(Imported);

/// Receives a block from the other end of `socket` (what
/// `cuheap_pool_export_block` sent) and maps it in the current device's
/// primary context: `int cuheap_import_receive(int socket,
/// cuheap_import_t** out, void** ptr, size_t* size)`. `*out` is NULL on
/// error.
///
/// # Safety
///
/// `socket` is an open descriptor (or negative, refused); `out` is NULL
/// (refused) or writable; `ptr` and `size` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuheap_import_receive(
    socket: c_int,
    out: *mut *mut CuheapImport,
    ptr: *mut *mut c_void,
    size: *mut usize,
) -> c_int {
    if !out.is_null() {
        // SAFETY: writable by the caller's contract.
        unsafe { out.write(std::ptr::null_mut()) };
    }
    if !ptr.is_null() {
        // SAFETY: writable by the caller's contract.
        unsafe { ptr.write(std::ptr::null_mut()) };
    }
    if !size.is_null() {
        // SAFETY: writable by the caller's contract.
        unsafe { size.write(0) };
    }
    entry("cuheap_import_receive", || {
        if out.is_null() {
            return invalid("out is NULL");
        }
        // SAFETY: the caller's contract.
        let socket = unsafe { borrow_socket(socket) }?;
        let ctx = current_context()?;
        let shared = Exported::<CudaBackend>::receive(&socket)?;
        let imported = Imported::map(CudaBackend::new(&ctx), &shared)?;
        if !ptr.is_null() {
            // SAFETY: writable by the caller's contract.
            unsafe { ptr.write(imported.ptr() as *mut c_void) };
        }
        if !size.is_null() {
            // SAFETY: writable by the caller's contract.
            unsafe { size.write(imported.len()) };
        }
        // SAFETY: checked above; writable by the caller's contract.
        unsafe { put(out, Box::into_raw(Box::new(CuheapImport(imported))), "out") }
    })
}

/// Unmaps an import once the device's work is done: `int
/// cuheap_import_close(cuheap_import_t*)`. NULL does nothing. The handle
/// is gone afterwards even on error (what failed to unmap stays mapped).
///
/// # Safety
///
/// `import` is NULL or from `cuheap_import_receive`, closed once.
#[no_mangle]
pub unsafe extern "C" fn cuheap_import_close(import: *mut CuheapImport) -> c_int {
    entry("cuheap_import_close", || {
        if import.is_null() {
            return Ok(());
        }
        // SAFETY: from Box::into_raw, closed once (the caller's contract).
        let CuheapImport(imported) = *unsafe { Box::from_raw(import) };
        imported.close().map(|_| ())
    })
}

/* cuheap: a GPU memory allocator. The device functions, for CUDA C++
 * compiled with nvcc -rdc=true and linked with cuheap's device library
 * (examples/cuda-cpp/ shows the build, with nvcc alone or with CMake).
 *
 * A heap is zeroed metadata plus a 64 KiB-aligned data region, in memory
 * the program owns: ask cuheap_meta_bytes for the metadata size, zero it,
 * then call cuheap_init from one thread of a kernel launched before any
 * kernel that allocates. cuheap_malloc, cuheap_aligned_alloc,
 * cuheap_realloc and cuheap_free then use that heap from any thread of any
 * later kernel of the program.
 *
 * Bad input never traps or hangs: size 0, sizes over the heap and
 * exhaustion return NULL (counted in failed_allocs); freeing NULL does
 * nothing; double, interior and foreign frees are refused and counted in
 * bad_frees. With no heap set, cuheap_malloc returns NULL.
 */
#ifndef CUHEAP_H
#define CUHEAP_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes: cuheap_init and cuheap_get_stats on the device, and
 * every host function below. */
#define CUHEAP_OK 0
/* Device: a null or misaligned pointer, too little memory, no slot or more than 65,536;
 * or, for cuheap_get_stats, no heap or a null out pointer. Host: a NULL
 * handle or out pointer, size 0, a pointer that is not a live block of
 * the pool (double or foreign free), a fixed heap asked to grow, a
 * current context that is not its device's primary context. */
#define CUHEAP_ERROR_INVALID 1
/* Host: the device, or the pool's reservation, has no memory for it. */
#define CUHEAP_ERROR_OUT_OF_MEMORY 2
/* Host: no CUDA driver, or no device. */
#define CUHEAP_ERROR_NO_DEVICE 3
/* Host: a CUDA driver call failed (cuheap_last_error names it). */
#define CUHEAP_ERROR_CUDA 4
/* Host: a defect in cuheap (caught; cuheap_last_error says where). */
#define CUHEAP_ERROR_INTERNAL 5

/* The statistics cuheap_get_stats fills. */
typedef struct cuheap_stats {
    unsigned long long bytes_in_use;   /* bytes of blocks handed out, not freed */
    unsigned long long bytes_reserved; /* bytes of pages the heap has taken */
    unsigned long long blocks_in_use;  /* blocks (and spans) not freed */
    unsigned long long failed_allocs;  /* allocations that returned NULL */
    unsigned long long failed_bytes;   /* their bytes, where memory ran out */
    unsigned long long bad_frees;      /* double, interior and foreign frees */
} cuheap_stats_t;

/* The counts cuheap_get_counts and cuheap_device_heap_get_counts fill, read
 * from the heap's counters (no scan of its pages). Exact once the kernels
 * that allocate have finished; while they run, each is a recent value. */
typedef struct cuheap_counts {
    unsigned long long allocs;              /* blocks and spans handed out, ever */
    unsigned long long frees;               /* blocks and spans freed, ever */
    unsigned long long spans_allocated;     /* allocations over 64 KiB, ever */
    unsigned long long spans_freed;
    unsigned long long span_bytes;          /* bytes of the spans in use */
    unsigned long long bytes_reserved;      /* bytes of pages the heap holds */
    unsigned long long peak_bytes_reserved; /* the most it has held */
    unsigned long long failed_allocs;       /* allocations that returned NULL, */
    unsigned long long zero_size;           /*   by cause: size 0, */
    unsigned long long too_large;           /*   larger than the heap, */
    unsigned long long bad_alignment;       /*   a bad alignment, */
    unsigned long long out_of_memory;       /*   out of memory, */
    unsigned long long failed_bytes;        /*   whose bytes these are */
    unsigned long long bad_frees;           /* double, interior and foreign frees */
    unsigned long long pages_activated;     /* pages given to a size class */
    unsigned long long pages_retired;       /* and given back */
    unsigned long long grow_requests;       /* growth asked for by running kernels */
    unsigned long long grow_refusals;       /* asks the host could not serve */
    unsigned long long grow_timeouts;       /* waits for growth that timed out */
    unsigned long long grow_waits;          /* waits for growth */
} cuheap_counts_t;

/* A heap's handle, for the cuheap_heap_* device functions: a program may
 * keep several heaps (say one per data structure) and pass their handles
 * to kernels by value. Filled by cuheap_heap_init on the device or
 * cuheap_device_heap_handle on the host; treat the fields as opaque. A
 * zeroed handle is no heap. */
typedef struct cuheap_heap {
    unsigned long long meta;
    unsigned long long data;
    unsigned page_count;
    unsigned slots;
} cuheap_heap_t;

#ifdef __CUDACC__
/* Bytes of zeroed metadata a heap of data_bytes (whole 64 KiB pages) with
 * `slots` current-page slots (usually the SM count) needs; 0 if none fits. */
__device__ unsigned long long cuheap_meta_bytes(unsigned long long data_bytes, unsigned slots);

/* Makes the memory the heap of cuheap_malloc/cuheap_free. One thread, in a
 * kernel that runs while no kernel uses the heap. meta: at least
 * cuheap_meta_bytes(data_bytes, slots) zeroed bytes, 16-byte aligned;
 * data: 64 KiB aligned.
 * Returns CUHEAP_OK or CUHEAP_ERROR_INVALID (and changes nothing). */
__device__ int cuheap_init(void* meta, unsigned long long meta_bytes,
                           void* data, unsigned long long data_bytes, unsigned slots);

/* A block of at least `size` bytes, 16-byte aligned (power-of-two sizes up
 * to 64 KiB: aligned to their size), or NULL. Any thread, converged or not. */
__device__ void* cuheap_malloc(size_t size);

/* A block of at least `size` bytes at a multiple of `alignment`, a power of
 * two up to 64 KiB (the page size); NULL for other alignments (counted in
 * failed_allocs, like size 0, sizes over the heap and exhaustion). The
 * block is the smallest size class whose blocks all have the alignment
 * (300 bytes at 64 take the 320-byte class): nothing is padded. Sizes over
 * 64 KiB are whole pages, 64 KiB aligned. Free it with cuheap_free. */
__device__ void* cuheap_aligned_alloc(size_t alignment, size_t size);

/* Resizes the block at `ptr` to `size` bytes, keeping its contents up to
 * the smaller of the two sizes, 16-byte aligned as C's realloc.
 * - The same pointer while `size` still fits the block (and, for a shrink,
 *   while no block half its size would do); blocks over 64 KiB grow and
 *   shrink in place by whole pages when the pages after them are free.
 * - Otherwise a new block with the contents copied; the old one is freed.
 * - A shrink never fails: it moves to a smaller block if the heap has one,
 *   else stays.
 * - ptr NULL: cuheap_malloc(size).
 * - NULL on failure, with the old block untouched and still to be freed:
 *   size 0 (unlike some C libraries, the block is not freed), sizes over
 *   the heap, exhaustion (counted in failed_allocs), or a pointer that is
 *   not a live block's start (counted in bad_frees).
 * The calling thread owns the block: no other thread uses it during the
 * call. A block from cuheap_aligned_alloc keeps its alignment while it
 * stays in place; a moved block is 16-byte aligned. */
__device__ void* cuheap_realloc(void* ptr, size_t size);

/* Frees a block from any thread (see above for bad input). */
__device__ void cuheap_free(void* ptr);

/* Fills *out with the heap's statistics. One thread reads every page's
 * descriptor: call it from a one-thread kernel between the kernels that
 * allocate. CUHEAP_OK, or CUHEAP_ERROR_INVALID with no heap or out NULL. */
__device__ int cuheap_get_stats(cuheap_stats_t* out);

/* Fills *out with the heap's counts: a few loads per SM, no page scan; any
 * thread, at any time. CUHEAP_OK, or CUHEAP_ERROR_INVALID with no heap or
 * out NULL. */
__device__ int cuheap_get_counts(cuheap_counts_t* out);

/* --- Heaps by handle: the same functions on the heap *heap names. A
 * NULL or zeroed handle: NULL allocations, frees ignored, statistics
 * CUHEAP_ERROR_INVALID. A block freed on another heap than its own is a
 * foreign pointer there (refused, counted in bad_frees). --- */

/* Fills *out with the handle of a heap over memory the program owns, with
 * cuheap_init's checks, without making it cuheap_malloc's heap. Any
 * thread; it writes nothing but *out. CUHEAP_OK or CUHEAP_ERROR_INVALID. */
__device__ int cuheap_heap_init(cuheap_heap_t* out, void* meta, unsigned long long meta_bytes,
                                void* data, unsigned long long data_bytes, unsigned slots);
__device__ void* cuheap_heap_malloc(const cuheap_heap_t* heap, size_t size);
__device__ void* cuheap_heap_aligned_alloc(const cuheap_heap_t* heap, size_t alignment, size_t size);
__device__ void* cuheap_heap_realloc(const cuheap_heap_t* heap, void* ptr, size_t size);
__device__ void cuheap_heap_free(const cuheap_heap_t* heap, void* ptr);
__device__ int cuheap_heap_get_stats(const cuheap_heap_t* heap, cuheap_stats_t* out);
__device__ int cuheap_heap_get_counts(const cuheap_heap_t* heap, cuheap_counts_t* out);
#endif /* __CUDACC__ */

/* ------------------------------------------------------------------ */
/* The host C API: libcuheap.so (link with -lcuheap). Every function runs
 * in the primary context of the current device, the context the CUDA
 * runtime uses, so pointers and streams pass freely between a runtime
 * API program and cuheap (cudaStream_t is a struct CUstream_st*).
 * Functions return CUHEAP_OK or an error code; cuheap_last_error() then
 * says what went wrong. Nothing panics, aborts or exits. */

typedef struct CUstream_st* cuheap_stream_t;

/* The message of the last call on this thread that failed ("" if none
 * has); valid until the next failing call on this thread. */
const char* cuheap_last_error(void);

/* --- The host pool: stream-ordered device memory. --- */
typedef struct cuheap_pool cuheap_pool_t;

/* Pool settings; a field left 0 takes its default. */
typedef struct cuheap_pool_config {
    size_t reserve;            /* address space; never maps more (device memory) */
    size_t initial;            /* mapped at creation (64 MiB) */
    size_t chunk;              /* mapping unit (2 MiB) */
    size_t stream_cache_limit; /* bytes one stream's cache may hold (64 MiB); each
                                  thread also keeps up to 2 MiB a stream, for 8 streams */
    size_t cache_limit;        /* bytes all streams' caches may hold (256 MiB) */
    size_t flags;              /* CUHEAP_POOL_* bits, or 0 (added in 0.1: rebuild callers) */
} cuheap_pool_config_t;

/* cuheap_pool_config_t::flags: memory other processes can map
 * (cuheap_pool_export_block); the device's driver must support POSIX
 * file descriptor handles. */
#define CUHEAP_POOL_SHAREABLE 1
/* cuheap_pool_config_t::flags: refuse (CUHEAP_ERROR_INVALID) an allocation
 * or free on a stream being captured into a CUDA graph, whose replays
 * would use memory the pool hands out again; one cuStreamIsCapturing per
 * call. The pools of the PyTorch and CuPy hooks have it. */
#define CUHEAP_POOL_CHECK_CAPTURE 2
/* cuheap_pool_config_t::flags: a CUDA graph's pool, for the allocations of
 * one capture: it serves one stream (the first it sees), and blocks freed
 * during the capture serve its later allocations with no event and no
 * host wait (stream order orders them). Map what the graph needs up front
 * (initial). After the capture, cuheap_pool_seal it, and
 * cuheap_pool_tie_to_graph it so that its memory goes with the graph. */
#define CUHEAP_POOL_GRAPH 4

typedef struct cuheap_pool_stats {
    unsigned long long reserved;    /* bytes of device memory mapped */
    unsigned long long in_use;      /* bytes handed out, not freed */
    unsigned long long peak_in_use; /* largest in_use seen (sampled) */
    unsigned long long cached;      /* freed, cached on streams or waiting for them */
    unsigned long long allocs;
    unsigned long long frees;
    unsigned long long same_stream_reuse;  /* reused on the stream that freed it */
    unsigned long long cross_stream_reuse; /* taken from another stream, ordered on the device */
    unsigned long long grows;       /* times more memory was mapped */
    unsigned long long bad_frees;   /* double, interior and foreign frees refused */
} cuheap_pool_stats_t;

/* A pool on the current device. config may be NULL (defaults). *out is
 * NULL on error, as for every function below that creates something. */
int cuheap_pool_create(const cuheap_pool_config_t* config, cuheap_pool_t** out);
/* size bytes (256-byte aligned) for work on stream; *out is NULL on any
 * error. Work on stream may use the block at once; a block reused from
 * another stream is ordered after that stream's work on the device, with
 * no host wait. Size 0: CUHEAP_ERROR_INVALID; no memory:
 * CUHEAP_ERROR_OUT_OF_MEMORY. The stream must live until
 * cuheap_pool_release_stream (the null and legacy streams always do);
 * cudaStreamPerThread is refused (CUHEAP_ERROR_INVALID): it names another
 * stream on each thread, so pass the stream itself. */
int cuheap_pool_alloc(cuheap_pool_t* pool, size_t size, cuheap_stream_t stream, void** out);
/* Frees on stream: reused at once by later work on stream, by other
 * streams after the device finishes stream's work so far. NULL does
 * nothing; a pointer that is not a live block of this pool is refused
 * (CUHEAP_ERROR_INVALID) and counted in bad_frees. */
int cuheap_pool_free(cuheap_pool_t* pool, void* ptr, cuheap_stream_t stream);
/* Call before destroying a stream the pool has seen: its cached blocks go
 * back to the pool after its work so far (the host waits for it when it
 * has cached blocks). */
int cuheap_pool_release_stream(cuheap_pool_t* pool, cuheap_stream_t stream);
/* Returns every cache to the pool and unmaps memory no block uses,
 * keeping at least keep bytes; waits on the host for the work that used
 * the memory it unmaps. *mapped (may be NULL) gets what stays mapped. */
int cuheap_pool_trim(cuheap_pool_t* pool, size_t keep, size_t* mapped);
/* Lets kernels on device read and write every block of the pool, mapped
 * now and later (as cudaMemPoolSetAccess). The pool's own device, or a
 * device granted before, does nothing; a device that does not exist or
 * has no peer path to the pool's: CUHEAP_ERROR_INVALID. Order work across
 * devices with events, as for any memory. */
int cuheap_pool_grant_access(cuheap_pool_t* pool, int device);
/* A graph's pool (CUHEAP_POOL_GRAPH) after its capture: later allocations
 * and trims that would unmap fail (CUHEAP_ERROR_INVALID), so the memory
 * the graph's replays use goes to no one else. Any other pool:
 * CUHEAP_ERROR_INVALID. */
int cuheap_pool_seal(cuheap_pool_t* pool);
/* Seals a graph's pool (CUHEAP_POOL_GRAPH; any other pool:
 * CUHEAP_ERROR_INVALID) and gives graph (a CUgraph / cudaGraph_t of the
 * pool's context, used by no other thread during the call) a reference to
 * it: the pool stays, with its memory, while the graph, the executable
 * graphs instantiated from it after this call, or their launches remain,
 * and its memory goes back once all are destroyed and done (on a thread
 * of cuheap's, a moment later), whenever cuheap_pool_destroy is called.
 * An executable instantiated before the call holds no reference and must
 * not be launched once the pool is gone: tie, then instantiate. Keep
 * libcuheap loaded while a tied graph lives. */
int cuheap_pool_tie_to_graph(cuheap_pool_t* pool, void* graph);
/* Takes device's access away (a device never granted does nothing; the
 * pool's own device: CUHEAP_ERROR_INVALID). No work on device may still
 * use the pool's memory. */
int cuheap_pool_revoke_access(cuheap_pool_t* pool, int device);
/* The pool's memory page by page: its mappings, free runs, size-class
 * pages (live, cached and returning blocks), spans and the stream that
 * caches each, as JSON into json (size bytes with the terminating NUL;
 * *needed, if not NULL, gets the bytes it takes; a NULL json only asks)
 * and as an HTML page written to html_path (if not NULL). A json buffer
 * too small: CUHEAP_ERROR_INVALID, nothing written (the page neither).
 * The pool may change between a size query and the next call: leave
 * room, and ask again if *needed grew. */
int cuheap_pool_snapshot(cuheap_pool_t* pool, char* json, size_t size, size_t* needed,
                         const char* html_path);
int cuheap_pool_get_stats(cuheap_pool_t* pool, cuheap_pool_stats_t* out);
/* Sends the live block at ptr (and the rest of the mappings under it:
 * the driver shares whole mappings) to the process at the other end of a
 * connected, blocking Unix stream socket. The pool needs
 * CUHEAP_POOL_SHAREABLE. Keep the block allocated while it is used there. */
int cuheap_pool_export_block(cuheap_pool_t* pool, const void* ptr, int socket);

/* Memory another process exported, mapped in this one. */
typedef struct cuheap_import cuheap_import_t;
/* Receives what cuheap_pool_export_block sent and maps it in the current
 * device's primary context: *ptr and *size (each may be NULL) get the
 * block. A socket read timeout bounds the wait. *out, *ptr and *size are
 * NULL / 0 on error. */
int cuheap_import_receive(int socket, cuheap_import_t** out, void** ptr, size_t* size);
/* Waits for the device and unmaps; the handle is gone afterwards, also on
 * error. NULL does nothing. */
int cuheap_import_close(cuheap_import_t* import);
/* Waits for the device and frees the pool's memory (blocks not freed
 * go with it); a pool tied to a graph stays until its graph goes (this
 * drops the handle only). NULL does nothing. */
int cuheap_pool_destroy(cuheap_pool_t* pool);

/* --- Device heaps for kernels that call cuheap_malloc. --- */
typedef struct cuheap_device_heap cuheap_device_heap_t;

/* What cuheap_init takes to make a heap the program's. */
typedef struct cuheap_heap_desc {
    void* meta;
    unsigned long long meta_bytes;
    void* data;
    unsigned long long data_bytes;
    unsigned slots;
} cuheap_heap_desc_t;

/* A heap on the current device with initial bytes usable (whole 64 KiB
 * pages); with max > initial it reserves max bytes of address space and
 * can grow into it, else it is fixed. Kernels use it once it is
 * installed (cuheap_device_heap_install, below). */
int cuheap_device_heap_create(size_t initial, size_t max, cuheap_device_heap_t** out);
int cuheap_device_heap_desc(const cuheap_device_heap_t* heap, cuheap_heap_desc_t* out);
/* Statistics (a synchronous copy): call it between the kernels that
 * allocate. */
int cuheap_device_heap_get_stats(const cuheap_device_heap_t* heap, cuheap_stats_t* out);
/* Counts (a synchronous copy of the heap's counters, a few KiB: no page
 * table). Exact between the kernels that allocate. */
int cuheap_device_heap_get_counts(const cuheap_device_heap_t* heap, cuheap_counts_t* out);
/* The heap's handle for kernels that call cuheap_heap_malloc and the
 * other cuheap_heap_* functions: no install needed. */
int cuheap_device_heap_handle(const cuheap_device_heap_t* heap, cuheap_heap_t* out);
/* Bytes of block memory usable now. */
int cuheap_device_heap_capacity(const cuheap_device_heap_t* heap, size_t* out);
/* Maps memory until bytes are usable (every block keeps its address);
 * later kernels, and running kernels looking for a fresh page, use it.
 * A fixed heap or bytes past max: CUHEAP_ERROR_INVALID. Out of device
 * memory part-way: CUHEAP_ERROR_OUT_OF_MEMORY, and what was mapped before
 * stays mapped and usable (see cuheap_device_heap_capacity). */
int cuheap_device_heap_grow(cuheap_device_heap_t* heap, size_t bytes, size_t* usable);
/* Unmaps growth steps at the end that no block uses, keeping at least
 * keep bytes; once this heap has called set_growth_piece or trim_on
 * (below) and while no growth service runs, also free steps or pieces
 * before the last one in use, which stay holes that
 * cuheap_device_heap_grow maps again. No kernel that uses the heap may be
 * running or queued. */
int cuheap_device_heap_trim(cuheap_device_heap_t* heap, size_t keep, size_t* mapped);
/* Later growth maps new memory in pieces of at most piece bytes (whole
 * 2 MiB chunks; 0: one mapping per step, the default), each of which a
 * trim gives back alone; *set (if not NULL) gets the piece. Small pieces
 * make growth slower (a cuMemCreate and a cuMemMap each). It also loads
 * the heaps' upkeep kernels: cuheap's device library, in the device's
 * primary context (no kernel in it calls CUDA's device malloc), loaded by
 * the first call that needs it and shared by the device's heaps until the
 * last of them goes; make that call before launching kernels that wait
 * for growth. A fixed heap: CUHEAP_ERROR_INVALID. */
int cuheap_device_heap_set_growth_piece(cuheap_device_heap_t* heap, size_t piece, size_t* set);
/* Gives back, in stream order, the steps (or pieces) of a growable heap
 * that no block uses, keeping at least keep bytes, while kernels on other
 * streams go on using the heap; the host does not wait. After the work
 * queued on stream (the kernels that freed the blocks), a kernel fences
 * each free step so no allocation can take it; once stream gets past it,
 * the heap unmaps them at its next call that looks
 * (cuheap_device_heap_finish_trims, _grow, _get_stats, _trim, the next
 * _trim_on) or from its growth service. What it gives back stays a hole
 * that growth while kernels run maps past (holes count against max) and
 * cuheap_device_heap_grow (no service running) maps again; blocks keep
 * their addresses. stream is a stream of the heap's device (0: its
 * legacy default stream; cudaStreamPerThread: the calling thread's); it
 * may be destroyed right after the call (the trim keeps an event). Loads
 * the upkeep kernels on first use (as above). A fixed heap keeps its
 * memory (CUHEAP_OK); at most 8 trims wait to be finished (then
 * CUHEAP_ERROR_INVALID). */
int cuheap_device_heap_trim_on(cuheap_device_heap_t* heap, cuheap_stream_t stream, size_t keep);
/* Unmaps what finished trims fenced (wait != 0: waits on the host for all
 * of them first); *freed (if not NULL) gets the bytes given back. */
int cuheap_device_heap_finish_trims(cuheap_device_heap_t* heap, int wait, size_t* freed);
/* Starts a host thread that grows the heap while kernels run: a thread
 * that finds the heap short waits (at most 2 s) until more is mapped,
 * instead of getting NULL (NULL still comes at max or when the device is
 * full). fill_percent 0: grow when asked; 1-99: also map the next step
 * once the heap is that full, so kernels find it mapped. A fixed heap, a
 * heap already served or a fill over 99: CUHEAP_ERROR_INVALID.
 * While such a kernel runs, no host thread may wait in a synchronous
 * copy queued behind it (cudaMemcpy right after the launch, and
 * cuheap_device_heap_get_stats / _get_counts, which copy on the legacy
 * default stream): that holds up the service's driver calls until the
 * kernel ends, and its waiting threads time out and get NULL. Synchronise
 * first (cudaDeviceSynchronize or cudaStreamSynchronize), then copy. */
int cuheap_device_heap_serve(cuheap_device_heap_t* heap, unsigned fill_percent);
/* Stops the heap's growth service, if one runs (waiting threads then get
 * NULL). Returns the first error the service's thread met, if any. */
int cuheap_device_heap_stop_serving(cuheap_device_heap_t* heap);
/* Frees the heap (stopping its growth service, and waiting for the trims
 * still queued on streams and the work before them); no kernel may use it
 * any more. NULL does nothing. */
int cuheap_device_heap_destroy(cuheap_device_heap_t* heap);

/* --- One pool per device for the process: PyTorch and CuPy. --- */
/* torch.cuda.memory.CUDAPluggableAllocator(path, "cuheap_torch_alloc",
 * "cuheap_torch_free"). NULL for size 0, bad arguments and no GPU. On any
 * other failure (device out of memory, a stream being captured into a
 * CUDA graph, a driver error) it prints why and aborts the process:
 * PyTorch does not check the pointer it gets. */
void* cuheap_torch_alloc(ptrdiff_t size, int device, cuheap_stream_t stream);
void cuheap_torch_free(void* ptr, ptrdiff_t size, int device, cuheap_stream_t stream);
/* cupy.cuda.CFunctionAllocator(0, malloc, free, owner): CuPy passes no
 * stream, so blocks are ordered on the null stream and a freed block is
 * reused at once: safe while the program's work runs on one stream at a
 * time (the null stream, CuPy's default, or one of its own). */
void* cuheap_cupy_malloc(void* param, size_t size, int device);
void cuheap_cupy_free(void* param, void* ptr, int device);
/* Host time spent inside the hooks above since the process started, when
 * it runs with CUHEAP_HOOK_TIMES set (zeros otherwise): calls, total
 * nanoseconds, the longest call. Any pointer may be NULL. */
int cuheap_hook_times(unsigned long long* calls, unsigned long long* ns,
                      unsigned long long* max_ns);
int cuheap_device_pool_get_stats(int device, cuheap_pool_stats_t* out);
int cuheap_device_pool_trim(int device, size_t keep, size_t* mapped);
/* cuheap_pool_snapshot of the process's pool on device. */
int cuheap_device_pool_snapshot(int device, char* json, size_t size, size_t* needed,
                                const char* html_path);

#ifdef __cplusplus
}
#endif

/* The layouts the library was built with. */
typedef char cuheap_check_pool_stats_[sizeof(cuheap_pool_stats_t) == 80 ? 1 : -1];
typedef char cuheap_check_stats_[sizeof(cuheap_stats_t) == 48 ? 1 : -1];
typedef char cuheap_check_pool_config_[sizeof(cuheap_pool_config_t) == 48 ? 1 : -1];
typedef char cuheap_check_heap_desc_[sizeof(cuheap_heap_desc_t) == 40 ? 1 : -1];
typedef char cuheap_check_counts_[sizeof(cuheap_counts_t) == 160 ? 1 : -1];
typedef char cuheap_check_heap_[sizeof(cuheap_heap_t) == 24 ? 1 : -1];

#if defined(__CUDACC__) && defined(__CUDACC_RDC__)
/* Installs a heap made by cuheap_device_heap_create as the heap of this
 * program's cuheap_malloc/cuheap_free: one thread calls cuheap_init on
 * stream, and the host waits for it. Call it while no kernel of the
 * program uses the heap. Returns CUHEAP_OK, CUHEAP_ERROR_INVALID (a NULL
 * heap, or cuheap_init refused it) or CUHEAP_ERROR_CUDA (the launch or
 * the copy failed: cudaGetLastError() says why). Needs -rdc=true, as
 * every program that links the device library. */
static __device__ int cuheap_install_rc_;
static __global__ void cuheap_install_kernel_(cuheap_heap_desc_t d) {
    cuheap_install_rc_ = cuheap_init(d.meta, d.meta_bytes, d.data, d.data_bytes, d.slots);
}
static inline int cuheap_device_heap_install(const cuheap_device_heap_t* heap, cuheap_stream_t stream) {
    cuheap_heap_desc_t d;
    int rc = cuheap_device_heap_desc(heap, &d);
    if (rc != CUHEAP_OK) return rc;
    cuheap_install_kernel_<<<1, 1, 0, stream>>>(d);
    if (cudaMemcpyFromSymbolAsync(&rc, cuheap_install_rc_, sizeof rc, 0, cudaMemcpyDeviceToHost, stream)
            != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
        return CUHEAP_ERROR_CUDA;
    return rc;
}
#endif

#endif /* CUHEAP_H */

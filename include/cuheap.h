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

/* Return codes of cuheap_init and cuheap_get_stats. */
#define CUHEAP_OK 0
/* A null or misaligned pointer, too little memory, or no slot; or, for
 * cuheap_get_stats, no heap or a null out pointer. */
#define CUHEAP_ERROR_INVALID 1

/* The statistics cuheap_get_stats fills. */
typedef struct cuheap_stats {
    unsigned long long bytes_in_use;   /* bytes of blocks handed out, not freed */
    unsigned long long bytes_reserved; /* bytes of pages the heap has taken */
    unsigned long long blocks_in_use;  /* blocks (and spans) not freed */
    unsigned long long failed_allocs;  /* allocations that returned NULL */
    unsigned long long failed_bytes;   /* their bytes, where memory ran out */
    unsigned long long bad_frees;      /* double, interior and foreign frees */
} cuheap_stats_t;

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
#endif /* __CUDACC__ */

#ifdef __cplusplus
}
#endif

#endif /* CUHEAP_H */

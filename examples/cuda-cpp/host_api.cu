// cuheap's host C API (libcuheap.so) from CUDA C++, beside the device
// library: a device heap the host creates, grows, reads and trims, used by
// cuheap_malloc in kernels; two more heaps used by handle, with their
// counts; the host pool on cudaStream_t streams; bad input; and what a
// call through the C API costs.
//
//   nvcc -arch=sm_90 -rdc=true -I../../include host_api.cu -L. -lcuheap_device \
//        -L../../target/release -lcuheap -o cuheap_host_api
//   LD_LIBRARY_PATH=../../target/release ./cuheap_host_api
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>
#include "cuheap.h"

static int failures = 0;
#define CHECK_CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); std::exit(1); } } while (0)
#define CHECK(x) do { int rc = (x); if (rc != CUHEAP_OK) { \
    std::printf("cuheap error %d at %s:%d: %s\n", rc, __FILE__, __LINE__, cuheap_last_error()); std::exit(1); } } while (0)
#define EXPECT(c, ...) do { if (!(c)) { std::printf("FAILED: " __VA_ARGS__); std::printf("\n"); failures++; } } while (0)

// Every thread: a block of 16..4096 bytes, filled with its id.
__global__ void alloc_fill(unsigned n, unsigned** ptrs, unsigned* errors) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned size = 16u << (i % 9);
    unsigned* p = static_cast<unsigned*>(cuheap_malloc(size));
    ptrs[i] = p;
    if (p == nullptr) { atomicAdd(&errors[0], 1u); return; }
    for (unsigned k = 0; k < size / 4; k++) p[k] = i;
}
// Checks and frees thread i's block from alloc_fill (NULL skipped).
__device__ void check_free_at(unsigned i, unsigned** ptrs, unsigned* errors) {
    if (ptrs[i] == nullptr) return;
    unsigned size = 16u << (i % 9);
    for (unsigned k = 0; k < size / 4; k++)
        if (ptrs[i][k] != i) { atomicAdd(&errors[1], 1u); break; }
    cuheap_free(ptrs[i]);
    ptrs[i] = nullptr;
}
// Checks and frees what alloc_fill left.
__global__ void check_free(unsigned n, unsigned** ptrs, unsigned* errors) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) check_free_at(i, ptrs, errors);
}
// The same for the blocks of threads `from` and up.
__global__ void check_free_from(unsigned n, unsigned from, unsigned** ptrs, unsigned* errors) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= from && i < n) check_free_at(i, ptrs, errors);
}
// Two heaps by handle, one per data structure: 64 B blocks from a, 256 B
// from b, tagged.
__global__ void two_heaps_alloc(cuheap_heap_t a, cuheap_heap_t b, unsigned n, unsigned** pa, unsigned** pb,
                                unsigned* errors) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned* x = static_cast<unsigned*>(cuheap_heap_malloc(&a, 64));
    unsigned* y = static_cast<unsigned*>(cuheap_heap_malloc(&b, 256));
    pa[i] = x; pb[i] = y;
    if (x == nullptr || y == nullptr) { atomicAdd(&errors[0], 1u); return; }
    x[0] = i; y[0] = ~i;
}
// Checks and frees them, each on its own heap; thread 0 first frees one of
// b's blocks on a, where it is foreign (refused, counted in a's bad_frees).
__global__ void two_heaps_free(cuheap_heap_t a, cuheap_heap_t b, unsigned n, unsigned** pa, unsigned** pb,
                               unsigned* errors) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || pa[i] == nullptr || pb[i] == nullptr) return;
    if (pa[i][0] != i || pb[i][0] != ~i) atomicAdd(&errors[1], 1u);
    if (i == 0) cuheap_heap_free(&a, pb[0]);
    cuheap_heap_free(&a, pa[i]);
    cuheap_heap_free(&b, pb[i]);
}
// One thread: a's counts from the device, and bad input to the handle
// functions (NULL handles, a zeroed handle, cuheap_heap_init's checks).
__global__ void handle_checks(cuheap_heap_t a, cuheap_counts_t* counts, int* rc, unsigned* errors) {
    rc[0] = cuheap_heap_get_counts(&a, counts);
    cuheap_heap_t zero = {0, 0, 0, 0}, out;
    if (cuheap_heap_malloc(nullptr, 64) != nullptr || cuheap_heap_malloc(&zero, 64) != nullptr) errors[2]++;
    cuheap_heap_free(nullptr, (void*)64);
    cuheap_stats_t st;
    if (cuheap_heap_get_stats(&zero, &st) != CUHEAP_ERROR_INVALID ||
        cuheap_heap_get_counts(nullptr, counts + 1) != CUHEAP_ERROR_INVALID)
        errors[2]++;
    // Misaligned data, too little metadata, no slot, NULL out.
    if (cuheap_heap_init(&out, (void*)256, 1 << 20, (void*)65537, 1 << 20, 4) != CUHEAP_ERROR_INVALID ||
        cuheap_heap_init(&out, (void*)256, 16, (void*)65536, 1 << 20, 4) != CUHEAP_ERROR_INVALID ||
        cuheap_heap_init(&out, (void*)256, 1 << 20, (void*)65536, 1 << 20, 0) != CUHEAP_ERROR_INVALID ||
        cuheap_heap_init(nullptr, (void*)256, 1 << 20, (void*)65536, 1 << 20, 4) != CUHEAP_ERROR_INVALID)
        errors[2]++;
}
// A heap a kernel makes over memory the program owns, by handle only.
__global__ void own_heap(void* meta, unsigned long long meta_bytes, void* data, unsigned long long data_bytes,
                         unsigned* errors) {
    cuheap_heap_t h;
    if (cuheap_heap_init(&h, meta, meta_bytes, data, data_bytes, 4) != CUHEAP_OK) { errors[2]++; return; }
    void* p[8];
    for (int k = 0; k < 8; k++) {
        p[k] = cuheap_heap_aligned_alloc(&h, 4096, 100 * (k + 1));
        if (p[k] == nullptr || ((size_t)p[k] & 4095) != 0) errors[2]++;
    }
    p[0] = cuheap_heap_realloc(&h, p[0], 20000);
    cuheap_counts_t c;
    if (cuheap_heap_get_counts(&h, &c) != CUHEAP_OK || c.allocs != 9 || c.frees != 1) errors[2]++;
    for (int k = 0; k < 8; k++) cuheap_heap_free(&h, p[k]);
    if (cuheap_heap_get_counts(&h, &c) != CUHEAP_OK || c.allocs != c.frees || c.bad_frees != 0) errors[2]++;
}
// Pool blocks: fill with a tag on one stream, check it on another.
__global__ void fill(unsigned* p, size_t words, unsigned tag) {
    for (size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < words; k += gridDim.x * blockDim.x) p[k] = tag;
}
__global__ void check(const unsigned* p, size_t words, unsigned tag, unsigned* errors) {
    for (size_t k = blockIdx.x * blockDim.x + threadIdx.x; k < words; k += gridDim.x * blockDim.x)
        if (p[k] != tag) { atomicAdd(errors, 1u); return; }
}

static cuheap_stats_t heap_stats(cuheap_device_heap_t* h) {
    cuheap_stats_t s;
    CHECK(cuheap_device_heap_get_stats(h, &s));
    return s;
}

static unsigned long long xorshift(unsigned long long* x) {
    *x ^= *x << 13; *x ^= *x >> 7; *x ^= *x << 17; return *x;
}

// The pool benchmark's threaded case (`cuheap bench host`): per thread,
// its own stream, alloc/free pairs of 256 B..64 KiB with up to 64 live.
// Completed pairs (a free) per second; failed calls counted.
static double pairs_per_s(cuheap_pool_t* pool, int threads, int pairs, unsigned long long* failed) {
    std::vector<cudaStream_t> streams(threads);
    for (auto& s : streams) CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::atomic<unsigned long long> done{0}, bad{0};
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; t++) {
        ts.emplace_back([&, t] {
            cudaSetDevice(0);
            unsigned long long rng = 0x9E3779B97F4A7C15ull ^ (unsigned long long)t;
            std::vector<void*> live; live.reserve(64);
            unsigned long long completed = 0, failures = 0;
            ready++;
            while (!go.load()) {}
            for (int i = 0; i < pairs; i++) {
                size_t sz = 256 + (size_t)(xorshift(&rng) % (64u << 10));
                void* p;
                if (cuheap_pool_alloc(pool, sz, streams[t], &p) == CUHEAP_OK) live.push_back(p); else failures++;
                if (live.size() >= 64) {
                    size_t k = (size_t)(xorshift(&rng) % live.size());
                    void* q = live[k]; live[k] = live.back(); live.pop_back();
                    if (cuheap_pool_free(pool, q, streams[t]) == CUHEAP_OK) completed++; else failures++;
                }
            }
            for (void* q : live)
                if (cuheap_pool_free(pool, q, streams[t]) == CUHEAP_OK) completed++; else failures++;
            done += completed; bad += failures;
        });
    }
    while (ready.load() < threads) {}
    auto t0 = std::chrono::steady_clock::now();
    go = true;
    for (auto& t : ts) t.join();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (auto& s : streams) { CHECK(cuheap_pool_release_stream(pool, s)); CHECK_CUDA(cudaStreamDestroy(s)); }
    *failed = bad.load();
    return done.load() / secs;
}

int main() {
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(0));  // the runtime's primary context, current

    // --- Bad input: codes and messages, never a crash.
    void* p = (void*)1;
    EXPECT(cuheap_pool_alloc(nullptr, 64, 0, &p) == CUHEAP_ERROR_INVALID && p == nullptr,
           "NULL pool: want CUHEAP_ERROR_INVALID and *out NULL");
    EXPECT(std::strstr(cuheap_last_error(), "the pool is NULL") != nullptr, "message: %s", cuheap_last_error());
    cuheap_stats_t st;
    EXPECT(cuheap_device_heap_get_stats(nullptr, &st) == CUHEAP_ERROR_INVALID, "NULL heap");
    cuheap_device_heap_t* none = (cuheap_device_heap_t*)1;
    EXPECT(cuheap_device_heap_create(0, 0, &none) == CUHEAP_ERROR_INVALID && none == nullptr, "heap of 0 bytes");
    EXPECT(cuheap_device_heap_install(nullptr, 0) == CUHEAP_ERROR_INVALID, "installing a NULL heap");

    // --- A device heap from the host: 64 MiB usable, up to 4 GiB.
    cuheap_device_heap_t* heap;
    CHECK(cuheap_device_heap_create(64ull << 20, 4ull << 30, &heap));
    CHECK(cuheap_device_heap_install(heap, 0));
    const unsigned n = 1u << 20;
    unsigned** ptrs; unsigned* errors; unsigned h_err[2];
    CHECK_CUDA(cudaMalloc(&ptrs, n * sizeof(void*)));
    CHECK_CUDA(cudaMalloc(&errors, 2 * sizeof(unsigned)));
    CHECK_CUDA(cudaMemset(errors, 0, 2 * sizeof(unsigned)));

    // 1M threads need about 0.9 GiB: in 64 MiB most get NULL, counted.
    alloc_fill<<<n / 256, 256>>>(n, ptrs, errors);
    CHECK_CUDA(cudaMemcpy(h_err, errors, sizeof h_err, cudaMemcpyDeviceToHost));
    st = heap_stats(heap);
    std::printf("64 MiB heap: %u of %u threads got NULL; failed_allocs %llu, %llu bytes short\n",
                h_err[0], n, st.failed_allocs, st.failed_bytes);
    EXPECT(h_err[0] > 0 && st.failed_allocs == h_err[0] && st.failed_bytes > 0,
           "a short heap: NULLs counted in failed_allocs and failed_bytes");
    check_free<<<n / 256, 256>>>(n, ptrs, errors);
    CHECK_CUDA(cudaMemcpy(h_err, errors, sizeof h_err, cudaMemcpyDeviceToHost));
    EXPECT(h_err[1] == 0, "%u damaged blocks", h_err[1]);
    st = heap_stats(heap);
    EXPECT(st.blocks_in_use == 0 && st.bytes_in_use == 0, "after the frees: %llu blocks in use", st.blocks_in_use);

    // Grown between launches (by what ran short, and room to spare), the
    // same launch succeeds whole.
    size_t usable = 0;
    CHECK(cuheap_device_heap_capacity(heap, &usable));
    CHECK(cuheap_device_heap_grow(heap, usable + 2 * st.failed_bytes, &usable));
    std::printf("grown to %zu MiB\n", usable >> 20);
    CHECK_CUDA(cudaMemset(errors, 0, 2 * sizeof(unsigned)));
    alloc_fill<<<n / 256, 256>>>(n, ptrs, errors);
    CHECK_CUDA(cudaMemcpy(h_err, errors, sizeof h_err, cudaMemcpyDeviceToHost));
    st = heap_stats(heap);
    EXPECT(h_err[0] == 0 && st.blocks_in_use == n, "after growth: %u NULLs, %llu blocks in use", h_err[0],
           st.blocks_in_use);
    check_free<<<n / 256, 256>>>(n, ptrs, errors);
    CHECK_CUDA(cudaMemcpy(h_err, errors, sizeof h_err, cudaMemcpyDeviceToHost));
    EXPECT(h_err[1] == 0, "%u damaged blocks", h_err[1]);
    st = heap_stats(heap);
    EXPECT(st.blocks_in_use == 0 && st.bytes_in_use == 0, "at the end: %llu blocks, %llu bytes in use",
           st.blocks_in_use, st.bytes_in_use);
    EXPECT(cuheap_device_heap_grow(heap, 8ull << 30, nullptr) == CUHEAP_ERROR_INVALID, "growth past max");
    size_t mapped = 0;
    CHECK(cuheap_device_heap_trim(heap, 0, &mapped));
    std::printf("device heap: 1M threads twice, statistics back to zero, trimmed from %zu to %zu MiB\n",
                usable >> 20, mapped >> 20);
    EXPECT(mapped < usable, "trim gave nothing back");

    // Grown while the kernel runs: a host thread answers the threads that
    // find the trimmed heap short, and the same launch succeeds whole.
    // Synchronise before copying: a cudaMemcpy queued behind a kernel
    // that waits for growth holds up the service until the kernel ends.
    CHECK(cuheap_device_heap_serve(heap, 0));
    EXPECT(cuheap_device_heap_serve(heap, 0) == CUHEAP_ERROR_INVALID, "a second growth service");
    CHECK_CUDA(cudaMemset(errors, 0, 2 * sizeof(unsigned)));
    alloc_fill<<<n / 256, 256>>>(n, ptrs, errors);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(h_err, errors, sizeof h_err, cudaMemcpyDeviceToHost));
    st = heap_stats(heap);
    size_t served = 0;
    CHECK(cuheap_device_heap_capacity(heap, &served));
    EXPECT(h_err[0] == 0 && st.blocks_in_use == n, "grown in the launch: %u NULLs, %llu blocks in use", h_err[0],
           st.blocks_in_use);
    check_free<<<n / 256, 256>>>(n, ptrs, errors);
    CHECK_CUDA(cudaMemcpy(h_err, errors, sizeof h_err, cudaMemcpyDeviceToHost));
    EXPECT(h_err[1] == 0, "%u damaged blocks after growth in the launch", h_err[1]);
    CHECK(cuheap_device_heap_stop_serving(heap));
    std::printf("device heap: 1M threads from %zu MiB, grown to %zu MiB while the kernel ran\n", mapped >> 20,
                served >> 20);
    EXPECT(served > mapped, "the heap did not grow in the launch");

    // Given back in stream order while the heap stays in use: growth in
    // 8 MiB pieces, 1M blocks, all but the first sixteenth freed on a
    // stream, then a trim queued on that stream behind the frees (the
    // host does not wait for it). The pieces no block uses go back to the
    // device; the kept blocks stay where they are.
    size_t piece = 0;
    auto t0 = std::chrono::steady_clock::now();
    CHECK(cuheap_device_heap_set_growth_piece(heap, 8ull << 20, &piece));  // loads the upkeep kernels
    double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT(piece == 8ull << 20, "pieces of %zu bytes", piece);
    CHECK(cuheap_device_heap_trim(heap, 64ull << 20, &mapped));
    CHECK(cuheap_device_heap_grow(heap, served, &usable));
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreate(&s));
    CHECK_CUDA(cudaMemsetAsync(errors, 0, 2 * sizeof(unsigned), s));
    alloc_fill<<<n / 256, 256, 0, s>>>(n, ptrs, errors);
    check_free_from<<<n / 256, 256, 0, s>>>(n, n / 16, ptrs, errors);
    size_t free_before = 0, free_after = 0, total = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_before, &total));
    CHECK(cuheap_device_heap_trim_on(heap, s, 0));
    CHECK_CUDA(cudaStreamSynchronize(s));
    size_t freed = 0, left = 0;
    CHECK(cuheap_device_heap_finish_trims(heap, 0, &freed));
    CHECK_CUDA(cudaMemGetInfo(&free_after, &total));
    CHECK(cuheap_device_heap_capacity(heap, &left));
    CHECK_CUDA(cudaMemcpy(h_err, errors, sizeof h_err, cudaMemcpyDeviceToHost));
    EXPECT(h_err[0] == 0 && h_err[1] == 0, "before the trim: %u NULLs, %u damaged blocks", h_err[0], h_err[1]);
    EXPECT(freed >= usable / 4 && left + freed == usable, "the trim on a stream gave back %zu of %zu bytes, %zu left",
           freed, usable, left);
    EXPECT(free_after >= free_before + freed / 2, "the device got %zu of the %zu bytes back",
           free_after > free_before ? free_after - free_before : 0, freed);
    check_free<<<n / 256, 256, 0, s>>>(n, ptrs, errors);
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemcpy(h_err, errors, sizeof h_err, cudaMemcpyDeviceToHost));
    EXPECT(h_err[1] == 0, "%u kept blocks damaged after the trim", h_err[1]);
    // Growth maps the holes again: the whole launch fits once more, every
    // block below the end the heap had before the trim.
    size_t regrown = 0;
    CHECK(cuheap_device_heap_grow(heap, usable, &regrown));
    cuheap_heap_desc_t desc;
    CHECK(cuheap_device_heap_desc(heap, &desc));
    CHECK_CUDA(cudaMemsetAsync(errors, 0, 2 * sizeof(unsigned), s));
    alloc_fill<<<n / 256, 256, 0, s>>>(n, ptrs, errors);
    std::vector<unsigned*> got(n);
    CHECK_CUDA(cudaMemcpyAsync(got.data(), ptrs, n * sizeof(void*), cudaMemcpyDeviceToHost, s));
    check_free<<<n / 256, 256, 0, s>>>(n, ptrs, errors);
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemcpy(h_err, errors, sizeof h_err, cudaMemcpyDeviceToHost));
    const char* end = static_cast<const char*>(desc.data) + usable;
    size_t past = 0;
    for (unsigned* p : got) past += reinterpret_cast<const char*>(p) >= end;
    EXPECT(h_err[0] == 0 && h_err[1] == 0 && past == 0,
           "after the holes were mapped again: %u NULLs, %u damaged blocks, %zu blocks past the old end", h_err[0],
           h_err[1], past);
    CHECK_CUDA(cudaStreamDestroy(s));
    std::printf("device heap: grown in %zu MiB pieces to %zu MiB (the first set_growth_piece took %.1f ms); with "
                "a sixteenth of 1M blocks kept, a trim on a stream gave back %zu MiB (the device's free memory rose "
                "by %zu MiB); grown again to %zu MiB\n",
                piece >> 20, usable >> 20, load_ms, freed >> 20,
                (free_after > free_before ? free_after - free_before : 0) >> 20, regrown >> 20);

    // --- Two more heaps, used by handle (no install): one per data
    // structure, each with its own counts.
    cuheap_device_heap_t *ha, *hb;
    CHECK(cuheap_device_heap_create(64ull << 20, 0, &ha));
    CHECK(cuheap_device_heap_create(64ull << 20, 0, &hb));
    cuheap_heap_t a, b2;
    CHECK(cuheap_device_heap_handle(ha, &a));
    CHECK(cuheap_device_heap_handle(hb, &b2));
    EXPECT(cuheap_device_heap_handle(nullptr, &a) == CUHEAP_ERROR_INVALID, "handle of a NULL heap");
    const unsigned m = 1u << 16;
    unsigned** pb; CHECK_CUDA(cudaMalloc(&pb, m * sizeof(void*)));
    CHECK_CUDA(cudaFree(errors));
    CHECK_CUDA(cudaMalloc(&errors, 3 * sizeof(unsigned)));
    CHECK_CUDA(cudaMemset(errors, 0, 3 * sizeof(unsigned)));
    two_heaps_alloc<<<m / 256, 256>>>(a, b2, m, ptrs, pb, errors);
    cuheap_counts_t ca, cb;
    CHECK(cuheap_device_heap_get_counts(ha, &ca));
    CHECK(cuheap_device_heap_get_counts(hb, &cb));
    st = heap_stats(ha);
    EXPECT(ca.allocs == m && ca.frees == 0 && cb.allocs == m && st.blocks_in_use == m &&
           st.bytes_in_use == 64ull * m && ca.bytes_reserved == st.bytes_reserved &&
           heap_stats(hb).bytes_in_use == 256ull * m,
           "two heaps after the allocations: a %llu allocs, b %llu allocs, a %llu bytes in use", ca.allocs,
           cb.allocs, st.bytes_in_use);
    two_heaps_free<<<m / 256, 256>>>(a, b2, m, ptrs, pb, errors);
    cuheap_counts_t* d_counts; int* d_rc; int h_rc = -1;
    CHECK_CUDA(cudaMalloc(&d_counts, 2 * sizeof(cuheap_counts_t)));
    CHECK_CUDA(cudaMalloc(&d_rc, sizeof(int)));
    handle_checks<<<1, 1>>>(a, d_counts, d_rc, errors);
    cuheap_counts_t dev_a;
    CHECK_CUDA(cudaMemcpy(&dev_a, d_counts, sizeof dev_a, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(&h_rc, d_rc, sizeof h_rc, cudaMemcpyDeviceToHost));
    CHECK(cuheap_device_heap_get_counts(ha, &ca));
    CHECK(cuheap_device_heap_get_counts(hb, &cb));
    unsigned h_err3[3];
    CHECK_CUDA(cudaMemcpy(h_err3, errors, sizeof h_err3, cudaMemcpyDeviceToHost));
    EXPECT(h_err3[0] == 0 && h_err3[1] == 0 && h_err3[2] == 0, "two heaps: %u NULLs, %u damaged, %u bad answers",
           h_err3[0], h_err3[1], h_err3[2]);
    EXPECT(ca.frees == m && ca.bad_frees == 1 && cb.frees == m && cb.bad_frees == 0 &&
           ca.peak_bytes_reserved >= st.bytes_reserved,
           "two heaps after the frees: a %llu frees %llu bad, b %llu frees %llu bad", ca.frees, ca.bad_frees,
           cb.frees, cb.bad_frees);
    EXPECT(h_rc == CUHEAP_OK && std::memcmp(&dev_a, &ca, sizeof ca) == 0,
           "counts read on the device and on the host differ");
    std::printf("two heaps by handle: %u blocks each, counts a %llu/%llu (1 foreign free refused), b %llu/%llu, "
                "peak %llu KiB\n", m, ca.allocs, ca.frees, cb.allocs, cb.frees, ca.peak_bytes_reserved >> 10);
    // A heap that a kernel makes from memory the program owns.
    size_t own_data = 4u << 20;
    void *own_meta_p, *own_data_p;
    unsigned long long own_meta = 1u << 20;  // more than 4 MiB and 4 slots need
    CHECK_CUDA(cudaMalloc(&own_meta_p, own_meta));
    CHECK_CUDA(cudaMemset(own_meta_p, 0, own_meta));
    CHECK_CUDA(cudaMalloc(&own_data_p, own_data + 65536));
    void* aligned = (void*)(((size_t)own_data_p + 65535) & ~(size_t)65535);
    own_heap<<<1, 1>>>(own_meta_p, own_meta, aligned, own_data, errors);
    CHECK_CUDA(cudaMemcpy(h_err3, errors, sizeof h_err3, cudaMemcpyDeviceToHost));
    EXPECT(h_err3[2] == 0, "a heap made in a kernel: %u bad answers", h_err3[2]);
    CHECK_CUDA(cudaFree(own_meta_p));
    CHECK_CUDA(cudaFree(own_data_p));
    CHECK_CUDA(cudaFree(d_counts));
    CHECK_CUDA(cudaFree(d_rc));
    CHECK_CUDA(cudaFree(pb));
    CHECK(cuheap_device_heap_destroy(ha));
    CHECK(cuheap_device_heap_destroy(hb));

    // --- The pool on cudaStream_t: fill on one stream, check on another,
    // free there; blocks move between streams with no host wait.
    cuheap_pool_t* pool;
    CHECK(cuheap_pool_create(nullptr, &pool));
    cudaStream_t s1, s2;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t filled;
    CHECK_CUDA(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming));
    unsigned* bad; CHECK_CUDA(cudaMalloc(&bad, sizeof(unsigned)));
    CHECK_CUDA(cudaMemset(bad, 0, sizeof(unsigned)));
    unsigned long long rng = 42;
    for (unsigned i = 0; i < 2000; i++) {
        size_t bytes = 256 + (size_t)(xorshift(&rng) % (1u << 20));
        void* b;
        CHECK(cuheap_pool_alloc(pool, bytes, i % 2 ? s2 : s1, &b));
        cudaStream_t mine = i % 2 ? s2 : s1, other = i % 2 ? s1 : s2;
        fill<<<32, 256, 0, mine>>>((unsigned*)b, bytes / 4, i);
        CHECK_CUDA(cudaEventRecord(filled, mine));
        CHECK_CUDA(cudaStreamWaitEvent(other, filled, 0));
        check<<<32, 256, 0, other>>>((unsigned*)b, bytes / 4, i, bad);
        CHECK(cuheap_pool_free(pool, b, other));
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    unsigned h_bad = 0;
    CHECK_CUDA(cudaMemcpy(&h_bad, bad, sizeof h_bad, cudaMemcpyDeviceToHost));
    EXPECT(h_bad == 0, "pool blocks: %u damaged", h_bad);
    // Bad input on a live pool.
    void* b;
    EXPECT(cuheap_pool_alloc(pool, 0, s1, &b) == CUHEAP_ERROR_INVALID && b == nullptr, "size 0");
    EXPECT(cuheap_pool_alloc(pool, (size_t)1 << 62, s1, &b) == CUHEAP_ERROR_OUT_OF_MEMORY && b == nullptr,
           "2^62 bytes: want CUHEAP_ERROR_OUT_OF_MEMORY");
    CHECK(cuheap_pool_alloc(pool, 4096, s1, &b));
    CHECK(cuheap_pool_free(pool, b, s1));
    EXPECT(cuheap_pool_free(pool, b, s1) == CUHEAP_ERROR_INVALID, "double free");
    EXPECT(cuheap_pool_free(pool, bad, s1) == CUHEAP_ERROR_INVALID, "foreign pointer");
    EXPECT(cuheap_pool_free(pool, nullptr, s1) == CUHEAP_OK, "free(NULL) does nothing");
    EXPECT(cuheap_pool_alloc(pool, 64, cudaStreamPerThread, &b) == CUHEAP_ERROR_INVALID && b == nullptr,
           "cudaStreamPerThread is refused");
    cuheap_pool_stats_t ps;
    CHECK(cuheap_pool_get_stats(pool, &ps));
    std::printf("pool: %llu allocs, %llu frees, %llu in use, %llu reused on their stream, %llu across streams, "
                "%llu bad frees, %llu MiB mapped\n", ps.allocs, ps.frees, ps.in_use, ps.same_stream_reuse,
                ps.cross_stream_reuse, ps.bad_frees, ps.reserved >> 20);
    EXPECT(ps.in_use == 0 && ps.bad_frees == 2 && ps.allocs == 2001 && ps.frees == 2001,
           "pool statistics after the frees");
    CHECK(cuheap_pool_release_stream(pool, s1));
    CHECK(cuheap_pool_release_stream(pool, s2));

    // --- What a call costs: the pool benchmark's threaded case.
    for (int threads : {1, 8}) {
        unsigned long long failed = 0;
        double r = pairs_per_s(pool, threads, 200000, &failed);
        std::printf("C API, %d thread%s (own stream each), 256 B..64 KiB: %.2f M pairs/s, %.1f ns per pair "
                    "per thread, %llu failed calls\n", threads, threads > 1 ? "s" : "", r / 1e6,
                    1e9 * threads / r, failed);
        EXPECT(failed == 0, "%llu failed calls", failed);
    }
    CHECK(cuheap_pool_trim(pool, 0, &mapped));
    CHECK(cuheap_pool_destroy(pool));
    CHECK(cuheap_device_heap_destroy(heap));
    CHECK_CUDA(cudaDeviceSynchronize());
    if (failures) { std::printf("cuheap host API example: %d checks FAILED\n", failures); return 1; }
    std::printf("cuheap host API example: OK\n");
    return 0;
}

// cuheap from CUDA C++: a heap over memory the program owns, 1M threads
// that allocate, fill, check and free, bad input through the C API, and
// CUB and Thrust in the same program (they need cuheap's device library
// built with this toolkit's PTX ISA: `cuheap device-lib`).
//
//   nvcc -arch=sm_90 -rdc=true -maxrregcount=64 -c cuheap_device.ptx -o cuheap_device.o
//   nvcc -arch=sm_90 -lib cuheap_device.o -o libcuheap_device.a
//   nvcc -arch=sm_90 -rdc=true -I../../include main.cu -L. -lcuheap_device -o cuheap_example
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>
#include <cub/device/device_scan.cuh>
#include <thrust/device_vector.h>
#include <thrust/sort.h>
#include <thrust/sequence.h>
#include <thrust/fill.h>
#include <thrust/functional.h>
#include "cuheap.h"

static int failures = 0;
#define CHECK_CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); std::exit(1); } } while (0)
#define EXPECT(c, ...) do { if (!(c)) { std::printf("FAILED: " __VA_ARGS__); std::printf("\n"); failures++; } } while (0)

__global__ void meta_bytes(unsigned long long data, unsigned slots, unsigned long long* out) {
    *out = cuheap_meta_bytes(data, slots);
}
__global__ void init(void* meta, unsigned long long mb, void* data, unsigned long long db,
                     unsigned slots, int* rc) {
    *rc = cuheap_init(meta, mb, data, db, slots);
}
__global__ void stats(cuheap_stats_t* s, int* rc) { *rc = cuheap_get_stats(s); }

// Before a heap is set: NULL, and stats refuse.
__global__ void no_heap(int* out) {
    out[0] = cuheap_malloc(64) == nullptr;
    cuheap_stats_t s;
    out[1] = cuheap_get_stats(&s) == CUHEAP_ERROR_INVALID;
}

// Size 0, bad alignments, a double free and a foreign pointer.
__global__ void bad_input(int* out, unsigned* foreign) {
    out[0] = cuheap_malloc(0) == nullptr;
    out[1] = cuheap_aligned_alloc(3, 64) == nullptr;
    out[2] = cuheap_aligned_alloc(1 << 17, 64) == nullptr;
    void* a = cuheap_aligned_alloc(4096, 100);
    out[3] = a != nullptr && (reinterpret_cast<size_t>(a) % 4096) == 0;
    cuheap_free(a);
    cuheap_free(a);        // double free: refused, counted
    cuheap_free(foreign);  // not the heap's: refused, counted
    cuheap_free(nullptr);  // nothing
}

// Every thread: a block of 16..4096 bytes, filled with its id, checked.
__global__ void alloc_fill(unsigned n, unsigned** ptrs, unsigned* errors) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned size = 16u << (i % 9);
    unsigned* p = static_cast<unsigned*>(cuheap_malloc(size));
    ptrs[i] = p;
    if (p == nullptr) { atomicAdd(&errors[0], 1u); return; }
    if (reinterpret_cast<size_t>(p) % 16 != 0) atomicAdd(&errors[1], 1u);
    for (unsigned k = 0; k < size / 4; k++) p[k] = i;
}
__global__ void check_free(unsigned n, unsigned** ptrs, unsigned* errors) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || ptrs[i] == nullptr) return;
    unsigned size = 16u << (i % 9);
    for (unsigned k = 0; k < size / 4; k++)
        if (ptrs[i][k] != i) { atomicAdd(&errors[1], 1u); break; }
    cuheap_free(ptrs[i]);
}

// The benchmark shape: allocate 16 B, write, read back, free.
__global__ void pair16(unsigned n, unsigned* errors) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned* p = static_cast<unsigned*>(cuheap_malloc(16));
    if (p == nullptr) { atomicAdd(&errors[0], 1u); return; }
    p[0] = i; p[3] = ~i;
    __threadfence();
    if (p[0] != i || p[3] != ~i) atomicAdd(&errors[1], 1u);
    cuheap_free(p);
}

// The benchmark's other two shapes: allocate 16 B and keep the pointer;
// free what the first kept.
__global__ void alloc16(unsigned n, void** ptrs, unsigned* errors) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    void* p = cuheap_malloc(16);
    if (p == nullptr) atomicAdd(&errors[0], 1u);
    ptrs[i] = p;
}
__global__ void free16(unsigned n, void** ptrs) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) cuheap_free(ptrs[i]);
}

static cuheap_stats_t read_stats() {
    cuheap_stats_t* d; int* rc; cuheap_stats_t h; int r;
    CHECK_CUDA(cudaMalloc(&d, sizeof h)); CHECK_CUDA(cudaMalloc(&rc, sizeof r));
    stats<<<1, 1>>>(d, rc);
    CHECK_CUDA(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(&r, rc, sizeof r, cudaMemcpyDeviceToHost));
    cudaFree(d); cudaFree(rc);
    EXPECT(r == CUHEAP_OK, "cuheap_get_stats returned %d", r);
    return h;
}

int main() {
    int dev = 0, sms = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int* flags; CHECK_CUDA(cudaMalloc(&flags, 8 * sizeof(int)));
    int h_flags[8];

    no_heap<<<1, 1>>>(flags);
    CHECK_CUDA(cudaMemcpy(h_flags, flags, 2 * sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(h_flags[0] && h_flags[1], "before cuheap_init: malloc must be NULL, stats refused");

    // The heap: 1 GiB of data, zeroed metadata.
    const unsigned long long data_bytes = 1ull << 30;
    unsigned long long* d_mb; unsigned long long mb = 0;
    CHECK_CUDA(cudaMalloc(&d_mb, sizeof mb));
    meta_bytes<<<1, 1>>>(data_bytes, sms, d_mb);
    CHECK_CUDA(cudaMemcpy(&mb, d_mb, sizeof mb, cudaMemcpyDeviceToHost));
    EXPECT(mb > 0, "cuheap_meta_bytes returned 0");
    void* meta; char* raw;
    CHECK_CUDA(cudaMalloc(&meta, mb));
    CHECK_CUDA(cudaMemset(meta, 0, mb));
    CHECK_CUDA(cudaMalloc(&raw, data_bytes + (64 << 10)));
    char* data = reinterpret_cast<char*>((reinterpret_cast<size_t>(raw) + 0xFFFF) & ~size_t(0xFFFF));
    int* rc; int h_rc;
    CHECK_CUDA(cudaMalloc(&rc, sizeof(int)));
    init<<<1, 1>>>(meta, mb, data + 16, data_bytes, sms, rc);  // misaligned
    CHECK_CUDA(cudaMemcpy(&h_rc, rc, sizeof h_rc, cudaMemcpyDeviceToHost));
    EXPECT(h_rc == CUHEAP_ERROR_INVALID, "misaligned data: cuheap_init returned %d", h_rc);
    init<<<1, 1>>>(meta, mb - 1, data, data_bytes, sms, rc);  // metadata too small
    CHECK_CUDA(cudaMemcpy(&h_rc, rc, sizeof h_rc, cudaMemcpyDeviceToHost));
    EXPECT(h_rc == CUHEAP_ERROR_INVALID, "short metadata: cuheap_init returned %d", h_rc);
    init<<<1, 1>>>(meta, mb, data, data_bytes, sms, rc);
    CHECK_CUDA(cudaMemcpy(&h_rc, rc, sizeof h_rc, cudaMemcpyDeviceToHost));
    EXPECT(h_rc == CUHEAP_OK, "cuheap_init returned %d", h_rc);

    unsigned* foreign; CHECK_CUDA(cudaMalloc(&foreign, 64));
    bad_input<<<1, 1>>>(flags, foreign);
    CHECK_CUDA(cudaMemcpy(h_flags, flags, 4 * sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(h_flags[0], "size 0 must give NULL");
    EXPECT(h_flags[1] && h_flags[2], "bad alignments must give NULL");
    EXPECT(h_flags[3], "cuheap_aligned_alloc(4096, 100) must be 4096-aligned");
    cuheap_stats_t s = read_stats();
    EXPECT(s.bad_frees == 2, "double and foreign frees: bad_frees %llu, want 2", s.bad_frees);
    EXPECT(s.blocks_in_use == 0, "after bad input: %llu blocks in use", s.blocks_in_use);

    // 1M threads: allocate 16..4096 B, fill, check, free.
    const unsigned n = 1u << 20;
    unsigned** ptrs; unsigned* errors; unsigned h_err[2];
    CHECK_CUDA(cudaMalloc(&ptrs, n * sizeof(void*)));
    CHECK_CUDA(cudaMalloc(&errors, 2 * sizeof(unsigned)));
    CHECK_CUDA(cudaMemset(errors, 0, 2 * sizeof(unsigned)));
    alloc_fill<<<n / 256, 256>>>(n, ptrs, errors);
    CHECK_CUDA(cudaGetLastError());
    s = read_stats();
    EXPECT(s.blocks_in_use == n, "%llu blocks in use, want %u", s.blocks_in_use, n);
    check_free<<<n / 256, 256>>>(n, ptrs, errors);
    CHECK_CUDA(cudaMemcpy(h_err, errors, sizeof h_err, cudaMemcpyDeviceToHost));
    EXPECT(h_err[0] == 0 && h_err[1] == 0, "1M threads: %u nulls, %u bad blocks", h_err[0], h_err[1]);
    s = read_stats();
    EXPECT(s.blocks_in_use == 0 && s.bytes_in_use == 0, "after free: %llu blocks, %llu bytes in use",
           s.blocks_in_use, s.bytes_in_use);

    // 1M x 16 B: the pair kernel (alloc + free), then alloc alone and
    // free alone; CUDA events, median of 7 after a warm-up. A timed alloc
    // is followed by an untimed free and a timed free follows an untimed
    // alloc, so every alloc starts from an empty heap.
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    void** kept = reinterpret_cast<void**>(ptrs);
    auto pair = [&] { pair16<<<n / 256, 256>>>(n, errors); };
    auto alloc = [&] { alloc16<<<n / 256, 256>>>(n, kept, errors); };
    auto release = [&] { free16<<<n / 256, 256>>>(n, kept); };
    auto median_ms = [&](auto before, auto timed, auto after) {
        std::vector<float> ms;
        for (int r = 0; r < 8; r++) {
            before();
            cudaEventRecord(a);
            timed();
            cudaEventRecord(b);
            after();
            cudaEventSynchronize(b);
            float t; cudaEventElapsedTime(&t, a, b);
            if (r > 0) ms.push_back(t);  // the first is the warm-up
        }
        std::sort(ms.begin(), ms.end());
        return ms[3];
    };
    auto nothing = [] {};
    float pair_ms = median_ms(nothing, pair, nothing);
    float alloc_ms = median_ms(nothing, alloc, release);
    float free_ms = median_ms(alloc, release, nothing);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(h_err, errors, sizeof h_err, cudaMemcpyDeviceToHost));
    EXPECT(h_err[0] == 0 && h_err[1] == 0, "16 B kernels: %u nulls, %u errors", h_err[0], h_err[1]);
    cudaFuncAttributes pair_attr, alloc_attr, free_attr;
    CHECK_CUDA(cudaFuncGetAttributes(&pair_attr, pair16));
    CHECK_CUDA(cudaFuncGetAttributes(&alloc_attr, alloc16));
    CHECK_CUDA(cudaFuncGetAttributes(&free_attr, free16));
    std::printf("1M x 16 B through the library, median of 7 (ms): pair %.3f (%d registers), "
                "alloc %.3f (%d registers), free %.3f (%d registers)\n",
                pair_ms, pair_attr.numRegs, alloc_ms, alloc_attr.numRegs, free_ms, free_attr.numRegs);

    // CUB and Thrust in the same program.
    thrust::device_vector<int> v(n);
    thrust::fill(v.begin(), v.end(), 1);
    thrust::device_vector<int> out(n);
    size_t temp = 0;
    CHECK_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, temp, v.data().get(), out.data().get(), (int)n));
    thrust::device_vector<char> tmp(temp);
    CHECK_CUDA(cub::DeviceScan::ExclusiveSum(tmp.data().get(), temp, v.data().get(), out.data().get(), (int)n));
    int last = out[n - 1];
    EXPECT(last == (int)n - 1, "CUB scan: %d, want %u", last, n - 1);
    thrust::sequence(v.begin(), v.end());
    thrust::sort(v.begin(), v.end(), thrust::greater<int>());
    EXPECT(v[0] == (int)n - 1, "Thrust sort: %d", (int)v[0]);

    s = read_stats();
    EXPECT(s.blocks_in_use == 0, "at the end: %llu blocks in use", s.blocks_in_use);
    CHECK_CUDA(cudaDeviceSynchronize());
    if (failures) { std::printf("cuheap example: %d checks FAILED\n", failures); return 1; }
    std::printf("cuheap example: OK (1M threads, bad input refused, CUB and Thrust ran)\n");
    return 0;
}

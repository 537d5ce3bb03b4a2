// A CUDA C++ kernel using cuheap's device heap through its C ABI.
// Build: nvcc -rdc=true -ptx -arch=sm_80 demo.cu -o demo.ptx, then JIT-link
// demo.ptx with cuheap's PTX (Gpu::open_linked).
#include <cstddef>

extern "C" __device__ void* cuheap_malloc(size_t size);
extern "C" __device__ void cuheap_free(void* ptr);
extern "C" __device__ void* cuheap_realloc(void* ptr, size_t size);

extern "C" __global__ void capi_demo(unsigned n, unsigned* errors) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned* p = static_cast<unsigned*>(cuheap_malloc(64));
    if (p == nullptr) { atomicAdd(&errors[0], 1u); return; }
    for (int k = 0; k < 16; k++) p[k] = i * 16 + k;
    __threadfence();
    for (int k = 0; k < 16; k++) if (p[k] != i * 16 + k) atomicAdd(&errors[1], 1u);
    // 48 B still fit the 64 B block, and no block half its size would do:
    // in place. 200 B do not fit: moved, contents kept.
    if (cuheap_realloc(p, 48) != p) atomicAdd(&errors[1], 1u);
    unsigned* q = static_cast<unsigned*>(cuheap_realloc(p, 200));
    if (q == nullptr) { atomicAdd(&errors[0], 1u); cuheap_free(p); return; }
    for (int k = 0; k < 16; k++) if (q[k] != i * 16 + k) atomicAdd(&errors[1], 1u);
    // Size 0 is refused and leaves the block to free.
    if (cuheap_realloc(q, 0) != nullptr) atomicAdd(&errors[1], 1u);
    cuheap_free(q);
}

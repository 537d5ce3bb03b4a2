// CUDA C++ kernels that allocate through cuheap's C ABI (the module's
// heap, `cuheap_malloc`) on a heap that a host service grows while they
// run. Build: nvcc -rdc=true -ptx -arch=sm_80 grow.cu -o grow.ptx, then
// JIT-link with cuheap's PTX (cuheap::open_linked).
#include <cstddef>

extern "C" __device__ void* cuheap_malloc(size_t size);
extern "C" __device__ void cuheap_free(void* ptr);

// The size of thread i's block: mode 0 and 1, 16 << (i % 9) (every warp
// in nine classes, as examples/cuda-cpp/host_api.cu); mode 2, 1 KiB.
__device__ unsigned grow_size(unsigned i, unsigned mode) {
    return mode == 2 ? 1024u : 16u << (i % 9);
}

// Every thread: a block, filled whole with its id (mode 1: its first
// word only). NULLs counted in errors[0].
extern "C" __global__ void grow_fill(unsigned n, unsigned mode, unsigned** ptrs, unsigned* errors) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned size = grow_size(i, mode);
    unsigned* p = static_cast<unsigned*>(cuheap_malloc(size));
    ptrs[i] = p;
    if (p == nullptr) { atomicAdd(&errors[0], 1u); return; }
    unsigned words = mode == 1 ? 1u : size / 4;
    for (unsigned k = 0; k < words; k++) p[k] = i;
}

// Checks and frees what grow_fill left; damaged blocks in errors[1].
extern "C" __global__ void grow_check_free(unsigned n, unsigned mode, unsigned** ptrs, unsigned* errors) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || ptrs[i] == nullptr) return;
    unsigned words = mode == 1 ? 1u : grow_size(i, mode) / 4;
    for (unsigned k = 0; k < words; k++)
        if (ptrs[i][k] != i) { atomicAdd(&errors[1], 1u); break; }
    cuheap_free(ptrs[i]);
    ptrs[i] = nullptr;
}

// The least a PyTorch pluggable allocator can cost: a control for
// examples/pytorch/train.py (--floor-lib), not an allocator to use.
//
// Blocks are cut from one arena (cudaMalloc'd once) and kept after a free
// in a list per rounded size, reused last in, first out, whatever the
// stream: correct for the loops of train.py, whose work runs on one
// stream, and for nothing else. Memory is never returned.
//
//     nvcc -O2 -shared -Xcompiler -fPIC examples/pytorch/pluggable_floor.cpp -o libfloor.so
//
// What train.py measures with it: the time PyTorch's pluggable-allocator
// path takes around each call (its own bookkeeping), apart from what any
// allocator behind it does.
#include <cuda_runtime.h>
#include <sys/types.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {
std::mutex lock;
char* arena = nullptr;
size_t arena_bytes = 0, used = 0;
std::unordered_map<size_t, std::vector<void*>> cached;

size_t rounded(size_t n) { return (n + 511) & ~size_t(511); }
}  // namespace

extern "C" void* floor_alloc(ssize_t size, int device, cudaStream_t stream) {
    (void)device;
    (void)stream;
    if (size <= 0) return nullptr;
    size_t n = rounded(size_t(size));
    std::lock_guard<std::mutex> g(lock);
    auto& list = cached[n];
    if (!list.empty()) {
        void* p = list.back();
        list.pop_back();
        return p;
    }
    // PyTorch does not check the pointer a pluggable allocator returns:
    // stop rather than hand it NULL.
    if (arena == nullptr) {
        const char* env = std::getenv("FLOOR_ARENA_MIB");
        arena_bytes = size_t(env ? std::atoll(env) : 4096) << 20;
        if (cudaMalloc(&arena, arena_bytes) != cudaSuccess) {
            std::fprintf(stderr, "pluggable floor: cudaMalloc of the arena failed\n");
            std::abort();
        }
    }
    if (used + n > arena_bytes) {
        std::fprintf(stderr, "pluggable floor: the %zu MiB arena is used up\n", arena_bytes >> 20);
        std::abort();
    }
    void* p = arena + used;
    used += n;
    return p;
}

extern "C" void floor_free(void* ptr, ssize_t size, int device, cudaStream_t stream) {
    (void)device;
    (void)stream;
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> g(lock);
    cached[rounded(size_t(size))].push_back(ptr);
}

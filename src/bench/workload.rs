//! Benchmark workloads, shared so the kernels and the host agree on what
//! each thread asks for. Plain `no_std` code with no imports: the GPU
//! benchmark kernels compile this same file (`#[path]`), so the allocator's
//! core does not carry benchmark code.

/// The size thread `tid` allocates: `sz`, or when `sz == 0` a size fixed
/// per thread and uniform in 16..=4096 (the "mixed" workload).
#[inline(always)]
pub const fn thread_size(tid: u32, sz: u32) -> usize {
    if sz != 0 {
        return sz as usize;
    }
    let mut x = tid.wrapping_mul(0x9E37_79B9) ^ 0x85EB_CA6B;
    x ^= x >> 15;
    x = x.wrapping_mul(0x2C1B_3C6D);
    x ^= x >> 12;
    16 + (x % (4096 - 16 + 1)) as usize
}

//! Benchmark and test workloads, shared so the kernels and the host agree
//! on what each thread asks for. Plain `no_std` code with no imports: the GPU
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

/// A 32-bit mix of two words (the Vec and alignment workloads).
#[inline(always)]
pub const fn mix(a: u32, b: u32) -> u32 {
    let mut x = a.wrapping_mul(0x9E37_79B9) ^ b.wrapping_mul(0x85EB_CA6B) ^ 0x27D4_EB2F;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7FEB_352D);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846C_A68B);
    x ^ (x >> 16)
}

/// The churn workload: in round `round`, whether thread `tid` frees its
/// block and allocates another (every thread in round 0, about half of
/// them, chosen by hash, in each later round), and that block's size,
/// uniform in 16..=4096.
#[inline(always)]
pub const fn churn_case(tid: u32, round: u32) -> (bool, usize) {
    let x = mix(tid, 0xC0FF_EE00u32.wrapping_add(round));
    (
        round == 0 || x & 1 == 1,
        16 + ((x >> 1) % (4096 - 16 + 1)) as usize,
    )
}

/// The aligned-allocation workload: thread `tid` asks for `(size,
/// align)`, every power-of-two alignment from 1 B to 64 KiB (the page
/// size) in turn, sizes from 1 B to three times the alignment (at least
/// 4 KiB), so large alignments also take spans.
#[inline(always)]
pub const fn aligned_case(tid: u32) -> (usize, usize) {
    let align = 1usize << (tid % 17);
    let span = if 3 * align > 4096 { 3 * align } else { 4096 };
    (1 + mix(tid, 0xA11) as usize % span, align)
}

/// Steps of the realloc workload.
pub const REALLOC_STEPS: u32 = 8;

/// The realloc workload: the size of thread `tid`'s block after step
/// `step` (`0..=REALLOC_STEPS`; step 0 is the first allocation), and its
/// alignment (1 B to 4 KiB). Sizes go up and down, mostly under 4 KiB,
/// one step in 64 a span of up to 256 KiB.
#[inline(always)]
pub const fn realloc_case(tid: u32, step: u32) -> (usize, usize) {
    let x = mix(tid, 0x5EED + step);
    let size = if x.is_multiple_of(64) {
        65_537 + (x >> 6) as usize % (192 << 10)
    } else {
        1 + (x >> 6) as usize % 4096
    };
    (size, 1usize << (tid % 13))
}

/// The Vec workload: how many `u64`s thread `tid` pushes. Most threads
/// push up to 256 (2 KiB), one in 64 up to 16384 (128 KiB, grown through
/// spans), one in 16 none.
#[inline(always)]
pub const fn vec_len(tid: u32, seed: u32) -> u32 {
    let x = mix(tid, seed);
    match x % 64 {
        0 => (x >> 6) % 16_385,
        1..=4 => 0,
        _ => (x >> 6) % 257,
    }
}

/// The `k`-th value thread `tid` pushes.
#[inline(always)]
pub const fn vec_value(tid: u32, k: u32) -> u64 {
    ((mix(tid, k) as u64) << 32) | mix(k, tid ^ 0xFFFF) as u64
}

/// Folds one value into a checksum (order matters: a value out of place
/// changes it).
#[inline(always)]
pub const fn checksum_step(sum: u64, v: u64) -> u64 {
    (sum.rotate_left(7) ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The checksum of thread `tid`'s values in order, as the Vec kernel
/// computes it from what its `Vec` holds.
pub const fn vec_checksum(tid: u32, seed: u32) -> u64 {
    let mut sum = 0u64;
    let mut k = 0;
    while k < vec_len(tid, seed) {
        sum = checksum_step(sum, vec_value(tid, k));
        k += 1;
    }
    sum
}

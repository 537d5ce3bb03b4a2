//! The GPU's warp-level operations and special registers, in one place.

extern "C" {
    #[link_name = "llvm.nvvm.activemask"]
    fn nvvm_activemask() -> u32;
    #[link_name = "llvm.nvvm.match.any.sync.i32"]
    fn nvvm_match_any(mask: u32, v: i32) -> u32;
    #[link_name = "llvm.nvvm.match.any.sync.i64"]
    fn nvvm_match_any_64(mask: u32, v: i64) -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.idx.i32"]
    fn nvvm_shfl_idx(mask: u32, v: i32, src: i32, clamp: i32) -> i32;
    #[link_name = "llvm.nvvm.redux.sync.or"]
    fn nvvm_redux_or(v: i32, mask: u32) -> i32;
    #[link_name = "llvm.nvvm.read.ptx.sreg.smid"]
    fn nvvm_smid() -> u32;
    #[link_name = "llvm.nvvm.read.ptx.sreg.laneid"]
    fn nvvm_laneid() -> u32;
    #[link_name = "llvm.nvvm.read.ptx.sreg.warpid"]
    fn nvvm_warpid() -> u32;
    #[link_name = "llvm.nvvm.read.ptx.sreg.tid.x"]
    fn nvvm_tid_x() -> u32;
    #[link_name = "llvm.nvvm.read.ptx.sreg.ctaid.x"]
    fn nvvm_ctaid_x() -> u32;
    #[link_name = "llvm.nvvm.read.ptx.sreg.ntid.x"]
    fn nvvm_ntid_x() -> u32;
    #[link_name = "llvm.nvvm.read.ptx.sreg.nctaid.x"]
    fn nvvm_nctaid_x() -> u32;
    #[link_name = "llvm.nvvm.membar.gl"]
    fn nvvm_membar_gl();
    #[link_name = "llvm.nvvm.shfl.sync.up.i32"]
    fn nvvm_shfl_up(mask: u32, v: i32, delta: i32, clamp: i32) -> i32;
    #[link_name = "llvm.nvvm.bar.warp.sync"]
    fn nvvm_bar_warp_sync(mask: u32);
    #[link_name = "llvm.nvvm.barrier0"]
    fn nvvm_barrier0();
    #[link_name = "llvm.nvvm.vote.ballot.sync"]
    fn nvvm_ballot(mask: u32, pred: bool) -> u32;
}

// The block's dynamic shared memory (the launch's `shared_bytes`), declared
// once for the module, as CUDA C++'s `extern __shared__` arrays are.
#[cfg(feature = "bench")]
core::arch::global_asm!(".extern .shared .align 16 .b8 cuheap_dynamic_shared[];");

/// Lanes of the calling warp that are executing this instruction: a mask
/// that the `.sync` operations below may take, on a path all of those
/// lanes follow.
#[inline(always)]
pub fn activemask() -> u32 {
    // SAFETY: reads a warp register; no memory effects.
    unsafe { nvvm_activemask() }
}

/// Lanes of `mask` whose `v` equals the caller's (`match.any.sync`).
///
/// # Safety
///
/// Every lane in `mask` executes this same call (the `.sync` contract:
/// otherwise the result is undefined and the warp may hang), and the
/// calling lane is in `mask`.
#[inline(always)]
pub unsafe fn match_any(mask: u32, v: u32) -> u32 {
    // SAFETY: forwarded from the caller.
    unsafe { nvvm_match_any(mask, v as i32) }
}

/// [`match_any`] on a 64-bit value.
///
/// # Safety
///
/// As for [`match_any`].
#[inline(always)]
pub unsafe fn match_any_64(mask: u32, v: u64) -> u32 {
    // SAFETY: forwarded from the caller.
    unsafe { nvvm_match_any_64(mask, v as i64) }
}

/// `v` of lane `src`, for every lane of `mask` (`shfl.sync.idx`).
///
/// # Safety
///
/// As for [`match_any`]; `src` is a lane of `mask`.
#[inline(always)]
pub unsafe fn shfl(mask: u32, v: u32, src: u32) -> u32 {
    // SAFETY: forwarded from the caller.
    unsafe { nvvm_shfl_idx(mask, v as i32, src as i32, 0x1f) as u32 }
}

/// Bitwise OR of `v` over the lanes of `mask` (`redux.sync.or`, sm_80
/// and newer).
///
/// # Safety
///
/// As for [`match_any`].
#[inline(always)]
pub unsafe fn reduce_or(mask: u32, v: u32) -> u32 {
    // SAFETY: forwarded from the caller.
    unsafe { nvvm_redux_or(v as i32, mask) as u32 }
}

#[inline(always)]
pub fn smid() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvvm_smid() }
}

/// The warp's slot on its SM (`%warpid`: may change if the warp is
/// preempted; a hint for spreading work, not an identity).
#[inline(always)]
pub fn warpid() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvvm_warpid() }
}

#[inline(always)]
pub fn laneid() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvvm_laneid() }
}

/// Global index of the calling thread in a 1-D launch.
#[inline(always)]
pub fn global_thread() -> u32 {
    // SAFETY: reads special registers.
    unsafe { nvvm_ctaid_x() * nvvm_ntid_x() + nvvm_tid_x() }
}

/// Threads in the whole (1-D) grid.
#[inline(always)]
pub fn grid_threads() -> u32 {
    // SAFETY: reads special registers.
    unsafe { nvvm_nctaid_x() * nvvm_ntid_x() }
}

/// Orders this thread's memory accesses for all threads of the GPU.
#[inline(always)]
pub fn fence_gpu() {
    // SAFETY: a memory barrier has no other effect.
    unsafe { nvvm_membar_gl() }
}

/// Thread index in the block (x).
#[inline(always)]
pub fn thread_in_block() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvvm_tid_x() }
}

/// Threads per block (x).
#[inline(always)]
pub fn block_threads() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvvm_ntid_x() }
}

/// Block index (x).
#[inline(always)]
pub fn block_index() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvvm_ctaid_x() }
}

/// Blocks in the grid (x).
#[inline(always)]
pub fn grid_blocks() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvvm_nctaid_x() }
}

/// `v` of the lane `delta` below the caller (its own `v` for the lowest
/// `delta` lanes), for every lane of `mask` (`shfl.sync.up`).
///
/// # Safety
///
/// As for [`match_any`].
#[inline(always)]
pub unsafe fn shfl_up(mask: u32, v: u32, delta: u32) -> u32 {
    // SAFETY: forwarded from the caller.
    unsafe { nvvm_shfl_up(mask, v as i32, delta as i32, 0) as u32 }
}

/// The lanes of `mask` whose `pred` is true (`vote.sync.ballot`).
///
/// # Safety
///
/// As for [`match_any`].
#[inline(always)]
pub unsafe fn ballot(mask: u32, pred: bool) -> u32 {
    // SAFETY: forwarded from the caller.
    unsafe { nvvm_ballot(mask, pred) }
}

/// `v` of lane `src` for every lane of `mask`, 64 bits (two `shfl.sync`).
///
/// # Safety
///
/// As for [`shfl`].
#[inline(always)]
pub unsafe fn shfl_u64(mask: u32, v: u64, src: u32) -> u64 {
    // SAFETY: forwarded from the caller.
    unsafe { (shfl(mask, (v >> 32) as u32, src) as u64) << 32 | shfl(mask, v as u32, src) as u64 }
}

/// Waits for every lane of `mask` and orders their memory accesses
/// (`bar.warp.sync`, CUDA's `__syncwarp`).
///
/// # Safety
///
/// Every lane of `mask` executes this same call.
#[inline(always)]
pub unsafe fn sync_warp(mask: u32) {
    // SAFETY: forwarded from the caller.
    unsafe { nvvm_bar_warp_sync(mask) }
}

/// Waits for every thread of the block and orders their memory accesses
/// (`bar.sync 0`, CUDA's `__syncthreads`).
///
/// # Safety
///
/// Every thread of the block executes this same call.
#[inline(always)]
pub unsafe fn sync_block() {
    // SAFETY: forwarded from the caller.
    unsafe { nvvm_barrier0() }
}

/// Generic address of the block's dynamic shared memory: as many bytes as
/// the launch gave (`shared_bytes`), 16-byte aligned.
#[cfg(feature = "bench")]
#[inline(always)]
pub fn dynamic_shared() -> *mut u8 {
    let p: u64;
    // SAFETY: converts the address of the module's shared array; no
    // memory is accessed.
    unsafe { core::arch::asm!("cvta.shared.u64 {p}, cuheap_dynamic_shared;", p = out(reg64) p) };
    p as *mut u8
}

/// Relaxed, block-scoped atomic load of `*p` in shared memory
/// (`ld.relaxed.cta.shared`).
///
/// # Safety
///
/// `p` is a valid, 4-byte aligned address in the block's shared memory
/// (a generic address, as [`dynamic_shared`] gives).
#[cfg(feature = "bench")]
#[inline(always)]
pub unsafe fn shared_load_u32(p: *const u32) -> u32 {
    let v: u32;
    // SAFETY: forwarded from the caller.
    unsafe {
        core::arch::asm!(
            "{{ .reg .u64 a; cvta.to.shared.u64 a, {p}; ld.relaxed.cta.shared.u32 {v}, [a]; }}",
            p = in(reg64) p,
            v = out(reg32) v,
        )
    };
    v
}

/// Block-scoped compare-and-swap on `*p` in shared memory: writes `new` if
/// it held `old`; returns what it held (`atom.relaxed.cta.shared.cas`).
///
/// # Safety
///
/// As for [`shared_load_u32`]; others access `*p` only atomically meanwhile.
#[cfg(feature = "bench")]
#[inline(always)]
pub unsafe fn shared_cas_u32(p: *mut u32, old: u32, new: u32) -> u32 {
    let v: u32;
    // SAFETY: forwarded from the caller.
    unsafe {
        core::arch::asm!(
            "{{ .reg .u64 a; cvta.to.shared.u64 a, {p}; atom.relaxed.cta.shared.cas.b32 {v}, [a], {o}, {n}; }}",
            p = in(reg64) p,
            o = in(reg32) old,
            n = in(reg32) new,
            v = out(reg32) v,
        )
    };
    v
}

/// `*p += v` in shared memory as one block-scoped atomic operation whose
/// result is not needed (`red.relaxed.cta.shared.add.f64`).
///
/// # Safety
///
/// As for [`shared_cas_u32`], 8-byte aligned.
#[cfg(feature = "bench")]
#[inline(always)]
pub unsafe fn shared_add_f64(p: *mut f64, v: f64) {
    // SAFETY: forwarded from the caller.
    unsafe {
        core::arch::asm!(
            "{{ .reg .u64 a; .reg .f64 t; cvta.to.shared.u64 a, {p}; mov.b64 t, {v}; red.relaxed.cta.shared.add.f64 [a], t; }}",
            p = in(reg64) p,
            v = in(reg64) v.to_bits(),
        )
    };
}

/// `*p += v` as one atomic operation whose result is not needed
/// (`red.add.f64`); `p` may be in global or shared memory.
///
/// # Safety
///
/// `p` is a valid, 8-byte aligned `f64` that others access only atomically
/// while this runs.
#[inline(always)]
pub unsafe fn atomic_add_f64(p: *mut f64, v: f64) {
    // SAFETY: forwarded from the caller.
    unsafe {
        core::arch::asm!(
            "{{ .reg .f64 t; mov.b64 t, {v}; red.relaxed.gpu.add.f64 [{p}], t; }}",
            p = in(reg64) p,
            v = in(reg64) v.to_bits(),
        )
    };
}

/// Nanoseconds of the GPU's global timer.
#[inline(always)]
pub fn globaltimer() -> u64 {
    let t: u64;
    // SAFETY: reads a special register.
    unsafe { core::arch::asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t) };
    t
}

/// Suspends the thread for about `ns` nanoseconds (`nanosleep`, at most
/// about 1 ms), so a waiting warp leaves its SM's issue slots to others.
#[inline(always)]
pub fn nanosleep(ns: u32) {
    // SAFETY: only delays the thread.
    unsafe { core::arch::asm!("nanosleep.u32 {t};", t = in(reg32) ns) };
}

/// Writes `v` to `p`, which may be host memory mapped into the device,
/// after every earlier write of this thread is visible system-wide
/// (`fence.sc.sys`, then a system-scope store): how a kernel tells a host
/// thread that polls `p` that data it wrote before is ready.
///
/// # Safety
///
/// `p` is a valid, 8-byte aligned address that others access only
/// atomically (or as volatile reads) meanwhile.
#[inline(always)]
pub unsafe fn store_system(p: *mut u64, v: u64) {
    // SAFETY: forwarded from the caller.
    unsafe {
        core::arch::asm!(
            "fence.sc.sys;\n\tst.relaxed.sys.u64 [{p}], {v};",
            p = in(reg64) p,
            v = in(reg64) v,
        )
    };
}

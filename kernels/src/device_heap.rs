//! The in-kernel heap: `dev_alloc`/`dev_free` over a heap the host created.
//!
//! Fast path of `dev_alloc`: the active lanes of a warp are grouped by size
//! class (`match.any.sync`); each group's leader reserves blocks for the
//! whole group on its SM's current page (one `fetch_sub`), claims them a
//! bitmap word at a time (one `fetch_and` serves up to 32 lanes), and
//! broadcasts the word and mask; each lane takes the set bit of its rank.
//! `dev_free` groups lanes by bitmap word, ORs their bits (`redux.sync`),
//! and the leader frees them with one `fetch_or` and one `fetch_add`.
//! Sizes over the largest class (spans), zero and huge sizes take the
//! per-thread path of `cuheap-core`.
//!
//! Lanes the fast path cannot serve go on one by one (`alloc_slow`): a
//! span, growth while the kernel runs when a host serves the heap (the
//! thread asks for pages and sleeps until the page limit rises, bounded),
//! else a counted null.
//!
//! `dev_alloc_aligned` takes the same warp path with the smallest class
//! whose blocks all have the alignment. `dev_realloc` resizes in place
//! where the block allows (`cuheap-core` decides) and otherwise moves the
//! block through `dev_alloc_aligned` and `dev_free`.

use crate::arch::{
    activemask, globaltimer, laneid, match_any_64, nanosleep, reduce_or, shfl, smid, store_system,
    warpid,
};
use cuheap_core::heap::{copy_block, GrowHost, Located};
use cuheap_core::size_class::{class_of, class_of_aligned, page_units, MAX_BLOCKS_PER_PAGE};
use cuheap_core::{AllocError, Grant, Heap, HeapHandle, Resize, Word};

/// The GPU's side of growth while a kernel runs (see `cuheap_core`'s
/// `grow`): the doorbell is host memory mapped into the device, waiting
/// threads sleep between polls of the page limit in device memory.
struct Gpu;

impl GrowHost for Gpu {
    #[inline(always)]
    fn ring(&self, bell: u64, ticket: u64) {
        // SAFETY: the host publishes the device address of a live, 8-byte
        // aligned doorbell word that it only reads.
        unsafe { store_system(bell as *mut u64, ticket) }
    }

    #[inline(always)]
    fn now_ns(&self) -> u64 {
        globaltimer()
    }

    #[inline(always)]
    fn pause(&self, round: u32) {
        // 0.5 us doubling to 32 us: a growth step takes tens to hundreds
        // of microseconds, and a million sleeping threads poll little.
        nanosleep(500 << round.min(6));
    }
}

/// Times a warp's group waits for growth together before its lanes go on
/// one by one (`alloc_slow`, bounded by the growth timeout).
const GROUP_WAITS: u32 = 64;

/// An allocation the fast path could not serve: growth, the out-of-memory
/// fallbacks and bad input, per thread and out of line.
#[cold]
#[inline(never)]
fn alloc_slow(heap: &Heap<'static, u32>, size: usize, align: usize) -> *mut u8 {
    heap.alloc_growing(size, align, smid(), &Gpu)
        .unwrap_or(core::ptr::null_mut())
}

/// A per-thread allocation: on a heap that can grow, through
/// [`alloc_slow`]; otherwise one attempt, its failure counted.
#[inline(always)]
fn alloc_one(heap: &Heap<'static, u32>, size: usize, align: usize) -> *mut u8 {
    if heap.may_grow() {
        return alloc_slow(heap, size, align);
    }
    heap.alloc_aligned(size, align, smid())
        .unwrap_or(core::ptr::null_mut())
}

/// # Safety
///
/// `h` describes a heap created by `cuheap-host` that outlives the kernel.
#[inline(always)]
unsafe fn view(h: &HeapHandle) -> Heap<'static, u32> {
    // SAFETY: forwarded from the caller.
    unsafe { Heap::from_handle(h) }
}

/// Allocates `size` bytes; null on size 0, on sizes over the heap, and on
/// exhaustion (each counted in the heap's `failed_allocs`). Never traps or
/// hangs: on a heap that a host grows while kernels run, a thread that
/// finds it short waits for more pages, and gets null if the host cannot
/// add any (or after `GROW_TIMEOUT_NS`, 2 s). Blocks are 16-byte aligned,
/// power-of-two sizes naturally aligned.
///
/// # Safety
///
/// `h` describes a live heap; may be called from any lanes, converged or
/// not, each with its own heap or the same.
#[inline(always)]
pub unsafe fn dev_alloc(h: &HeapHandle, size: usize) -> *mut u8 {
    // SAFETY: forwarded from the caller.
    let heap = unsafe { view(h) };
    let Some(class) = class_of(size) else {
        return alloc_slow(&heap, size, 1);
    };
    // SAFETY: the lanes here all make this call.
    unsafe { warp_alloc(&heap, size, 1, class) }
}

/// Allocates `size` bytes at a multiple of `align`, a power of two up to
/// the page size (64 KiB): the smallest class whose blocks all have that
/// alignment (no padding), through the warp path of [`dev_alloc`]; sizes
/// over the largest class are spans, page-aligned. Null, counted in the
/// heap's `failed_allocs`, on size 0, sizes over the heap, exhaustion and
/// an alignment that is not a power of two or exceeds the page size.
/// Free it with [`dev_free`].
///
/// # Safety
///
/// `h` describes a live heap; may be called from any lanes, converged or not.
#[inline(always)]
pub unsafe fn dev_alloc_aligned(h: &HeapHandle, size: usize, align: usize) -> *mut u8 {
    // SAFETY: forwarded from the caller.
    let heap = unsafe { view(h) };
    match class_of_aligned(size, align) {
        // SAFETY: the lanes here all make this call.
        Some(class) => unsafe { warp_alloc(&heap, size, align, class) },
        None => alloc_slow(&heap, size, align),
    }
}

/// Resizes the block at `ptr` to `new_size` bytes at a multiple of
/// `align`, keeping its first `min(old_size, new_size)` bytes
/// (`old_size`: the bytes the caller cares about, `usize::MAX` for the
/// whole block). The same pointer while the new size fits the block (a
/// span takes or gives back pages at its end); else a new block from
/// [`dev_alloc_aligned`] with the contents copied, and the old one freed.
/// A shrink to at most half the block moves to a smaller block when the
/// heap has one and otherwise stays: it never fails. Null `ptr`:
/// [`dev_alloc_aligned`]. Null on failure, with the old block left as it
/// was: size 0, sizes over the heap, a bad alignment or exhaustion
/// (counted in `failed_allocs`), a `ptr` that is not a live block's start
/// (counted in `bad_frees`).
///
/// # Safety
///
/// `h` describes a live heap; `ptr` is null, a block of it that this
/// thread owns (nobody else uses it during the call), or an address that
/// is not a live block's start (refused). May be called from any lanes.
#[inline(always)]
pub unsafe fn dev_realloc(
    h: &HeapHandle,
    ptr: *mut u8,
    old_size: usize,
    new_size: usize,
    align: usize,
) -> *mut u8 {
    if ptr.is_null() {
        // SAFETY: forwarded from the caller.
        return unsafe { dev_alloc_aligned(h, new_size, align) };
    }
    // SAFETY: forwarded from the caller.
    let heap = unsafe { view(h) };
    let (to, copy) = match heap.resize_in_place(ptr, new_size, align) {
        Err(_) => return core::ptr::null_mut(), // counted
        Ok(Resize::InPlace) => return ptr,
        Ok(Resize::Move { copy }) => {
            // SAFETY: forwarded from the caller.
            let to = unsafe { dev_alloc_aligned(h, new_size, align) };
            if to.is_null() {
                return to;
            }
            (to, copy)
        }
        Ok(Resize::Shrink { copy }) => match heap.try_alloc_aligned(new_size, align, smid()) {
            Ok(to) => (to, copy),
            Err(_) => return ptr,
        },
    };
    // SAFETY: `ptr` is this thread's live block (checked by
    // `resize_in_place`), `to` a fresh one; `copy` is at most the old
    // block's size and the new size, and blocks are 16-byte aligned
    // multiples of 16 bytes.
    unsafe { copy_block(to, ptr, copy.min(old_size)) };
    // SAFETY: `ptr` is this thread's block, no longer used.
    unsafe { dev_free(h, ptr) };
    to
}

/// The warp path of [`dev_alloc`] for `size` bytes at `align` in `class`.
///
/// # Safety
///
/// Called only from `#[inline(always)]` functions, so that it is inlined
/// at each call site and the lanes reaching its `match.any` are exactly
/// the lanes making this call.
#[inline(always)]
unsafe fn warp_alloc(heap: &Heap<'static, u32>, size: usize, align: usize, class: u32) -> *mut u8 {
    // Lanes of one heap and class. Lanes may name different heaps: a C
    // caller's lanes meet in one body of `cuheap_heap_malloc` from
    // several call sites. The heap's metadata address plus the class is
    // unique: metadata regions do not overlap and are longer than the
    // class count.
    let key = heap.handle().meta + class as u64;
    // SAFETY: `activemask()` is the lanes executing this line, and each
    // of them makes this call next (the caller's contract).
    let peers = unsafe { match_any_64(activemask(), key) };
    let lane = laneid();
    let leader = peers.trailing_zeros();
    let mut rank = (peers & ((1u32 << lane) - 1)).count_ones() as i32;
    let mut remaining = peers.count_ones();
    let slot = smid();
    let mut grant = Grant {
        page: 0,
        class,
        count: 0,
        start: 0,
    };
    let mut result = core::ptr::null_mut();
    let mut waits = 0u32;
    // Whether the leader's last search left pages to growth.
    let mut deferred = false;
    loop {
        let (mut page, mut word, mut mask) = (0u32, 0u32, 0u32);
        if lane == leader {
            if grant.count == 0 {
                match heap.reserve(class, remaining, slot) {
                    Ok(g) => grant = g,
                    Err(e) => deferred = e == AllocError::Growing,
                }
            }
            if grant.count > 0 {
                let run = heap.claim(&mut grant);
                (page, word, mask) = (run.page, run.word, run.mask);
            }
        }
        // SAFETY: `peers` is the lanes with this class; they all run this
        // loop for the same number of trips (`remaining` and `mask` are the
        // same in all of them), and `leader` is one of them.
        let mask = unsafe { shfl(peers, mask, leader) };
        if mask == 0 && waits < GROUP_WAITS {
            // On a heap the host grows while kernels run, the group waits
            // for more pages as one (its leader asks and polls) and
            // searches again: one request and one search per group, not
            // per thread.
            waits += 1;
            let again = lane == leader && heap.await_growth(page_units(class), deferred, &Gpu);
            // SAFETY: as above.
            if unsafe { shfl(peers, again as u32, leader) } != 0 {
                continue;
            }
            waits = GROUP_WAITS;
        }
        if mask == 0 {
            // No class page: the lanes not yet served go on one by one
            // (below).
            // SAFETY: as above.
            deferred = unsafe { shfl(peers, deferred as u32, leader) } != 0;
            break;
        }
        // SAFETY: as above.
        let page = unsafe { shfl(peers, page, leader) };
        // SAFETY: as above.
        let word = unsafe { shfl(peers, word, leader) };
        let k = mask.count_ones() as i32;
        if rank >= 0 && rank < k {
            result = heap.block_addr(page, class, word * u32::BITS + mask.nth_set(rank as u32));
        }
        rank -= k;
        remaining -= k as u32;
        if remaining == 0 {
            break;
        }
    }
    // One count of the blocks the group's grants served.
    let served = peers.count_ones() - remaining;
    if lane == leader && served > 0 {
        heap.count_allocated(slot, warpid(), served);
    }
    if rank < 0 {
        return result;
    }
    // Not served by the group: to growth when a host serves the heap, or
    // to one more search if the leader's left pages to growth that has
    // ended since; else the leader's search was the last word: a span for
    // classes with multi-unit pages (small heaps), else a counted null.
    if heap.may_grow() || deferred {
        return alloc_slow(heap, size, align);
    }
    heap.alloc_fallback(size, class, slot)
        .unwrap_or(core::ptr::null_mut())
}

/// [`dev_alloc`] for one thread on its own, without the warp-cooperative
/// path: for code where one thread allocates for its whole group (smaller
/// code, fewer registers). The same results and counts.
///
/// # Safety
///
/// `h` describes a live heap.
#[inline(always)]
pub unsafe fn dev_alloc_single(h: &HeapHandle, size: usize) -> *mut u8 {
    // SAFETY: forwarded from the caller.
    let heap = unsafe { view(h) };
    alloc_one(&heap, size, 1)
}

/// [`dev_free`] for one thread on its own (see [`dev_alloc_single`]).
///
/// # Safety
///
/// `h` describes a live heap.
#[inline(always)]
pub unsafe fn dev_free_single(h: &HeapHandle, ptr: *mut u8) {
    // SAFETY: forwarded from the caller.
    let heap = unsafe { view(h) };
    let _ = heap.free(ptr, smid());
}

/// Frees a block from any thread. Null is a no-op; foreign, interior and
/// double frees are counted in the heap's `bad_frees` and change nothing.
///
/// # Safety
///
/// `h` describes a live heap; may be called from any lanes.
#[inline(always)]
pub unsafe fn dev_free(h: &HeapHandle, ptr: *mut u8) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: forwarded from the caller.
    let heap = unsafe { view(h) };
    match heap.locate(ptr as usize) {
        Ok(Located::Block { page, word, mask }) => {
            let words = (MAX_BLOCKS_PER_PAGE / 32) as u64;
            // Lanes freeing blocks of one bitmap word of one heap (lanes
            // may name different heaps, as in `warp_alloc`): the heap's
            // metadata address plus the word's index is unique, as the
            // metadata holds more bytes than the heap has bitmap words.
            let key = heap.handle().meta + page as u64 * words + word as u64;
            // SAFETY: `activemask()` is the lanes executing this line, and
            // each of them makes this call next.
            let peers = unsafe { match_any_64(activemask(), key) };
            // SAFETY: `peers` is the lanes that matched just above; all of
            // them make this call next.
            let bits = unsafe { reduce_or(peers, mask) };
            if laneid() == peers.trailing_zeros() {
                // The group's frees, counted without waiting for them (the
                // double ones are subtracted where they are found).
                heap.count_freed(smid(), warpid(), peers.count_ones());
                heap.free_run(page, word, bits, smid());
                // Lanes of one warp freeing the same block: all but one are
                // double frees that the OR folded together.
                let dup = peers.count_ones() - bits.count_ones();
                if dup > 0 {
                    heap.count_double_frees(dup);
                }
            }
        }
        Ok(Located::Span { .. }) => {
            let _ = heap.free(ptr, smid());
        }
        Err(_) => {} // counted by `locate`
    }
}

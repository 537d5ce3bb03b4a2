//! Sparse matrix products C = A x B (CSR, `f64`), row by row, Gustavson's
//! way, with the output of each row allocated where the method says:
//!
//! - two-pass: [`spgemm_count`] the nonzeros of every row (symbolic pass), scan,
//!   then [`spgemm_numeric`] writes each row into C at its offset;
//! - one pass: [`spgemm_cuheap`] (or [`malloc`], CUDA's device heap) computes each
//!   row and allocates its output as soon as it knows its size, then
//!   [`spgemm_compact`] copies the rows into C and [`spgemm_free_cuheap`] frees them.
//!
//! Every method shares the same row kernels, so they differ only in where
//! the output goes. Rows are first binned by a bound on their nonzeros
//! ([`spgemm_analyse`], [`spgemm_place`]): a warp per short row and a block per medium
//! row accumulate in a hash table in shared memory, compact and sort it;
//! a block per long row accumulates in a dense array (a value and a bit per
//! column) and reads it out in column order. Rows come out sorted.
//!
//! Contract of every kernel here (`problem` is a [`Problem`] in device
//! memory): its arrays are valid for what the kernel reads and writes, as
//! the field documentation says, until the kernel ends; the launch shapes
//! are those of `problem.rs` (`THREAD_BLOCK` threads and `THREAD_SHARED`
//! bytes of dynamic shared memory for the thread bin, `HASH_BLOCK` and
//! `HASH_SHARED` for the hash bins, `DENSE_BLOCK` and `DENSE_SHARED` for
//! the dense one, `SCAN_BLOCK` and `SCAN_SHARED` for the scan, any 1-D
//! shape of whole warps for the others).

#[path = "../../src/spgemm/problem.rs"]
mod problem;

use crate::arch::{
    activemask, atomic_add_f64, ballot, block_index, block_threads, dynamic_shared, global_thread,
    grid_blocks, grid_threads, laneid, match_any, shared_add_f64, shared_cas_u32, shared_load_u32,
    shfl, shfl_u64, shfl_up, sync_block, sync_warp, thread_in_block,
};
use crate::device_heap::{dev_alloc, dev_alloc_single, dev_free, dev_free_single};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use cuheap_core::HeapHandle;
pub use problem::*;

const EMPTY: u32 = u32::MAX;
const FULL: u32 = u32::MAX;

extern "C" {
    /// CUDA's device heap (linked by the driver).
    fn malloc(size: usize) -> *mut u8;
    fn free(ptr: *mut u8);
}

/// # Safety
///
/// `a` is a device address of at least `i + 1` `T`s.
#[inline(always)]
unsafe fn at<T: Copy>(a: u64, i: u64) -> T {
    // SAFETY: forwarded from the caller.
    unsafe { (a as *const T).add(i as usize).read() }
}

/// # Safety
///
/// As for [`at`], writable.
#[inline(always)]
unsafe fn put<T>(a: u64, i: u64, v: T) {
    // SAFETY: forwarded from the caller.
    unsafe { (a as *mut T).add(i as usize).write(v) }
}

/// # Safety
///
/// `a` is a device address of at least `i + 1` `u32`s accessed atomically.
#[inline(always)]
unsafe fn atomic_u32<'a>(a: u64, i: u64) -> &'a AtomicU32 {
    // SAFETY: forwarded from the caller.
    unsafe { AtomicU32::from_ptr((a as *mut u32).add(i as usize)) }
}

/// # Safety
///
/// As for [`atomic_u32`], `u64`s.
#[inline(always)]
unsafe fn atomic_u64<'a>(a: u64, i: u64) -> &'a AtomicU64 {
    // SAFETY: forwarded from the caller.
    unsafe { AtomicU64::from_ptr((a as *mut u64).add(i as usize)) }
}

// ---------------------------------------------------------------------------
// Binning

/// Sum of `v` over the full warp (every lane calls it).
///
/// # Safety
///
/// All 32 lanes of the warp execute this call.
#[inline(always)]
unsafe fn warp_sum_u64(v: u64) -> u64 {
    let (mut lo, mut hi) = (v as u32, (v >> 32) as u32);
    let mut d = 16;
    while d > 0 {
        // SAFETY: forwarded from the caller: every lane runs every step.
        let (l, h) = unsafe { (shfl(FULL, lo, laneid() ^ d), shfl(FULL, hi, laneid() ^ d)) };
        let (s, carry) = lo.overflowing_add(l);
        lo = s;
        hi = hi.wrapping_add(h).wrapping_add(carry as u32);
        d /= 2;
    }
    (hi as u64) << 32 | lo as u64
}

/// Per row: the bound on its nonzeros (`row_bound`), the count of rows
/// per bin, and the intermediate products of the whole product. Launch
/// whole warps: every lane takes part in the warp sums.
///
/// # Safety
///
/// See the module documentation; `bins` and `status` start at zero.
pub unsafe fn spgemm_analyse(problem: *const Problem) {
    // SAFETY: the launch's contract.
    let p = unsafe { &*problem };
    let mut row = global_thread() as u64;
    let stride = grid_threads() as u64;
    let rounds = p.rows.div_ceil(stride);
    for _ in 0..rounds {
        let mut products = 0u64;
        if row < p.rows {
            // The row's columns lie between the lowest first column and the
            // highest last column of the rows of B it meets (B's rows are
            // sorted): a tighter bound than the products for banded and
            // other local patterns.
            let (mut lo, mut hi) = (u32::MAX, 0u32);
            // SAFETY: row < rows: A's offsets hold rows + 1 values, B's
            // offsets one per column of A plus one; a non-empty row of B
            // has its first and last columns at bs and be - 1.
            unsafe {
                for j in at::<u64>(p.a_offsets, row)..at::<u64>(p.a_offsets, row + 1) {
                    let k = at::<u32>(p.a_cols, j) as u64;
                    let (bs, be) = (at::<u64>(p.b_offsets, k), at::<u64>(p.b_offsets, k + 1));
                    if be > bs {
                        products += be - bs;
                        lo = lo.min(at::<u32>(p.b_cols, bs));
                        hi = hi.max(at::<u32>(p.b_cols, be - 1));
                    }
                }
            }
            let span = if products == 0 {
                0
            } else {
                (hi - lo) as u64 + 1
            };
            let bound = products.min(p.cols).min(span) as u32;
            // SAFETY: row < rows.
            unsafe { put(p.row_bound, row, bound) };
            let bin = bin_of(bound);
            // SAFETY: the lanes with a row run this together.
            let peers = unsafe { match_any(activemask(), bin) };
            if laneid() == peers.trailing_zeros() {
                // SAFETY: bins holds BINS counters.
                unsafe { atomic_u32(p.bins, bin as u64) }.fetch_add(peers.count_ones(), Relaxed);
            }
        }
        // SAFETY: every lane of the warp runs every round.
        let sum = unsafe { warp_sum_u64(products) };
        if laneid() == 0 && sum > 0 {
            // SAFETY: status holds STATUS_WORDS words.
            unsafe { atomic_u64(p.status, STATUS_PRODUCTS as u64) }.fetch_add(sum, Relaxed);
        }
        row += stride;
    }
}

/// Index in `bin_rows` of the first row of `bin`.
///
/// # Safety
///
/// `p.bins` holds the counts of [`spgemm_analyse`].
#[inline(always)]
unsafe fn bin_base(p: &Problem, bin: u32) -> u64 {
    let mut base = 0u64;
    for b in 0..bin {
        // SAFETY: b < BINS.
        base += unsafe { at::<u32>(p.bins, b as u64) } as u64;
    }
    base
}

/// Per row: writes the row into its bin's part of `bin_rows` (in any
/// order). Runs after [`spgemm_analyse`].
///
/// # Safety
///
/// See the module documentation; the cursors (`bins[BINS..]`) start at 0.
pub unsafe fn spgemm_place(problem: *const Problem) {
    // SAFETY: the launch's contract.
    let p = unsafe { &*problem };
    let mut row = global_thread() as u64;
    while row < p.rows {
        // SAFETY: row < rows.
        let bin = bin_of(unsafe { at::<u32>(p.row_bound, row) });
        if bin != BIN_EMPTY {
            // SAFETY: the lanes here run this together; bins holds
            // 2 x BINS words; the slot is below the bin's count.
            unsafe {
                let peers = match_any(activemask(), bin);
                let leader = peers.trailing_zeros();
                let mut first = 0;
                if laneid() == leader {
                    first = atomic_u32(p.bins, (BINS as u32 + bin) as u64)
                        .fetch_add(peers.count_ones(), Relaxed);
                }
                let first = shfl(peers, first, leader);
                let rank = (peers & ((1u32 << laneid()) - 1)).count_ones();
                put(
                    p.bin_rows,
                    bin_base(p, bin) + (first + rank) as u64,
                    row as u32,
                );
            }
        }
        row += grid_threads() as u64;
    }
}

// ---------------------------------------------------------------------------
// Where a row's output goes

/// Where the leader of a row's group is told to write the row.
enum Place {
    /// Nowhere (counting, or an empty row).
    Nothing,
    /// `n` values here and `n` columns there.
    To(*mut f64, *mut u32),
    /// The output could not be allocated: the row is counted as failed.
    Failed,
    /// No room for the row until [`Output::refill`] has run: the row loop
    /// returns to its kernel, which refills, and resumes at this row.
    Short,
}

/// A row whose output had no room: the `i`-th of its bin for this group,
/// computed, with `n` nonzeros (in the group's shared memory, or the dense
/// accumulator).
#[derive(Clone, Copy)]
struct Short {
    i: u64,
    n: u32,
}

/// Header code of `Place::Short` where the leader hands a row's place to
/// its group (no output address is 1).
const SHORT: u64 = 1;

/// Records that `row` has no output because memory for it could not be
/// allocated: no nonzeros, no block, and one more failed row.
///
/// # Safety
///
/// `row < p.rows`; `p` as in the module documentation.
unsafe fn fail(p: &Problem, row: u64) -> Place {
    // SAFETY: forwarded; status holds STATUS_WORDS words.
    unsafe {
        put(p.row_nnz, row, 0u32);
        if p.row_blocks != 0 {
            put(p.row_blocks, row, 0u64);
        }
        atomic_u64(p.status, STATUS_FAILED_ROWS as u64).fetch_add(1, Relaxed);
    }
    Place::Failed
}

/// A method: what the row kernels do with a finished row.
trait Output {
    /// Whether the values are computed (else only the pattern).
    const NUMERIC: bool;
    /// Called by one thread per row with its nonzeros `n`.
    ///
    /// # Safety
    ///
    /// `row < p.rows`; `p` as in the module documentation.
    unsafe fn place(&mut self, p: &Problem, row: u64, n: u32) -> Place;
    /// `place` for the 32 lanes of a warp at once, each with its own row
    /// (`None`: this lane has none): every lane of the warp calls it.
    ///
    /// # Safety
    ///
    /// As for `place`; all 32 lanes call it together.
    unsafe fn place_lanes(&mut self, p: &Problem, row: Option<u64>, n: u32) -> Place {
        match row {
            // SAFETY: forwarded.
            Some(row) => unsafe { self.place(p, row, n) },
            None => Place::Nothing,
        }
    }
    /// The dense accumulator of this block (`bytes`), or null. Called by
    /// thread 0 of the block.
    ///
    /// # Safety
    ///
    /// As for `place`.
    unsafe fn scratch(&mut self, p: &Problem, bytes: u64) -> *mut u8;
    /// Gives back what `scratch` returned.
    ///
    /// # Safety
    ///
    /// `s` came from `scratch` of the same method in this kernel.
    unsafe fn release(&mut self, s: *mut u8);
    /// Whether `place` may answer `Place::Short`.
    const REFILLS: bool = false;
    /// Makes room for a row of `n` nonzeros after `place` answered
    /// `Place::Short`; called by the group's leader between the row
    /// loop's return and its resumption, where nothing of the row loop is
    /// live: the allocator is a call, and a call inside the row loop makes
    /// the assembler keep the loop's values in local memory. (An output
    /// that allocates inside the loop, as with a block per row, calls it
    /// from `place` instead.)
    ///
    /// # Safety
    ///
    /// As for `place`.
    unsafe fn refill(&mut self, _n: u32) {}
    /// `refill` for the 32 lanes of a warp at once after `place_lanes`
    /// answered `Place::Short`, each for its own row of `n` nonzeros (0:
    /// none).
    ///
    /// # Safety
    ///
    /// As for `refill`; all 32 lanes call it together.
    unsafe fn refill_lanes(&mut self, _n: u32) {}
}

/// The symbolic pass: records each row's nonzeros.
struct Count;

impl Output for Count {
    const NUMERIC: bool = false;
    unsafe fn place(&mut self, p: &Problem, row: u64, n: u32) -> Place {
        // SAFETY: row < rows.
        unsafe { put(p.row_nnz, row, n) };
        Place::Nothing
    }
    unsafe fn scratch(&mut self, p: &Problem, _bytes: u64) -> *mut u8 {
        (p.scratch + block_index() as u64 * p.scratch_stride) as *mut u8
    }
    unsafe fn release(&mut self, _s: *mut u8) {}
}

/// The numeric pass: each row at its offset in C.
struct Csr;

impl Output for Csr {
    const NUMERIC: bool = true;
    unsafe fn place(&mut self, p: &Problem, row: u64, _n: u32) -> Place {
        // SAFETY: row < rows; C's offsets were scanned from the counts.
        let off = unsafe { at::<u64>(p.c_offsets, row) } as usize;
        // SAFETY: C holds nnz entries, this row's from `off`.
        unsafe {
            Place::To(
                (p.c_vals as *mut f64).add(off),
                (p.c_cols as *mut u32).add(off),
            )
        }
    }
    unsafe fn scratch(&mut self, p: &Problem, bytes: u64) -> *mut u8 {
        // SAFETY: the same scratch as the symbolic pass.
        unsafe { Count.scratch(p, bytes) }
    }
    unsafe fn release(&mut self, _s: *mut u8) {}
}

/// Bytes of a row's block: `n` values and `n` columns, in 16-byte units.
#[inline(always)]
fn need_of(n: u32) -> u64 {
    (n as u64 * ENTRY_BYTES as u64).div_ceil(16) * 16
}

/// Records a one-pass row: its nonzeros and block (bit 0: `owner`), or,
/// with no block for a non-empty row, its failure.
///
/// # Safety
///
/// `row < p.rows`; a non-null `block` holds `need_of(n)` bytes.
#[inline(always)]
unsafe fn record(p: &Problem, row: u64, n: u32, block: *mut u8, owner: u64) -> Place {
    if n > 0 && block.is_null() {
        // SAFETY: forwarded.
        return unsafe { fail(p, row) };
    }
    // SAFETY: row < rows.
    unsafe {
        put(p.row_nnz, row, n);
        put(
            p.row_blocks,
            row,
            if n == 0 { 0 } else { block as u64 | owner },
        );
    }
    if n == 0 {
        return Place::Nothing;
    }
    // SAFETY: the block holds n values then n columns.
    unsafe { Place::To(block as *mut f64, block.add(8 * n as usize) as *mut u32) }
}

/// An in-kernel allocator.
trait Alloc {
    /// # Safety
    ///
    /// The allocator is live.
    unsafe fn alloc(&self, bytes: u64) -> *mut u8;
    /// `alloc` called by many lanes of a warp at once, each for itself.
    ///
    /// # Safety
    ///
    /// The allocator is live.
    unsafe fn alloc_lanes(&self, bytes: u64) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { self.alloc(bytes) }
    }
    /// # Safety
    ///
    /// `p` came from `alloc` and is not yet freed.
    unsafe fn free(&self, p: *mut u8);
}

/// cuheap's device heap.
struct OnHeap<'h>(&'h HeapHandle);

impl Alloc for OnHeap<'_> {
    // The warp-cooperative path: the lanes that ask together share the
    // atomics of a size class.
    #[inline(never)]
    unsafe fn alloc_lanes(&self, bytes: u64) -> *mut u8 {
        // SAFETY: forwarded: the heap is live.
        unsafe { dev_alloc(self.0, bytes as usize) }
    }
    // One thread allocates for its whole group (once per chunk, or per row
    // with a block per row): out of line, the allocator's registers do not
    // count against the row kernels'.
    #[inline(never)]
    unsafe fn alloc(&self, bytes: u64) -> *mut u8 {
        // SAFETY: forwarded: the heap is live.
        unsafe { dev_alloc_single(self.0, bytes as usize) }
    }
    #[inline(never)]
    unsafe fn free(&self, p: *mut u8) {
        // SAFETY: forwarded.
        unsafe { dev_free_single(self.0, p) }
    }
}

/// CUDA's device heap.
struct OnMalloc;

impl Alloc for OnMalloc {
    unsafe fn alloc(&self, bytes: u64) -> *mut u8 {
        // SAFETY: CUDA's malloc takes any size; null when short.
        unsafe { malloc(bytes as usize) }
    }
    unsafe fn free(&self, p: *mut u8) {
        // SAFETY: forwarded.
        unsafe { free(p) }
    }
}

/// One pass: each row's output in a block of its own (`chunk == 0`), or
/// carved from a chunk of `chunk` bytes the group allocated for this and
/// later rows. `APART`: the allocator is called between runs of the row
/// loop (`Place::Short`, then `refill`), not inside it, which keeps the
/// loop's values in registers: on an H100 80 GB, 8 KiB chunks took
/// 6.42-6.55 ms against 7.12-7.13 on uniform rows. With a block per row
/// every row allocates, and leaving and re-entering the loop for each
/// cost more than it saved (15.4 against 12.6-12.8 ms), so the per-row
/// kernels allocate inside the loop (`docs/ab-spgemm-apart-h100.txt`).
struct Blocks<A: Alloc, const APART: bool> {
    alloc: A,
    chunk: u64,
    /// The free rest of the group's last block, `left` bytes.
    cursor: *mut u8,
    left: u64,
    /// No row has been carved from the block at `cursor` yet: the next
    /// row's output owns (frees) it.
    fresh: bool,
    /// The last refill failed: the next row that does not fit fails.
    failed: bool,
}

impl<A: Alloc, const APART: bool> Blocks<A, APART> {
    fn new(alloc: A, chunk: u32) -> Self {
        Blocks {
            alloc,
            chunk: chunk as u64,
            cursor: core::ptr::null_mut(),
            left: 0,
            fresh: false,
            failed: false,
        }
    }
}

impl<A: Alloc, const APART: bool> Blocks<A, APART> {
    /// `place_lanes` in chunks: the warp's rows of a round are carved one
    /// after another from the warp's chunk (each lane's at the prefix sum
    /// of the needs before it), and the round that does not fit asks for
    /// a new chunk. Carving rounds from chunks kept across rounds, not a
    /// block per round, makes the 2D stencil's rows (about 5 KiB a round)
    /// leave the row loop and allocate once in several rounds.
    ///
    /// # Safety
    ///
    /// As for `place_lanes`; every lane holds the same chunk state.
    #[inline(always)]
    unsafe fn place_warp(&mut self, p: &Problem, row: Option<u64>, n: u32) -> Place {
        let need = match row {
            Some(_) if n > 0 => need_of(n),
            _ => 0,
        };
        // SAFETY: all 32 lanes call this (the caller's contract).
        let incl = unsafe { warp_inclusive_scan(need) };
        // SAFETY: as above.
        let total = unsafe { shfl_u64(FULL, incl, 31) };
        // The same decision in every lane: the state and total are the
        // warp's.
        // SAFETY: all 32 lanes run this; forwarded.
        if total > self.left && unsafe { self.short_of(|b| b.refill_lanes(n)) } {
            return Place::Short;
        }
        if core::mem::take(&mut self.failed) {
            return match row {
                // SAFETY: row < rows.
                Some(row) => unsafe { record(p, row, n, core::ptr::null_mut(), 0) },
                None => Place::Nothing,
            };
        }
        let excl = incl - need;
        let block = self.cursor.wrapping_add(excl as usize);
        // The chunk's first row (the first lane with one, excl 0) owns it.
        let owner = (self.fresh && excl == 0) as u64;
        if total > 0 {
            // SAFETY: total <= left: inside the chunk.
            self.cursor = unsafe { self.cursor.add(total as usize) };
            self.left -= total;
            self.fresh = false;
        }
        match row {
            // SAFETY: row < rows; a non-empty row's part holds need bytes.
            Some(row) => unsafe { record(p, row, n, block, owner) },
            None => Place::Nothing,
        }
    }

    /// A row (or round) needs more than is left: true if the row loop
    /// must stop short for a refill between its runs (`APART`), else
    /// false, after `refill` has run here, inside the loop, unless the
    /// last refill failed: then `failed` stays set and the row fails
    /// without a second attempt.
    ///
    /// # Safety
    ///
    /// `refill`'s contract (`Output::refill` or `refill_lanes`) holds.
    #[inline(always)]
    unsafe fn short_of(&mut self, refill: impl FnOnce(&mut Self)) -> bool {
        if self.failed {
            return false;
        }
        if APART {
            return true;
        }
        refill(self);
        false
    }

    /// Allocates `need` bytes, or `chunk` if larger (the rest serves later
    /// rows); with the chunk short, the row's `need` alone, so that a
    /// nearly full heap fails no row that fits. Null if neither fits.
    ///
    /// # Safety
    ///
    /// The allocator is live.
    #[inline(always)]
    unsafe fn grab(&self, need: u64) -> (*mut u8, u64) {
        let bytes = need.max(self.chunk);
        // SAFETY: forwarded.
        let block = unsafe { self.alloc.alloc(bytes) };
        if block.is_null() && bytes > need {
            // SAFETY: forwarded.
            return (unsafe { self.alloc.alloc(need) }, need);
        }
        (block, bytes)
    }

    /// Makes `block` (`bytes`, or null: the allocation failed) the block
    /// rows are carved from next.
    #[inline(always)]
    fn use_block(&mut self, block: *mut u8, bytes: u64) {
        self.cursor = block;
        self.failed = block.is_null();
        self.fresh = !self.failed;
        self.left = if self.failed { 0 } else { bytes };
    }
}

impl<A: Alloc, const APART: bool> Output for Blocks<A, APART> {
    const NUMERIC: bool = true;
    const REFILLS: bool = APART;
    // Inline: most rows of a chunk only move the cursor.
    #[inline(always)]
    unsafe fn place(&mut self, p: &Problem, row: u64, n: u32) -> Place {
        if n == 0 {
            // SAFETY: row < rows.
            return unsafe { record(p, row, 0, core::ptr::null_mut(), 0) };
        }
        let need = need_of(n);
        // SAFETY: forwarded (the leader's `refill`).
        if need > self.left && unsafe { self.short_of(|b| b.refill(n)) } {
            return Place::Short;
        }
        if need > self.left && core::mem::take(&mut self.failed) {
            // SAFETY: row < rows.
            return unsafe { record(p, row, n, core::ptr::null_mut(), 0) };
        }
        let block = self.cursor;
        let owner = core::mem::take(&mut self.fresh) as u64;
        // SAFETY: need <= left: inside the block.
        self.cursor = unsafe { self.cursor.add(need as usize) };
        self.left -= need;
        // SAFETY: row < rows; the block holds need bytes.
        unsafe { record(p, row, n, block, owner) }
    }
    unsafe fn refill(&mut self, n: u32) {
        // A block of its own (chunk 0), or a new chunk: the rest of the
        // last one is left unused.
        // SAFETY: the allocator is live for the kernel.
        let (block, bytes) = unsafe { self.grab(need_of(n)) };
        self.use_block(block, bytes);
    }
    // Short for every lane if any lane is: no lane places its row twice.
    #[inline(always)]
    unsafe fn place_lanes(&mut self, p: &Problem, row: Option<u64>, n: u32) -> Place {
        if self.chunk != 0 {
            // SAFETY: forwarded.
            return unsafe { self.place_warp(p, row, n) };
        }
        let short = row.is_some() && n > 0 && need_of(n) > self.left && !self.failed;
        // SAFETY: all 32 lanes call this (the caller's contract).
        if unsafe { ballot(FULL, short) } != 0 {
            if APART {
                return Place::Short;
            }
            // SAFETY: as above.
            unsafe { self.refill_lanes(if row.is_some() { n } else { 0 }) };
        }
        // (A lane whose refill failed fails its row in `place`.)
        match row {
            // SAFETY: forwarded.
            Some(row) => unsafe { self.place(p, row, n) },
            None => Place::Nothing,
        }
    }
    unsafe fn refill_lanes(&mut self, n: u32) {
        let need = if n > 0 { need_of(n) } else { 0 };
        if self.chunk == 0 {
            if need > 0 {
                // SAFETY: the allocator is live; lanes allocate together.
                let block = unsafe { self.alloc.alloc_lanes(need) };
                self.use_block(block, need);
            }
            return;
        }
        // A chunk for the warp's rows, of this round and later ones: every
        // lane keeps the same copy of the chunk's state.
        // SAFETY: all 32 lanes call this (the caller's contract).
        let total = unsafe { shfl_u64(FULL, warp_inclusive_scan(need), 31) };
        let (mut base, mut bytes) = (0u64, 0u64);
        if laneid() == 31 {
            // SAFETY: the allocator is live.
            let (block, b) = unsafe { self.grab(total) };
            (base, bytes) = (block as u64, b);
        }
        // SAFETY: as above.
        let (base, bytes) = unsafe { (shfl_u64(FULL, base, 31), shfl_u64(FULL, bytes, 31)) };
        self.use_block(base as *mut u8, bytes);
    }
    unsafe fn scratch(&mut self, _p: &Problem, bytes: u64) -> *mut u8 {
        // SAFETY: the allocator is live.
        unsafe { self.alloc.alloc(bytes) }
    }
    unsafe fn release(&mut self, s: *mut u8) {
        if !s.is_null() {
            // SAFETY: from `scratch`.
            unsafe { self.alloc.free(s) }
        }
    }
}

// ---------------------------------------------------------------------------
// Row kernels

/// A warp or a whole block working on one row.
#[derive(Clone, Copy)]
struct Group {
    /// Threads.
    size: u32,
    /// The caller's index in the group.
    rank: u32,
    warp: bool,
}

impl Group {
    /// # Safety
    ///
    /// Every thread of the group calls it.
    #[inline(always)]
    unsafe fn sync(&self) {
        // SAFETY: forwarded from the caller.
        unsafe {
            if self.warp {
                sync_warp(FULL)
            } else {
                sync_block()
            }
        }
    }
}

/// A hash group's part of shared memory.
#[derive(Clone, Copy)]
struct Table {
    header: *mut Header,
    /// The hash table: `table_max` values, then (after the sort buffer's
    /// values) as many keys.
    vals: *mut f64,
    keys: *mut u32,
    /// The sort buffer: half as many entries.
    sort_vals: *mut f64,
    sort_keys: *mut u32,
    /// The stage of `for_products` and `warp_products`.
    stage: *mut u64,
}

impl Table {
    /// Group `index` of a hash kernel's block, of `size` threads.
    ///
    /// # Safety
    ///
    /// The kernel was launched with `HASH_SHARED` bytes of dynamic shared
    /// memory.
    #[inline(always)]
    unsafe fn of<const WARP: bool>(index: u32, size: u32) -> Table {
        let table_max = if WARP { WARP_TABLE } else { BLOCK_TABLE };
        let smem = dynamic_shared();
        // SAFETY: HASH_SHARED bytes: a header per warp, then per group a
        // table of `table_max` entries and a sort buffer of half that, then
        // the stages.
        unsafe {
            let header = smem.add((index * GROUP_HEADER) as usize) as *mut Header;
            let slice = smem.add(
                ((HASH_BLOCK / 32) * GROUP_HEADER + index * table_max * 3 / 2 * ENTRY_BYTES)
                    as usize,
            );
            let vals = slice as *mut f64;
            let sort_vals = vals.add(table_max as usize);
            let keys = sort_vals.add(table_max as usize / 2) as *mut u32;
            let sort_keys = keys.add(table_max as usize);
            let stage = smem.add((HASH_TABLES + index * size * STAGE_BYTES) as usize) as *mut u64;
            Table {
                header,
                vals,
                keys,
                sort_vals,
                sort_keys,
                stage,
            }
        }
    }
}

/// Per-group state in shared memory.
#[repr(C)]
struct Header {
    /// Distinct columns inserted.
    nnz: u32,
    /// Next free entry of the sort buffer.
    cursor: u32,
    /// Where the row goes (`Place::To`); 0 for nowhere (no output, or the
    /// allocation failed), `SHORT` for a row that stopped short.
    vals: u64,
    cols: u64,
}

/// Calls `f(column, product)` for this thread's share of the row's
/// intermediate products: products are numbered across the row and the
/// group's threads take them round robin, so every thread has an equal
/// share however the row's entries are spread over rows of B.
///
/// # Safety
///
/// `row < p.rows`; the arrays of `p` as documented; the group's size is a
/// power of two.
#[inline(always)]
unsafe fn for_products(
    p: &Problem,
    row: u64,
    g: Group,
    numeric: bool,
    stage: Option<*mut u64>,
    mut f: impl FnMut(u32, f64),
) {
    let size = g.size as u64;
    // In registers: `f` writes memory, after which fields of `p` would be
    // read again.
    let (a_cols, a_vals, b_offsets, b_cols, b_vals) =
        (p.a_cols, p.a_vals, p.b_offsets, p.b_cols, p.b_vals);
    let mut base = 0u64;
    let mut each = |bs: u64, len: u64, a: f64, base: u64| {
        // The first of the row's products numbered `rank` modulo the
        // group's size (a power of two).
        let mut o = (g.rank as u64).wrapping_sub(base) & (size - 1);
        while o < len {
            let idx = bs + o;
            let v = if numeric {
                // SAFETY: idx < the end of B's row.
                a * unsafe { at::<f64>(b_vals, idx) }
            } else {
                0.0
            };
            // SAFETY: as above.
            f(unsafe { at::<u32>(b_cols, idx) }, v);
            o += size;
        }
    };
    // SAFETY: row < rows.
    let (start, end) = unsafe { (at::<u64>(p.a_offsets, row), at::<u64>(p.a_offsets, row + 1)) };
    let Some(stage) = stage else {
        for j in start..end {
            // SAFETY: j is an entry of A's row; k a row of B.
            unsafe {
                let k = at::<u32>(a_cols, j) as u64;
                let a = if numeric { at::<f64>(a_vals, j) } else { 0.0 };
                let bs = at::<u64>(b_offsets, k);
                let len = at::<u64>(b_offsets, k + 1) - bs;
                each(bs, len, a, base);
                base += len;
            }
        }
        return;
    };
    // A group stages up to `size` entries of the row at a time, one per
    // thread, so the loads of B's offsets overlap instead of following
    // each other.
    let (st_bs, st_len, st_a) = (
        stage,
        stage.wrapping_add(g.size as usize),
        stage.wrapping_add(2 * g.size as usize),
    );
    let mut j0 = start;
    while j0 < end {
        let count = (end - j0).min(size);
        if (g.rank as u64) < count {
            let j = j0 + g.rank as u64;
            // SAFETY: j < end; the stage holds 3 x size words of the group.
            unsafe {
                let k = at::<u32>(a_cols, j) as u64;
                let bs = at::<u64>(b_offsets, k);
                *st_bs.add(g.rank as usize) = bs;
                *st_len.add(g.rank as usize) = at::<u64>(b_offsets, k + 1) - bs;
                *st_a.add(g.rank as usize) = if numeric { at::<u64>(a_vals, j) } else { 0 };
            }
        }
        // SAFETY: every thread of the group runs the loop (uniform bounds).
        unsafe { g.sync() };
        for e in 0..count as usize {
            // SAFETY: e < count: staged above.
            let (bs, len, a) =
                unsafe { (*st_bs.add(e), *st_len.add(e), f64::from_bits(*st_a.add(e))) };
            each(bs, len, a, base);
            base += len;
        }
        // SAFETY: as above: the stage is refilled next.
        unsafe { g.sync() };
        j0 += count;
    }
}

/// `for_products` for a warp, which takes every product of a batch of the
/// row's entries together: it stages up to 32 entries (one per lane), and
/// lane `l` takes products `l`, `l + 32`, ... of the batch, numbered across
/// the batch's rows of B, two at a time so that their loads overlap. So
/// every lane works however short B's rows are (the round robin of
/// [`for_products`] keeps only as many lanes busy as a row of B has
/// entries).
///
/// # Safety
///
/// `row < p.rows`, a row of the warp bin; the arrays of `p` as documented;
/// all 32 lanes of the warp call it; `stage` is `32 * STAGE_BYTES` bytes of
/// shared memory that only this warp uses meanwhile.
#[inline(always)]
unsafe fn warp_products(
    p: &Problem,
    row: u64,
    numeric: bool,
    stage: *mut u64,
    mut f: impl FnMut(u32, f64),
) {
    let lane = laneid();
    // In registers, as in `for_products`.
    let (a_cols, a_vals, b_offsets, b_cols, b_vals) =
        (p.a_cols, p.a_vals, p.b_offsets, p.b_cols, p.b_vals);
    // SAFETY: 32 * STAGE_BYTES = 32 x (two u64 and one u32 and room).
    let (st_bs, st_a, st_first) = unsafe { (stage, stage.add(32), stage.add(64) as *mut u32) };
    // SAFETY: row < rows.
    let (start, end) = unsafe { (at::<u64>(p.a_offsets, row), at::<u64>(p.a_offsets, row + 1)) };
    let mut j0 = start;
    while j0 < end {
        let count = (end - j0).min(32) as u32;
        // A row of B has at most as many entries as the row's bound (its
        // columns are distinct and within the span of the row), at most
        // WARP_BOUND here: the batch's products fit a u32.
        let mut len = 0u32;
        if lane < count {
            let j = j0 + lane as u64;
            // SAFETY: j < end; k a row of B; the lane's stage slots.
            unsafe {
                let k = at::<u32>(a_cols, j) as u64;
                let bs = at::<u64>(b_offsets, k);
                len = (at::<u64>(b_offsets, k + 1) - bs) as u32;
                *st_bs.add(lane as usize) = bs;
                *st_a.add(lane as usize) = if numeric { at::<u64>(a_vals, j) } else { 0 };
            }
        }
        // SAFETY: every lane runs every batch (uniform bounds).
        let (incl, total) = unsafe {
            let incl = warp_inclusive_scan(len as u64) as u32;
            (incl, shfl(FULL, incl, 31))
        };
        // SAFETY: the lane's slot; then every lane reads the stage.
        unsafe {
            *st_first.add(lane as usize) = incl - len;
            sync_warp(FULL);
        }
        // Column and product of the batch's product `t < total`: from the
        // last entry whose first product is at most `t` (the firsts
        // increase with the entries).
        let product = |t: u32| -> (u32, f64) {
            let mut e = 0u32;
            let mut step = 16u32;
            while step > 0 {
                // SAFETY: e + step < count <= 32: staged above.
                if e + step < count && unsafe { *st_first.add((e + step) as usize) } <= t {
                    e += step;
                }
                step /= 2;
            }
            // SAFETY: e < count: staged; idx lies in that entry's row of B.
            unsafe {
                let idx = *st_bs.add(e as usize) + (t - *st_first.add(e as usize)) as u64;
                let v = if numeric {
                    f64::from_bits(*st_a.add(e as usize)) * at::<f64>(b_vals, idx)
                } else {
                    0.0
                };
                (at::<u32>(b_cols, idx), v)
            }
        };
        let mut t = lane;
        while t < total {
            let first = product(t);
            let second = (t + 32 < total).then(|| product(t + 32));
            f(first.0, first.1);
            if let Some((col, v)) = second {
                f(col, v);
            }
            t += 64;
        }
        // SAFETY: every lane; the stage is refilled next.
        unsafe { sync_warp(FULL) };
        j0 += count as u64;
    }
}

/// Inserts `col` (adding `v` when `numeric`) into the open-addressing
/// table of `mask + 1` entries in shared memory; true if `col` was not in
/// it.
///
/// # Safety
///
/// `keys` and `vals` hold `mask + 1` entries (a power of two) of shared
/// memory with room for every distinct column of the row; all accesses to
/// them meanwhile are atomic.
#[inline(always)]
unsafe fn insert(
    numeric: bool,
    keys: *mut u32,
    vals: *mut f64,
    mask: u32,
    col: u32,
    v: f64,
) -> bool {
    let mut h = col.wrapping_mul(0x9E37_79B1) & mask;
    loop {
        // SAFETY: h <= mask: an entry of the table.
        let (slot, mut k) = unsafe {
            let slot = keys.add(h as usize);
            (slot, shared_load_u32(slot))
        };
        let mut new = false;
        if k == EMPTY {
            // SAFETY: as above.
            k = unsafe { shared_cas_u32(slot, EMPTY, col) };
            if k == EMPTY {
                new = true;
                k = col;
            }
        }
        if k == col {
            if numeric {
                // SAFETY: h <= mask; values are only added to atomically.
                unsafe { shared_add_f64(vals.add(h as usize), v) };
            }
            return new;
        }
        h = (h + 1) & mask;
    }
}

/// Sorts `m` entries (a power of two) by column, ascending, with the
/// group's threads (bitonic sort).
///
/// # Safety
///
/// Every thread of `g` calls it; `keys` and `vals` hold `m` entries that
/// only the group uses meanwhile.
#[inline(always)]
unsafe fn sort(g: Group, keys: *mut u32, vals: *mut f64, m: u32) {
    let mut k = 2;
    while k <= m {
        let mut j = k / 2;
        while j > 0 {
            let mut i = g.rank;
            while i < m {
                let l = i ^ j;
                if l > i {
                    // SAFETY: i, l < m; each pair is one thread's this step.
                    unsafe {
                        let (ki, kl) = (*keys.add(i as usize), *keys.add(l as usize));
                        if (ki > kl) == (i & k == 0) {
                            *keys.add(i as usize) = kl;
                            *keys.add(l as usize) = ki;
                            let vi = *vals.add(i as usize);
                            *vals.add(i as usize) = *vals.add(l as usize);
                            *vals.add(l as usize) = vi;
                        }
                    }
                }
                i += g.size;
            }
            // SAFETY: every thread of the group reaches it.
            unsafe { g.sync() };
            j /= 2;
        }
        k *= 2;
    }
}

/// The hash bins: a group (warp or block) per row of `bin`, grid-stride
/// over the bin's rows, from the start (`from` None) or from the row that
/// stopped short; returns the row that stops short, if one does (see
/// [`resume`]).
///
/// # Safety
///
/// See the module documentation; launched with `HASH_BLOCK` threads and
/// `HASH_SHARED` bytes of dynamic shared memory.
#[inline(always)]
unsafe fn hash_rows<O: Output, const WARP: bool>(
    p: &Problem,
    out: &mut O,
    from: Option<Short>,
) -> Option<Short> {
    let bin = if WARP { BIN_WARP } else { BIN_BLOCK };
    let size = if WARP { 32 } else { block_threads() };
    let g = Group {
        size,
        rank: thread_in_block() % size,
        warp: WARP,
    };
    let index = thread_in_block() / size;
    let groups = block_threads() / size;
    // SAFETY: launched with HASH_SHARED bytes.
    let t = unsafe { Table::of::<WARP>(index, size) };
    let (header, sort_vals, sort_keys) = (t.header, t.sort_vals, t.sort_keys);
    // SAFETY: analyse and place ran.
    let (count, base) = unsafe { (at::<u32>(p.bins, bin as u64) as u64, bin_base(p, bin)) };
    let stride = (grid_blocks() * groups) as u64;
    let mut i = match from {
        Some(s) => s.i,
        None => (block_index() * groups + index) as u64,
    };
    let mut resumed = from;
    while i < count {
        // SAFETY: i < the bin's count.
        let row = unsafe { at::<u32>(p.bin_rows, base + i) } as u64;
        let n = match resumed.take() {
            // Computed before the loop stopped short: still in the sort buffer.
            Some(s) => s.n,
            // SAFETY: every thread of the group runs it; row < rows.
            None => unsafe { hash_row::<O, WARP>(p, row, g, &t) },
        };
        if g.rank == 0 {
            // SAFETY: row < rows; the group's header, read after the barrier.
            unsafe {
                ((*header).vals, (*header).cols) = match out.place(p, row, n) {
                    Place::To(v, c) => (v as u64, c as u64),
                    Place::Short => (SHORT, 0),
                    Place::Nothing | Place::Failed => (0, 0),
                };
            }
        }
        // SAFETY: as above.
        let (ov, oc) = unsafe {
            g.sync();
            ((*header).vals as *mut f64, (*header).cols as *mut u32)
        };
        if ov as u64 == SHORT {
            // SAFETY: as above: every thread has read the header.
            unsafe { g.sync() };
            return Some(Short { i, n });
        }
        if !ov.is_null() {
            // SAFETY: the sort buffer holds the row's n entries; the
            // output has room for n; every thread of the group runs this.
            unsafe {
                if WARP {
                    warp_write_sorted(sort_keys, sort_vals, n, ov, oc);
                } else {
                    let mut q = g.rank;
                    while q < n {
                        *ov.add(q as usize) = *sort_vals.add(q as usize);
                        *oc.add(q as usize) = *sort_keys.add(q as usize);
                        q += size;
                    }
                }
            }
        }
        // SAFETY: as above: the next row reuses the table.
        unsafe { g.sync() };
        i += stride;
    }
    None
}

/// Accumulates `row` in the group's hash table and, for the numeric
/// methods, leaves its entries compacted (and, a block per row, sorted) in
/// the sort buffer; returns its nonzeros.
///
/// # Safety
///
/// As for [`hash_rows`]; `t` is the group's part of shared memory; every
/// thread of the group calls it.
#[inline(always)]
unsafe fn hash_row<O: Output, const WARP: bool>(p: &Problem, row: u64, g: Group, t: &Table) -> u32 {
    let size = g.size;
    let table_max = if WARP { WARP_TABLE } else { BLOCK_TABLE };
    let Table {
        header,
        keys,
        vals,
        stage,
        sort_keys,
        sort_vals,
    } = *t;
    // SAFETY: row < rows.
    let bound = unsafe { at::<u32>(p.row_bound, row) };
    let cap = (2 * bound).next_power_of_two().min(table_max);
    let mut s = g.rank;
    while s < cap {
        // SAFETY: s < cap <= table_max.
        unsafe {
            *keys.add(s as usize) = EMPTY;
            *vals.add(s as usize) = 0.0;
        }
        s += size;
    }
    if g.rank == 0 {
        // SAFETY: the group's header; the others wait at the barrier.
        unsafe {
            (*header).nnz = 0;
            (*header).cursor = 0;
        }
    }
    // SAFETY: every thread of the group runs the loop's body.
    unsafe { g.sync() };
    // SAFETY: the table has 2 x bound >= 2 x distinct columns entries;
    // every thread of the group runs this.
    let n = unsafe {
        if WARP {
            // Each lane counts the columns it added; the warp sums.
            let mut added = 0u32;
            warp_products(p, row, O::NUMERIC, stage, |col, v| {
                added += insert(O::NUMERIC, keys, vals, cap - 1, col, v) as u32
            });
            sync_warp(FULL);
            warp_sum_u64(added as u64) as u32
        } else {
            let nnz = AtomicU32::from_ptr(&raw mut (*header).nnz);
            for_products(p, row, g, O::NUMERIC, Some(stage), |col, v| {
                if insert(O::NUMERIC, keys, vals, cap - 1, col, v) {
                    nnz.fetch_add(1, Relaxed);
                }
            });
            g.sync();
            nnz.load(Relaxed)
        }
    };
    if O::NUMERIC {
        // Compact into the sort buffer (cap / 2 >= bound >= n).
        // SAFETY: every thread of the group runs this.
        unsafe {
            if WARP {
                warp_compact(keys, vals, cap, sort_keys, sort_vals);
            } else {
                // Pad to a power of two and sort.
                let cursor = AtomicU32::from_ptr(&raw mut (*header).cursor);
                let m = n.next_power_of_two();
                let mut s = g.rank;
                while s < cap {
                    // s < cap; the sort buffer holds cap / 2 >= n.
                    let k = *keys.add(s as usize);
                    if k != EMPTY {
                        let at = cursor.fetch_add(1, Relaxed) as usize;
                        *sort_keys.add(at) = k;
                        *sort_vals.add(at) = *vals.add(s as usize);
                    }
                    s += size;
                }
                let mut s = n + g.rank;
                while s < m {
                    // m <= cap / 2 (n <= bound, cap >= 2 x bound).
                    *sort_keys.add(s as usize) = EMPTY;
                    s += size;
                }
                g.sync();
                sort(g, sort_keys, sort_vals, m);
            }
        }
    }
    n
}

/// Copies the entries of a warp's table (`cap` of them) that are not
/// `EMPTY` to the front of the sort buffer, in table order (a
/// ballot per 32 entries, no atomics), and pads them with `EMPTY` to a
/// multiple of 4.
///
/// # Safety
///
/// All 32 lanes of the warp call it; the table's entries, and the sort
/// buffer's for every entry of the table that is not `EMPTY` plus 3, are
/// shared memory that only this warp uses.
#[inline(always)]
unsafe fn warp_compact(
    keys: *const u32,
    vals: *const f64,
    cap: u32,
    sort_keys: *mut u32,
    sort_vals: *mut f64,
) {
    let lane = laneid();
    let below = (1u32 << lane) - 1;
    let mut n = 0u32;
    let mut s0 = 0u32;
    while s0 < cap {
        let s = s0 + lane;
        // SAFETY: s < cap; the sort buffer has room for the entries.
        unsafe {
            let k = if s < cap {
                *keys.add(s as usize)
            } else {
                EMPTY
            };
            let found = ballot(FULL, k != EMPTY);
            if k != EMPTY {
                let at = (n + (found & below).count_ones()) as usize;
                *sort_keys.add(at) = k;
                *sort_vals.add(at) = *vals.add(s as usize);
            }
            n += found.count_ones();
        }
        s0 += 32;
    }
    if lane < n.next_multiple_of(4) - n {
        // SAFETY: the padding is within the buffer (the contract).
        unsafe { *sort_keys.add((n + lane) as usize) = EMPTY };
    }
    // SAFETY: every lane.
    unsafe { sync_warp(FULL) };
}

/// Four columns of the sort buffer, read with one vector load.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Keys4([u32; 4]);

/// Writes a warp's `n` compacted entries to the row's output in column
/// order: an entry's place is the number of smaller columns (they are
/// distinct), so no sort is needed. Each lane ranks two entries per pass
/// over the buffer, whose reads every lane shares.
///
/// # Safety
///
/// All 32 lanes of the warp call it; `sort_keys` (16-byte aligned) and
/// `sort_vals` hold the `n` entries of [`warp_compact`] and its padding;
/// `ov` and `oc` have room for `n` values and columns.
#[inline(always)]
unsafe fn warp_write_sorted(
    sort_keys: *const u32,
    sort_vals: *const f64,
    n: u32,
    ov: *mut f64,
    oc: *mut u32,
) {
    let lane = laneid();
    let mut q0 = 0u32;
    while q0 < n {
        let (q1, q2) = (q0 + lane, q0 + 32 + lane);
        // Entries below n; EMPTY (no column) beyond.
        let key = |q: u32| {
            if q < n {
                // SAFETY: q < n: an entry of the sort buffer.
                unsafe { *sort_keys.add(q as usize) }
            } else {
                EMPTY
            }
        };
        let (k1, k2) = (key(q1), key(q2));
        let (mut r1, mut r2) = (0u32, 0u32);
        let mut j = 0u32;
        while j < n {
            // SAFETY: j < n rounded up to 4, the padded buffer; aligned.
            let Keys4([a, b, c, d]) = unsafe { *(sort_keys.add(j as usize) as *const Keys4) };
            r1 += (a < k1) as u32 + (b < k1) as u32 + (c < k1) as u32 + (d < k1) as u32;
            r2 += (a < k2) as u32 + (b < k2) as u32 + (c < k2) as u32 + (d < k2) as u32;
            j += 4;
        }
        // SAFETY: ranks are below n: the row's output.
        unsafe {
            if q1 < n {
                *ov.add(r1 as usize) = *sort_vals.add(q1 as usize);
                *oc.add(r1 as usize) = k1;
            }
            if q2 < n {
                *ov.add(r2 as usize) = *sort_vals.add(q2 as usize);
                *oc.add(r2 as usize) = k2;
            }
        }
        q0 += 64;
    }
}

/// The thread bin: a thread per row, grid-stride over the bin's rows, in
/// rounds that every lane of a warp runs (the warp places its rows
/// together). Each thread keeps its row sorted, columns merged, in its own
/// `THREAD_BOUND` entries of shared memory (strided by the block size, so
/// the threads of a warp use different banks). From, and returning, a
/// round that stopped short as [`hash_rows`] does (each lane its own row).
///
/// # Safety
///
/// See the module documentation; launched with `THREAD_BLOCK` threads and
/// `THREAD_SHARED` bytes of dynamic shared memory, whole warps.
#[inline(always)]
unsafe fn thread_rows<O: Output>(p: &Problem, out: &mut O, from: Option<Short>) -> Option<Short> {
    let tid = thread_in_block() as usize;
    let bd = block_threads() as usize;
    let vals = dynamic_shared() as *mut f64;
    // SAFETY: THREAD_SHARED bytes: THREAD_BOUND values, then as many
    // columns, per thread.
    let keys = unsafe { vals.add(THREAD_BOUND as usize * bd) } as *mut u32;
    let slot = |q: u32| q as usize * bd + tid;
    // SAFETY: analyse and place ran.
    let (count, base) = unsafe {
        (
            at::<u32>(p.bins, BIN_THREAD as u64) as u64,
            bin_base(p, BIN_THREAD),
        )
    };
    // Whole rounds: every lane of a warp runs each.
    let stride = grid_threads() as u64;
    let first = global_thread() as u64;
    let end = first + count.div_ceil(stride) * stride;
    let mut i = from.map_or(first, |s| s.i);
    let mut resumed = from;
    while i < end {
        // SAFETY: i < the bin's count.
        let row = (i < count).then(|| unsafe { at::<u32>(p.bin_rows, base + i) } as u64);
        let mut n = 0u32;
        if let Some(s) = resumed.take() {
            n = s.n;
        } else if let Some(row) = row {
            let g = Group {
                size: 1,
                rank: 0,
                warp: false,
            };
            // SAFETY: row < rows; slot(q) for q < n + 1 <= THREAD_BOUND
            // (the row has at most `bound` distinct columns).
            unsafe {
                for_products(p, row, g, O::NUMERIC, None, |col, v| {
                    let mut q = n;
                    while q > 0 && *keys.add(slot(q - 1)) > col {
                        q -= 1;
                    }
                    if q > 0 && *keys.add(slot(q - 1)) == col {
                        if O::NUMERIC {
                            *vals.add(slot(q - 1)) += v;
                        }
                        return;
                    }
                    let mut r = n;
                    while r > q {
                        *keys.add(slot(r)) = *keys.add(slot(r - 1));
                        if O::NUMERIC {
                            *vals.add(slot(r)) = *vals.add(slot(r - 1));
                        }
                        r -= 1;
                    }
                    *keys.add(slot(q)) = col;
                    if O::NUMERIC {
                        *vals.add(slot(q)) = v;
                    }
                    n += 1;
                });
            }
        }
        // SAFETY: every lane of the warp runs every round.
        match unsafe { out.place_lanes(p, row, n) } {
            Place::Short => return Some(Short { i, n }),
            Place::To(ov, oc) => {
                for q in 0..n {
                    // SAFETY: q < n: the row's sorted entries and its output.
                    unsafe {
                        *ov.add(q as usize) = *vals.add(slot(q));
                        *oc.add(q as usize) = *keys.add(slot(q));
                    }
                }
            }
            Place::Nothing | Place::Failed => {}
        }
        i += stride;
    }
    None
}

/// Inclusive prefix sum of `v` over the lanes of the warp.
///
/// # Safety
///
/// All 32 lanes of the warp execute this call.
#[inline(always)]
unsafe fn warp_inclusive_scan(v: u64) -> u64 {
    let lane = laneid();
    let mut x = v;
    let mut d = 1;
    while d < 32 {
        // SAFETY: forwarded from the caller: every lane runs every step.
        let y = unsafe {
            let lo = shfl_up(FULL, x as u32, d);
            let hi = shfl_up(FULL, (x >> 32) as u32, d);
            (hi as u64) << 32 | lo as u64
        };
        if lane >= d {
            x += y;
        }
        d *= 2;
    }
    x
}

/// Exclusive prefix sum of `v` over the block, and the total.
///
/// # Safety
///
/// Every thread of the block calls it; `words` is shared memory of at
/// least 33 `u64`s used by nothing else meanwhile.
#[inline(always)]
unsafe fn block_scan(v: u64, words: *mut u64) -> (u64, u64) {
    let lane = laneid();
    let warp = thread_in_block() / 32;
    let warps = block_threads().div_ceil(32);
    // SAFETY: every thread of the block, so every lane of its (full) warp.
    let x = unsafe { warp_inclusive_scan(v) };
    // SAFETY: warp < 32; the block's threads all reach the barriers.
    unsafe {
        if lane == 31 {
            *words.add(warp as usize) = x;
        }
        sync_block();
        if warp == 0 {
            let mut s = 0u64;
            let mut total = 0u64;
            for w in 0..warps {
                let t = *words.add(w as usize);
                if w == lane {
                    s = total;
                }
                total += t;
            }
            sync_warp(FULL);
            *words.add(lane as usize) = s;
            if lane == 0 {
                *words.add(32) = total;
            }
        }
        sync_block();
        let r = (x - v + *words.add(warp as usize), *words.add(32));
        sync_block();
        r
    }
}

/// The dense bin: a block per row, grid-stride over the bin's rows, with a
/// dense accumulator (values and a bitmap over the columns) that the block
/// clears as it reads it out.
///
/// # Safety
///
/// See the module documentation; launched with `DENSE_BLOCK` threads and
/// `DENSE_SHARED` bytes of dynamic shared memory.
#[inline(always)]
unsafe fn dense_kernel<O: Output>(p: &Problem, out: &mut O) {
    let smem = dynamic_shared() as *mut u64;
    let (rank, size) = (thread_in_block(), block_threads());
    let words = p.cols.div_ceil(32);
    if rank == 0 {
        // SAFETY: thread 0 of the block; smem holds DENSE_SHARED bytes.
        unsafe { *smem.add(40) = out.scratch(p, dense_bytes(p.cols)) as u64 };
    }
    // SAFETY: every thread of the block runs this.
    unsafe { sync_block() };
    // SAFETY: written before the barrier.
    let scratch = unsafe { *smem.add(40) };
    if scratch != 0 {
        let (vals, bits) = (scratch, scratch + p.cols * 8);
        let mut w = rank as u64;
        while w < words {
            // SAFETY: the scratch holds `dense_bytes(cols)`.
            unsafe { put(bits, w, 0u32) };
            w += size as u64;
        }
        if O::NUMERIC {
            let mut c = rank as u64;
            while c < p.cols {
                // SAFETY: as above.
                unsafe { put(vals, c, 0f64) };
                c += size as u64;
            }
        }
    }
    // SAFETY: as above; every thread of the block runs the loop.
    unsafe {
        sync_block();
        let by = Refiller::Leader { group: size };
        resume(out, by, move |o, at| dense_rows(p, o, scratch, at));
    }
    if rank == 0 {
        // SAFETY: from `scratch` above.
        unsafe { out.release(scratch as *mut u8) };
    }
}

/// The row loop of [`dense_kernel`] over its accumulator `scratch`
/// (cleared, or 0 if it could not be allocated), from the start or from a
/// row that stopped short.
///
/// # Safety
///
/// As for [`dense_kernel`]; every thread of the block runs it.
#[inline(always)]
unsafe fn dense_rows<O: Output>(
    p: &Problem,
    out: &mut O,
    scratch: u64,
    from: Option<Short>,
) -> Option<Short> {
    let g = Group {
        size: block_threads(),
        rank: thread_in_block(),
        warp: false,
    };
    let smem = dynamic_shared() as *mut u64;
    let words = p.cols.div_ceil(32);
    let vals = scratch;
    let bits = scratch + p.cols * 8;
    // SAFETY: analyse and place ran.
    let (count, base) = unsafe {
        (
            at::<u32>(p.bins, BIN_DENSE as u64) as u64,
            bin_base(p, BIN_DENSE),
        )
    };
    let per_thread = words.div_ceil(g.size as u64);
    let (w0, w1) = (
        (g.rank as u64 * per_thread).min(words),
        ((g.rank as u64 + 1) * per_thread).min(words),
    );
    let mut i = from.map_or(block_index() as u64, |s| s.i);
    let mut resumed = from.is_some();
    while i < count {
        // SAFETY: i < the bin's count.
        let row = unsafe { at::<u32>(p.bin_rows, base + i) } as u64;
        if scratch == 0 {
            if g.rank == 0 {
                // SAFETY: row < rows.
                unsafe { fail(p, row) };
            }
            i += grid_blocks() as u64;
            continue;
        }
        // A row that stopped short is already in the accumulator.
        if !core::mem::take(&mut resumed) {
            // SAFETY: row < rows; the accumulator covers every column.
            unsafe {
                for_products(
                    p,
                    row,
                    g,
                    O::NUMERIC,
                    Some(smem.add(DENSE_STAGE as usize / 8)),
                    |col, v| {
                        let w = atomic_u32(bits, col as u64 / 32);
                        let bit = 1u32 << (col % 32);
                        if w.load(Relaxed) & bit == 0 {
                            w.fetch_or(bit, Relaxed);
                        }
                        if O::NUMERIC {
                            atomic_add_f64((vals as *mut f64).add(col as usize), v);
                        }
                    },
                );
                sync_block();
            }
        }
        let mut mine = 0u64;
        for w in w0..w1 {
            // SAFETY: w < words.
            mine += unsafe { at::<u32>(bits, w) }.count_ones() as u64;
        }
        // SAFETY: every thread of the block runs it; words 0..33 of smem.
        let (mut at_out, n) = unsafe { block_scan(mine, smem) };
        if g.rank == 0 {
            // SAFETY: row < rows.
            let (v, c) = match unsafe { out.place(p, row, n as u32) } {
                Place::To(v, c) => (v as u64, c as u64),
                Place::Short => (SHORT, 0),
                Place::Nothing | Place::Failed => (0, 0),
            };
            // SAFETY: words 34 and 35 of smem, read after the barrier.
            unsafe {
                *smem.add(34) = v;
                *smem.add(35) = c;
            }
        }
        // SAFETY: as above.
        unsafe { sync_block() };
        // SAFETY: written before the barrier.
        let (ov, oc) = unsafe { (*smem.add(34), *smem.add(35)) };
        if ov == SHORT {
            // SAFETY: as above: every thread has read them.
            unsafe { sync_block() };
            return Some(Short { i, n: n as u32 });
        }
        for w in w0..w1 {
            // SAFETY: w < words; each bit a column < cols; the output
            // holds n entries, this thread's from its scan offset.
            unsafe {
                let mut word = at::<u32>(bits, w);
                while word != 0 {
                    let col = w * 32 + word.trailing_zeros() as u64;
                    if O::NUMERIC {
                        if ov != 0 {
                            put(ov, at_out, at::<f64>(vals, col));
                            put(oc, at_out, col as u32);
                        }
                        put(vals, col, 0f64);
                    }
                    at_out += 1;
                    word &= word - 1;
                }
                put(bits, w, 0u32);
            }
        }
        // SAFETY: as above: the next row reuses the accumulator.
        unsafe { sync_block() };
        i += grid_blocks() as u64;
    }
    None
}

/// Runs a row loop (`rows(out, from)`: from the start, or from where it
/// stopped short) until it has done all its rows, refilling the output
/// between as `by` says. For an
/// output that refills, the row loop is a function of its own: then no
/// value of the loop is live across the allocator's call, which would
/// make the assembler keep them in local memory (in the hash kernel, 544
/// bytes of spills, and its hash-table pointers reloaded per product).
///
/// # Safety
///
/// `rows` is a row loop of this module with its safety contract met;
/// every thread of the kernel calls this.
#[inline(always)]
unsafe fn resume<O: Output>(
    out: &mut O,
    by: Refiller,
    rows: impl Fn(&mut O, Option<Short>) -> Option<Short>,
) {
    #[inline(never)]
    fn apart<O>(
        out: &mut O,
        at: Option<Short>,
        rows: &impl Fn(&mut O, Option<Short>) -> Option<Short>,
    ) -> Option<Short> {
        rows(out, at)
    }
    if !O::REFILLS {
        rows(out, None);
        return;
    }
    let mut at = None;
    while let Some(s) = apart(out, at, &rows) {
        match by {
            // SAFETY: forwarded: every lane, between two runs of the loop.
            Refiller::Lanes => unsafe { out.refill_lanes(s.n) },
            Refiller::Leader { group } if thread_in_block().is_multiple_of(group) => {
                // SAFETY: forwarded: the leader, between two runs of the loop.
                unsafe { out.refill(s.n) }
            }
            Refiller::Leader { .. } => {}
        }
        at = Some(s);
    }
}

/// Who refills the output when a row loop stops short.
#[derive(Clone, Copy)]
enum Refiller {
    /// The first thread of each group of `group` threads (a warp or a
    /// block per row).
    Leader { group: u32 },
    /// Every lane, a warp refilling together (a thread per row).
    Lanes,
}

// Entry bodies: a kernel per method and kind of bin, so each gets the
// registers its own path needs (one kernel for all three would spill).
macro_rules! method_kernels {
    ($(
        $(#[$doc:meta])*
        [$thread:ident, $hash:ident, $dense:ident]($($arg:ident: $ty:ty),*) => $out:expr;
    )*) => {$(
        $(#[$doc])*
        /// Rows of the thread bin.
        pub unsafe fn $thread(problem: *const Problem $(, $arg: $ty)*) {
            // SAFETY: the launch's contract, forwarded.
            unsafe {
                let p = &*problem;
                resume(&mut $out, Refiller::Lanes, move |o, at| thread_rows(p, o, at))
            }
        }

        $(#[$doc])*
        /// Rows of the hash bin `bin`: `BIN_WARP` (a warp per row) or
        /// `BIN_BLOCK` (a block per row; any other value means it).
        pub unsafe fn $hash(problem: *const Problem, bin: u32 $(, $arg: $ty)*) {
            // SAFETY: the launch's contract, forwarded.
            unsafe {
                let (p, out) = (&*problem, &mut $out);
                if bin == BIN_WARP {
                    let by = Refiller::Leader { group: 32 };
                    resume(out, by, move |o, at| hash_rows::<_, true>(p, o, at))
                } else {
                    let by = Refiller::Leader { group: block_threads() };
                    resume(out, by, move |o, at| hash_rows::<_, false>(p, o, at))
                }
            }
        }

        $(#[$doc])*
        /// Rows of the dense bin.
        pub unsafe fn $dense(problem: *const Problem $(, $arg: $ty)*) {
            // SAFETY: the launch's contract, forwarded.
            unsafe { dense_kernel(&*problem, &mut $out) }
        }
    )*};
}

method_kernels! {
    /// Symbolic pass: `row_nnz`.
    ///
    /// # Safety
    ///
    /// See the module documentation; the dense kernel needs `scratch`.
    [spgemm_count_thread, spgemm_count_hash, spgemm_count_dense]() => Count;

    /// Numeric pass: C's columns and values at the offsets scanned from the
    /// symbolic pass.
    ///
    /// # Safety
    ///
    /// As for the symbolic pass, after the scan, with C allocated.
    [spgemm_numeric_thread, spgemm_numeric_hash, spgemm_numeric_dense]() => Csr;

    /// One pass on cuheap: each row's output carved from chunks of `chunk`
    /// bytes that a group (a warp in the thread kernel) allocates between
    /// runs of its row loop (with `chunk == 0`, a block per row, allocated
    /// the same way: slower than the `row` kernels below); `row_nnz` and
    /// `row_blocks`; a
    /// row whose block could not be allocated is counted in
    /// `status[STATUS_FAILED_ROWS]`.
    ///
    /// # Safety
    ///
    /// See the module documentation; `heap` stays live until the kernel ends.
    [spgemm_cuheap_thread, spgemm_cuheap_hash, spgemm_cuheap_dense](heap: HeapHandle, chunk: u32)
        => Blocks::<_, true>::new(OnHeap(&heap), chunk);

    /// One pass on cuheap, each row's output in a block of its own,
    /// allocated inside the row loop; otherwise as the kernels above with
    /// `chunk == 0`.
    ///
    /// # Safety
    ///
    /// See the module documentation; `heap` stays live until the kernel ends.
    [spgemm_cuheap_row_thread, spgemm_cuheap_row_hash, spgemm_cuheap_row_dense](heap: HeapHandle)
        => Blocks::<_, false>::new(OnHeap(&heap), 0);

    /// One pass on CUDA's device `malloc`, a block per row.
    ///
    /// # Safety
    ///
    /// See the module documentation.
    [spgemm_malloc_thread, spgemm_malloc_hash, spgemm_malloc_dense]() => Blocks::<_, false>::new(OnMalloc, 0);
}

// ---------------------------------------------------------------------------
// Scan of the row counts into C's offsets

/// This thread's rows of the tile and their sum.
///
/// # Safety
///
/// `p.row_nnz` holds `rows` counts.
#[inline(always)]
unsafe fn tile_items(p: &Problem) -> (u64, [u64; SCAN_ITEMS], u64) {
    let first = (block_index() as u64 * block_threads() as u64 + thread_in_block() as u64)
        * SCAN_ITEMS as u64;
    let mut items = [0u64; SCAN_ITEMS];
    let mut sum = 0;
    for (k, item) in items.iter_mut().enumerate() {
        let r = first + k as u64;
        if r < p.rows {
            // SAFETY: r < rows.
            *item = unsafe { at::<u32>(p.row_nnz, r) } as u64;
            sum += *item;
        }
    }
    (first, items, sum)
}

/// Scan, step 1: `sums[b]` = the nonzeros of tile `b` (a block's
/// `block_threads() x 4` rows).
///
/// # Safety
///
/// See the module documentation; `sums` holds a word per block, and the
/// launch has `SCAN_SHARED` bytes of dynamic shared memory.
pub unsafe fn spgemm_scan_tiles(problem: *const Problem, sums: *mut u64) {
    // SAFETY: the launch's contract.
    let p = unsafe { &*problem };
    // SAFETY: as documented.
    let (_, _, mine) = unsafe { tile_items(p) };
    // SAFETY: every thread runs it; shared words.
    let (_, total) = unsafe { block_scan(mine, dynamic_shared() as *mut u64) };
    if thread_in_block() == 0 {
        // SAFETY: a word per block.
        unsafe { *sums.add(block_index() as usize) = total };
    }
}

/// Scan, step 2 (one block): `sums[0..n]` becomes its exclusive prefix
/// sum, and `sums[n]` the total.
///
/// # Safety
///
/// `sums` holds `n + 1` words; one block, `SCAN_SHARED` bytes of shared
/// memory.
pub unsafe fn spgemm_scan_sums(sums: *mut u64, n: u32) {
    let mut carry = 0u64;
    let mut start = 0u32;
    let smem = dynamic_shared() as *mut u64;
    while start < n {
        let i = start + thread_in_block();
        let v = if i < n {
            // SAFETY: i < n.
            unsafe { *sums.add(i as usize) }
        } else {
            0
        };
        // SAFETY: every thread of the block runs every round.
        let (ex, total) = unsafe { block_scan(v, smem) };
        if i < n {
            // SAFETY: as above.
            unsafe { *sums.add(i as usize) = carry + ex };
        }
        carry += total;
        start += block_threads();
    }
    if thread_in_block() == 0 {
        // SAFETY: sums holds n + 1 words.
        unsafe { *sums.add(n as usize) = carry };
    }
}

/// Scan, step 3: C's offsets from the counts and the scanned tile sums.
///
/// # Safety
///
/// As for [`spgemm_scan_tiles`], after [`spgemm_scan_sums`].
pub unsafe fn spgemm_scan_apply(problem: *const Problem, sums: *const u64) {
    // SAFETY: the launch's contract.
    let p = unsafe { &*problem };
    // SAFETY: as documented.
    let (first, items, mine) = unsafe { tile_items(p) };
    // SAFETY: every thread runs it; shared words.
    let (ex, _) = unsafe { block_scan(mine, dynamic_shared() as *mut u64) };
    // SAFETY: a word per block.
    let mut off = ex + unsafe { *sums.add(block_index() as usize) };
    for (k, item) in items.iter().enumerate() {
        let r = first + k as u64;
        if r < p.rows {
            // SAFETY: r < rows: C's offsets hold rows + 1 words.
            unsafe { put(p.c_offsets, r, off) };
            off += item;
            if r + 1 == p.rows {
                // SAFETY: as above.
                unsafe { put(p.c_offsets, r + 1, off) };
            }
        }
    }
}

// ---------------------------------------------------------------------------
// One pass: compaction and free

/// Copies every row's block into C, by C's entries: a warp takes
/// `COMPACT_TILE` consecutive entries and its lanes take every 32nd of
/// them, so reads and writes are coalesced whatever the row lengths. A
/// lane finds the row of its first entry by binary search over C's
/// offsets, then walks forward.
///
/// # Safety
///
/// See the module documentation; C's offsets are scanned and its arrays
/// allocated; whole warps.
pub unsafe fn spgemm_compact(problem: *const Problem) {
    // SAFETY: the launch's contract.
    let p = unsafe { &*problem };
    let lane = laneid() as u64;
    // SAFETY: C's offsets hold rows + 1 words.
    let nnz = unsafe { at::<u64>(p.c_offsets, p.rows) };
    let mut tile = (global_thread() / 32) as u64 * COMPACT_TILE;
    let stride = (grid_threads() / 32) as u64 * COMPACT_TILE;
    while tile < nnz {
        let mut e = tile + lane;
        if e < nnz {
            // The row of e: the last r with offsets[r] <= e (a non-empty
            // row, since e < nnz).
            let (mut lo, mut hi) = (0u64, p.rows);
            while hi - lo > 1 {
                let mid = (lo + hi) / 2;
                // SAFETY: mid < rows.
                if unsafe { at::<u64>(p.c_offsets, mid) } <= e {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            let mut r = lo;
            let end_of = |r: u64| -> (u64, u64, u64) {
                // SAFETY: r < rows; the row's block holds its n values
                // then n columns.
                unsafe {
                    let start = at::<u64>(p.c_offsets, r);
                    let end = at::<u64>(p.c_offsets, r + 1);
                    (start, end, at::<u64>(p.row_blocks, r) & !1)
                }
            };
            let (mut start, mut end, mut block) = end_of(r);
            let last = (tile + COMPACT_TILE).min(nnz);
            while e < last {
                while e >= end {
                    r += 1;
                    (start, end, block) = end_of(r);
                }
                let (q, n) = (e - start, end - start);
                // SAFETY: q < n: inside the row's block and C.
                unsafe {
                    put(p.c_vals, e, at::<f64>(block, q));
                    put(p.c_cols, e, at::<u32>(block + 8 * n, q));
                }
                e += 32;
            }
        }
        tile += stride;
    }
}

/// # Safety
///
/// See the module documentation; every block in `row_blocks` is live.
#[inline(always)]
unsafe fn free_rows(p: &Problem, free: impl Fn(*mut u8)) {
    let mut row = global_thread() as u64;
    while row < p.rows {
        // SAFETY: row < rows; an owned block is freed once, here.
        unsafe {
            let b = at::<u64>(p.row_blocks, row);
            if b & 1 == 1 {
                free((b & !1) as *mut u8);
            }
        }
        row += grid_threads() as u64;
    }
}

/// Frees every block the rows own (after [`spgemm_compact`]).
///
/// # Safety
///
/// See the module documentation; `heap` is the heap of [`spgemm_cuheap`].
pub unsafe fn spgemm_free_cuheap(heap: HeapHandle, problem: *const Problem) {
    // SAFETY: forwarded.
    unsafe { free_rows(&*problem, |b| dev_free(&heap, b)) }
}

/// [`spgemm_free_cuheap`] for [`spgemm_malloc`].
///
/// # Safety
///
/// See the module documentation.
pub unsafe fn spgemm_free_malloc(problem: *const Problem) {
    // SAFETY: forwarded.
    unsafe { free_rows(&*problem, |b| OnMalloc.free(b)) }
}

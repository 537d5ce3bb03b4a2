//! What the host and the SpGEMM kernels agree on: the [`Problem`] every
//! kernel reads (one product's arrays and workspace, as device addresses),
//! how rows are binned by the bound on their output, and the shared memory
//! each kernel is launched with. Compiled into the host crate and, through
//! `#[path]`, into the kernels crate, so both read the same numbers.

/// One product C = A x B as the kernels see it: device addresses of the
/// inputs, the workspace and the outputs (0 where a method has none).
/// Every field is a `u64`, so the host writes it as a word array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Problem {
    /// A: `rows + 1` `u64` offsets, `u32` columns, `f64` values.
    pub a_offsets: u64,
    pub a_cols: u64,
    pub a_vals: u64,
    /// B, the same layout.
    pub b_offsets: u64,
    pub b_cols: u64,
    pub b_vals: u64,
    /// Rows of A (and C).
    pub rows: u64,
    /// Columns of B (and C).
    pub cols: u64,
    /// `u32` per row: a bound on the row's nonzeros: the least of its
    /// intermediate products, `cols`, and the span from the lowest to the
    /// highest column of the rows of B it meets.
    pub row_bound: u64,
    /// `u32` per row: the rows of each bin, bin after bin.
    pub bin_rows: u64,
    /// `u32 [BINS]` rows per bin, then `u32 [BINS]` placement cursors.
    pub bins: u64,
    /// `u32` per row: nonzeros of each row of C.
    pub row_nnz: u64,
    /// `u64` per row (one-pass methods): the address of the row's values
    /// (`n` `f64`) followed by its columns (`n` `u32`); bit 0 set where the
    /// row owns the block (frees it), clear where it shares a chunk.
    pub row_blocks: u64,
    /// C: `rows + 1` `u64` offsets, `u32` columns, `f64` values.
    pub c_offsets: u64,
    pub c_cols: u64,
    pub c_vals: u64,
    /// `u64 [STATUS_WORDS]`: see `STATUS_*`.
    pub status: u64,
    /// Two-pass only: `scratch_stride` bytes per block of the dense kernel.
    pub scratch: u64,
    pub scratch_stride: u64,
}

/// Words of a [`Problem`].
pub const PROBLEM_WORDS: usize = core::mem::size_of::<Problem>() / 8;

impl Problem {
    /// The problem as the words the kernels read.
    pub fn to_words(&self) -> [u64; PROBLEM_WORDS] {
        let s = self;
        [
            s.a_offsets,
            s.a_cols,
            s.a_vals,
            s.b_offsets,
            s.b_cols,
            s.b_vals,
            s.rows,
            s.cols,
            s.row_bound,
            s.bin_rows,
            s.bins,
            s.row_nnz,
            s.row_blocks,
            s.c_offsets,
            s.c_cols,
            s.c_vals,
            s.status,
            s.scratch,
            s.scratch_stride,
        ]
    }
}

/// Status word: intermediate products of the whole product.
pub const STATUS_PRODUCTS: usize = 0;
/// Status word: rows whose output could not be allocated (one-pass).
pub const STATUS_FAILED_ROWS: usize = 1;
/// Status words.
pub const STATUS_WORDS: usize = 2;

/// Bins, by the bound `b` on a row's nonzeros: rows with no products; a
/// thread per row that keeps the row sorted in its own part of shared
/// memory (`b <= THREAD_BOUND`); a warp per row with a hash table in shared
/// memory (`b <= WARP_BOUND`); a block of `HASH_BLOCK` threads per row with
/// a larger one (`b <= BLOCK_BOUND`); a block of `DENSE_BLOCK` threads per
/// row with a dense accumulator (a value per column and a bitmap) in
/// global memory.
pub const BINS: usize = 5;
pub const BIN_EMPTY: u32 = 0;
pub const BIN_THREAD: u32 = 1;
pub const BIN_WARP: u32 = 2;
pub const BIN_BLOCK: u32 = 3;
pub const BIN_DENSE: u32 = 4;
pub const THREAD_BOUND: u32 = 32;
pub const WARP_BOUND: u32 = 128;
pub const BLOCK_BOUND: u32 = 1024;

/// Threads per block of the thread-per-row kernel, and its dynamic shared
/// memory: `THREAD_BOUND` entries per thread.
pub const THREAD_BLOCK: u32 = 128;
pub const THREAD_SHARED: u32 = THREAD_BLOCK * THREAD_BOUND * ENTRY_BYTES;

/// Threads per block of the hash kernels (both hash bins).
pub const HASH_BLOCK: u32 = 256;
/// Threads per block of the dense kernel.
pub const DENSE_BLOCK: u32 = 512;

/// Entries of a hash table (the largest a row of the bin uses: twice its
/// bound, a power of two), per warp and per block.
pub const WARP_TABLE: u32 = 2 * WARP_BOUND;
pub const BLOCK_TABLE: u32 = 2 * BLOCK_BOUND;
/// Bytes of shared memory per group (warp or block) header.
pub const GROUP_HEADER: u32 = 32;
/// Bytes of an entry: an `f64` value and a `u32` column, in the table and
/// in the sort buffer of half its size.
pub const ENTRY_BYTES: u32 = 12;

/// Bytes per thread of the stage where a group loads a batch of a row's
/// entries (the offset and length of a row of B, and A's value).
pub const STAGE_BYTES: u32 = 24;

/// Dynamic shared memory of a hash kernel's block: a header per group,
/// then per group a table and a sort buffer (the same for both bins),
/// then the stage.
pub const HASH_TABLES: u32 =
    (HASH_BLOCK / 32) * GROUP_HEADER + (HASH_BLOCK / 32) * WARP_TABLE * 3 / 2 * ENTRY_BYTES;
pub const HASH_SHARED: u32 = HASH_TABLES + HASH_BLOCK * STAGE_BYTES;
/// Threads per block of the scan kernels, and rows per block (tile).
pub const SCAN_BLOCK: u32 = 1024;
/// Rows each thread of the scan sums.
pub const SCAN_ITEMS: usize = 4;
pub const SCAN_TILE: usize = SCAN_BLOCK as usize * SCAN_ITEMS;

/// Entries of C a warp of the compaction copies per step.
pub const COMPACT_TILE: u64 = 32 * 16;

/// Dynamic shared memory of the dense kernel's block: the scan's words,
/// then the stage.
pub const DENSE_STAGE: u32 = 512;
pub const DENSE_SHARED: u32 = DENSE_STAGE + DENSE_BLOCK * STAGE_BYTES;
/// Dynamic shared memory of the scan kernels.
pub const SCAN_SHARED: u32 = 512;

/// The bin of a row whose nonzeros are at most `bound`.
pub const fn bin_of(bound: u32) -> u32 {
    match bound {
        0 => BIN_EMPTY,
        b if b <= THREAD_BOUND => BIN_THREAD,
        b if b <= WARP_BOUND => BIN_WARP,
        b if b <= BLOCK_BOUND => BIN_BLOCK,
        _ => BIN_DENSE,
    }
}

/// Bytes of the dense accumulator for `cols` columns: a value per column
/// and a bit per column, rounded to 16 bytes.
pub const fn dense_bytes(cols: u64) -> u64 {
    (cols * 8 + cols.div_ceil(32) * 4).div_ceil(16) * 16
}

// Both hash bins fit the same shared memory.
const _: () = assert!((HASH_BLOCK / 32) * WARP_TABLE == BLOCK_TABLE && HASH_TABLES == 256 + 36864);
// No kernel needs the opt-in for more than 48 KiB of shared memory.
const _: () =
    assert!(HASH_SHARED <= 48 << 10 && DENSE_SHARED <= 48 << 10 && THREAD_SHARED <= 48 << 10);

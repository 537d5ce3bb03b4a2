//! C = A x B on the GPU, three ways that share the row kernels of
//! `kernels/src/spgemm.rs` and differ only in where each row's output goes:
//!
//! - [`Method::TwoPass`]: count every row (symbolic pass), scan, allocate
//!   C, compute every row again into C (numeric pass): the standard way;
//! - [`Method::Cuheap`]: one pass; each row allocates its output from a
//!   cuheap [`DeviceHeap`] as soon as it knows its size (a block per row,
//!   or chunks a warp carves its rows from), then a scan, C, and one
//!   compaction kernel that copies the rows into C;
//! - [`Method::CudaMalloc`]: the same one pass on CUDA's device `malloc`.
//!
//! Every step of a product (the workspace, binning the rows, every pass,
//! the scan, C's allocation, compaction and freeing the rows) is inside the
//! time [`multiply`] reports. A row whose output cannot be allocated makes
//! the product fail with [`Error::DeviceHeapExhausted`]: never a wrong C.

use super::problem::*;
use super::DeviceCsr;
use crate::kernels::Bench;
use crate::{DeviceHeap, Error, Gpu, LaunchConfig, Result};
use cuheap_host::DeviceMemory;

/// Registers per thread of every kernel but the thread bin's row kernels
/// ([`THREAD_BIN_MAX_REGISTERS`]): 4 blocks of the hash kernels and 2 of
/// the dense kernel per SM. Uncapped, the
/// allocator's rare paths (spans, new pages) would set the count for the
/// whole kernel (over 180).
pub const MAX_REGISTERS: u32 = 64;

/// Registers per thread of the thread bin's row kernels (`spgemm_*_thread`):
/// shared memory bounds their blocks to 4 per SM (16 warps), which 128
/// registers a thread still fit, and at [`MAX_REGISTERS`] the one-pass
/// kernel spilled (on an H100 80 GB, 12.4 M local-memory requests on the
/// 2D stencil against none for the numeric pass:
/// `docs/ab-spgemm-register-caps-h100.txt`).
pub const THREAD_BIN_MAX_REGISTERS: u32 = 128;

/// The register cap [`open_gpu`] gives the kernel `entry`:
/// [`THREAD_BIN_MAX_REGISTERS`] for the thread bin's row kernels
/// (`spgemm_*_thread`), [`MAX_REGISTERS`] for every other. (96 for the
/// one pass's block-per-row hash kernel alone was measured and not kept:
/// `docs/ab-spgemm-row-hash-cap-h100.txt`.)
pub fn register_cap(entry: &str) -> u32 {
    if entry.starts_with("spgemm_") && entry.ends_with("_thread") {
        THREAD_BIN_MAX_REGISTERS
    } else {
        MAX_REGISTERS
    }
}

/// GPU 0 with the benchmark kernels ([`crate::BENCH_PTX`]) loaded as the
/// products need them: each kernel at most [`register_cap`] registers
/// per thread (written into the PTX, entry by entry). It shares the device's primary context
/// (memory, heaps, streams) with every other [`Gpu`] of this process.
/// `CUHEAP_MAX_REGISTERS` (16..=255, or 0 for none) sets one cap for
/// every kernel instead.
pub fn open_gpu() -> Result<Gpu> {
    // Every entry gets a cap of its own, none over the module's.
    crate::open_capped(crate::BENCH_PTX, |entry| Some(register_cap(entry)))
}

/// How the rows of C are allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Symbolic pass, scan, numeric pass into C.
    TwoPass,
    /// One pass on cuheap: a block per row (`chunk == 0`), or a chunk of
    /// `chunk` bytes per warp (or block) that its rows are carved from.
    Cuheap { chunk: u32 },
    /// One pass on CUDA's device `malloc`, a block per row.
    CudaMalloc,
}

impl Method {
    /// cuheap's default: chunks of 32 KiB. On an H100 80 GB they were as
    /// fast as 8 KiB or faster on every product of `cuheap demo spgemm`
    /// (up to 8%, on uniform rows), with as much memory or less
    /// (docs/ab-spgemm-chunks-h100.txt).
    pub const CUHEAP: Method = Method::Cuheap {
        chunk: Method::DEFAULT_CHUNK,
    };

    /// The chunk of [`Method::CUHEAP`], in bytes.
    pub const DEFAULT_CHUNK: u32 = 32 << 10;

    /// A short name for tables.
    pub fn name(&self) -> String {
        match self {
            Method::TwoPass => "two-pass".into(),
            Method::Cuheap { chunk: 0 } => "cuheap one-pass, per row".into(),
            Method::Cuheap { chunk } => format!("cuheap one-pass, {} KiB chunks", chunk >> 10),
            Method::CudaMalloc => "CUDA malloc one-pass".into(),
        }
    }
}

/// A product and what it cost.
pub struct GpuProduct {
    pub c: DeviceCsr,
    /// Milliseconds, CUDA events around every step.
    pub ms: f64,
    /// Intermediate products (multiply-adds).
    pub products: u64,
    /// Device memory the product held at its peak besides A and B: the
    /// workspace, C, and the rows' memory (the heap's pages in use after
    /// the row kernels for cuheap, the whole heap for CUDA malloc, the
    /// dense accumulators for two-pass). Measured when `measure` was set.
    pub peak_bytes: usize,
    /// Bytes of the cuheap heap's pages in use after the row kernels.
    pub heap_bytes: usize,
}

/// Device memory of one product's workspace, counted as it is allocated.
struct Workspace<'g> {
    gpu: &'g Gpu,
    bytes: usize,
}

impl Workspace<'_> {
    fn alloc(&mut self, bytes: usize) -> Result<DeviceMemory> {
        self.bytes += bytes;
        self.gpu.alloc(bytes)
    }

    fn alloc_zeroed(&mut self, bytes: usize) -> Result<DeviceMemory> {
        self.bytes += bytes;
        self.gpu.alloc_zeroed(bytes)
    }
}

/// Frees the blocks of a one-pass product's rows once (`free`), or, if the
/// product stops with an error before that, when dropped (then waits for
/// the device, so the workspace the kernel reads outlives it).
struct RowsGuard<'a> {
    k: &'a Bench,
    gpu: &'a Gpu,
    method: Method,
    heap: Option<&'a DeviceHeap>,
    p: crate::DevicePtr<Problem>,
    cfg: LaunchConfig<'static>,
    armed: bool,
}

impl RowsGuard<'_> {
    fn free(&mut self) -> Result<()> {
        if !std::mem::take(&mut self.armed) {
            return Ok(());
        }
        // SAFETY: the Problem and its `row_blocks` are live (the guard is
        // dropped before the workspace), and every owned block recorded
        // there is live until this frees it.
        unsafe {
            match (self.method, self.heap) {
                (Method::Cuheap { .. }, Some(heap)) => {
                    self.k.spgemm_free_cuheap(&self.cfg, heap, self.p)
                }
                (Method::CudaMalloc, _) => self.k.spgemm_free_malloc(&self.cfg, self.p),
                _ => Ok(()),
            }
        }
    }
}

impl Drop for RowsGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            // On an error path: nothing to report the failures to.
            let _ = self.free();
            let _ = self.gpu.sync();
        }
    }
}

/// Bytes the dense accumulators of one product may take at once: caps the
/// blocks of the dense bin when C has very many columns.
const DENSE_BUDGET: u64 = 1 << 30;

/// Blocks of the warp bin's kernels per SM: as many as are resident at
/// once on an H100 (shared memory: 4 x 42.25 KiB; registers: 4 x 256 x 64);
/// the thread bin's too (4 x 48 KiB).
/// One wave of blocks that loop over the rows: each warp's last chunk is
/// left part-used once, not once per block.
const RESIDENT_BLOCKS: u32 = 4;

/// What the products run with: the GPU, its kernels, the cuheap heap for
/// [`Method::Cuheap`], and the size CUDA's device heap was given (counted as
/// the memory of [`Method::CudaMalloc`]).
pub struct Runner<'a> {
    pub gpu: &'a Gpu,
    pub kernels: &'a Bench,
    pub heap: Option<&'a DeviceHeap>,
    pub malloc_heap: usize,
}

impl Runner<'_> {
    /// C = A x B with `method`. When `measure` is set, the host stops after
    /// the row kernels to read the heap's footprint (for `peak_bytes`),
    /// which adds a synchronisation to the time.
    pub fn multiply(
        &self,
        method: Method,
        a: &DeviceCsr,
        b: &DeviceCsr,
        measure: bool,
    ) -> Result<GpuProduct> {
        if a.cols != b.rows {
            return Err(Error::InvalidArgument(format!(
                "cannot multiply a {}x{} matrix by a {}x{} matrix",
                a.rows, a.cols, b.rows, b.cols
            )));
        }
        if matches!(method, Method::Cuheap { .. }) && self.heap.is_none() {
            return Err(Error::InvalidArgument(
                "the cuheap method needs a device heap".into(),
            ));
        }
        if b.cols > u32::MAX as usize || a.rows > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "a {}x{} result: rows and columns must fit 32 bits",
                a.rows, b.cols
            )));
        }
        let mut result = None;
        let ms = self.gpu.time(|| {
            result = Some(self.run(method, a, b, measure)?);
            Ok(())
        })? as f64;
        let mut product = result.expect("run returned");
        product.ms = ms;
        Ok(product)
    }

    fn run(
        &self,
        method: Method,
        a: &DeviceCsr,
        b: &DeviceCsr,
        measure: bool,
    ) -> Result<GpuProduct> {
        let Runner {
            gpu,
            kernels: k,
            heap,
            malloc_heap,
        } = *self;
        let rows = a.rows;
        if rows == 0 || b.cols == 0 || a.nnz == 0 || b.nnz == 0 {
            // No products: C is all zeros (nothing for the kernels to do).
            let c = DeviceCsr::uninit(gpu, rows, b.cols, 0)?;
            return Ok(GpuProduct {
                peak_bytes: c.bytes(),
                c,
                ms: 0.0,
                products: 0,
                heap_bytes: 0,
            });
        }
        let one_pass = method != Method::TwoPass;
        // CUHEAP_SPGEMM_PHASES=1: wait after each phase and print its time
        // (to find where a product spends it; the waits add to the total).
        let phases = std::env::var_os("CUHEAP_SPGEMM_PHASES").is_some();
        let mut clock = std::time::Instant::now();
        let mut phase = |name: &str| -> Result<()> {
            if phases {
                gpu.sync()?;
                eprintln!("  {name}: {:.3} ms", clock.elapsed().as_secs_f64() * 1e3);
                clock = std::time::Instant::now();
            }
            Ok(())
        };
        let mut ws = Workspace { gpu, bytes: 0 };
        let row_bound = ws.alloc(rows * 4)?;
        let bin_rows = ws.alloc(rows * 4)?;
        let bins = ws.alloc_zeroed(BINS * 2 * 4)?;
        let row_nnz = ws.alloc_zeroed(rows * 4)?;
        let row_blocks = if one_pass {
            Some(ws.alloc_zeroed(rows * 8)?)
        } else {
            None
        };
        let status = ws.alloc_zeroed(STATUS_WORDS * 8)?;
        let tiles = rows.div_ceil(SCAN_TILE).max(1);
        let sums = ws.alloc((tiles + 1) * 8)?;
        let c_offsets = ws.alloc((rows + 1) * 8)?;
        let problem_mem = ws.alloc(PROBLEM_WORDS * 8)?;
        let mut problem = Problem {
            a_offsets: a.row_offsets.ptr(),
            a_cols: a.col_indices.ptr(),
            a_vals: a.values.ptr(),
            b_offsets: b.row_offsets.ptr(),
            b_cols: b.col_indices.ptr(),
            b_vals: b.values.ptr(),
            rows: rows as u64,
            cols: b.cols as u64,
            row_bound: row_bound.ptr(),
            bin_rows: bin_rows.ptr(),
            bins: bins.ptr(),
            row_nnz: row_nnz.ptr(),
            row_blocks: row_blocks.as_ref().map_or(0, |m| m.ptr()),
            c_offsets: c_offsets.ptr(),
            status: status.ptr(),
            ..Problem::default()
        };
        problem_mem.write(0, &problem.to_words())?;
        let p = problem_mem.as_ptr::<Problem>();
        let per_row = LaunchConfig::for_threads(rows as u32);
        // SAFETY: (every launch below) the Problem's arrays were allocated
        // above with the sizes its documentation gives, A and B are the
        // caller's valid matrices, and all of them outlive the launches: the
        // host reads results back (synchronising) before returning.
        unsafe {
            k.spgemm_analyse(&per_row, p)?;
            k.spgemm_place(&per_row, p)?;
        }
        phase("workspace, analyse, place")?;
        let mut counts = [0u32; BINS];
        bins.read(0, &mut counts)?;
        let sms = gpu.info().sms.max(1);
        let dense = dense_bytes(b.cols as u64);
        let dense_grid = (counts[BIN_DENSE as usize])
            .min(sms * 2)
            .min((DENSE_BUDGET / dense).max(1) as u32);
        let mut scratch = None;
        if !one_pass && dense_grid > 0 {
            let s = ws.alloc(dense_grid as usize * dense as usize)?;
            problem.scratch = s.ptr();
            problem.scratch_stride = dense;
            problem_mem.write(0, &problem.to_words())?;
            scratch = Some(s);
        }
        // In chunks, each warp of the thread bin carves its rounds from a
        // chunk it keeps: one wave of blocks, so that every warp runs many
        // rounds and leaves one chunk's tail unused, not one per few rounds.
        let thread_waves = match method {
            Method::Cuheap { chunk } if chunk > 0 => RESIDENT_BLOCKS,
            _ => 64,
        };
        let launches = |bin: u32| -> LaunchConfig<'static> {
            let n = counts[bin as usize];
            match bin {
                BIN_THREAD => LaunchConfig::shape(
                    (n.div_ceil(THREAD_BLOCK).min(sms * thread_waves), 1, 1),
                    (THREAD_BLOCK, 1, 1),
                )
                .with_shared_bytes(THREAD_SHARED),
                BIN_WARP => LaunchConfig::shape(
                    (n.div_ceil(HASH_BLOCK / 32).min(sms * RESIDENT_BLOCKS), 1, 1),
                    (HASH_BLOCK, 1, 1),
                )
                .with_shared_bytes(HASH_SHARED),
                BIN_BLOCK => LaunchConfig::shape((n.min(sms * 12), 1, 1), (HASH_BLOCK, 1, 1))
                    .with_shared_bytes(HASH_SHARED),
                _ => LaunchConfig::shape((dense_grid, 1, 1), (DENSE_BLOCK, 1, 1))
                    .with_shared_bytes(DENSE_SHARED),
            }
        };
        let row_kernels = |numeric: bool| -> Result<()> {
            for bin in [BIN_DENSE, BIN_BLOCK, BIN_WARP, BIN_THREAD] {
                if counts[bin as usize] == 0 {
                    continue;
                }
                let cfg = launches(bin);
                // SAFETY: as above; the shape is the bin's (problem.rs).
                unsafe {
                    match (method, numeric, bin) {
                        (Method::TwoPass, false, BIN_THREAD) => k.spgemm_count_thread(&cfg, p)?,
                        (Method::TwoPass, false, BIN_DENSE) => k.spgemm_count_dense(&cfg, p)?,
                        (Method::TwoPass, false, _) => k.spgemm_count_hash(&cfg, p, bin)?,
                        (Method::TwoPass, true, BIN_THREAD) => k.spgemm_numeric_thread(&cfg, p)?,
                        (Method::TwoPass, true, BIN_DENSE) => k.spgemm_numeric_dense(&cfg, p)?,
                        (Method::TwoPass, true, _) => k.spgemm_numeric_hash(&cfg, p, bin)?,
                        (Method::Cuheap { chunk }, _, _) => {
                            let heap = heap.expect("checked by multiply");
                            match (chunk, bin) {
                                (0, BIN_THREAD) => k.spgemm_cuheap_row_thread(&cfg, p, heap)?,
                                (0, BIN_DENSE) => k.spgemm_cuheap_row_dense(&cfg, p, heap)?,
                                (0, _) => k.spgemm_cuheap_row_hash(&cfg, p, bin, heap)?,
                                (_, BIN_THREAD) => k.spgemm_cuheap_thread(&cfg, p, heap, chunk)?,
                                (_, BIN_DENSE) => k.spgemm_cuheap_dense(&cfg, p, heap, chunk)?,
                                _ => k.spgemm_cuheap_hash(&cfg, p, bin, heap, chunk)?,
                            }
                        }
                        (Method::CudaMalloc, _, BIN_THREAD) => k.spgemm_malloc_thread(&cfg, p)?,
                        (Method::CudaMalloc, _, BIN_DENSE) => k.spgemm_malloc_dense(&cfg, p)?,
                        (Method::CudaMalloc, _, _) => k.spgemm_malloc_hash(&cfg, p, bin)?,
                    }
                }
            }
            Ok(())
        };
        // From here until they are freed, the rows' blocks are in the
        // heap: on an error the guard frees them before the workspace goes.
        let mut rows_guard = RowsGuard {
            k,
            gpu,
            method,
            heap,
            p,
            cfg: per_row,
            armed: one_pass,
        };
        row_kernels(false)?;
        phase(if one_pass { "rows" } else { "symbolic pass" })?;
        let mut heap_bytes = 0;
        if measure {
            if let (Method::Cuheap { .. }, Some(h)) = (method, heap) {
                heap_bytes = h.stats()?.bytes_reserved as usize;
            }
        }
        let scan = LaunchConfig::shape((tiles as u32, 1, 1), (SCAN_BLOCK, 1, 1))
            .with_shared_bytes(SCAN_SHARED);
        let one = LaunchConfig::shape((1, 1, 1), (SCAN_BLOCK, 1, 1)).with_shared_bytes(SCAN_SHARED);
        // SAFETY: as above; `sums` holds tiles + 1 words.
        unsafe {
            k.spgemm_scan_tiles(&scan, p, sums.as_ptr())?;
            k.spgemm_scan_sums(&one, sums.as_ptr(), tiles as u32)?;
            k.spgemm_scan_apply(&scan, p, sums.as_ptr())?;
        }
        let mut nnz = [0u64];
        c_offsets.read(rows * 8, &mut nnz)?;
        phase("scan")?;
        let mut st = [0u64; STATUS_WORDS];
        status.read(0, &mut st)?;
        if st[STATUS_FAILED_ROWS] > 0 {
            rows_guard.free()?;
            gpu.sync()?;
            let bytes = match heap {
                Some(h) if matches!(method, Method::Cuheap { .. }) => h.shortfall()?.1,
                _ => 0,
            };
            return Err(Error::DeviceHeapExhausted {
                failed: st[STATUS_FAILED_ROWS],
                bytes,
            });
        }
        let nnz = nnz[0] as usize;
        let col_indices = gpu.alloc(nnz * 4)?;
        let values = gpu.alloc(nnz * 8)?;
        problem.c_cols = col_indices.ptr();
        problem.c_vals = values.ptr();
        problem_mem.write(0, &problem.to_words())?;
        phase("allocate C")?;
        if one_pass {
            let tiles = (nnz as u64).div_ceil(COMPACT_TILE).clamp(1, 1 << 20) as u32;
            let compact = LaunchConfig::for_threads(tiles * 32);
            // SAFETY: as above; C holds nnz entries.
            unsafe { k.spgemm_compact(&compact, p)? };
            phase("compact")?;
            rows_guard.free()?;
            phase("free rows")?;
        } else {
            row_kernels(true)?;
            phase("numeric pass")?;
        }
        gpu.sync()?;
        let rows_memory = match method {
            Method::TwoPass => 0,
            Method::Cuheap { .. } => heap_bytes,
            Method::CudaMalloc => malloc_heap,
        };
        let c = DeviceCsr {
            rows,
            cols: b.cols,
            nnz,
            row_offsets: c_offsets,
            col_indices,
            values,
        };
        drop(scratch);
        Ok(GpuProduct {
            peak_bytes: ws.bytes - (rows + 1) * 8 + c.bytes() + rows_memory,
            c,
            ms: 0.0,
            products: st[STATUS_PRODUCTS],
            heap_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ptx` with every entry capped at its [`register_cap`], as
    /// [`open_gpu`] loads it.
    fn caps(ptx: &str) -> Result<String> {
        crate::with_register_caps(ptx, |entry| Some(register_cap(entry)))
    }

    /// Every entry of the benchmark PTX gets one cap, the thread bin's
    /// kernels the larger, and the entries and their parameters read the
    /// same as before (the typed launches check them).
    #[test]
    fn every_entry_gets_its_register_cap() {
        let capped = caps(crate::BENCH_PTX).unwrap();
        let before: Vec<_> = crate::entries(crate::BENCH_PTX).collect();
        let after: Vec<_> = crate::entries(&capped).collect();
        assert_eq!(before, after);
        let mut lines = capped.lines();
        let mut thread_bin = 0;
        while let Some(l) = lines.next() {
            let Some(name) = l.strip_prefix(".visible .entry ") else {
                continue;
            };
            let name = name.trim_end_matches('(');
            let cap = lines
                .by_ref()
                .skip_while(|l| !l.starts_with(')'))
                .nth(1)
                .unwrap_or_default();
            let want = register_cap(name);
            if want == THREAD_BIN_MAX_REGISTERS {
                thread_bin += 1;
            }
            assert_eq!(cap, format!(".maxnreg {want}"), "{name}");
        }
        // count, numeric, one pass in chunks and per row, CUDA malloc.
        assert_eq!(thread_bin, 5);
        assert_eq!(capped.matches(".maxnreg").count(), before.len());
        // Applied twice, nothing changes.
        assert_eq!(caps(&capped).unwrap(), capped);
    }

    /// Which kernel gets which cap, by name.
    #[test]
    fn caps_go_by_kernel_name() {
        assert_eq!(register_cap("spgemm_cuheap_row_thread"), 128);
        assert_eq!(register_cap("spgemm_numeric_thread"), 128);
        assert_eq!(register_cap("spgemm_cuheap_row_hash"), 64);
        assert_eq!(register_cap("spgemm_numeric_hash"), 64);
        assert_eq!(register_cap("spgemm_cuheap_row_dense"), 64);
        assert_eq!(register_cap("pair_cuheap"), 64);
        // None over the module's cap, which `open_gpu` leaves in place.
        assert!(Some(THREAD_BIN_MAX_REGISTERS.max(MAX_REGISTERS)) <= crate::DEFAULT_MAX_REGISTERS);
    }

    /// Headers as PTX allows them: no parameters, the parenthesis closing
    /// on a parameter's line, the body's brace on the header's line,
    /// other directives, a cap of their own, `.weak` and bare entries.
    #[test]
    fn every_header_form_gets_one_cap_before_its_body() {
        let cases = [
            (".visible .entry a()\n{\n}\n", ".visible .entry a()\n.maxnreg 64\n{\n}\n"),
            (
                ".visible .entry spgemm_x_thread(\n\t.param .u64 p)\n{\n}\n",
                ".visible .entry spgemm_x_thread(\n\t.param .u64 p)\n.maxnreg 128\n{\n}\n",
            ),
            (".entry a(.param .u32 p){ ret; }", ".entry a(.param .u32 p)\n.maxnreg 64\n{ ret; }"),
            (
                ".weak .entry b()\n.maxntid 256\n{\n}\n",
                ".weak .entry b()\n.maxntid 256\n.maxnreg 64\n{\n}\n",
            ),
            (
                ".visible .entry spgemm_x_thread(\n\t.param .u64 p\n)\n.maxntid 128\n.maxnreg 40\n{\n}\n",
                ".visible .entry spgemm_x_thread(\n\t.param .u64 p\n)\n.maxntid 128\n.maxnreg 40\n{\n}\n",
            ),
            // Not an entry: a function, and `.entry` inside a comment.
            (".func f()\n{\n}\n// .entry z\n", ".func f()\n{\n}\n// .entry z\n"),
        ];
        for (ptx, want) in cases {
            assert_eq!(caps(ptx).unwrap(), want, "{ptx:?}");
        }
        // Two entries: each gets its own cap.
        let two = ".visible .entry a()\n{\n}\n.visible .entry spgemm_b_thread()\n{\n}\n";
        assert_eq!(
            caps(two).unwrap(),
            ".visible .entry a()\n.maxnreg 64\n{\n}\n.visible .entry spgemm_b_thread()\n.maxnreg 128\n{\n}\n"
        );
        // No body: an error that names the entry, not a broken module.
        let e = caps(".visible .entry lost(\n\t.param .u64 p\n)\n").unwrap_err();
        assert!(e.to_string().contains("no body for entry lost"), "{e}");
    }
}

// The benchmark and test kernels' parameters: the one place they are written.
//
// Included by `kernels/src/entry.rs`, which generates each `.entry` point
// (and fails to compile if a body's parameters differ), and by the root
// crate's `src/kernels.rs`, which generates the typed host launches. The
// types are the device's; on the host a `*mut T` or `*const T` is a
// `DevicePtr<T>` and a `HeapHandle` is a `&DeviceHeap`.
//
// Shared conventions: `n` threads do the work (one item each; the grid may
// be larger); `sz` is the bytes each thread allocates, 0 for mixed sizes
// (16..=4096, fixed per thread); `errors` points to two `u32` counters,
// `[0]` null allocations and `[1]` wrong contents or alignment.

signatures! {
    /// Per thread: allocates `sz` bytes from `heap`, writes up to 4 words,
    /// fences, reads them back, frees.
    ///
    /// # Safety
    ///
    /// `heap` stays live until the kernel ends; `errors` points to two `u32`s.
    fn bench::pair_cuheap(heap: HeapHandle, n: u32, sz: u32, errors: *mut u32);

    /// Per thread: allocates `sz` bytes from `heap` into `ptrs[tid]`.
    ///
    /// # Safety
    ///
    /// `heap` stays live until the kernel ends; `ptrs` holds `n` pointers;
    /// `errors` points to two `u32`s.
    fn bench::alloc_cuheap(heap: HeapHandle, n: u32, sz: u32, ptrs: *mut *mut u8, errors: *mut u32);

    /// `alloc_cuheap`, and each warp's lane 0 writes the device clock
    /// (`%globaltimer`, ns) before and after its allocation to
    /// `trace[2 * warp]` and `trace[2 * warp + 1]`: where a launch spends
    /// its time (`cuheap bench growth` with `CUHEAP_GROWTH_TRACE`).
    ///
    /// # Safety
    ///
    /// As `alloc_cuheap`; `trace` holds two `u64`s per warp of `n` threads.
    fn bench::alloc_cuheap_traced(heap: HeapHandle, n: u32, sz: u32, ptrs: *mut *mut u8, errors: *mut u32, trace: *mut u64);

    /// One round of the churn workload (`churn_case`): each thread that
    /// the round picks checks its block in `ptrs[tid]` (null: none), frees
    /// it, allocates one of the round's size and fills it; `round`
    /// `u32::MAX` checks and frees every block and allocates none. Damaged
    /// blocks count in `errors[1]`, nulls in `errors[0]`.
    ///
    /// # Safety
    ///
    /// `heap` stays live until the kernel ends; `ptrs` holds `n` pointers,
    /// each null or a live block of `heap` that the previous rounds of this
    /// workload allocated for that thread; `errors` points to two `u32`s.
    fn bench::churn_cuheap(heap: HeapHandle, n: u32, round: u32, ptrs: *mut *mut u8, errors: *mut u32);

    /// Per thread: frees `ptrs[tid]` to `heap` (null, foreign, interior and
    /// double frees are refused and counted in the heap's `bad_frees`).
    ///
    /// # Safety
    ///
    /// `heap` stays live until the kernel ends; `ptrs` holds `n` pointers.
    fn bench::free_cuheap(heap: HeapHandle, n: u32, ptrs: *mut *mut u8);

    /// `pair_cuheap` on CUDA's device `malloc`/`free`.
    ///
    /// # Safety
    ///
    /// `errors` points to two `u32`s.
    fn bench::pair_cuda(n: u32, sz: u32, errors: *mut u32);

    /// `alloc_cuheap` on CUDA's device `malloc`.
    ///
    /// # Safety
    ///
    /// `ptrs` holds `n` pointers; `errors` points to two `u32`s.
    fn bench::alloc_cuda(n: u32, sz: u32, ptrs: *mut *mut u8, errors: *mut u32);

    /// Per thread: CUDA's device `free` of `ptrs[tid]`.
    ///
    /// # Safety
    ///
    /// `ptrs` holds `n` pointers, each null or from `alloc_cuda` and not
    /// yet freed.
    fn bench::free_cuda(n: u32, ptrs: *mut *mut u8);

    /// The ceiling: a warp-aggregated bump pointer over `cap` bytes at
    /// `base` (one atomic per warp, no free). `cursor` is the offset of the
    /// next free byte.
    ///
    /// # Safety
    ///
    /// `base` holds `cap` bytes; `cursor` points to a `u64`; `ptrs` holds
    /// `n` pointers; `errors` points to two `u32`s.
    fn bench::alloc_bump(
        base: *mut u8,
        cap: u64,
        cursor: *mut u64,
        n: u32,
        sz: u32,
        ptrs: *mut *mut u8,
        errors: *mut u32,
    );

    /// `x[i] = x[i] * 2 + 1`: proves a launch runs and writes memory.
    ///
    /// # Safety
    ///
    /// `x` holds `n` values.
    fn checks::smoke(x: *mut u32, n: u32);

    /// For every size `s` in `0..=max`: `class[s]` = `class_of(s)` (or
    /// `u32::MAX`) and `size[s]` = that class's block size.
    ///
    /// # Safety
    ///
    /// `class` and `size` hold `max + 1` values.
    fn checks::conformance_classes(class: *mut u32, size: *mut u32, max: u32);

    /// For input word `i` and every `k` in `0..=32`: `out[(i*33+k)*2]` =
    /// `lowest_set(w, k)`, `out[(i*33+k)*2+1]` = `nth_set(w, k)` (or `u32::MAX`).
    ///
    /// # Safety
    ///
    /// `words` holds `n` values, `out` `n * 66`.
    fn checks::conformance_bits(words: *const u32, n: u32, out: *mut u32);

    /// The metadata layout of a heap of `pages` pages and `slots` slots as
    /// the GPU computes it: 8 values (thread 0 only).
    ///
    /// # Safety
    ///
    /// `out` holds 8 values.
    fn checks::conformance_layout(pages: u32, slots: u32, out: *mut u64);

    /// Per thread whose `ptrs[tid]` is null: allocates `sz` bytes from
    /// `heap` into it (null again if the heap is short). Threads that
    /// already hold a block do nothing, so running it again after the heap
    /// grew retries only the failed part.
    ///
    /// # Safety
    ///
    /// `heap` stays live until the kernel ends; `ptrs` holds `n` pointers.
    fn checks::alloc_missing(heap: HeapHandle, n: u32, sz: u32, ptrs: *mut *mut u8);

    /// Fills each thread's whole block `ptrs[tid]` with its thread id.
    ///
    /// # Safety
    ///
    /// `ptrs` holds `n` pointers, each null or a live block of at least
    /// the size thread `tid` asked for with `sz`.
    fn checks::fill_blocks(ptrs: *const *mut u8, n: u32, sz: u32);

    /// Checks each block still holds only its thread id (another id means
    /// two live blocks overlapped) and is aligned: 16 bytes, and its own
    /// size for power-of-two sizes up to 64 KiB when `natural != 0`
    /// (cuheap's promise). Failures go to `errors[1]`.
    ///
    /// # Safety
    ///
    /// As for `fill_blocks`; `errors` points to two `u32`s.
    fn checks::check_blocks(ptrs: *const *mut u8, n: u32, sz: u32, natural: u32, errors: *mut u32);

    /// Random sizes, `rounds` rounds: each thread holds two blocks at once,
    /// tags them, checks both, frees both. Mostly small sizes, some large
    /// classes and some spans.
    ///
    /// # Safety
    ///
    /// `heap` stays live until the kernel ends; `errors` points to two `u32`s.
    fn checks::stress_heap(heap: HeapHandle, n: u32, rounds: u32, seed: u32, errors: *mut u32);

    /// Per thread: `(size, align)` of `aligned_case(tid)` (every power of
    /// two from 1 B to 64 KiB), from `heap` by `dev_alloc_aligned`, or with
    /// `global != 0` by Rust's global allocator (the module heap); fills
    /// the block's words with `tid` and stores it in `ptrs[tid]`. Nulls go
    /// to `errors[0]`, misaligned blocks to `errors[1]`.
    ///
    /// # Safety
    ///
    /// `heap` stays live until the kernel ends, and with `global != 0` is
    /// the module's heap (`DeviceHeap::install`); `ptrs` holds `n`
    /// pointers; `errors` points to two `u32`s.
    fn checks::alloc_aligned_cuheap(
        heap: HeapHandle,
        n: u32,
        global: u32,
        ptrs: *mut *mut u8,
        errors: *mut u32,
    );

    /// Checks each block of `alloc_aligned_cuheap` still holds its thread
    /// id and has its alignment; failures go to `errors[1]`.
    ///
    /// # Safety
    ///
    /// `ptrs` holds the `n` pointers `alloc_aligned_cuheap` stored, each
    /// null or still live; `errors` points to two `u32`s.
    fn checks::check_aligned(ptrs: *const *mut u8, n: u32, errors: *mut u32);

    /// Per thread: a block of `realloc_case(tid, 0)`, grown to its whole
    /// block (which must stay in place), then resized through the sizes of
    /// `realloc_case(tid, 1..=REALLOC_STEPS)` by `dev_realloc` (or, with
    /// `global != 0`, Rust's global allocator), checking after each step
    /// that the kept bytes hold the last tag and the block its alignment,
    /// then freed. Nulls go to `errors[0]`, lost contents, misaligned
    /// blocks and moves that should not happen to `errors[1]`.
    ///
    /// # Safety
    ///
    /// As for `alloc_aligned_cuheap`, without `ptrs`.
    fn checks::realloc_chain(heap: HeapHandle, n: u32, global: u32, errors: *mut u32);

    /// Per thread: pushes `vec_len(tid, seed)` values `vec_value(tid, k)`
    /// onto a `Vec<u64>` (growth by realloc), shrinks it into a `Box<[u64]>`,
    /// spells its checksum in a `String` and reads it back; writes the
    /// length and checksum to `out[2 * tid]` and `out[2 * tid + 1]`.
    /// Exhaustion (fallible growth) writes `u64::MAX` as the length and
    /// counts `errors[0]`; a wrongly spelled checksum counts `errors[1]`.
    ///
    /// # Safety
    ///
    /// The module's heap (`cuheap_heap`, `DeviceHeap::install`) is set and
    /// stays live until the kernel ends; `out` holds `2 * n` values;
    /// `errors` points to two `u32`s.
    fn vecs::vec_build(n: u32, seed: u32, out: *mut u64, errors: *mut u32);

    /// Spins for `spin_ns` nanoseconds, then writes `value` to `x[0..n]`
    /// (grid-stride): a slow producer for cross-stream tests.
    ///
    /// # Safety
    ///
    /// `x` holds `n` values.
    fn checks::spin_fill(x: *mut u32, n: u32, value: u32, spin_ns: u64);

    /// Counts the values of `x[0..n]` that are not `expect` (in
    /// `errors[0]`), then writes `value` over them (grid-stride).
    ///
    /// # Safety
    ///
    /// `x` holds `n` values; `errors` points to a `u32`.
    fn checks::check_fill(x: *mut u32, n: u32, expect: u32, value: u32, errors: *mut u32);

    /// SpGEMM: per row, the bound on its nonzeros, rows per bin, products.
    /// Whole warps.
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs` for `problem`.
    fn spgemm::spgemm_analyse(problem: *const Problem);

    /// SpGEMM: groups the rows by bin (after `spgemm_analyse`).
    ///
    /// # Safety
    ///
    /// As for `spgemm_analyse`.
    fn spgemm::spgemm_place(problem: *const Problem);

    /// SpGEMM, `count` over the rows of the thread bin.
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; the bin's launch shape.
    fn spgemm::spgemm_count_thread(problem: *const Problem);

    /// SpGEMM, `count` over the rows of the hash bin `bin` (warp or block).
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; the bin's launch shape.
    fn spgemm::spgemm_count_hash(problem: *const Problem, bin: u32);

    /// SpGEMM, `count` over the rows of the dense bin.
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; the bin's launch shape.
    fn spgemm::spgemm_count_dense(problem: *const Problem);

    /// SpGEMM, `numeric` over the rows of the thread bin.
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; the bin's launch shape.
    fn spgemm::spgemm_numeric_thread(problem: *const Problem);

    /// SpGEMM, `numeric` over the rows of the hash bin `bin` (warp or block).
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; the bin's launch shape.
    fn spgemm::spgemm_numeric_hash(problem: *const Problem, bin: u32);

    /// SpGEMM, `numeric` over the rows of the dense bin.
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; the bin's launch shape.
    fn spgemm::spgemm_numeric_dense(problem: *const Problem);

    /// SpGEMM, `cuheap` over the rows of the thread bin.
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; `heap` stays live until the kernel ends; the bin's launch shape.
    fn spgemm::spgemm_cuheap_thread(problem: *const Problem, heap: HeapHandle, chunk: u32);

    /// SpGEMM, `cuheap` over the rows of the hash bin `bin` (warp or block).
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; `heap` stays live until the kernel ends; the bin's launch shape.
    fn spgemm::spgemm_cuheap_hash(problem: *const Problem, bin: u32, heap: HeapHandle, chunk: u32);

    /// SpGEMM, `cuheap` over the rows of the dense bin.
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; `heap` stays live until the kernel ends; the bin's launch shape.
    fn spgemm::spgemm_cuheap_dense(problem: *const Problem, heap: HeapHandle, chunk: u32);

    /// SpGEMM, `cuheap` with a block per row (allocated inside the row loop) over the rows of the thread bin.
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; `heap` stays live until the kernel ends; the bin's launch shape.
    fn spgemm::spgemm_cuheap_row_thread(problem: *const Problem, heap: HeapHandle);

    /// SpGEMM, `cuheap` with a block per row (allocated inside the row loop) over the rows of the hash bin `bin`.
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; `heap` stays live until the kernel ends; the bin's launch shape.
    fn spgemm::spgemm_cuheap_row_hash(problem: *const Problem, bin: u32, heap: HeapHandle);

    /// SpGEMM, `cuheap` with a block per row (allocated inside the row loop) over the rows of the dense bin.
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; `heap` stays live until the kernel ends; the bin's launch shape.
    fn spgemm::spgemm_cuheap_row_dense(problem: *const Problem, heap: HeapHandle);

    /// SpGEMM, `malloc` over the rows of the thread bin.
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; the bin's launch shape.
    fn spgemm::spgemm_malloc_thread(problem: *const Problem);

    /// SpGEMM, `malloc` over the rows of the hash bin `bin` (warp or block).
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; the bin's launch shape.
    fn spgemm::spgemm_malloc_hash(problem: *const Problem, bin: u32);

    /// SpGEMM, `malloc` over the rows of the dense bin.
    ///
    /// # Safety
    ///
    /// The contract of `kernels/src/spgemm.rs`; the bin's launch shape.
    fn spgemm::spgemm_malloc_dense(problem: *const Problem);

    /// SpGEMM scan, step 1: nonzeros per tile into `sums`.
    ///
    /// # Safety
    ///
    /// As for `spgemm_analyse`; `sums` holds a word per block.
    fn spgemm::spgemm_scan_tiles(problem: *const Problem, sums: *mut u64);

    /// SpGEMM scan, step 2 (one block): exclusive scan of `n` sums, total at `sums[n]`.
    ///
    /// # Safety
    ///
    /// `sums` holds `n + 1` words.
    fn spgemm::spgemm_scan_sums(sums: *mut u64, n: u32);

    /// SpGEMM scan, step 3: C's offsets.
    ///
    /// # Safety
    ///
    /// As for `spgemm_scan_tiles`, after `spgemm_scan_sums`.
    fn spgemm::spgemm_scan_apply(problem: *const Problem, sums: *const u64);

    /// SpGEMM, one pass: copies every row's block into C. Whole warps.
    ///
    /// # Safety
    ///
    /// As for `spgemm_analyse`, with C's offsets scanned and its arrays allocated.
    fn spgemm::spgemm_compact(problem: *const Problem);

    /// SpGEMM, one pass: frees the rows' blocks to `heap` (after `spgemm_compact`).
    ///
    /// # Safety
    ///
    /// As for `spgemm_analyse`; `heap` is the heap the rows came from.
    fn spgemm::spgemm_free_cuheap(heap: HeapHandle, problem: *const Problem);

    /// `spgemm_free_cuheap` for `spgemm_malloc`.
    ///
    /// # Safety
    ///
    /// As for `spgemm_analyse`.
    fn spgemm::spgemm_free_malloc(problem: *const Problem);

    /// Retires the empty pages `heap`'s slots and lists hold, then fences
    /// each range of pages `ranges[i]` (first page in the low 32 bits, end
    /// in the high), all or none of it, and writes whether it did to
    /// `fenced[i]`. One block (any number of threads).
    ///
    /// # Safety
    ///
    /// `heap` stays live until the kernel ends; `ranges` and `fenced` hold
    /// `n` values; the launch is one block.
    fn upkeep::cuheap_fence_free(heap: HeapHandle, ranges: *const u64, fenced: *mut u32, n: u32);

    /// Gives pages `from..to` of `heap` back to service (thread 0).
    ///
    /// # Safety
    ///
    /// `heap` stays live until the kernel ends; the caller fenced every
    /// page of `from..to` and has mapped memory behind them again.
    fn upkeep::cuheap_unfence(heap: HeapHandle, from: u32, to: u32);

    /// Per thread: allocates `sz` bytes (a multiple of 4) and tags them,
    /// counts itself in `state[0]`, waits until `state[1]` is nonzero (at
    /// most 30 s),
    /// then checks the block, allocates, tags and checks a second one, and
    /// frees both: blocks held across what the host does meanwhile.
    ///
    /// # Safety
    ///
    /// `heap` stays live until the kernel ends; `state` holds two `u32`s,
    /// the second set by the host while the kernel runs; `errors` points
    /// to two `u32`s.
    fn upkeep::hold_blocks(heap: HeapHandle, n: u32, sz: u32, state: *mut u32, errors: *mut u32);
}

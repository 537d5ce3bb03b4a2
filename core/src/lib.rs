//! `cuheap-core`: the size-class allocator at the heart of cuheap.
//!
//! `no_std`, no `alloc`, and only atomics that exist on both x86_64 and
//! nvptx64 (32- and 64-bit CAS, `fetch_add`/`fetch_sub`/`fetch_and`/`fetch_or`),
//! so the same code runs on host threads (where it is tested) and inside GPU
//! kernels (where the `cuheap-kernels` crate wraps it in warp-level fast paths).
//!
//! Vocabulary: the **heap** is one memory region; it is cut into **pages**
//! (64 KiB), each page serves one **size class** and is cut into **blocks**,
//! which callers get. Requests over the largest class take a **span** of
//! whole pages.
//!
//! Layers, each using only those before it:
//!
//! 1. [`sync`]: the atomics facade (loom's atomics under `cfg(loom)`).
//! 2. [`word`]: bitmap word widths (`u32` for the GPU, `u64` on the host).
//! 3. [`size_class`]: size to class and back, `const` tables with compile-time checks.
//! 4. [`bitmap`], [`page_map`], [`page_list`]: lock-free data structures.
//! 5. [`page`]: one page's reservation counter and life cycle.
//! 6. [`layout`], [`heap`]: the heap over a caller-provided region.
//! 7. [`stats`]: statistics and invariant checks read off the metadata.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(asm_experimental_arch))]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

#[cfg(any(test, feature = "std"))]
extern crate std;

pub mod bitmap;
pub mod heap;
pub mod layout;
#[cfg(all(feature = "std", not(loom)))]
pub mod owned;
pub mod page;
pub mod page_list;
pub mod page_map;
pub mod run_index;
pub mod size_class;
pub mod stats;
pub mod sync;
pub mod word;

pub use heap::{
    AllocError, BlockInfo, FreeError, FreeOutcome, FreedAll, Grant, Heap, HeapHandle, Placement,
    ReallocError, Resize, Run,
};
pub use layout::Layout;
#[cfg(all(feature = "std", not(loom)))]
pub use owned::OwnedHeap;
pub use size_class::{
    class_align, class_of, class_of_aligned, class_size, CLASS_COUNT, MAX_ALIGN, MAX_CLASS_SIZE,
    PAGE_SIZE,
};
pub use stats::{CStats, Counters, Counts, Stats, Tallies, Tally};
pub use word::Word;

//! cuheap's GPU side: warp-level code and kernel entry points only. The
//! allocator itself is `cuheap-core`, compiled here for nvptx64.
//!
//! The root crate's `build.rs` builds this crate twice:
//!
//! - with `c-abi` into `cuheap::PTX`, what a program links: the heap
//!   ([`device_heap`], inlined into its callers), [`c_abi`] and the two
//!   [`upkeep`] kernels;
//! - with `bench` into `cuheap::BENCH_PTX`: the benchmark and test kernels,
//!   whose entry points ([`entry`]) are generated from `signatures.rs`, the
//!   table the host's typed launches are generated from too. `bench`
//!   enables `alloc`: Rust's `alloc` crate with the module heap as its
//!   global allocator ([`module_heap`]), built with `-Zbuild-std=core,alloc`.
//!
//! Modules, each using only those before it:
//!
//! - [`arch`]: every NVVM intrinsic and inline PTX the crate uses.
//! - [`device_heap`]: `dev_alloc`/`dev_free`, `dev_alloc_aligned`,
//!   `dev_realloc` and their warp-cooperative paths.
//! - [`module_heap`]: the module's heap (`cuheap_heap`) and, with the
//!   `alloc` feature, `ModuleHeap`, the `#[global_allocator]` over it that
//!   `Box`, `Vec` and `String` use.
//! - [`c_abi`]: `cuheap_malloc`/`cuheap_free` and friends for CUDA C/C++.
//! - [`bench`]: benchmark kernel bodies (cuheap, CUDA's malloc, a bump ceiling).
//! - [`checks`]: test kernel bodies (conformance, fill-and-check, stress,
//!   alignment, realloc).
//! - [`vecs`]: per-thread `Vec`s on the module heap.
//! - [`spgemm`]: sparse matrix products whose rows are allocated in the kernel.
//! - [`upkeep`]: a growable heap's upkeep while kernels run (trim, unfence).
//! - [`entry`]: the `.entry` points of `bench`, `checks`, `vecs` and `spgemm`.
#![no_std]
#![feature(stdarch_nvptx, link_llvm_intrinsics, asm_experimental_arch)]
#![cfg_attr(any(feature = "bench", feature = "c-abi"), feature(abi_ptx))]
#![allow(internal_features)]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc
)]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod arch;
#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "c-abi")]
pub mod c_abi;
#[cfg(feature = "bench")]
pub mod checks;
pub mod device_heap;
#[cfg(feature = "bench")]
pub mod entry;
#[cfg(any(feature = "c-abi", feature = "alloc"))]
pub mod module_heap;
#[cfg(feature = "bench")]
pub mod spgemm;
#[cfg(any(feature = "bench", feature = "c-abi"))]
pub mod upkeep;
#[cfg(feature = "bench")]
pub mod vecs;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; nothing runs after it.
    unsafe { core::arch::nvptx::trap() }
}

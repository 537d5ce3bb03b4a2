//! cuheap's GPU side: warp-level code and kernel entry points only. The
//! allocator itself is `cuheap-core`, compiled here for nvptx64.
//!
//! - [`arch`]: every NVVM intrinsic and inline PTX the crate uses.
//! - [`device_heap`]: `dev_alloc`/`dev_free`, the warp-cooperative paths,
//!   and the C ABI (`cuheap_malloc`/`cuheap_free`) for CUDA C/C++.
//! - [`bench`]: benchmark kernels (cuheap, CUDA's malloc, a bump ceiling).
//! - [`checks`]: kernels the GPU tests use (conformance, fill-and-check).
#![no_std]
#![feature(abi_ptx, stdarch_nvptx, link_llvm_intrinsics, asm_experimental_arch)]
#![allow(internal_features)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod arch;
pub mod bench;
pub mod checks;
pub mod device_heap;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; nothing runs after it.
    unsafe { core::arch::nvptx::trap() }
}

//! Placeholder facade (filled in below).
/// The PTX of `kernels/`, built by `build.rs`.
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/cuheap_kernels.ptx"));
/// The architecture the PTX targets (`CUHEAP_PTX_ARCH`, default `sm_80`).
pub const PTX_ARCH: &str = env!("CUHEAP_PTX_ARCH");

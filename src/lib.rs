#![doc = include_str!("../README.md")]

pub mod bench;

pub use cuheap_core as core;
pub use cuheap_host as host;
pub use cuheap_host::{DeviceHeap, Error, Gpu, Result, Stats};

/// The PTX of `kernels/` (with `cuheap-core` inside), built by `build.rs`.
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/cuheap_kernels.ptx"));

/// The architecture the PTX targets (`CUHEAP_PTX_ARCH`, default `sm_80`).
pub const PTX_ARCH: &str = env!("CUHEAP_PTX_ARCH");

/// Opens GPU 0 with cuheap's kernels loaded.
pub fn open_gpu() -> Result<Gpu> {
    Gpu::open(PTX)
}

/// Names of the kernels (`.entry`) in the embedded PTX.
pub fn kernel_names() -> Vec<&'static str> {
    PTX.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|l| l.trim_end_matches('('))
        .collect()
}

/// Device functions exported for CUDA C/C++ (`.visible .func`).
pub fn exported_functions() -> Vec<&'static str> {
    PTX.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .func "))
        .map(|l| {
            l.rsplit(')')
                .next()
                .unwrap_or(l)
                .trim()
                .trim_end_matches('(')
                .trim()
        })
        .map(|l| l.split('(').next().unwrap_or(l).trim())
        .collect()
}

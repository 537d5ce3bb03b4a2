#![doc = include_str!("../README.md")]

#[cfg(feature = "cli")]
pub mod bench;

pub use cuheap_core as core;
pub use cuheap_host as host;
pub use cuheap_host::{DeviceHeap, Error, Gpu, Result, Stats};

/// The PTX of `kernels/` (with `cuheap-core` inside), built by `build.rs`.
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/cuheap_kernels.ptx"));

/// The architecture the PTX targets (`CUHEAP_PTX_ARCH`, default `sm_80`).
pub const PTX_ARCH: &str = env!("CUHEAP_PTX_ARCH");

/// Opens GPU 0 with cuheap's kernels loaded. `CUHEAP_MAX_REGISTERS=N`
/// caps the registers per thread of every kernel (more warps per SM);
/// `0` leaves the choice to the compiler.
pub fn open_gpu() -> Result<Gpu> {
    open_ptx(PTX)
}

/// Opens GPU 0 with the kernels of `ptx` (same settings as [`open_gpu`]).
pub fn open_ptx(ptx: &str) -> Result<Gpu> {
    Gpu::open_with_options(ptx, load_options()?)
}

/// The load options [`open_gpu`] uses: `CUHEAP_MAX_REGISTERS` or the default.
pub fn load_options() -> Result<cuheap_host::LoadOptions> {
    let max_registers = match std::env::var("CUHEAP_MAX_REGISTERS") {
        Err(_) => DEFAULT_MAX_REGISTERS,
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(0) => None,
            Ok(n) if (16..=255).contains(&n) => Some(n),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "CUHEAP_MAX_REGISTERS={v}: use 0 or 16..=255"
                )))
            }
        },
    };
    Ok(cuheap_host::LoadOptions { max_registers })
}

/// Register cap applied when `CUHEAP_MAX_REGISTERS` is unset.
pub const DEFAULT_MAX_REGISTERS: Option<u32> = None;

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

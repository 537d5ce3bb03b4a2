//! `cuheap-host`: cuheap on the CUDA driver.
//!
//! Layers, each using only those before it:
//!
//! 1. [`error`]: the one [`Error`] type.
//! 2. [`driver`]: the driver behind safe wrappers: [`Gpu`] (context,
//!    stream, module), [`DeviceMemory`] (RAII, bounds-checked copies of
//!    plain data), typed kernel launches ([`Kernel`], [`LaunchConfig`],
//!    [`kernel_table!`]), event timing. `cudarc` loads `libcuda` at run
//!    time; [`Gpu::open`] checks for it first so a machine without a GPU
//!    gets [`Error::NoDriver`], never a panic.
//! 3. [`device_heap`], [`growth`]: [`DeviceHeap`], the memory behind the
//!    in-kernel heap, its handle for kernels and its statistics, and its
//!    growth between launches and while kernels run ([`GrowthService`]).
//! 4. [`backend`]: what the pool needs from a device, as a trait, on the
//!    CUDA driver ([`driver::CudaBackend`]) or in host memory for tests
//!    ([`backend::HostBackend`]).
//! 5. [`vmm`], [`reclaim`], [`stream_pool`]: the host pool ([`Pool`]):
//!    a reserved address range mapped as it grows, pooled events, and
//!    stream-ordered allocation with per-stream caches. A [`Reservation`]
//!    shared by a pool and growable device heaps lets them map the
//!    physical memory the others gave back.
//!    [`share`] hands a pool's memory to other processes; [`snapshot`]
//!    draws it.
//! 6. [`trace`]: a logging adaptor over any resource and a reader of
//!    traces in RAPIDS RMM's CSV format.
//!
//! `cudarc` (its streams and events are in this API) and `bytemuck` (the
//! bound on copies and kernel arguments) are re-exported, so a program
//! needs neither as a dependency of its own.

pub mod backend;
pub mod device_heap;
pub mod driver;
pub mod error;
pub mod growth;
pub mod reclaim;
pub mod share;
pub mod snapshot;
pub mod stream_pool;
pub mod trace;
pub mod vmm;

pub use backend::{Backend, HostBackend, HostStream};
pub use bytemuck;
pub use cudarc;
pub use cuheap_core::{Counts, HeapHandle, Stats};
pub use device_heap::{DeviceHeap, Growth, HeapArg};
pub use driver::{
    CudaBackend, DeviceInfo, DeviceMemory, DevicePtr, Function, Gpu, Kernel, KernelArgs,
    LaunchConfig, LoadOptions, Module, Param,
};
pub use error::{Context, Error, Result};
pub use growth::{GrowthService, GrowthStats};
pub use share::{Exported, Imported};
pub use snapshot::{Picture, Snapshot, Timeline};
pub use stream_pool::{DeviceBuffer, Pool, PoolConfig, PoolStats};
pub use trace::{read_trace, Logged, Resource, TraceEvent, TraceLog};
pub use vmm::{Part, Reservation, ReservationStats};

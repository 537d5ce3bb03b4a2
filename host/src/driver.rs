//! The CUDA driver behind safe wrappers: raw `cudarc` calls stay here.
//!
//! - [`module`]: loaded modules and their functions (a [`Function`] keeps
//!   its module loaded), JIT options, linking;
//! - [`memory`]: [`DeviceMemory`] and its copies;
//! - [`launch`]: [`LaunchConfig`], typed [`Kernel`]s, [`kernel_table!`](crate::kernel_table);
//! - [`backend`]: [`CudaBackend`], the host pool's device operations
//!   (virtual memory, events, copies);
//! - here: [`Gpu`], one context with a stream and a module.

pub mod backend;
pub mod current;
pub mod launch;
pub mod memory;
pub mod module;

pub use backend::{CudaBackend, CudaMemory};
pub use current::{before_bind, KeepContext};
pub use launch::{DevicePtr, Kernel, KernelArgs, LaunchConfig, Param};
pub use memory::DeviceMemory;
pub use module::{Function, Module};

use crate::error::{Context, Error, Result};
use bytemuck::NoUninit;
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What `cuheap info` prints about a device.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sms: u32,
    pub memory_bytes: usize,
    /// e.g. 13000 for CUDA 13.0.
    pub driver_cuda_version: i32,
}

/// True when `libcuda` can be loaded (checked before any other driver call,
/// because `cudarc` panics on first use when it is missing). Looked up
/// once: each look opens the library, which takes microseconds.
pub fn driver_present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: only tries to open the library; no driver call is made.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Makes `ctx` current on this thread (a [`KeepContext`] puts the
/// caller's back).
pub(crate) fn bind(ctx: &CudaContext) -> Result<()> {
    before_bind();
    ctx.bind_to_thread().during("cuCtxSetCurrent")
}

/// Initialises the driver and counts the devices: [`Error::NoDriver`] or
/// [`Error::NoDevice`] where there is no GPU, never a panic. Call it
/// before any other driver call.
pub fn init_driver() -> Result<usize> {
    if !driver_present() {
        return Err(Error::NoDriver);
    }
    result::init().map_err(|e| Error::NoDevice(e.to_string()))?;
    let count = result::device::get_count().map_err(|e| Error::NoDevice(e.to_string()))?;
    if count < 1 {
        return Err(Error::NoDevice("device count is 0".into()));
    }
    Ok(count as usize)
}

/// One GPU: a context, a stream, and a module loaded from PTX.
pub struct Gpu {
    module: Module,
    functions: Mutex<HashMap<String, Function>>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    info: DeviceInfo,
}

/// Options for loading PTX (JIT compilation).
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// Cap on registers per thread for every kernel (`CU_JIT_MAX_REGISTERS`);
    /// fewer registers, more warps per SM. `None`: the compiler decides.
    pub max_registers: Option<u32>,
}

impl Gpu {
    /// Opens GPU 0 and loads `ptx`. [`Error::NoDriver`]/[`Error::NoDevice`]
    /// on machines without one.
    pub fn open(ptx: &str) -> Result<Gpu> {
        Self::open_with_options(ptx, LoadOptions::default())
    }

    /// [`Gpu::open`] with load options (e.g. a register cap).
    pub fn open_with_options(ptx: &str, options: LoadOptions) -> Result<Gpu> {
        let ctx = Self::open_context()?;
        let module = Module::load(&ctx, ptx.as_bytes(), options)?;
        Self::open_with(ctx, module)
    }

    /// Loads `ptx` in `ctx` (any device's context, e.g. the primary
    /// context the CUDA runtime uses, from `CudaContext::new(ordinal)`).
    pub fn on_context(ctx: &Arc<CudaContext>, ptx: &str, options: LoadOptions) -> Result<Gpu> {
        bind(ctx)?;
        let module = Module::load(ctx, ptx.as_bytes(), options)?;
        Self::open_with(ctx.clone(), module)
    }

    /// Opens GPU 0 with one module JIT-linked from several PTX sources
    /// (`cuLink*`): how CUDA C/C++ code compiled with `-rdc` reaches
    /// `cuheap_malloc`/`cuheap_free` in cuheap's PTX.
    pub fn open_linked(ptx: &[&str]) -> Result<Gpu> {
        Self::open_linked_with_options(ptx, LoadOptions::default())
    }

    /// [`Gpu::open_linked`] with load options, applied when the sources
    /// are compiled for the link.
    pub fn open_linked_with_options(ptx: &[&str], options: LoadOptions) -> Result<Gpu> {
        let ctx = Self::open_context()?;
        let cubin = module::link(&ctx, ptx, options)?;
        let module = Module::load(&ctx, &cubin, LoadOptions::default())?;
        Self::open_with(ctx, module)
    }

    /// Makes sure a driver and a device exist before any other driver call.
    fn open_context() -> Result<Arc<CudaContext>> {
        init_driver()?;
        before_bind();
        let ctx = CudaContext::new(0).during("cuCtxCreate")?;
        bind(&ctx)?;
        Ok(ctx)
    }

    fn open_with(ctx: Arc<CudaContext>, module: Module) -> Result<Gpu> {
        let stream = ctx.default_stream();
        let mut version = 0i32;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .during("cuDriverGetVersion")?;
        let info = DeviceInfo {
            name: ctx.name().during("cuDeviceGetName")?,
            compute_capability: ctx.compute_capability().during("cuDeviceGetAttribute")?,
            sms: ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .during("cuDeviceGetAttribute")? as u32,
            memory_bytes: ctx.total_mem().during("cuDeviceTotalMem")?,
            driver_cuda_version: version,
        };
        Ok(Gpu {
            ctx,
            stream,
            module,
            functions: Mutex::new(HashMap::new()),
            info,
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The GPU's stream (the context's default stream), where launches
    /// go unless their [`LaunchConfig`] names another.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The module loaded at open.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// A kernel of the loaded module by name.
    pub fn function(&self, name: &str) -> Result<Function> {
        let mut map = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get(name) {
            return Ok(f.clone());
        }
        let f = self.module.function(name)?;
        map.insert(name.into(), f.clone());
        Ok(f)
    }

    /// The kernel `name` of the loaded module, taking the parameters `A`
    /// (a tuple), launched on this GPU's stream by default. Fails if the
    /// driver reports parameter sizes other than `A`'s (CUDA 12.4 drivers
    /// and newer report them).
    pub fn kernel<A: KernelArgs>(&self, name: &str) -> Result<Kernel<A>> {
        Kernel::new(self.function(name)?, self.stream.clone())
    }

    /// Registers per thread the driver compiled `kernel` with.
    pub fn registers(&self, kernel: &str) -> Result<u32> {
        self.function(kernel)?.registers()
    }

    /// Waits for all work on the stream and reports any kernel fault.
    pub fn sync(&self) -> Result<()> {
        before_bind();
        self.stream.synchronize().during("cuStreamSynchronize")
    }

    /// Device memory free and total, in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        bind(&self.ctx)?;
        result::mem_get_info().during("cuMemGetInfo")
    }

    /// Allocates `bytes` of device memory (`cuMemAlloc`), zeroed.
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceMemory> {
        DeviceMemory::alloc_zeroed(&self.ctx, bytes)
    }

    /// Allocates `bytes` of device memory (`cuMemAlloc`) without clearing
    /// it: for buffers a kernel writes before anything reads them.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceMemory> {
        DeviceMemory::alloc(&self.ctx, bytes)
    }

    /// Sets CUDA's own device-heap size (`cuCtxSetLimit`); only effective
    /// before the first kernel that calls `malloc`.
    pub fn set_malloc_heap_size(&self, bytes: usize) -> Result<()> {
        bind(&self.ctx)?;
        result::ctx::set_limit(sys::CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE, bytes)
            .during("cuCtxSetLimit")
    }

    /// Writes `value` into the module global `name`, which must be exactly
    /// its size (synchronous, legacy default stream).
    pub fn write_global<T: NoUninit>(&self, name: &str, value: &T) -> Result<()> {
        let (dptr, bytes) = self.module.global(name)?;
        if bytes != std::mem::size_of::<T>() {
            return Err(Error::InvalidArgument(format!(
                "global `{name}` is {bytes} bytes, the value {}",
                std::mem::size_of::<T>()
            )));
        }
        bind(&self.ctx)?;
        // SAFETY: `dptr` is a device global of exactly size_of::<T>() bytes;
        // T has no uninitialised bytes.
        unsafe { result::memcpy_htod_sync(dptr, std::slice::from_ref(value)) }
            .during("cuMemcpyHtoD")
    }

    /// Times `work` with CUDA events on the stream; returns milliseconds.
    pub fn time<F: FnOnce() -> Result<()>>(&self, work: F) -> Result<f32> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        before_bind(); // the events' calls and drops bind
        let start = self.ctx.new_event(flags).during("cuEventCreate")?;
        let stop = self.ctx.new_event(flags).during("cuEventCreate")?;
        start.record(&self.stream).during("cuEventRecord")?;
        work()?;
        stop.record(&self.stream).during("cuEventRecord")?;
        start.elapsed_ms(&stop).during("cuEventElapsedTime")
    }
}

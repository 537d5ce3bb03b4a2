//! The CUDA driver behind safe wrappers: raw `cudarc` calls stay here.

use crate::error::{Context, Error, Result};
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

mod backend;
pub use backend::{CudaBackend, CudaMemory};

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
/// because `cudarc` panics on first use when it is missing).
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library; no driver call is made.
    unsafe { sys::is_culib_present() }
}

/// One GPU: a context, a stream, and cuheap's kernels loaded from PTX.
pub struct Gpu {
    // Field order is drop order: the module goes before the context.
    module: Module,
    functions: Mutex<HashMap<String, Function>>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    info: DeviceInfo,
}

/// Options for loading cuheap's PTX.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// Cap on registers per thread for every kernel (`CU_JIT_MAX_REGISTERS`);
    /// fewer registers, more warps per SM. `None`: the compiler decides.
    pub max_registers: Option<u32>,
}

/// A loaded module (`cuModuleLoadDataEx`), unloaded on drop.
struct Module(sys::CUmodule);

// SAFETY: a CUmodule handle may be used from any thread of its context.
unsafe impl Send for Module {}
// SAFETY: as above; the driver serialises module calls.
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuModuleLoadDataEx and is unloaded once.
        let _ = unsafe { sys::cuModuleUnload(self.0) };
    }
}

/// A kernel of the loaded module.
#[derive(Clone, Copy, Debug)]
pub struct Function(sys::CUfunction);

// SAFETY: a CUfunction handle may be used from any thread of its context.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Gpu {
    /// Opens GPU 0 and loads `ptx`. [`Error::NoDriver`]/[`Error::NoDevice`]
    /// on machines without one.
    pub fn open(ptx: &str) -> Result<Gpu> {
        Self::open_with_options(ptx, LoadOptions::default())
    }

    /// [`Gpu::open`] with load options (e.g. a register cap).
    pub fn open_with_options(ptx: &str, options: LoadOptions) -> Result<Gpu> {
        let text = std::ffi::CString::new(ptx)
            .map_err(|_| Error::InvalidArgument("PTX with a NUL byte".into()))?;
        Self::open_with(Self::open_context()?, text.into_bytes_with_nul(), options)
    }

    /// Opens GPU 0 with one module JIT-linked from several PTX sources
    /// (`cuLink*`): how CUDA C/C++ code compiled with `-rdc` reaches
    /// `cuheap_malloc`/`cuheap_free` in cuheap's PTX.
    pub fn open_linked(ptx: &[&str]) -> Result<Gpu> {
        let ctx = Self::open_context()?;
        let cubin = link(ptx)?;
        Self::open_with(ctx, cubin, LoadOptions::default())
    }

    /// Makes sure a driver and a device exist before any other driver call.
    fn open_context() -> Result<Arc<CudaContext>> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        result::init().map_err(|e| Error::NoDevice(e.to_string()))?;
        let count = result::device::get_count().map_err(|e| Error::NoDevice(e.to_string()))?;
        if count < 1 {
            return Err(Error::NoDevice("device count is 0".into()));
        }
        let ctx = CudaContext::new(0).during("cuCtxCreate")?;
        ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        Ok(ctx)
    }

    /// Loads `image` (NUL-terminated PTX, or a cubin) into `ctx`.
    fn open_with(ctx: Arc<CudaContext>, image: Vec<u8>, options: LoadOptions) -> Result<Gpu> {
        let stream = ctx.default_stream();
        let module = load_module(&image, options)?;
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

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// A kernel of the loaded PTX by name.
    pub fn function(&self, name: &str) -> Result<Function> {
        let mut map = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get(name) {
            return Ok(*f);
        }
        let cname = std::ffi::CString::new(name).map_err(|_| Error::MissingKernel(name.into()))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        // SAFETY: out-parameter; the module is loaded.
        unsafe { sys::cuModuleGetFunction(&mut f, self.module.0, cname.as_ptr()) }
            .result()
            .map_err(|_| Error::MissingKernel(name.into()))?;
        map.insert(name.into(), Function(f));
        Ok(Function(f))
    }

    /// Registers per thread the driver compiled `kernel` with.
    pub fn registers(&self, kernel: &str) -> Result<u32> {
        let f = self.function(kernel)?;
        let mut n = 0i32;
        // SAFETY: out-parameter for a function of the loaded module.
        unsafe {
            sys::cuFuncGetAttribute(
                &mut n,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS,
                f.0,
            )
        }
        .result()
        .during("cuFuncGetAttribute")?;
        Ok(n as u32)
    }

    /// Starts a launch of `kernel` over `threads` threads (256 per block).
    pub fn launch(&self, kernel: &str, threads: u32) -> Result<Launch<'_>> {
        Ok(Launch {
            gpu: self,
            func: self.function(kernel)?,
            threads,
            args: Vec::new(),
            stream: None,
        })
    }

    /// Waits for all work on the stream and reports any kernel fault.
    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().during("cuStreamSynchronize")
    }

    /// Device memory free and total, in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        result::mem_get_info().during("cuMemGetInfo")
    }

    /// Allocates `bytes` of device memory (`cuMemAlloc`), zeroed.
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceMemory> {
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        // SAFETY: plain allocation; the pointer is owned by DeviceMemory.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                let (free, total) = result::mem_get_info().unwrap_or((0, 0));
                Error::OutOfMemory {
                    requested: bytes,
                    reserved: total - free,
                    free,
                }
            } else {
                Error::Driver {
                    what: "cuMemAlloc",
                    source: e,
                }
            }
        })?;
        let mem = DeviceMemory {
            ptr,
            bytes,
            ctx: self.ctx.clone(),
        };
        mem.zero()?;
        Ok(mem)
    }

    /// Sets CUDA's own device-heap size (`cuCtxSetLimit`); only effective
    /// before the first kernel that calls `malloc`.
    pub fn set_malloc_heap_size(&self, bytes: usize) -> Result<()> {
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        result::ctx::set_limit(sys::CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE, bytes)
            .during("cuCtxSetLimit")
    }

    /// Writes `value` into the module global `name` (e.g. `cuheap_heap`).
    pub fn write_global<T: Copy>(&self, name: &str, value: &T) -> Result<()> {
        let cname = std::ffi::CString::new(name).map_err(|_| Error::MissingKernel(name.into()))?;
        let (mut dptr, mut bytes) = (0, 0usize);
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        // SAFETY: out-parameters for the loaded module's global.
        unsafe { sys::cuModuleGetGlobal_v2(&mut dptr, &mut bytes, self.module.0, cname.as_ptr()) }
            .result()
            .map_err(|_| Error::MissingKernel(name.into()))?;
        if bytes != std::mem::size_of::<T>() {
            return Err(Error::InvalidArgument(format!(
                "global `{name}` is {bytes} bytes"
            )));
        }
        // SAFETY: `dptr` is a device global of exactly size_of::<T>() bytes;
        // T is plain data (`Copy`, `#[repr(C)]` at the call sites).
        unsafe { result::memcpy_htod_sync(dptr, std::slice::from_ref(value)) }
            .during("cuMemcpyHtoD")
    }

    /// Times `work` with CUDA events on the stream; returns milliseconds.
    pub fn time<F: FnOnce() -> Result<()>>(&self, work: F) -> Result<f32> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(flags).during("cuEventCreate")?;
        let stop = self.ctx.new_event(flags).during("cuEventCreate")?;
        start.record(&self.stream).during("cuEventRecord")?;
        work()?;
        stop.record(&self.stream).during("cuEventRecord")?;
        start.elapsed_ms(&stop).during("cuEventElapsedTime")
    }
}

/// Loads a module image with the JIT options of `options`.
fn load_module(image: &[u8], options: LoadOptions) -> Result<Module> {
    let mut keys = Vec::new();
    let mut vals: Vec<*mut std::ffi::c_void> = Vec::new();
    if let Some(n) = options.max_registers {
        keys.push(sys::CUjit_option::CU_JIT_MAX_REGISTERS);
        vals.push(n as usize as *mut std::ffi::c_void);
    }
    let mut m: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `image` is a NUL-terminated PTX text or a cubin, alive for the
    // call; the option arrays have the same length.
    unsafe {
        sys::cuModuleLoadDataEx(
            &mut m,
            image.as_ptr() as *const _,
            keys.len() as u32,
            keys.as_mut_ptr(),
            vals.as_mut_ptr(),
        )
    }
    .result()
    .during("cuModuleLoadDataEx")?;
    Ok(Module(m))
}

/// JIT-links PTX sources into one cubin (the current context's device).
fn link(sources: &[&str]) -> Result<Vec<u8>> {
    let mut state: sys::CUlinkState = std::ptr::null_mut();
    // SAFETY: no options; `state` is an out-parameter.
    unsafe { sys::cuLinkCreate_v2(0, std::ptr::null_mut(), std::ptr::null_mut(), &mut state) }
        .result()
        .during("cuLinkCreate")?;
    let out = (|| {
        for (i, src) in sources.iter().enumerate() {
            let text = std::ffi::CString::new(*src)
                .map_err(|_| Error::InvalidArgument("PTX with a NUL byte".into()))?;
            let name = std::ffi::CString::new(format!("input{i}.ptx")).unwrap_or_default();
            // SAFETY: `text` is NUL-terminated PTX of the given size, alive for the call.
            unsafe {
                sys::cuLinkAddData_v2(
                    state,
                    sys::CUjitInputType::CU_JIT_INPUT_PTX,
                    text.as_ptr() as *mut _,
                    text.as_bytes_with_nul().len(),
                    name.as_ptr(),
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            }
            .result()
            .during("cuLinkAddData")?;
        }
        let mut cubin: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: out-parameters; the cubin lives until cuLinkDestroy.
        unsafe { sys::cuLinkComplete(state, &mut cubin, &mut size) }
            .result()
            .during("cuLinkComplete")?;
        // SAFETY: the driver returned `size` bytes at `cubin`.
        Ok(unsafe { std::slice::from_raw_parts(cubin as *const u8, size) }.to_vec())
    })();
    // SAFETY: `state` came from cuLinkCreate and is destroyed once.
    let _ = unsafe { sys::cuLinkDestroy(state) };
    out
}

/// One kernel parameter: kernels take only 32- and 64-bit scalars
/// (device pointers are `u64`).
#[derive(Clone, Copy, Debug)]
enum Arg {
    U32(u32),
    U64(u64),
}

/// A kernel launch being put together: scalar arguments, then [`Launch::run`].
pub struct Launch<'a> {
    gpu: &'a Gpu,
    func: Function,
    threads: u32,
    args: Vec<Arg>,
    stream: Option<sys::CUstream>,
}

impl Launch<'_> {
    pub fn u32(mut self, v: u32) -> Self {
        self.args.push(Arg::U32(v));
        self
    }

    /// A 64-bit value or a device pointer.
    pub fn u64(mut self, v: u64) -> Self {
        self.args.push(Arg::U64(v));
        self
    }

    /// Launches on `stream` instead of the GPU's default stream.
    pub fn on(mut self, stream: &CudaStream) -> Self {
        self.stream = Some(stream.cu_stream());
        self
    }

    /// A heap handle as the kernels take it: meta, data, pages, slots.
    pub fn heap(self, h: &cuheap_core::HeapHandle) -> Self {
        self.u64(h.meta).u64(h.data).u32(h.page_count).u32(h.slots)
    }

    /// Enqueues the kernel on the GPU's stream (256 threads per block).
    ///
    /// # Safety
    ///
    /// The arguments match the kernel's parameters in number and type, and
    /// every device pointer among them is valid for what the kernel does.
    pub unsafe fn run(mut self) -> Result<()> {
        let blocks = self.threads.div_ceil(256).max(1);
        let mut params: Vec<*mut std::ffi::c_void> = self
            .args
            .iter_mut()
            .map(|a| match a {
                Arg::U32(v) => v as *mut u32 as *mut std::ffi::c_void,
                Arg::U64(v) => v as *mut u64 as *mut std::ffi::c_void,
            })
            .collect();
        self.gpu.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        // SAFETY: the caller vouches for the arguments; `params` points to
        // live values of the kernel's parameter types for the call.
        unsafe {
            result::launch_kernel(
                self.func.0,
                (blocks, 1, 1),
                (256, 1, 1),
                0,
                self.stream.unwrap_or(self.gpu.stream.cu_stream()),
                &mut params,
            )
        }
        .during("cuLaunchKernel")
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
pub struct DeviceMemory {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceMemory {
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn zero(&self) -> Result<()> {
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        // SAFETY: the range is this allocation.
        unsafe { result::memset_d8_sync(self.ptr, 0, self.bytes) }.during("cuMemsetD8")
    }

    /// Copies `out.len()` values from `self` at byte `offset` to the host.
    pub fn read<T: Copy>(&self, offset: usize, out: &mut [T]) -> Result<()> {
        if offset + std::mem::size_of_val(out) > self.bytes {
            return Err(Error::InvalidArgument(
                "read past the end of device memory".into(),
            ));
        }
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        // SAFETY: the range is inside this allocation; T is plain data.
        unsafe { result::memcpy_dtoh_sync(out, self.ptr + offset as u64) }.during("cuMemcpyDtoH")
    }

    /// Copies `data` to `self` at byte `offset`.
    pub fn write<T: Copy>(&self, offset: usize, data: &[T]) -> Result<()> {
        if offset + std::mem::size_of_val(data) > self.bytes {
            return Err(Error::InvalidArgument(
                "write past the end of device memory".into(),
            ));
        }
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        // SAFETY: the range is inside this allocation.
        unsafe { result::memcpy_htod_sync(self.ptr + offset as u64, data) }.during("cuMemcpyHtoD")
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // Errors cannot be returned from drop; a failed free leaks.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc and is freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

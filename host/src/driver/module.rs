//! Modules and their functions: PTX loaded or JIT-linked with the load
//! options, unloaded when the last holder is gone.

use super::LoadOptions;
use crate::error::{Context, Error, Result};
use cudarc::driver::{sys, CudaContext, DriverError};
use std::ffi::{c_void, CString};
use std::sync::Arc;

/// A loaded module (`cuModuleLoadDataEx`). Clones share it; it is
/// unloaded when the last clone, and the last [`Function`] of it, is gone.
#[derive(Clone)]
pub struct Module(Arc<Loaded>);

struct Loaded {
    handle: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

// SAFETY: a CUmodule handle may be used from any thread of its context.
unsafe impl Send for Loaded {}
// SAFETY: as above; the driver serialises module calls.
unsafe impl Sync for Loaded {}

impl Drop for Loaded {
    fn drop(&mut self) {
        // Errors cannot be returned from drop; a failed unload leaks.
        if crate::driver::bind(&self.ctx).is_ok() {
            // SAFETY: the handle came from cuModuleLoadDataEx and is
            // unloaded once, after every Function of it (they hold the Arc).
            let _ = unsafe { sys::cuModuleUnload(self.handle) };
        }
    }
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Module").field(&self.0.handle).finish()
    }
}

/// A kernel of a loaded module; it keeps the module loaded.
#[derive(Clone, Debug)]
pub struct Function {
    handle: sys::CUfunction,
    module: Module,
}

// SAFETY: a CUfunction handle may be used from any thread of its context;
// the module it belongs to is kept alive by `module`.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Module {
    /// Loads `image` (PTX, or a cubin) into `ctx` with the JIT options of
    /// `options`.
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        image: &[u8],
        options: LoadOptions,
    ) -> Result<Module> {
        let image = nul_terminated(image)?;
        let (mut keys, mut vals) = jit_options(options);
        let mut m: sys::CUmodule = std::ptr::null_mut();
        crate::driver::bind(ctx)?;
        // SAFETY: `image` is a NUL-terminated PTX text or a cubin, alive for
        // the call; the option arrays have the same length.
        unsafe {
            sys::cuModuleLoadDataEx(
                &mut m,
                image.as_ptr() as *const c_void,
                keys.len() as u32,
                keys.as_mut_ptr(),
                vals.as_mut_ptr(),
            )
        }
        .result()
        .during("cuModuleLoadDataEx")?;
        Ok(Module(Arc::new(Loaded {
            handle: m,
            ctx: ctx.clone(),
        })))
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.0.ctx
    }

    /// The kernel `name` of this module ([`Error::MissingKernel`] if none).
    pub fn function(&self, name: &str) -> Result<Function> {
        let cname = CString::new(name).map_err(|_| Error::MissingKernel(name.into()))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        crate::driver::bind(&self.0.ctx)?;
        // SAFETY: out-parameter; the module is loaded.
        unsafe { sys::cuModuleGetFunction(&mut f, self.0.handle, cname.as_ptr()) }
            .result()
            .map_err(|_| Error::MissingKernel(name.into()))?;
        Ok(Function {
            handle: f,
            module: self.clone(),
        })
    }

    /// The device address and size of the module global `name`.
    pub(crate) fn global(&self, name: &str) -> Result<(sys::CUdeviceptr, usize)> {
        let cname = CString::new(name).map_err(|_| Error::MissingKernel(name.into()))?;
        let (mut dptr, mut bytes) = (0, 0usize);
        crate::driver::bind(&self.0.ctx)?;
        // SAFETY: out-parameters for the loaded module's global.
        unsafe { sys::cuModuleGetGlobal_v2(&mut dptr, &mut bytes, self.0.handle, cname.as_ptr()) }
            .result()
            .map_err(|_| Error::MissingKernel(name.into()))?;
        Ok((dptr, bytes))
    }
}

impl Function {
    pub(crate) fn handle(&self) -> sys::CUfunction {
        self.handle
    }

    pub fn module(&self) -> &Module {
        &self.module
    }

    /// Registers per thread the driver compiled this kernel with.
    pub fn registers(&self) -> Result<u32> {
        let mut n = 0i32;
        // SAFETY: out-parameter for a function of a loaded module.
        unsafe {
            sys::cuFuncGetAttribute(
                &mut n,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS,
                self.handle,
            )
        }
        .result()
        .during("cuFuncGetAttribute")?;
        Ok(n as u32)
    }

    /// The sizes in bytes of the first `count` parameters, from the
    /// driver (`cuFuncGetParamInfo`); fewer when the kernel has fewer.
    /// `None` where the driver is older than CUDA 12.4 and cannot tell.
    /// Only indices below `count` are asked for, so a kernel with more
    /// parameters goes unnoticed here (the PTX checks of the kernel table
    /// catch it), and a matching kernel makes no failing driver call.
    pub fn param_sizes(&self, count: usize) -> Result<Option<Vec<usize>>> {
        let mut version = 0i32;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .during("cuDriverGetVersion")?;
        if version < 12040 {
            return Ok(None);
        }
        let mut sizes = Vec::new();
        while sizes.len() < count {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: out-parameters for a function of a loaded module; an
            // index past the last parameter is an error, not a fault.
            let r = unsafe {
                sys::cuFuncGetParamInfo(self.handle, sizes.len(), &mut offset, &mut size)
            };
            match r {
                sys::CUresult::CUDA_SUCCESS => sizes.push(size),
                sys::CUresult::CUDA_ERROR_INVALID_VALUE => break,
                e => {
                    return Err(Error::Driver {
                        what: "cuFuncGetParamInfo",
                        source: DriverError(e),
                    })
                }
            }
        }
        Ok(Some(sizes))
    }
}

/// JIT-links PTX sources into one cubin for `ctx`'s device, compiling them
/// with the JIT options of `options` (a cubin loads as it is, so the
/// options apply here, not at the load).
pub(crate) fn link(
    ctx: &Arc<CudaContext>,
    sources: &[&str],
    options: LoadOptions,
) -> Result<Vec<u8>> {
    let (mut keys, mut vals) = jit_options(options);
    let mut state: sys::CUlinkState = std::ptr::null_mut();
    crate::driver::bind(ctx)?;
    // SAFETY: the option arrays have the same length and outlive the link
    // (cuLinkDestroy below); `state` is an out-parameter.
    unsafe {
        sys::cuLinkCreate_v2(
            keys.len() as u32,
            keys.as_mut_ptr(),
            vals.as_mut_ptr(),
            &mut state,
        )
    }
    .result()
    .during("cuLinkCreate")?;
    let out = (|| {
        for (i, src) in sources.iter().enumerate() {
            let text = nul_terminated(src.as_bytes())?;
            let name = CString::new(format!("input{i}.ptx")).unwrap_or_default();
            // SAFETY: `text` is NUL-terminated PTX of the given size, alive for the call.
            unsafe {
                sys::cuLinkAddData_v2(
                    state,
                    sys::CUjitInputType::CU_JIT_INPUT_PTX,
                    text.as_ptr() as *mut c_void,
                    text.len(),
                    name.as_ptr(),
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            }
            .result()
            .during("cuLinkAddData")?;
        }
        let mut cubin: *mut c_void = std::ptr::null_mut();
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

/// The driver's JIT option arrays (keys, values) for `options`.
fn jit_options(options: LoadOptions) -> (Vec<sys::CUjit_option>, Vec<*mut c_void>) {
    let mut keys = Vec::new();
    let mut vals = Vec::new();
    if let Some(n) = options.max_registers {
        keys.push(sys::CUjit_option::CU_JIT_MAX_REGISTERS);
        vals.push(n as usize as *mut c_void);
    }
    (keys, vals)
}

/// `image` with a NUL at the end, as the driver reads PTX text; a cubin
/// (which starts with the ELF magic) is passed as it is.
fn nul_terminated(image: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>> {
    if image.starts_with(b"\x7fELF") || image.last() == Some(&0) {
        return Ok(image.into());
    }
    if image.contains(&0) {
        return Err(Error::InvalidArgument("PTX with a NUL byte".into()));
    }
    let mut v = image.to_vec();
    v.push(0);
    Ok(v.into())
}

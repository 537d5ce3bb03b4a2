//! Kernel launches: a launch configuration, kernels whose argument types
//! are fixed where they are declared ([`Kernel`]), and [`kernel_table!`](crate::kernel_table),
//! which declares a set of them once.
//!
//! One contract remains for the caller of a launch, stated once, on
//! [`Kernel::launch`]: the device memory the kernel touches must be valid
//! for what the kernel does until it ends.

use super::module::Function;
use crate::error::{Context, Error, Result};
use bytemuck::NoUninit;
use cudarc::driver::{result, CudaStream};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

/// Grid and block shape, dynamic shared memory and stream of a launch.
#[derive(Clone, Copy, Debug)]
pub struct LaunchConfig<'s> {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
    /// The stream to launch on, borrowed for the launch call; `None`: the
    /// stream of the [`Gpu`] the kernel came from.
    pub stream: Option<&'s CudaStream>,
}

impl LaunchConfig<'static> {
    /// Threads per block of [`LaunchConfig::for_threads`].
    pub const BLOCK: u32 = 256;

    /// A 1-D launch of at least `n` threads: 256 per block, at least one
    /// block (kernels check their index against their `n`).
    pub fn for_threads(n: u32) -> Self {
        Self::shape((n.div_ceil(Self::BLOCK).max(1), 1, 1), (Self::BLOCK, 1, 1))
    }

    /// A launch of `grid` blocks of `block` threads.
    pub fn shape(grid: (u32, u32, u32), block: (u32, u32, u32)) -> Self {
        LaunchConfig {
            grid,
            block,
            shared_bytes: 0,
            stream: None,
        }
    }
}

impl<'s> LaunchConfig<'s> {
    /// The same launch on `stream`.
    pub fn on<'t>(self, stream: &'t CudaStream) -> LaunchConfig<'t> {
        LaunchConfig {
            grid: self.grid,
            block: self.block,
            shared_bytes: self.shared_bytes,
            stream: Some(stream),
        }
    }

    /// The same launch with `bytes` of dynamic shared memory per block.
    pub fn with_shared_bytes(self, bytes: u32) -> Self {
        LaunchConfig {
            shared_bytes: bytes,
            ..self
        }
    }
}

/// A device address of `T`s, as a kernel's `*mut T` or `*const T`
/// parameter takes it. Only an address: what it may be used for is the
/// contract of the launch it goes to.
#[repr(transparent)]
pub struct DevicePtr<T> {
    addr: u64,
    _elem: PhantomData<fn() -> T>,
}

impl<T> DevicePtr<T> {
    /// The device address `addr` (from a pool block, another library, ...).
    pub const fn from_raw(addr: u64) -> Self {
        DevicePtr {
            addr,
            _elem: PhantomData,
        }
    }

    pub const fn addr(self) -> u64 {
        self.addr
    }
}

impl<T> Clone for DevicePtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for DevicePtr<T> {}

impl<T> std::fmt::Debug for DevicePtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevicePtr({:#x})", self.addr)
    }
}

impl<T> PartialEq for DevicePtr<T> {
    fn eq(&self, other: &Self) -> bool {
        self.addr == other.addr
    }
}

impl<T> Eq for DevicePtr<T> {}

// SAFETY: `#[repr(transparent)]` over a `u64`: no padding, every byte
// initialised; `Copy` and `'static` as `NoUninit` requires.
unsafe impl<T: 'static> NoUninit for DevicePtr<T> {}

mod sealed {
    pub trait Sealed {}
}

/// The arguments of a [`Kernel`]: a tuple of plain-data values
/// ([`bytemuck::NoUninit`]: no padding, no uninitialised bytes), each
/// passed by value as one kernel parameter, in order.
pub trait KernelArgs: sealed::Sealed {
    /// The size in bytes of each parameter.
    fn sizes() -> Vec<usize>;
    /// A pointer to each argument, as `cuLaunchKernel` takes them.
    fn params(&mut self) -> Vec<*mut c_void>;
}

macro_rules! tuple_args {
    ($($t:ident . $i:tt),*) => {
        impl<$($t: NoUninit),*> sealed::Sealed for ($($t,)*) {}
        impl<$($t: NoUninit),*> KernelArgs for ($($t,)*) {
            fn sizes() -> Vec<usize> {
                vec![$(std::mem::size_of::<$t>()),*]
            }
            #[allow(clippy::unused_unit, unused_variables)]
            fn params(&mut self) -> Vec<*mut c_void> {
                vec![$(&mut self.$i as *mut $t as *mut c_void),*]
            }
        }
    };
}

tuple_args!();
tuple_args!(A.0);
tuple_args!(A.0, B.1);
tuple_args!(A.0, B.1, C.2);
tuple_args!(A.0, B.1, C.2, D.3);
tuple_args!(A.0, B.1, C.2, D.3, E.4);
tuple_args!(A.0, B.1, C.2, D.3, E.4, F.5);
tuple_args!(A.0, B.1, C.2, D.3, E.4, F.5, G.6);
tuple_args!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7);
tuple_args!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8);
tuple_args!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9);
tuple_args!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10);
tuple_args!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11);

/// A kernel whose parameters are the tuple `A`: its launches take exactly
/// those types. From [`Gpu::kernel`] or a table of [`kernel_table!`](crate::kernel_table).
pub struct Kernel<A> {
    function: Function,
    stream: Arc<CudaStream>,
    _args: PhantomData<fn(A)>,
}

impl<A> Clone for Kernel<A> {
    fn clone(&self) -> Self {
        Kernel {
            function: self.function.clone(),
            stream: self.stream.clone(),
            _args: PhantomData,
        }
    }
}

impl<A: KernelArgs> Kernel<A> {
    /// `function` taking `A`, launched on `stream` by default. Fails if
    /// the driver reports parameter sizes that differ from `A`'s.
    pub(crate) fn new(function: Function, stream: Arc<CudaStream>) -> Result<Self> {
        if let Some(sizes) = function.param_sizes(A::sizes().len())? {
            if sizes != A::sizes() {
                return Err(Error::InvalidArgument(format!(
                    "the kernel's parameters are {sizes:?} bytes, its declaration says {:?}",
                    A::sizes()
                )));
            }
        }
        Ok(Kernel {
            function,
            stream,
            _args: PhantomData,
        })
    }

    pub fn function(&self) -> &Function {
        &self.function
    }

    /// Enqueues the kernel with `args` as `cfg` says; returns once it is
    /// queued.
    ///
    /// # Safety
    ///
    /// The contract of every launch: each device pointer among `args` (and
    /// any the kernel reads from memory, such as a heap's) is valid, until
    /// the kernel ends, for everything the kernel does with it (the bytes
    /// it reads and writes), and no other stream or host copy writes
    /// memory the kernel uses meanwhile. Each kernel's documentation says
    /// what that is for it. `A` matches the kernel's parameters. For a
    /// [`kernel_table!`](crate::kernel_table) that is checked when the
    /// kernels are compiled from the same table, and by a test against the
    /// PTX. For [`Gpu::kernel`](crate::Gpu::kernel) the sizes of `A`'s
    /// parameters are compared with the driver's (drivers from CUDA 12.4),
    /// which catches a wrong size or too many parameters but not a kernel
    /// with more parameters than `A` declares: that is the caller's to get
    /// right.
    pub unsafe fn launch(&self, cfg: &LaunchConfig<'_>, mut args: A) -> Result<()> {
        let stream = cfg.stream.unwrap_or(&self.stream);
        let mut params = args.params();
        // SAFETY: forwarded from the caller; `params` points into `args`,
        // alive for the call.
        unsafe { launch_raw(&self.function, cfg, stream, &mut params) }
    }
}

/// # Safety
///
/// `params` point to live values of the kernel's parameter types, and the
/// launch has the contract of [`Kernel::launch`].
unsafe fn launch_raw(
    function: &Function,
    cfg: &LaunchConfig<'_>,
    stream: &CudaStream,
    params: &mut [*mut c_void],
) -> Result<()> {
    crate::driver::bind(function.module().context())?;
    // SAFETY: forwarded from the caller.
    unsafe {
        result::launch_kernel(
            function.handle(),
            cfg.grid,
            cfg.block,
            cfg.shared_bytes,
            stream.cu_stream(),
            params,
        )
    }
    .during("cuLaunchKernel")
}

/// How a parameter type of a [`kernel_table!`](crate::kernel_table) (written as the device's
/// type) is passed from the host: the host wrapper takes a `Host` value,
/// and the kernel receives the bytes of its `Raw` form.
pub trait Param {
    type Host<'a>;
    type Raw: NoUninit;
    fn raw(host: Self::Host<'_>) -> Self::Raw;
}

macro_rules! scalar_params {
    ($($t:ty),*) => {$(
        impl Param for $t {
            type Host<'a> = $t;
            type Raw = $t;
            fn raw(host: $t) -> $t {
                host
            }
        }
    )*};
}

scalar_params!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64);

impl<T: 'static> Param for *mut T {
    type Host<'a> = DevicePtr<T>;
    type Raw = DevicePtr<T>;
    fn raw(host: DevicePtr<T>) -> DevicePtr<T> {
        host
    }
}

impl<T: 'static> Param for *const T {
    type Host<'a> = DevicePtr<T>;
    type Raw = DevicePtr<T>;
    fn raw(host: DevicePtr<T>) -> DevicePtr<T> {
        host
    }
}

/// Declares a set of kernels once, as the device declares them, and makes
/// a struct with one typed launch method per kernel.
///
/// ```ignore
/// cuheap_host::kernel_table! {
///     /// My kernels.
///     pub struct Mine;
///     /// Scales `x[0..n]`.
///     ///
///     /// # Safety
///     ///
///     /// `x` holds `n` values.
///     fn my_module::scale(x: *mut f32, n: u32, by: f32);
/// }
/// // Mine::new(&gpu)? looks the kernels up in the Gpu's module;
/// // unsafe { mine.scale(&LaunchConfig::for_threads(n), x.as_ptr(), n, 2.0)? }
/// ```
///
/// Parameter types are the device's, mapped by [`Param`]: scalars stay,
/// `*mut T`/`*const T` become [`DevicePtr<T>`], cuheap-core's `HeapHandle`
/// becomes `&DeviceHeap`. The module path before each name is for the
/// device side (where the body is); the host ignores it. The kernels crate
/// includes the same table to generate its entry points, so the two sides
/// cannot disagree.
#[macro_export]
macro_rules! kernel_table {
    (
        $(#[$set_doc:meta])*
        $vis:vis struct $set:ident;
        $(
            $(#[$doc:meta])*
            fn $module:ident::$name:ident($($arg:ident: $ty:ty),* $(,)?);
        )*
    ) => {
        $(#[$set_doc])*
        $vis struct $set {
            $($name: $crate::Kernel<($(<$ty as $crate::Param>::Raw,)*)>,)*
        }

        impl $set {
            /// Every kernel of the table: its name and the size in bytes
            /// of each parameter.
            $vis const SIGNATURES: &'static [(&'static str, &'static [usize])] = &[
                $((
                    stringify!($name),
                    &[$(::core::mem::size_of::<<$ty as $crate::Param>::Raw>()),*],
                ),)*
            ];

            /// Looks up every kernel of the table in `gpu`'s module
            /// (`Error::MissingKernel` if one is not there), checking
            /// parameter sizes where the driver reports them.
            $vis fn new(gpu: &$crate::Gpu) -> $crate::Result<Self> {
                Ok(Self {
                    $($name: gpu.kernel(stringify!($name))?,)*
                })
            }

            $(
                $(#[$doc])*
                ///
                /// Every launch also has the contract of `Kernel::launch`.
                #[allow(clippy::too_many_arguments)]
                $vis unsafe fn $name(
                    &self,
                    cfg: &$crate::LaunchConfig<'_>,
                    $($arg: <$ty as $crate::Param>::Host<'_>),*
                ) -> $crate::Result<()> {
                    // SAFETY: the caller upholds the kernel's contract (above).
                    unsafe { self.$name.launch(cfg, ($(<$ty as $crate::Param>::raw($arg),)*)) }
                }
            )*
        }
    };
}

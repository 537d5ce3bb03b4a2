//! Typed launches of the benchmark and test kernels in
//! [`crate::BENCH_PTX`]: [`Bench`], generated from
//! `kernels/src/signatures.rs`, the table the kernels' entry points are
//! generated from too. A launch with a wrong argument type or count does
//! not compile; the table's parameter sizes are checked against the PTX in
//! a test and, where the driver reports them, when [`Bench::new`] runs.
//!
//! ```no_run
//! use cuheap::{kernels::Bench, DeviceHeap, LaunchConfig};
//! let gpu = cuheap::open_bench_gpu()?;
//! let bench = Bench::new(&gpu)?;
//! let heap = DeviceHeap::new(&gpu, 1 << 30)?;
//! let errors = gpu.alloc_zeroed(8)?;
//! let n = 1 << 20;
//! // SAFETY: pair_cuheap's contract: the heap outlives the launch (synchronised
//! // below) and `errors` holds two u32s.
//! unsafe { bench.pair_cuheap(&LaunchConfig::for_threads(n), &heap, n, 64, errors.as_ptr())? };
//! gpu.sync()?;
//! # Ok::<(), cuheap::Error>(())
//! ```
//!
//! A raw address where the table says `errors: *mut u32` does not compile:
//!
//! ```compile_fail,E0308
//! # fn f(bench: &cuheap::kernels::Bench, heap: &cuheap::DeviceHeap,
//! #      errors: &cuheap::host::DeviceMemory) -> cuheap::Result<()> {
//! let cfg = cuheap::LaunchConfig::for_threads(64);
//! // SAFETY: not reached: this does not compile.
//! unsafe { bench.pair_cuheap(&cfg, heap, 64, 16, errors.ptr())? };
//! # Ok(()) }
//! ```

use crate::spgemm::problem::Problem;
use cuheap_host::HeapHandle;

macro_rules! signatures {
    ($($table:tt)*) => {
        cuheap_host::kernel_table! {
            /// The benchmark and test kernels of [`crate::BENCH_PTX`], one
            /// typed launch each.
            pub struct Bench;
            $($table)*
        }
    };
}

include!("../kernels/src/signatures.rs");

#![doc = include_str!("../README.md")]

#[cfg(feature = "cli")]
pub mod bench;
pub mod kernels;
mod ptx;
pub mod spgemm;

pub use ptx::entries;
pub(crate) use ptx::with_register_caps;

pub use cudarc;
pub use cuheap_core as core;
pub use cuheap_host as host;
pub use cuheap_host::{
    Counts, DeviceHeap, DevicePtr, Error, Gpu, GrowthService, GrowthStats, Kernel, LaunchConfig,
    Pool, PoolConfig, Reservation, ReservationStats, Result, Stats,
};

/// The PTX a program links: the heap and its C ABI (`cuheap_malloc`,
/// `cuheap_aligned_alloc`, `cuheap_realloc`, `cuheap_free`, the
/// `cuheap_heap` global), built by `build.rs` from `kernels/` (with
/// `cuheap-core` inside) with its `c-abi` feature. Rust kernels call
/// `dev_alloc`/`dev_free` (and `dev_alloc_aligned`/`dev_realloc`) from the
/// kernels crate instead, or use `Box`/`Vec`/`String` on the module heap
/// through its `alloc` feature.
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/cuheap.ptx"));

/// The benchmark and test kernels (the `bench` feature of `kernels/`),
/// which [`kernels::Bench`] launches. Some call CUDA's own device `malloc`.
pub const BENCH_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/cuheap_bench.ptx"));

/// The architecture the PTX targets (`CUHEAP_PTX_ARCH`, default `sm_80`).
pub const PTX_ARCH: &str = env!("CUHEAP_PTX_ARCH");

/// Opens GPU 0 with [`PTX`] loaded. `CUHEAP_MAX_REGISTERS=N` caps the
/// registers per thread of every kernel (more warps per SM); `0` leaves the
/// choice to the compiler.
pub fn open_gpu() -> Result<Gpu> {
    open_ptx(PTX)
}

/// Opens GPU 0 with [`BENCH_PTX`] loaded (same settings as [`open_gpu`]),
/// for [`kernels::Bench`].
pub fn open_bench_gpu() -> Result<Gpu> {
    open_ptx(BENCH_PTX)
}

/// Opens GPU 0 with the kernels of `ptx` (same settings as [`open_gpu`]):
/// each kernel at most [`kernel_register_cap`] registers per thread, unless
/// `CUHEAP_MAX_REGISTERS` sets one cap for all.
pub fn open_ptx(ptx: &str) -> Result<Gpu> {
    open_capped(ptx, kernel_register_cap)
}

/// [`PTX`] (the device library, which also holds a growable heap's
/// upkeep kernels: [`DeviceHeap::trim_on`], [`DeviceHeap::set_growth_piece`])
/// loaded in `ctx` (any device's context, e.g. the primary context a
/// CUDA runtime program uses) with the settings of [`open_gpu`]. It holds
/// no kernel that calls CUDA's own device `malloc`, so loading it leaves
/// the context's `malloc` heap as it was. The driver compiles the module
/// for the device when it loads (and caches the result between runs).
pub fn library_gpu_on(ctx: &std::sync::Arc<cudarc::driver::CudaContext>) -> Result<Gpu> {
    let (ptx, options) = capped(PTX, kernel_register_cap)?;
    Gpu::on_context(ctx, &ptx, options)
}

/// Opens GPU 0 with the kernels of `ptx`, each capped at `cap(entry)`
/// registers per thread, written into its PTX (`None`: the module's cap,
/// [`load_options`]); `CUHEAP_MAX_REGISTERS` sets one cap for every
/// kernel instead, and no entry gets one of its own.
pub(crate) fn open_capped(ptx: &str, cap: impl Fn(&str) -> Option<u32>) -> Result<Gpu> {
    let (ptx, options) = capped(ptx, cap)?;
    Gpu::open_with_options(&ptx, options)
}

/// `ptx` with the caps of [`open_capped`] written in, and the load options.
fn capped(
    ptx: &str,
    cap: impl Fn(&str) -> Option<u32>,
) -> Result<(std::borrow::Cow<'_, str>, cuheap_host::LoadOptions)> {
    let options = load_options()?;
    if std::env::var_os("CUHEAP_MAX_REGISTERS").is_some() {
        return Ok((ptx.into(), options));
    }
    Ok((with_register_caps(ptx, cap)?.into(), options))
}

/// Opens GPU 0 with one module JIT-linked from [`PTX`] and `ptx` (e.g.
/// CUDA C/C++ compiled with `nvcc -rdc=true -ptx` that calls
/// `cuheap_malloc`), with the settings of [`open_gpu`].
pub fn open_linked(ptx: &[&str]) -> Result<Gpu> {
    let sources: Vec<&str> = std::iter::once(PTX).chain(ptx.iter().copied()).collect();
    Gpu::open_linked_with_options(&sources, load_options()?)
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

/// Register cap applied when `CUHEAP_MAX_REGISTERS` is unset: 128, so
/// two blocks of 256 threads fit on an SM. The assembler gives a kernel
/// the registers of the heaviest path it may call, and the heap's rarest
/// path (a thread waiting for growth while the kernel runs, a loop around
/// a whole allocation) takes about 150 uncapped: half the warps per SM,
/// and 60% slower allocation at 1M x 16 B on an H100, for every kernel
/// that allocates, growth or not. Capped, the rare path spills and the
/// warp path keeps its speed (`docs/ab-registers-growth-h100.txt`).
pub const DEFAULT_MAX_REGISTERS: Option<u32> = Some(128);

/// Registers per thread of the kernels that only free
/// (`free_cuheap`): six blocks of 256 threads per SM instead of four at
/// the 54 the assembler gives them uncapped. On an H100 80 GB, alternating
/// twice, frees took 10-25% less time at 1M and 4M threads, from 16 B to
/// mixed sizes (4M x 16 B 0.093 against 0.114 ms, 1M mixed 0.061-0.062
/// against 0.069), the other kernels unchanged; at 32 the free path
/// spills and mixed sizes lost the gain
/// (`docs/ab-free-maxnreg-h100.txt`).
pub const FREE_MAX_REGISTERS: u32 = 40;

/// The register cap [`open_ptx`] writes into the PTX for the kernel
/// `entry`: [`FREE_MAX_REGISTERS`] for the free kernel, none for the
/// others (they keep the module's cap, [`DEFAULT_MAX_REGISTERS`]).
pub fn kernel_register_cap(entry: &str) -> Option<u32> {
    (entry == "free_cuheap").then_some(FREE_MAX_REGISTERS)
}

/// Names of the benchmark and test kernels (`.entry`) in [`BENCH_PTX`]
/// ([`PTX`] holds device functions and the two upkeep kernels only).
pub fn kernel_names() -> Vec<&'static str> {
    entries(BENCH_PTX).map(|(name, _)| name).collect()
}

/// Device functions [`PTX`] exports for CUDA C/C++ (`.visible .func`).
pub fn exported_functions() -> Vec<&'static str> {
    PTX.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .func "))
        .map(|l| {
            // Skip a return value's `(.param ...)` before the name.
            let l = l.trim_start();
            let l = if l.starts_with('(') {
                l.split_once(')').map_or(l, |(_, rest)| rest)
            } else {
                l
            };
            l.split('(').next().unwrap_or(l).trim()
        })
        .collect()
}

/// [`PTX`] relabelled for the toolkit that links it: `.version` set to
/// the PTX ISA `isa` (e.g. `"9.0"` for CUDA 13.0, `"8.7"` for 12.8) and
/// `.target` to `arch` (`sm_80` or newer: the heap uses `redux.sync`).
///
/// nvcc links relocatable device code only with objects of its own PTX
/// ISA and target: a program that links cuheap's functions built as
/// `.version 7.0` / `.target sm_80` and also calls CUB gets
/// `cudaErrorInvalidDeviceFunction`. Raising both labels is valid: PTX
/// of an older ISA and target is valid PTX of a newer one.
pub fn device_ptx(arch: &str, isa: &str) -> Result<String> {
    let sm = arch
        .strip_prefix("sm_")
        .and_then(|n| n.trim_end_matches(['a', 'f']).parse::<u32>().ok());
    let Some(sm) = sm.filter(|&n| n >= 80) else {
        return Err(Error::InvalidArgument(format!(
            "architecture `{arch}`: use sm_80 or newer (e.g. sm_90)"
        )));
    };
    let (major, minor) = isa
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
        .filter(|&(a, b)| (a, b) >= (7, 0) && b < 10)
        .ok_or_else(|| {
            Error::InvalidArgument(format!("PTX ISA `{isa}`: use 7.0 or newer, as in 9.0"))
        })?;
    // The first PTX ISA with each architecture (ptxas refuses older ones).
    let first = match sm {
        80 => (7, 0),
        86 => (7, 1),
        87 => (7, 4),
        89 | 90 => (7, 8),
        _ => (7, 0),
    };
    if (major, minor) < first {
        return Err(Error::InvalidArgument(format!(
            "PTX ISA {isa} cannot target {arch}: it needs {}.{} or newer",
            first.0, first.1
        )));
    }
    let mut out = String::with_capacity(PTX.len());
    for line in PTX.lines() {
        let t = line.trim_start();
        if t.starts_with(".version ") {
            out.push_str(&format!(".version {major}.{minor}"));
        } else if t.starts_with(".target ") {
            out.push_str(&format!(".target {arch}"));
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    Ok(out)
}

/// The PTX ISA of a CUDA toolkit (`nvcc --version`'s release), for
/// [`device_ptx`]; `None` for a release not in the table (pass the ISA
/// yourself: the PTX ISA notes of the toolkit give it).
pub fn ptx_isa_of_cuda(major: u32, minor: u32) -> Option<&'static str> {
    Some(match (major, minor) {
        (11, 0) => "7.0",
        (11, 1) => "7.1",
        (11, 2) => "7.2",
        (11, 3) => "7.3",
        (11, 4) => "7.4",
        (11, 5) => "7.5",
        (11, 6) => "7.6",
        (11, 7) => "7.7",
        (11, 8) => "7.8",
        (12, 0) => "8.0",
        (12, 1) => "8.1",
        (12, 2) => "8.2",
        (12, 3) => "8.3",
        (12, 4) => "8.4",
        (12, 5) | (12, 6) => "8.5",
        (12, 8) => "8.7",
        (12, 9) => "8.8",
        (13, 0) => "9.0",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The free kernel alone gets a cap in the benchmark PTX; the others
    /// keep the module's, and every entry reads as before.
    #[test]
    fn only_the_free_kernel_gets_a_register_cap_of_its_own() {
        let capped = with_register_caps(BENCH_PTX, kernel_register_cap).unwrap();
        assert_eq!(
            entries(BENCH_PTX).collect::<Vec<_>>(),
            entries(&capped).collect::<Vec<_>>()
        );
        assert_eq!(capped.matches(".maxnreg").count(), 1);
        let at = capped.find(".visible .entry free_cuheap(").unwrap();
        let header = &capped[at..at + capped[at..].find('{').unwrap()];
        assert!(
            header.ends_with(&format!(")\n.maxnreg {FREE_MAX_REGISTERS}\n")),
            "{header}"
        );
        // An entry with no cap is copied as it is, even one whose body
        // the search would not find.
        let bare = ".visible .entry pair_cuheap(\n\t.param .u32 n\n)\n";
        assert_eq!(with_register_caps(bare, kernel_register_cap).unwrap(), bare);
        assert_eq!(kernel_register_cap("pair_cuheap"), None);
        assert_eq!(kernel_register_cap("free_cuheap"), Some(FREE_MAX_REGISTERS));
        // Applied twice, nothing changes.
        assert_eq!(
            with_register_caps(&capped, kernel_register_cap).unwrap(),
            capped
        );
    }

    /// The device library's only kernels are the upkeep kernels, with the
    /// parameters of their rows in `signatures.rs`.
    #[test]
    fn ptx_is_the_heap_its_c_abi_and_the_upkeep_kernels_only() {
        let mut kernels: Vec<(&str, Vec<usize>)> = entries(PTX).collect();
        kernels.sort();
        let upkeep = ["cuheap_fence_free", "cuheap_unfence"];
        let rows: Vec<(&str, Vec<usize>)> = (kernels::Bench::SIGNATURES.iter())
            .filter(|(name, _)| upkeep.contains(name))
            .map(|(name, sizes)| (*name, sizes.to_vec()))
            .collect();
        assert_eq!(rows.len(), upkeep.len());
        assert_eq!(kernels, rows, "PTX's kernels");
        let mut names = exported_functions();
        names.sort();
        assert_eq!(
            names,
            [
                "cuheap_aligned_alloc",
                "cuheap_free",
                "cuheap_get_counts",
                "cuheap_get_stats",
                "cuheap_heap_aligned_alloc",
                "cuheap_heap_free",
                "cuheap_heap_get_counts",
                "cuheap_heap_get_stats",
                "cuheap_heap_init",
                "cuheap_heap_malloc",
                "cuheap_heap_realloc",
                "cuheap_init",
                "cuheap_malloc",
                "cuheap_meta_bytes",
                "cuheap_realloc"
            ]
        );
        assert!(PTX.contains(".visible .global .align 8 .b8 cuheap_heap[24]"));
        // CUDA's device heap belongs to the benchmarks only.
        assert!(
            !PTX.contains(".extern .func"),
            "PTX calls an external function"
        );
        assert!(BENCH_PTX.contains(".extern .func  (.param .b64 func_retval0) malloc"));
    }

    #[test]
    fn device_ptx_relabels_the_header_only() {
        let p = device_ptx("sm_90", "9.0").unwrap();
        assert!(p.contains("\n.version 9.0\n.target sm_90\n"));
        assert_eq!(p.lines().count(), PTX.lines().count());
        let changed = p.lines().zip(PTX.lines()).filter(|(a, b)| a != b).count();
        assert_eq!(changed, 2, "only .version and .target change");
        for bad in [
            ("sm_75", "9.0"),
            ("sm_x", "9.0"),
            ("sm_90", "6.4"),
            ("sm_90", "9"),
            ("sm_90", "9.10"),
        ] {
            assert!(
                matches!(device_ptx(bad.0, bad.1), Err(Error::InvalidArgument(_))),
                "{bad:?} must be refused"
            );
        }
        assert_eq!(ptx_isa_of_cuda(13, 0), Some("9.0"));
        assert_eq!(ptx_isa_of_cuda(12, 8), Some("8.7"));
        assert_eq!(ptx_isa_of_cuda(10, 2), None);
    }

    #[test]
    fn the_kernel_table_matches_the_bench_ptx() {
        let ptx: Vec<(&str, Vec<usize>)> = entries(BENCH_PTX).collect();
        let mut table: Vec<(&str, Vec<usize>)> = kernels::Bench::SIGNATURES
            .iter()
            .map(|(name, sizes)| (*name, sizes.to_vec()))
            .collect();
        table.sort();
        let mut sorted = ptx.clone();
        sorted.sort();
        assert_eq!(
            table, sorted,
            "kernels/src/signatures.rs and BENCH_PTX differ"
        );
        assert_eq!(kernel_names().len(), table.len());
    }
}

//! Helpers shared by the GPU tests: each launches one kernel of
//! `cuheap::kernels::Bench` and waits for it.
#![allow(dead_code)]

use cuheap::host::DeviceMemory;
use cuheap::kernels::Bench;
use cuheap::{DeviceHeap, Gpu, LaunchConfig};

/// GPU 0 with the benchmark and test kernels loaded.
pub fn gpu() -> Gpu {
    cuheap::open_bench_gpu().expect("these tests need an NVIDIA GPU")
}

/// The kernels of `gpu` (opened by [`gpu`]).
pub fn kernels(gpu: &Gpu) -> Bench {
    Bench::new(gpu).expect("BENCH_PTX has every kernel of the table")
}

/// A pointer per thread and the two error counters `[nulls, damaged]`.
pub struct Bufs {
    pub kernels: Bench,
    pub ptrs: DeviceMemory,
    pub errors: DeviceMemory,
    threads: u32,
}

impl Bufs {
    /// For launches of up to `n` threads.
    pub fn new(gpu: &Gpu, n: u32) -> Bufs {
        Bufs {
            kernels: kernels(gpu),
            ptrs: gpu.alloc_zeroed(n as usize * 8).unwrap(),
            errors: gpu.alloc_zeroed(8).unwrap(),
            threads: n,
        }
    }

    /// `[nulls, damaged]`, then reset.
    pub fn take_errors(&self) -> [u32; 2] {
        let mut e = [0u32; 2];
        self.errors.read(0, &mut e).unwrap();
        self.errors.zero().unwrap();
        e
    }

    pub fn ptrs(&self, n: u32) -> Vec<u64> {
        let mut v = vec![0u64; n as usize];
        self.ptrs.read(0, &mut v).unwrap();
        v
    }
}

/// Waits for the launch just queued; any error fails the test.
fn wait(gpu: &Gpu, launched: cuheap::Result<()>) {
    launched.unwrap();
    gpu.sync().unwrap();
}

pub fn alloc(gpu: &Gpu, heap: &DeviceHeap, b: &Bufs, n: u32, sz: u32) {
    assert!(n <= b.threads);
    let cfg = LaunchConfig::for_threads(n);
    // SAFETY: `b.ptrs` holds n pointers and `b.errors` two u32s; the heap
    // and both buffers outlive the launch, which is waited for.
    let launched = unsafe {
        b.kernels
            .alloc_cuheap(&cfg, heap, n, sz, b.ptrs.as_ptr(), b.errors.as_ptr())
    };
    wait(gpu, launched);
}

/// Fills and checks the blocks of the last [`alloc`] of `n` threads and
/// size `sz`.
pub fn fill_check(gpu: &Gpu, b: &Bufs, n: u32, sz: u32) {
    assert!(n <= b.threads);
    // SAFETY: `b.ptrs` holds the n blocks (or nulls) that the last alloc
    // made with `sz`, each still live (tests free after checking).
    let launched = unsafe {
        cuheap::bench::device::fill_and_check(&b.kernels, &b.ptrs, &b.errors, n, sz, true)
    };
    wait(gpu, launched);
}

pub fn free(gpu: &Gpu, heap: &DeviceHeap, b: &Bufs, n: u32) {
    assert!(n <= b.threads);
    let cfg = LaunchConfig::for_threads(n);
    // SAFETY: `b.ptrs` holds n pointers, which free_cuheap only hands to
    // the heap (which refuses those not its own); the heap and the buffer
    // outlive the launch, which is waited for.
    let launched = unsafe { b.kernels.free_cuheap(&cfg, heap, n, b.ptrs.as_ptr()) };
    wait(gpu, launched);
}

pub fn pair(gpu: &Gpu, heap: &DeviceHeap, b: &Bufs, n: u32, sz: u32) {
    let cfg = LaunchConfig::for_threads(n);
    // SAFETY: `b.errors` holds two u32s; the heap and the buffer outlive
    // the launch, which is waited for.
    let launched = unsafe { b.kernels.pair_cuheap(&cfg, heap, n, sz, b.errors.as_ptr()) };
    wait(gpu, launched);
}

/// The CUDA compiler: `nvcc` on the path, or CUDA's default install.
pub fn nvcc() -> std::path::PathBuf {
    for p in ["nvcc", "/usr/local/cuda/bin/nvcc"] {
        if std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return p.into();
        }
    }
    panic!("nvcc not found: the CUDA C++ tests compile with it");
}

/// `source` (CUDA C++ that calls cuheap's C ABI) compiled by nvcc to PTX
/// for linking with cuheap's (`cuheap::open_linked`), in a directory of
/// its own under the temporary directory; `name` names the files.
pub fn nvcc_ptx(name: &str, source: &str) -> String {
    let dir = std::env::temp_dir().join(format!("cuheap-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, out) = (
        dir.join(format!("{name}.cu")),
        dir.join(format!("{name}.ptx")),
    );
    std::fs::write(&src, source).unwrap();
    let st = std::process::Command::new(nvcc())
        .args(["-rdc=true", "-ptx", "-arch=sm_80"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success(), "nvcc failed on {name}.cu");
    let ptx = std::fs::read_to_string(&out).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    ptx
}

//! The pipeline on a GPU: the embedded PTX loads, a kernel launches, and
//! `cuheap-core` computes the same results on the GPU as on the CPU.

mod common;
use common::{gpu, kernels};
use cuheap::core::size_class::{class_of, class_size, MAX_CLASS_SIZE};
use cuheap::core::{Layout, Word};
use cuheap::LaunchConfig;

#[test]
fn no_gpu_is_a_clear_error_not_a_panic() {
    // On any machine: either a GPU opens and works, or the error names the
    // cause. Which one must agree with whether a driver is installed.
    match cuheap::open_gpu() {
        Ok(gpu) => {
            assert!(cuheap::host::driver::driver_present());
            let i = gpu.info();
            assert!(i.sms > 0 && i.memory_bytes > 0, "{i:?}");
            // The module is loaded: its heap global is there, 24 bytes.
            let heap = cuheap::DeviceHeap::new(&gpu, 1 << 20).unwrap();
            heap.install(&gpu).unwrap();
            assert!(gpu.write_global("cuheap_heap", &0u64).is_err());
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("no NVIDIA GPU found"), "{msg}");
            assert!(
                matches!(e, cuheap::Error::NoDriver | cuheap::Error::NoDevice(_)),
                "{e:?}"
            );
            if !cuheap::host::driver::driver_present() {
                assert!(matches!(e, cuheap::Error::NoDriver), "{e:?}");
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn kernel_launch_smoke() {
    let gpu = gpu();
    let n = 100_000u32;
    let x = gpu.alloc_zeroed(n as usize * 4).unwrap();
    let input: Vec<u32> = (0..n).collect();
    x.write(0, &input).unwrap();
    // On a stream of its own: the launch and the stream-ordered copies.
    let stream = gpu.context().new_stream().unwrap();
    // SAFETY: `x` holds n u32s and outlives the launch (read back below).
    unsafe {
        kernels(&gpu)
            .smoke(&LaunchConfig::for_threads(n).on(&stream), x.as_ptr(), n)
            .unwrap()
    };
    let mut out = vec![0u32; n as usize];
    x.read_on(0, &mut out, &stream).unwrap();
    assert!(out.iter().enumerate().all(|(i, &v)| v == i as u32 * 2 + 1));
    // A declaration that disagrees with the kernel is refused where the
    // driver reports parameter sizes (CUDA 12.4 and newer).
    if gpu.info().driver_cuda_version >= 12040 {
        assert!(gpu.kernel::<(u32,)>("smoke").is_err());
        assert!(gpu.kernel::<(u32, u64)>("smoke").is_err());
        assert!(gpu.kernel::<(cuheap::DevicePtr<u32>, u32)>("smoke").is_ok());
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn size_classes_match_cpu_for_every_size() {
    let gpu = gpu();
    let max = MAX_CLASS_SIZE as u32 + 1;
    let n = max as usize + 1;
    let class = gpu.alloc_zeroed(n * 4).unwrap();
    let size = gpu.alloc_zeroed(n * 4).unwrap();
    // SAFETY: `class` and `size` hold max + 1 u32s and outlive the launch.
    unsafe {
        kernels(&gpu)
            .conformance_classes(
                &LaunchConfig::for_threads(max + 1),
                class.as_ptr(),
                size.as_ptr(),
                max,
            )
            .unwrap()
    };
    gpu.sync().unwrap();
    let (mut c, mut s) = (vec![0u32; n], vec![0u32; n]);
    class.read(0, &mut c).unwrap();
    size.read(0, &mut s).unwrap();
    let mut mismatches = 0;
    for sz in 0..n {
        let cc = class_of(sz).unwrap_or(u32::MAX);
        if c[sz] != cc || s[sz] != class_size(cc) {
            mismatches += 1;
        }
    }
    assert_eq!(mismatches, 0, "GPU and CPU disagree on {mismatches} sizes");
    println!("size classes: {n} sizes, 0 mismatches");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn bitmap_helpers_and_layout_match_cpu() {
    let gpu = gpu();
    let mut words: Vec<u32> = vec![0, 1, u32::MAX, 0x8000_0000, 0xAAAA_AAAA, 0x0F0F_00FF];
    let mut x = 0x1234_5678u32;
    for _ in 0..4000 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        words.push(x);
    }
    let n = words.len() as u32;
    let input = gpu.alloc_zeroed(words.len() * 4).unwrap();
    input.write(0, &words).unwrap();
    let out = gpu.alloc_zeroed(words.len() * 66 * 4).unwrap();
    let k = kernels(&gpu);
    // SAFETY: `input` holds n u32s and `out` n * 66; both outlive the launch.
    unsafe {
        k.conformance_bits(
            &LaunchConfig::for_threads(n),
            input.as_ptr(),
            n,
            out.as_ptr(),
        )
        .unwrap()
    };
    let lay = gpu.alloc_zeroed(64).unwrap();
    // SAFETY: `lay` holds 8 u64s and outlives the launch.
    unsafe {
        k.conformance_layout(&LaunchConfig::for_threads(1), 12345, 132, lay.as_ptr())
            .unwrap()
    };
    gpu.sync().unwrap();
    let mut got = vec![0u32; words.len() * 66];
    out.read(0, &mut got).unwrap();
    let mut mismatches = 0;
    for (i, &w) in words.iter().enumerate() {
        for k in 0..=32u32 {
            let at = (i * 33 + k as usize) * 2;
            let nth = if k < w.count_ones() {
                w.nth_set(k)
            } else {
                u32::MAX
            };
            mismatches += (got[at] != w.lowest_set(k)) as u32 + (got[at + 1] != nth) as u32;
        }
    }
    assert_eq!(mismatches, 0);
    let mut l = [0u64; 8];
    lay.read(0, &mut l).unwrap();
    let c = Layout::new(12345, 132);
    let cpu = [
        c.counters,
        c.lists,
        c.cache,
        c.descs,
        c.page_map,
        c.bitmaps,
        c.meta_bytes,
        std::mem::size_of::<cuheap::core::page::PageDesc>(),
    ];
    assert_eq!(
        l.to_vec(),
        cpu.iter().map(|&v| v as u64).collect::<Vec<_>>(),
        "metadata layout differs between GPU and CPU"
    );
}

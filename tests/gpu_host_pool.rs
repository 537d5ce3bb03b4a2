//! The host pool on a GPU: cross-stream reuse ordered by the GPU alone,
//! growth and trim visible in cuMemGetInfo, out-of-memory as an error,
//! bad frees refused, and host threads with their own streams at once.

mod common;
use common::gpu;
use cudarc::driver::{sys, CudaStream};
use cuheap::host::{DeviceBuffer, Pool, PoolConfig};
use cuheap::kernels::Bench;
use cuheap::{DevicePtr, Gpu, LaunchConfig};
use std::sync::Arc;

/// The tests of this file take turns: one reads cuMemGetInfo, which the
/// others' allocations would disturb.
static GPU_MEMORY: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    GPU_MEMORY.lock().unwrap_or_else(|p| p.into_inner())
}

const A: u32 = 0xAAAA_0001;
const B: u32 = 0xBBBB_0002;

fn pool(gpu: &Gpu, reserve: usize) -> Arc<Pool> {
    Arc::new(Pool::new(gpu.context(), PoolConfig::new(reserve)).unwrap())
}

fn stream(gpu: &Gpu) -> Arc<CudaStream> {
    gpu.context().new_stream().unwrap()
}

fn busy(s: &CudaStream) -> bool {
    // SAFETY: queries a live stream.
    let r = unsafe { sys::cuStreamQuery(s.cu_stream()) };
    r == sys::CUresult::CUDA_ERROR_NOT_READY
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cross_stream_reuse_waits_on_the_gpu_not_the_host() {
    let _turn = turn();
    let gpu = gpu();
    // The block fills the pool's initial mapping, so B can only get it back,
    // and A's cache keeps it (B takes it from there).
    let pool = Arc::new(
        Pool::new(
            gpu.context(),
            PoolConfig {
                initial: 64 << 20,
                stream_cache_limit: 128 << 20,
                ..PoolConfig::new(1 << 30)
            },
        )
        .unwrap(),
    );
    let (sa, sb) = (stream(&gpu), stream(&gpu));
    let n = 16u32 << 20;
    let errors = gpu.alloc_zeroed(4).unwrap();
    let p = pool.alloc(n as usize * 4, &sa).unwrap();
    // A slow producer on A (200 ms), then the block is freed on A.
    let k = Bench::new(&gpu).unwrap();
    // SAFETY: the block holds n u32s and stays allocated until after the kernel.
    unsafe {
        k.spin_fill(
            &LaunchConfig::for_threads(256 * 1024).on(&sa),
            DevicePtr::from_raw(p),
            n,
            A,
            200_000_000,
        )
        .unwrap()
    };
    pool.free(p, &sa).unwrap();
    // B gets the same block at once; its kernel must see A's data, i.e. run after A.
    let q = pool.alloc(n as usize * 4, &sb).unwrap();
    assert_eq!(q, p, "the block freed on A is reused on B");
    assert!(busy(&sa), "the host waited for stream A");
    // SAFETY: as above, on B; `errors` holds a u32.
    unsafe {
        k.check_fill(
            &LaunchConfig::for_threads(256 * 1024).on(&sb),
            DevicePtr::from_raw(q),
            n,
            A,
            B,
            errors.as_ptr(),
        )
        .unwrap()
    };
    let mut e = [0u32];
    errors.read_on(0, &mut e, &sb).unwrap();
    assert_eq!(e[0], 0, "B's kernel ran before A's finished");
    let mut data = vec![0u32; n as usize];
    // SAFETY: `q` is a live block of n u32s; the copy follows B's kernel on B.
    unsafe {
        use cuheap::host::Backend;
        let bytes = cuheap::host::bytemuck::cast_slice_mut(&mut data);
        pool.backend().copy_from_device(bytes, q, &sb).unwrap()
    };
    assert!(
        data.iter().all(|&v| v == B),
        "B's data is the final content"
    );
    let s = pool.stats();
    assert_eq!(
        (s.cross_stream_reuse, s.in_use),
        (1, (n as usize * 4).div_ceil(65536) * 65536)
    );
    pool.free(q, &sb).unwrap();
    // Same-stream reuse is immediate.
    let r = pool.alloc(n as usize * 4, &sb).unwrap();
    assert_eq!(r, q);
    assert_eq!(pool.stats().same_stream_reuse, 1);
    pool.free(r, &sb).unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn growth_and_trim_change_device_memory() {
    let _turn = turn();
    let gpu = gpu();
    let (free0, _) = gpu.mem_info().unwrap();
    let pool = pool(&gpu, 16 << 30);
    let s = stream(&gpu);
    let bufs: Vec<u64> = (0..64).map(|_| pool.alloc(32 << 20, &s).unwrap()).collect();
    let (free1, _) = gpu.mem_info().unwrap();
    assert!(
        free0 - free1 >= 2 << 30,
        "growth maps memory: {free0} -> {free1}"
    );
    assert!(pool.stats().reserved >= 2 << 30);
    for b in bufs {
        pool.free(b, &s).unwrap();
    }
    let kept = pool.trim(0).unwrap();
    let (free2, _) = gpu.mem_info().unwrap();
    // Trim keeps one chunk mapped (2 MiB by default; at most 32 MiB).
    assert!(
        free2 - free1 >= (2 << 30) - (32 << 20),
        "trim unmaps memory: {free1} -> {free2}"
    );
    assert!(kept <= 32 << 20, "{kept} bytes still mapped");
    // And the pool still works after trimming.
    let b = pool.alloc(100 << 20, &s).unwrap();
    pool.free(b, &s).unwrap();
    println!(
        "growth and trim: free {} -> {} -> {} MiB",
        free0 >> 20,
        free1 >> 20,
        free2 >> 20
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn out_of_memory_is_an_error_and_the_pool_recovers() {
    let _turn = turn();
    let gpu = gpu();
    let pool = pool(&gpu, 1 << 30);
    let s = stream(&gpu);
    let e = pool.alloc(2 << 30, &s).unwrap_err();
    assert!(e.to_string().contains("pool out of memory"), "{e}");
    let a = pool.alloc(512 << 20, &s).unwrap();
    let b = pool.alloc(400 << 20, &s).unwrap();
    let e = pool.alloc(512 << 20, &s).unwrap_err();
    assert!(e.to_string().contains("largest free run"), "{e}");
    pool.free(a, &s).unwrap();
    let c = pool.alloc(512 << 20, &s).unwrap();
    for p in [b, c] {
        pool.free(p, &s).unwrap();
    }
    // Bad frees: foreign, interior, double.
    assert!(pool.free(0x1234_5678, &s).is_err());
    let d = pool.alloc(4096, &s).unwrap();
    assert!(pool.free(d + 256, &s).is_err());
    pool.free(d, &s).unwrap();
    assert!(pool.free(d, &s).is_err());
    assert_eq!(pool.stats().bad_frees, 3);
    assert!(pool.alloc(0, &s).is_err());
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn threads_with_own_streams_fill_and_check() {
    let _turn = turn();
    let gpu = Arc::new(gpu());
    let pool = pool(&gpu, 8 << 30);
    let errors = Arc::new(gpu.alloc_zeroed(4).unwrap());
    let k = Bench::new(&gpu).unwrap();
    std::thread::scope(|sc| {
        for t in 0..8u32 {
            let (gpu, pool, errors, k) = (gpu.clone(), pool.clone(), errors.clone(), &k);
            sc.spawn(move || {
                let s = gpu.context().new_stream().unwrap();
                let mut x = 0x9E37_79B9u32 ^ t;
                let mut live: Vec<DeviceBuffer<u32>> = Vec::new();
                for i in 0..300u32 {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let words = 64 + (x % (1 << 20)) as usize;
                    let buf = DeviceBuffer::<u32>::new(&pool, words, &s).unwrap();
                    let v = (t << 24) | i;
                    let cfg = LaunchConfig::for_threads(64 * 1024).on(&s);
                    let at = DevicePtr::from_raw(buf.ptr());
                    // SAFETY: spin_fill/check_fill over `words` u32s of the
                    // buffer, freed on the same stream afterwards.
                    unsafe {
                        k.spin_fill(&cfg, at, words as u32, v, 0).unwrap();
                        k.check_fill(&cfg, at, words as u32, v, !v, errors.as_ptr())
                            .unwrap();
                    }
                    live.push(buf);
                    if live.len() > 8 {
                        live.remove((x as usize) % live.len()); // dropped: freed on its stream
                    }
                }
                drop(live);
                s.synchronize().unwrap();
            });
        }
    });
    let mut e = [0u32];
    errors.read(0, &mut e).unwrap();
    assert_eq!(
        e[0], 0,
        "a buffer was overwritten by another thread's kernel"
    );
    let st = pool.stats();
    assert_eq!((st.in_use, st.allocs, st.frees), (0, 2400, 2400));
    println!(
        "8 threads x 300 buffers: {} reused on their stream, {} across streams, {} grows",
        st.same_stream_reuse, st.cross_stream_reuse, st.grows
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn event_log_replays() {
    use cuheap::host::trace::Action;
    use cuheap::host::{Logged, Resource};
    let _turn = turn();
    let gpu = gpu();
    let path = std::env::temp_dir().join(format!("cuheap-trace-{}.csv", std::process::id()));
    let pool = Pool::new(gpu.context(), PoolConfig::new(1 << 30)).unwrap();
    let logged = Logged::to_file(pool, &path).unwrap();
    let (sa, sb) = (stream(&gpu), stream(&gpu));
    let mut live = Vec::new();
    for i in 0..1000usize {
        let s = if i % 3 == 0 { &sb } else { &sa };
        live.push((
            logged.allocate(256 + (i * 4099) % (1 << 20), s).unwrap(),
            s.clone(),
        ));
        if i % 2 == 1 {
            let (p, s) = live.swap_remove(i % live.len());
            logged.deallocate(p, &s).unwrap();
        }
    }
    for (p, s) in live {
        logged.deallocate(p, &s).unwrap();
    }
    drop(logged); // flushes the log
    let events = cuheap::host::read_trace(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(events.len(), 2000);
    assert_eq!(
        events
            .iter()
            .filter(|e| e.action == Action::Allocate)
            .count(),
        1000
    );
    let rows = cuheap::bench::replay::run(&gpu, &events).unwrap();
    assert!(
        rows.iter().all(|r| r.allocs == 1000 && r.frees == 1000),
        "{rows:?}"
    );
    let _ = std::fs::remove_file(path);
}

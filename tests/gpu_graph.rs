//! Pool allocations inside a captured CUDA graph: a graph's own pool
//! (`PoolConfig::for_graph`) serves the capture on its stream; the graph
//! replays 1,000 times with every word checked by its kernels, a block
//! freed and allocated again during the capture keeps its order, the
//! other pool refuses the capturing stream, the sealed pool hands nothing
//! out while another pool serves other streams, the replays map nothing,
//! and dropping the pool after the graph gives its memory back.

mod common;
use common::{gpu, kernels};
use cudarc::driver::sys;
use cuheap::host::{Pool, PoolConfig};
use cuheap::{DevicePtr, LaunchConfig};

const MIB: usize = 1 << 20;
const X: u32 = 0x0A0A_0001;
const Y: u32 = 0x0B0B_0002;
const Z: u32 = 0x0C0C_0003;
const W: u32 = 0x0D0D_0004;

/// The tests read the device's free memory: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn free_memory() -> usize {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: out-parameters; a context is current (the test's GPU).
    unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }
        .result()
        .unwrap();
    free
}

/// Starts capturing `s` into a graph.
fn begin_capture(s: &cudarc::driver::CudaStream) {
    // SAFETY: a live stream of the current context.
    unsafe {
        sys::cuStreamBeginCapture_v2(
            s.cu_stream(),
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        )
    }
    .result()
    .unwrap();
}

/// Ends `s`'s capture: the graph.
fn end_capture(s: &cudarc::driver::CudaStream) -> sys::CUgraph {
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: a capture begun on this stream; out-parameter.
    unsafe { sys::cuStreamEndCapture(s.cu_stream(), &mut graph) }
        .result()
        .unwrap();
    graph
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_captured_graph_replays_on_its_own_pools_memory() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let gpu = gpu();
    let k = kernels(&gpu);
    let ctx = gpu.context();
    let s = ctx.new_stream().unwrap();
    let other = ctx.new_stream().unwrap();
    let shared = Pool::new(
        ctx,
        PoolConfig {
            capture_check: true,
            ..PoolConfig::new(4 << 30)
        },
    )
    .unwrap();
    let before = free_memory();
    let gp = Pool::new(ctx, PoolConfig::for_graph(4 << 30, 256 * MIB)).unwrap();
    assert!(before - free_memory() >= 256 * MIB, "mapped up front");
    let errors = gpu.alloc_zeroed(4).unwrap();
    let n = (4 * MIB / 4) as u32;
    let big = (64 * MIB / 4) as u32;
    let cfg = LaunchConfig::for_threads(256 * 1024).on(&s);

    begin_capture(&s);
    let a = gp.alloc(4 * MIB, &s).unwrap();
    let d = gp.alloc(64 * MIB, &s).unwrap();
    // The other pool refuses the capturing stream (asking does not break
    // the capture).
    let e = shared.alloc(4096, &s).unwrap_err();
    assert!(e.to_string().contains("being captured"), "{e}");
    // SAFETY: the blocks hold the words given and live until their free
    // below, in stream order on `s`; `errors` holds a u32.
    unsafe {
        k.spin_fill(&cfg, DevicePtr::from_raw(a), n, X, 0).unwrap();
        k.check_fill(&cfg, DevicePtr::from_raw(a), n, X, Y, errors.as_ptr())
            .unwrap();
    }
    gp.free(a, &s).unwrap();
    let c = gp.alloc(4 * MIB, &s).unwrap();
    assert_eq!(c, a, "freed during the capture, reused in stream order");
    // SAFETY: as above.
    unsafe {
        // `c` is `a`'s memory: it must hold Y, written before the free.
        k.check_fill(&cfg, DevicePtr::from_raw(c), n, Y, Z, errors.as_ptr())
            .unwrap();
        k.spin_fill(&cfg, DevicePtr::from_raw(d), big, W, 0)
            .unwrap();
        k.check_fill(&cfg, DevicePtr::from_raw(d), big, W, 0, errors.as_ptr())
            .unwrap();
    }
    gp.free(c, &s).unwrap();
    gp.free(d, &s).unwrap();
    let graph = end_capture(&s);
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: the graph just captured; out-parameter.
    unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }
        .result()
        .unwrap();
    gp.seal().unwrap();
    assert!(gp.alloc(4096, &s).is_err(), "sealed: nothing more from it");

    let (mapped, device_free) = (gp.mapped(), free_memory());
    for round in 0..10 {
        for _ in 0..100 {
            // SAFETY: an instantiated graph, launched on a live stream.
            unsafe { sys::cuGraphLaunch(exec, s.cu_stream()) }
                .result()
                .unwrap();
        }
        // Meanwhile the other pool serves another stream.
        let p = shared.alloc(8 * MIB, &other).unwrap();
        shared.free(p, &other).unwrap();
        s.synchronize().unwrap();
        let mut e = [0u32];
        errors.read(0, &mut e).unwrap();
        assert_eq!(e[0], 0, "a replay saw a wrong word (round {round})");
    }
    assert_eq!(gp.mapped(), mapped, "the replays mapped nothing");
    assert!(
        free_memory() + 64 * MIB >= device_free,
        "device memory did not grow with the replays"
    );
    // The replays wrote Z last over `a`'s memory.
    let mut words = vec![0u32; n as usize];
    // SAFETY: the graph's block, idle after the synchronisation; nothing
    // else uses the sealed pool.
    unsafe {
        use cuheap::host::Backend;
        let bytes = cuheap::host::bytemuck::cast_slice_mut(&mut words);
        gp.backend().copy_from_device(bytes, a, &s).unwrap();
    }
    assert!(words.iter().all(|&w| w == Z), "the replays ran");

    // SAFETY: the graph and its executable, not used again.
    unsafe {
        sys::cuGraphExecDestroy(exec).result().unwrap();
        sys::cuGraphDestroy(graph).result().unwrap();
    }
    let held = free_memory();
    drop(gp);
    assert!(
        free_memory() >= held + 256 * MIB,
        "the graph's pool gave its memory back"
    );
}

/// A graph's pool tied to its graph (`Pool::tie_to_graph`) outlives every
/// handle of the program's: the graph's executable replays on its
/// memory after the program dropped the pool, and the memory goes back
/// once the graph and its executable are destroyed.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_pool_tied_to_its_graph_goes_when_the_graph_does() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let gpu = gpu();
    let k = kernels(&gpu);
    let ctx = gpu.context();
    let s = ctx.new_stream().unwrap();
    let before = free_memory();
    let gp =
        std::sync::Arc::new(Pool::new(ctx, PoolConfig::for_graph(4 << 30, 256 * MIB)).unwrap());
    assert!(before - free_memory() >= 256 * MIB, "mapped up front");
    let errors = gpu.alloc_zeroed(4).unwrap();
    let n = (4 * MIB / 4) as u32;
    let cfg = LaunchConfig::for_threads(256 * 1024).on(&s);
    begin_capture(&s);
    let a = gp.alloc(4 * MIB, &s).unwrap();
    // SAFETY: the block holds `n` words and lives until its free below,
    // in stream order on `s`; `errors` holds a u32.
    unsafe {
        k.spin_fill(&cfg, DevicePtr::from_raw(a), n, X, 0).unwrap();
        k.check_fill(&cfg, DevicePtr::from_raw(a), n, X, Y, errors.as_ptr())
            .unwrap();
    }
    gp.free(a, &s).unwrap();
    let graph = end_capture(&s);
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    gp.seal().unwrap();
    // SAFETY: the live graph just captured, of the pool's context.
    unsafe { gp.tie_to_graph(graph) }.unwrap();
    // SAFETY: a null graph is refused before the driver sees it.
    assert!(unsafe { gp.tie_to_graph(std::ptr::null_mut()) }.is_err());
    let plain = std::sync::Arc::new(Pool::new(ctx, PoolConfig::new(1 << 30)).unwrap());
    // SAFETY: the live graph; a pool that is not a graph's is refused
    // before the driver sees it.
    let e = unsafe { plain.tie_to_graph(graph) }.unwrap_err();
    assert!(e.to_string().contains("not a graph's"), "{e}");
    drop(plain);
    // SAFETY: the graph captured above; out-parameter.
    unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }
        .result()
        .unwrap();
    let weak = std::sync::Arc::downgrade(&gp);
    drop(gp);
    assert!(weak.upgrade().is_some(), "the graph holds the pool");
    for _ in 0..100 {
        // SAFETY: an instantiated graph, launched on a live stream.
        unsafe { sys::cuGraphLaunch(exec, s.cu_stream()) }
            .result()
            .unwrap();
    }
    s.synchronize().unwrap();
    let mut e = [0u32];
    errors.read(0, &mut e).unwrap();
    assert_eq!(e[0], 0, "a replay saw a wrong word");
    // Destroying the source graph alone leaves the executable's reference.
    // SAFETY: the graph, not used again (the executable is its own).
    unsafe { sys::cuGraphDestroy(graph) }.result().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(weak.upgrade().is_some(), "the executable holds the pool");
    let held = free_memory();
    // SAFETY: the executable, idle after the synchronisation above.
    unsafe { sys::cuGraphExecDestroy(exec) }.result().unwrap();
    let start = std::time::Instant::now();
    while weak.upgrade().is_some() || free_memory() < held + 256 * MIB {
        assert!(
            start.elapsed().as_secs() < 20,
            "the pool did not go with its graph: {} MiB back",
            free_memory().saturating_sub(held) / MIB
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

//! A pool's block in another process, on the GPU: this test's process
//! fills a block that lies over several mappings, exports it, and sends
//! the handles over a Unix socket to a second process (this test binary
//! again, running `child_maps_what_the_parent_shares`). The child maps
//! the block, checks the parent's words with a kernel and writes its own,
//! which the parent then checks. The parent then frees the block and
//! trims its pool; the child's mapping still holds the last words. Bad
//! handles get the driver's error by name.

mod common;
use common::{gpu, kernels};
use cuheap::host::{CudaBackend, Error, Exported, Imported, Pool, PoolConfig};
use cuheap::kernels::Bench;
use cuheap::{DevicePtr, Gpu, LaunchConfig};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
/// Set in the child's environment: the socket to connect to.
const SOCKET: &str = "CUHEAP_SHARE_TEST_SOCKET";
const PARENT: u32 = 0x9A7E_0001;
const CHILD: u32 = 0xC41D_0002;
const AGAIN: u32 = 0x9A7E_0003;

/// Counts the `n` words at `p` that are not `expect`, writing `value`
/// over each; waits.
fn check(gpu: &Gpu, k: &Bench, p: u64, n: u32, expect: u32, value: u32) -> u32 {
    let errors = gpu.alloc_zeroed(4).unwrap();
    // SAFETY: `p` holds n u32s mapped for this GPU; nothing else uses
    // them meanwhile (the two processes take turns over the socket).
    unsafe {
        k.check_fill(
            &LaunchConfig::for_threads(256 * 1024),
            DevicePtr::from_raw(p),
            n,
            expect,
            value,
            errors.as_ptr(),
        )
        .unwrap()
    };
    gpu.sync().unwrap();
    let mut e = [0u32];
    errors.read(0, &mut e).unwrap();
    e[0]
}

fn send_u32(mut s: &UnixStream, v: u32) {
    s.write_all(&v.to_le_bytes()).unwrap();
}

fn recv_u32(mut s: &UnixStream) -> u32 {
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    u32::from_le_bytes(b)
}

/// Accepts the child's connection, failing (with its output) if it exits
/// first or takes more than a minute.
fn accept(listener: &UnixListener, child: &mut std::process::Child) -> UnixStream {
    listener.set_nonblocking(true).unwrap();
    let start = Instant::now();
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
                return s;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the child exited before it connected: {status}");
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no child");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_block_crosses_to_another_process() {
    let gpu = gpu();
    let k = kernels(&gpu);
    let cfg = PoolConfig {
        initial: 32 * MIB,
        chunk: 32 * MIB,
        shareable: true,
        ..PoolConfig::new(4 << 30)
    };
    let pool = Pool::new(gpu.context(), cfg).unwrap();
    let s = gpu.stream();
    let keep = pool.alloc(MIB, s).unwrap(); // holds the first mapping
    let block = pool.alloc(48 * MIB, s).unwrap();
    let n = (pool.size_of(block).unwrap() / 4) as u32;
    gpu.sync().unwrap();
    // SAFETY: `block` holds n u32s; nothing else uses it.
    unsafe {
        k.spin_fill(
            &LaunchConfig::for_threads(256 * 1024),
            DevicePtr::from_raw(block),
            n,
            PARENT,
            0,
        )
        .unwrap()
    };
    gpu.sync().unwrap();
    let e = pool.export_block(block).unwrap();
    assert!(e.mappings() >= 2, "48 MiB over 32 MiB mappings");

    let dir = std::env::temp_dir().join(format!("cuheap-share-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("socket");
    let listener = UnixListener::bind(&path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_maps_what_the_parent_shares",
            "--nocapture",
        ])
        .env(SOCKET, &path)
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let conn = accept(&listener, &mut child);
    e.send(&conn).unwrap();
    send_u32(&conn, n);

    // The child checked PARENT and wrote CHILD.
    assert_eq!(recv_u32(&conn), 0, "the child read the parent's words");
    assert_eq!(
        check(&gpu, &k, block, n, CHILD, AGAIN),
        0,
        "the parent reads the child's"
    );

    // Freed and trimmed here: the child's mapping keeps the memory.
    drop(e);
    pool.free(block, s).unwrap();
    pool.release_stream(s).unwrap();
    let mapped = pool.trim(0).unwrap();
    assert!(
        mapped < 48 * MIB,
        "the block's mappings went ({mapped} bytes mapped)"
    );
    send_u32(&conn, 1);
    assert_eq!(recv_u32(&conn), 0, "the child still reads the last words");
    let status = child.wait().unwrap();
    assert!(status.success(), "child: {status}");
    pool.free(keep, s).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// The child of [`a_block_crosses_to_another_process`]; without its
/// socket in the environment (a run of the whole suite) it does nothing.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn child_maps_what_the_parent_shares() {
    let Some(path) = std::env::var_os(SOCKET) else {
        return;
    };
    let conn = UnixStream::connect(path).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let e = Exported::<CudaBackend>::receive(&conn).unwrap();
    let n = recv_u32(&conn);
    let gpu = gpu();
    let k = kernels(&gpu);
    let there = Imported::map(CudaBackend::new(gpu.context()), &e).unwrap();
    drop(e); // the handles are not needed once mapped
    assert_eq!(there.len(), n as usize * 4);
    send_u32(&conn, check(&gpu, &k, there.ptr(), n, PARENT, CHILD));
    assert_eq!(recv_u32(&conn), 1);
    send_u32(&conn, check(&gpu, &k, there.ptr(), n, AGAIN, AGAIN));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn handles_the_driver_refuses_are_its_error() {
    let gpu = gpu();
    // Not a CUDA handle.
    let null: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    let e = Exported::<CudaBackend>::from_handles(vec![(2 * MIB, null)], 0, 4096).unwrap();
    match Imported::map(CudaBackend::new(gpu.context()), &e) {
        Err(Error::Driver { what, .. }) => assert_eq!(what, "cuMemImportFromShareableHandle"),
        other => panic!("{:?}", other.map(|i| i.ptr())),
    }
    // A pool made without shareable memory.
    let pool = Pool::new(gpu.context(), PoolConfig::new(256 * MIB)).unwrap();
    let p = pool.alloc(MIB, gpu.stream()).unwrap();
    match pool.export_block(p) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("shareable: true"), "{m}"),
        other => panic!("{:?}", other.map(|e| e.len())),
    }
    pool.free(p, gpu.stream()).unwrap();
}

//! Pools on two GPUs, each granting the other access: kernels on one GPU
//! write a pool's blocks on the other and kernels there read them, for
//! memory mapped before the grant and memory the pool maps after it; the
//! driver's own record of access (`cuMemGetAccess`) follows grants and
//! revokes. Needs a machine with two GPUs that have a peer path; on one
//! GPU the test says so and checks only that a grant to a device that
//! does not exist is refused.

use cudarc::driver::{sys, CudaContext};
use cuheap::host::{Error, Pool, PoolConfig};
use cuheap::kernels::Bench;
use cuheap::{DevicePtr, Gpu, LaunchConfig};
use std::sync::Arc;

const MIB: usize = 1 << 20;

/// The access the driver records for `device` at `ptr`
/// (`CU_MEM_ACCESS_FLAGS_PROT_*`: 0 none, 3 read and write).
fn access(ctx: &Arc<CudaContext>, device: i32, ptr: u64) -> u64 {
    ctx.bind_to_thread().unwrap();
    let location = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    };
    let mut flags = 0u64;
    // SAFETY: out-parameter; `ptr` is inside a mapped range of the pool.
    unsafe { sys::cuMemGetAccess(&mut flags, &location, ptr) }
        .result()
        .unwrap();
    flags
}

/// One GPU with the test kernels and an error counter.
struct Side {
    gpu: Gpu,
    kernels: Bench,
    errors: cuheap::host::DeviceMemory,
}

impl Side {
    fn open(device: usize) -> Side {
        let ctx = CudaContext::new(device).unwrap();
        let gpu =
            Gpu::on_context(&ctx, cuheap::BENCH_PTX, cuheap::load_options().unwrap()).unwrap();
        let kernels = Bench::new(&gpu).unwrap();
        let errors = gpu.alloc_zeroed(4).unwrap();
        Side {
            gpu,
            kernels,
            errors,
        }
    }

    /// Writes `value` to `n` words at `p` and waits.
    fn fill(&self, p: u64, n: u32, value: u32) {
        // SAFETY: `p` is a live pool block of at least n u32s that this
        // GPU may access; nothing else uses it meanwhile.
        unsafe {
            self.kernels
                .spin_fill(
                    &LaunchConfig::for_threads(256 * 1024).on(self.gpu.stream()),
                    DevicePtr::from_raw(p),
                    n,
                    value,
                    0,
                )
                .unwrap()
        };
        self.gpu.sync().unwrap();
    }

    /// Counts the words of `n` at `p` that are not `expect`, writing
    /// `value` over them; waits.
    fn check(&self, p: u64, n: u32, expect: u32, value: u32) -> u32 {
        self.errors.zero().unwrap();
        // SAFETY: as in `fill`; `errors` holds a u32.
        unsafe {
            self.kernels
                .check_fill(
                    &LaunchConfig::for_threads(256 * 1024).on(self.gpu.stream()),
                    DevicePtr::from_raw(p),
                    n,
                    expect,
                    value,
                    self.errors.as_ptr(),
                )
                .unwrap()
        };
        self.gpu.sync().unwrap();
        let mut e = [0u32];
        self.errors.read(0, &mut e).unwrap();
        e[0]
    }
}

/// A pool on `owner` that grants `peer` access after one block is
/// allocated; `peer` writes that block and one allocated after the grant
/// (past the pool's first mapping, so new memory), and `owner` reads both
/// and writes them again for `peer` to read. Then a revoke.
fn share(owner: &Side, peer: &Side, peer_ordinal: i32) {
    let cfg = PoolConfig {
        initial: 64 * MIB,
        chunk: 64 * MIB,
        ..PoolConfig::new(4 << 30)
    };
    let pool = Pool::new(owner.gpu.context(), cfg).unwrap();
    let s = owner.gpu.stream();
    let early = pool.alloc(16 * MIB, s).unwrap();
    let own_ctx = owner.gpu.context();
    assert_eq!(access(own_ctx, peer_ordinal, early), 0, "no access yet");

    pool.grant_access(peer_ordinal).unwrap();
    assert_eq!(pool.peers(), [peer_ordinal]);
    let mapped = pool.stats().reserved;
    let late = pool.alloc(512 * MIB, s).unwrap();
    assert!(
        pool.stats().reserved > mapped,
        "the pool grew after the grant"
    );
    owner.gpu.sync().unwrap();
    for (p, bytes) in [(early, 16 * MIB), (late, 512 * MIB)] {
        assert_eq!(access(own_ctx, peer_ordinal, p), 3, "read and write");
        let n = (bytes / 4) as u32;
        peer.fill(p, n, 0xA11C_E000 | peer_ordinal as u32);
        let bad = owner.check(p, n, 0xA11C_E000 | peer_ordinal as u32, 0x0B0B_0000);
        assert_eq!(bad, 0, "the owner read what the peer wrote at {p:#x}");
        let bad = peer.check(p, n, 0x0B0B_0000, 0);
        assert_eq!(bad, 0, "the peer read what the owner wrote at {p:#x}");
    }

    // SAFETY: every kernel on the peer has finished (`check` waits).
    unsafe { pool.revoke_access(peer_ordinal) }.unwrap();
    assert!(pool.peers().is_empty());
    for p in [early, late] {
        assert_eq!(access(own_ctx, peer_ordinal, p), 0, "revoked");
    }
    let own = owner.gpu.context().ordinal() as i32;
    let after = pool.alloc(1 << 30, s).unwrap();
    assert_eq!(
        access(own_ctx, peer_ordinal, after),
        0,
        "no grant after a revoke"
    );
    assert_eq!(access(own_ctx, own, after), 3, "the owner keeps its access");
    assert_eq!(owner.check(early, 1024, 0, 7), 0);
    for p in [early, late, after] {
        pool.free(p, s).unwrap();
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn pools_on_two_gpus_grant_each_other_access() {
    let count = cuheap::host::driver::init_driver().expect("a GPU");
    let zero = Side::open(0);
    let pool = Pool::new(zero.gpu.context(), PoolConfig::new(256 * MIB)).unwrap();
    let missing = count as i32;
    match pool.grant_access(missing) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(&format!("device {missing}")), "{m}"),
        other => panic!("grant to a device that does not exist: {other:?}"),
    }
    if count < 2 {
        eprintln!("one GPU: the peer part of this test needs two");
        return;
    }
    let one = Side::open(1);
    share(&zero, &one, 1);
    share(&one, &zero, 0);
}

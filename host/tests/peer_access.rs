//! Access for other devices to a pool's memory, over [`HostBackend`]
//! with three devices (host memory standing in for them; a read or write
//! by a device fails on any byte not mapped with access granted to it):
//! a grant covers every block, mapped before or after it, through growth,
//! trim and memory banked by a device heap; a revoke takes all of it
//! away; bad devices are refused and change nothing. No GPU needed.

use cuheap_host::vmm::Region;
use cuheap_host::{Error, HostBackend, HostStream, Part, Pool, PoolConfig, Reservation};

const MIB: usize = 1 << 20;

fn backend() -> HostBackend {
    HostBackend::new(2 * MIB, 1 << 30).with_devices(3)
}

fn config() -> PoolConfig {
    PoolConfig {
        initial: 8 * MIB,
        chunk: 8 * MIB,
        ..PoolConfig::new(512 * MIB)
    }
}

/// Whether `device` can write `len` bytes at `at` and read them back
/// (and the pool's own device, 0, then reads the same bytes).
fn reaches(b: &HostBackend, device: i32, at: u64, len: usize) -> bool {
    let bytes: Vec<u8> = (0..len).map(|i| (i as u8) ^ (device as u8 * 17)).collect();
    if b.write_as(device, at, &bytes).is_err() {
        return false;
    }
    let (mut got, mut own) = (vec![0u8; len], vec![0u8; len]);
    b.read_as(device, at, &mut got).unwrap();
    b.read(at, &mut own).unwrap();
    assert!(
        got == bytes && own == bytes,
        "device {device} and the own device see different bytes at {at:#x}"
    );
    true
}

#[test]
fn a_grant_covers_blocks_mapped_before_and_after_it() {
    let pool = Pool::with_backend(backend(), config()).unwrap();
    let s = HostStream::new();
    let b = pool.backend();
    let early = pool.alloc(MIB, &s).unwrap();
    assert!(reaches(b, 0, early, MIB));
    assert!(!reaches(b, 1, early, MIB), "no access before the grant");

    pool.grant_access(1).unwrap();
    assert_eq!(pool.peers(), [1]);
    assert!(reaches(b, 1, early, MIB), "memory mapped before the grant");
    assert!(!reaches(b, 2, early, MIB), "only the device granted");

    // Past the first mapping: the pool grows, and the new memory is
    // granted too.
    let mapped = pool.stats().reserved;
    let late = pool.alloc(64 * MIB, &s).unwrap();
    assert!(pool.stats().reserved > mapped, "the pool grew");
    assert!(
        reaches(b, 1, late, 64 * MIB),
        "memory mapped after the grant"
    );

    // Granting again, or the own device, changes nothing.
    pool.grant_access(1).unwrap();
    pool.grant_access(0).unwrap();
    assert_eq!(pool.peers(), [1]);
    pool.grant_access(2).unwrap();
    assert_eq!(pool.peers(), [1, 2]);
    assert!(reaches(b, 2, early, MIB) && reaches(b, 2, late, 64 * MIB));

    // Trimmed and mapped again: still granted.
    pool.free(late, &s).unwrap();
    pool.release_stream(&s).unwrap();
    pool.trim(0).unwrap();
    let again = pool.alloc(64 * MIB, &s).unwrap();
    assert!(reaches(b, 1, again, 64 * MIB) && reaches(b, 2, again, 64 * MIB));
    pool.free(again, &s).unwrap();
    pool.free(early, &s).unwrap();
}

#[test]
fn a_revoke_takes_every_mapping_away_from_that_device_only() {
    let pool = Pool::with_backend(backend(), config()).unwrap();
    let s = HostStream::new();
    let b = pool.backend();
    pool.grant_access(1).unwrap();
    pool.grant_access(2).unwrap();
    let small = pool.alloc(MIB, &s).unwrap();
    let large = pool.alloc(64 * MIB, &s).unwrap();
    // SAFETY: no work on device 1 uses the pool (host memory, no kernels).
    unsafe { pool.revoke_access(1) }.unwrap();
    assert_eq!(pool.peers(), [2]);
    for (at, len) in [(small, MIB), (large, 64 * MIB)] {
        assert!(!reaches(b, 1, at, len), "device 1 keeps no access");
        assert!(reaches(b, 2, at, len) && reaches(b, 0, at, len));
    }
    // Memory mapped after the revoke is not granted to device 1 either.
    let later = pool.alloc(128 * MIB, &s).unwrap();
    assert!(!reaches(b, 1, later, 128 * MIB) && reaches(b, 2, later, 128 * MIB));

    // The own device cannot lose access; a device never granted is a no-op.
    // SAFETY: as above.
    let own = unsafe { pool.revoke_access(0) };
    assert!(
        matches!(&own, Err(Error::InvalidArgument(m)) if m.contains("device 0 owns")),
        "{own:?}"
    );
    // SAFETY: as above.
    unsafe { pool.revoke_access(1) }.unwrap();
    assert_eq!(pool.peers(), [2]);
    assert!(reaches(b, 0, small, MIB));
    for p in [small, large, later] {
        pool.free(p, &s).unwrap();
    }
}

#[test]
fn a_device_that_cannot_be_granted_is_refused_and_changes_nothing() {
    let pool = Pool::with_backend(backend(), config()).unwrap();
    let s = HostStream::new();
    let p = pool.alloc(MIB, &s).unwrap();
    for bad in [3, 7, -1, i32::MAX] {
        match pool.grant_access(bad) {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains(&format!("device {bad}")), "{m}")
            }
            other => panic!("grant to device {bad}: {other:?}"),
        }
    }
    assert!(pool.peers().is_empty());
    assert!(reaches(pool.backend(), 0, p, MIB));
    assert!(!reaches(pool.backend(), 1, p, MIB));
    pool.free(p, &s).unwrap();
}

/// Memory a device heap gives back to a shared reservation is mapped
/// again by the pool with the pool's grants, and by the heap's range
/// without them: access belongs to the mapping's owner, not the memory.
#[test]
fn banked_memory_takes_the_grants_of_whoever_maps_it() {
    let res = Reservation::shared(backend(), 8 << 30).unwrap();
    let heap = Region::within(&res, Part::DeviceHeap, 1 << 30, 2 * MIB).unwrap();
    heap.grow_at_once(96 * MIB).unwrap();
    assert!(!reaches(res.backend(), 1, heap.base(), 96 * MIB));
    // SAFETY: nothing uses host-backed test memory.
    unsafe { heap.shrink_to(0) }.unwrap();
    assert_eq!(res.stats().banked, 96 * MIB);

    let pool = Pool::in_reservation(&res, config()).unwrap();
    pool.grant_access(1).unwrap();
    let s = HostStream::new();
    let p = pool.alloc(80 * MIB, &s).unwrap();
    assert_eq!(
        res.stats().reused,
        96 * MIB,
        "the pool mapped the banked piece"
    );
    assert!(reaches(res.backend(), 1, p, 80 * MIB));

    // The pool gives it back; the heap's range maps it with no grant.
    pool.free(p, &s).unwrap();
    pool.release_stream(&s).unwrap();
    pool.trim(0).unwrap();
    heap.grow_at_once(96 * MIB).unwrap();
    assert!(reaches(res.backend(), 0, heap.base(), 96 * MIB));
    assert!(!reaches(res.backend(), 1, heap.base(), 96 * MIB));
}

/// A 1 MiB block in the first mapping and a 64 MiB one over later ones:
/// their addresses, the large one's last page and every mapping's start.
fn spread(pool: &Pool<HostBackend>, s: &HostStream) -> (u64, u64, u64, Vec<u64>) {
    let first = pool.alloc(MIB, s).unwrap();
    let large = pool.alloc(64 * MIB, s).unwrap();
    let last_page = large + (64 * MIB - 65536) as u64;
    let maps: Vec<u64> = pool
        .snapshot()
        .mappings
        .iter()
        .map(|m| pool.base() + m.offset as u64)
        .collect();
    assert!(maps.len() >= 3, "{maps:?}");
    assert!(first < maps[1] && last_page >= maps[2]);
    (first, large, last_page, maps)
}

/// A driver that refuses a grant on one mapping: the grants made before
/// it are undone. One that refuses a revoke part-way: the device stays
/// listed, keeps the mappings not yet revoked, and a second call
/// finishes.
#[test]
fn refused_grants_are_undone_and_refused_revokes_can_be_finished() {
    let pool = Pool::with_backend(backend(), config()).unwrap();
    let s = HostStream::new();
    let b = pool.backend();
    let (first, large, last_page, maps) = spread(&pool, &s);

    b.refuse_access_at(maps[1], true, true);
    assert!(pool.grant_access(1).is_err());
    assert!(pool.peers().is_empty());
    assert!(
        !reaches(b, 1, first, MIB),
        "the first mapping's grant was undone"
    );
    assert!(!reaches(b, 1, last_page, 65536));

    b.refuse_access_at(maps[1], false, false);
    pool.grant_access(1).unwrap();
    assert!(reaches(b, 1, first, MIB) && reaches(b, 1, large, 64 * MIB));

    b.refuse_access_at(maps[1], true, true);
    // SAFETY: no work on device 1 uses the pool (host memory, no kernels).
    assert!(unsafe { pool.revoke_access(1) }.is_err());
    assert_eq!(pool.peers(), [1], "still listed");
    assert!(!reaches(b, 1, first, MIB), "revoked before the refusal");
    assert!(reaches(b, 1, last_page, 65536), "not yet revoked");
    b.refuse_access_at(maps[1], false, false);
    // SAFETY: as above.
    unsafe { pool.revoke_access(1) }.unwrap();
    assert!(pool.peers().is_empty());
    assert!(!reaches(b, 1, last_page, 65536) && !reaches(b, 1, first, MIB));
    pool.free(first, &s).unwrap();
    pool.free(large, &s).unwrap();
}

/// A grant refused on one mapping whose undoing is refused too: the
/// device stays listed, a second grant finishes it (rather than return
/// at once), and a revoke takes it all away.
#[test]
fn a_grant_that_cannot_be_undone_is_finished_by_the_next() {
    let pool = Pool::with_backend(backend(), config()).unwrap();
    let s = HostStream::new();
    let b = pool.backend();
    let (first, large, last_page, maps) = spread(&pool, &s);
    b.refuse_access_at(maps[0], false, true); // its grant works, its undo does not
    b.refuse_access_at(maps[1], true, false); // its grant fails
    assert!(pool.grant_access(1).is_err());
    assert_eq!(pool.peers(), [1], "listed: it reaches the first mapping");
    assert!(reaches(b, 1, first, MIB) && !reaches(b, 1, last_page, 65536));
    b.refuse_access_at(maps[1], false, false);
    pool.grant_access(1).unwrap();
    assert!(reaches(b, 1, last_page, 65536), "the second grant finished");
    b.refuse_access_at(maps[0], false, false);
    // SAFETY: no work on device 1 uses the pool (host memory, no kernels).
    unsafe { pool.revoke_access(1) }.unwrap();
    assert!(pool.peers().is_empty() && !reaches(b, 1, first, MIB));
    pool.free(first, &s).unwrap();
    pool.free(large, &s).unwrap();
}

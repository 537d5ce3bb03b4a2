//! One reservation shared by a pool and a device heap's range, over
//! [`HostBackend`] (host memory standing in for the device, unmapped
//! memory poisoned): memory one side gives back serves the other without
//! new memory, contents stay where they were written, nothing is lost,
//! and the bank goes back to the device. No GPU needed.

use cuheap_host::vmm::Region;
use cuheap_host::{HostBackend, HostStream, Part, Pool, PoolConfig, Reservation};
use std::sync::Arc;

const MIB: usize = 1 << 20;

/// A shared reservation of 8 GiB over a backend with 2 MiB granules and
/// 256 MiB of physical memory.
fn reservation() -> Arc<Reservation<HostBackend>> {
    Reservation::shared(HostBackend::new(2 * MIB, 256 * MIB), 8 << 30).unwrap()
}

fn pool_in(res: &Arc<Reservation<HostBackend>>) -> Pool<HostBackend> {
    let cfg = PoolConfig {
        initial: 32 * MIB,
        chunk: 32 * MIB,
        ..PoolConfig::new(1 << 30)
    };
    Pool::in_reservation(res, cfg).unwrap()
}

/// The range of a device heap (what `DeviceHeap::growable_in` carves).
fn heap_in(res: &Arc<Reservation<HostBackend>>, bytes: usize) -> Region<HostBackend> {
    Region::within(res, Part::DeviceHeap, bytes, 2 * MIB).unwrap()
}

/// A heap's range maps 96 MiB of new memory and gives it back: one
/// banked piece.
fn bank_96_mib(res: &Arc<Reservation<HostBackend>>) {
    let heap = heap_in(res, 1 << 30);
    heap.grow_at_once(96 * MIB).unwrap();
    // SAFETY: nothing uses host-backed test memory.
    unsafe { heap.shrink_to(0) }.unwrap();
    assert_eq!(res.stats().banked, 96 * MIB);
}

/// `len` bytes of the pattern of `seed`.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

/// Writes the pattern of `seed` over `len` bytes at `at`, reads it back.
fn fill_and_check(b: &HostBackend, at: u64, len: usize, seed: u8) {
    b.write(at, &pattern(len, seed)).unwrap();
    assert!(
        holds(b, at, len, seed),
        "memory at {at:#x} lost what was written"
    );
}

/// Whether `len` bytes at `at` hold the pattern of `seed`.
fn holds(b: &HostBackend, at: u64, len: usize, seed: u8) -> bool {
    let mut got = vec![0u8; len];
    b.read(at, &mut got).is_ok() && got == pattern(len, seed)
}

#[test]
fn memory_a_heap_gives_back_serves_the_pool_and_the_reverse() {
    let res = reservation();
    let heap = heap_in(&res, 1 << 30);
    assert_eq!(heap.grow_at_once(96 * MIB).unwrap(), 96 * MIB);
    fill_and_check(res.backend(), heap.base(), 96 * MIB, 1);
    let pool = pool_in(&res);
    let s = res.stats();
    assert_eq!((s.heap_mapped, s.pool_mapped), (96 * MIB, 32 * MIB));
    assert_eq!((s.created, s.reused, s.banked), (128 * MIB, 0, 0));

    // The heap gives its step back (as `DeviceHeap::trim` does): banked,
    // not released; the pool sees it.
    // SAFETY: nothing uses host-backed test memory.
    assert_eq!(unsafe { heap.shrink_to(0) }.unwrap(), 0);
    assert_eq!(res.backend().physical(), 128 * MIB);
    let ps = pool.stats();
    assert_eq!((ps.banked, ps.device_heap_mapped), (96 * MIB, 0));

    // A host allocation larger than the pool's memory maps the banked
    // piece: no new memory.
    let stream = HostStream::new();
    let p = pool.alloc(64 * MIB, &stream).unwrap();
    fill_and_check(res.backend(), p, 64 * MIB, 2);
    let s = res.stats();
    assert_eq!((s.created, s.reused, s.banked), (128 * MIB, 96 * MIB, 0));
    assert_eq!(s.pool_mapped, 128 * MIB);
    assert_eq!(res.backend().physical(), 128 * MIB);

    // The reverse: the pool frees and trims, the heap grows into what it
    // gave back.
    pool.free(p, &stream).unwrap();
    assert_eq!(pool.trim(0).unwrap(), 32 * MIB, "the first mapping stays");
    assert_eq!(pool.stats().banked, 96 * MIB);
    // (A first mapping takes no piece longer than asked: it stays.)
    assert_eq!(heap.grow_at_once(96 * MIB).unwrap(), 96 * MIB);
    fill_and_check(res.backend(), heap.base(), 96 * MIB, 3);
    let s = res.stats();
    assert_eq!((s.created, s.reused, s.banked), (128 * MIB, 192 * MIB, 0));
    assert_eq!(pool.stats().device_heap_mapped, 96 * MIB);

    // Everything back: the heap's step to the bank, the bank to the device.
    // SAFETY: as above.
    unsafe { heap.shrink_to(0) }.unwrap();
    assert_eq!(res.release(), 96 * MIB);
    assert_eq!(res.backend().physical(), 32 * MIB, "the pool's first chunk");
    drop(pool);
    drop(heap);
    assert_eq!(
        res.release(),
        32 * MIB,
        "a dropped region's memory is banked"
    );
    assert_eq!(res.backend().physical(), 0);
    assert_eq!(res.stats().released, 128 * MIB);
}

#[test]
fn a_step_is_made_of_banked_pieces_before_new_memory() {
    let res = reservation();
    let pool = pool_in(&res);
    let stream = HostStream::new();
    // The pool grows by a few chunks, then trims them: each is a piece of
    // the bank.
    let p = pool.alloc(80 * MIB, &stream).unwrap();
    pool.free(p, &stream).unwrap();
    let mapped = pool.stats().reserved;
    assert!(mapped >= 96 * MIB, "{mapped}");
    pool.trim(0).unwrap();
    let banked = res.stats().banked;
    assert_eq!(banked, mapped - 32 * MIB);
    // A heap step larger than any piece maps them all, then new memory
    // for the rest: one mapping each.
    let heap = heap_in(&res, 1 << 30);
    let created = res.stats().created;
    let want = banked + 10 * MIB;
    let got = heap.grow_at_once(want).unwrap();
    assert!(got >= want, "{got} < {want}");
    fill_and_check(res.backend(), heap.base(), got, 4);
    let s = res.stats();
    assert_eq!(s.banked, 0);
    assert_eq!(s.reused, banked);
    assert_eq!(
        s.created - created,
        got - banked,
        "new memory only for the rest"
    );
    assert_eq!(s.heap_mapped, got);
}

#[test]
fn a_piece_longer_than_the_range_left_stays_banked() {
    let res = reservation();
    bank_96_mib(&res);
    let small = heap_in(&res, 64 * MIB);
    assert_eq!(small.grow_at_once(64 * MIB).unwrap(), 64 * MIB);
    let s = res.stats();
    assert_eq!(
        (s.banked, s.reused),
        (96 * MIB, 0),
        "a 96 MiB piece in 64 MiB"
    );
    assert_eq!(s.created, 160 * MIB);
}

#[test]
fn the_pool_trims_a_banked_piece_whole_and_never_while_in_use() {
    let res = reservation();
    let pool = pool_in(&res);
    bank_96_mib(&res);
    let stream = HostStream::new();
    // Two blocks: the second lies in the 96 MiB piece the pool maps.
    let a = pool.alloc(16 * MIB, &stream).unwrap();
    let b = pool.alloc(48 * MIB, &stream).unwrap();
    assert_eq!(pool.stats().reserved, 128 * MIB);
    pool.free(a, &stream).unwrap();
    assert_eq!(
        pool.trim(0).unwrap(),
        128 * MIB,
        "a live block holds the piece"
    );
    fill_and_check(res.backend(), b, 48 * MIB, 5);
    pool.free(b, &stream).unwrap();
    assert_eq!(pool.trim(0).unwrap(), 32 * MIB);
    assert_eq!(res.stats().banked, 96 * MIB);
}

#[test]
fn a_region_of_its_own_releases_what_it_unmaps() {
    let backend = HostBackend::new(2 * MIB, 256 * MIB);
    let r = Region::with_backend(backend, 1 << 30, 2 * MIB).unwrap();
    r.grow_at_once(64 * MIB).unwrap();
    assert_eq!(r.backend().physical(), 64 * MIB);
    // SAFETY: nothing uses host-backed test memory.
    unsafe { r.shrink_to(0) }.unwrap();
    assert_eq!(r.backend().physical(), 0);
    assert_eq!(r.reservation().stats().banked, 0);
}

#[test]
fn a_full_reservation_refuses_new_regions() {
    let res = Reservation::shared(HostBackend::new(2 * MIB, 256 * MIB), 64 * MIB).unwrap();
    let _a = heap_in(&res, 48 * MIB);
    assert!(Region::within(&res, Part::DeviceHeap, 32 * MIB, 2 * MIB).is_err());
    assert!(Region::within(&res, Part::DeviceHeap, 16 * MIB, 2 * MIB).is_ok());
    assert_eq!(res.stats().carved, 64 * MIB);
}

#[test]
fn out_of_device_memory_releases_pieces_too_long_to_use() {
    // 128 MiB of device memory: a heap banks 96 MiB, then a pool whose
    // range is too short for that piece still gets memory.
    let res = Reservation::shared(HostBackend::new(2 * MIB, 128 * MIB), 8 << 30).unwrap();
    bank_96_mib(&res);
    let cfg = PoolConfig {
        initial: 16 * MIB,
        chunk: 16 * MIB,
        ..PoolConfig::new(64 * MIB)
    };
    let pool = Pool::in_reservation(&res, cfg).unwrap();
    let stream = HostStream::new();
    let p = pool.alloc(48 * MIB, &stream).unwrap();
    fill_and_check(res.backend(), p, 48 * MIB, 6);
    let s = res.stats();
    assert_eq!((s.banked, s.released), (0, 96 * MIB), "{s:?}");
    assert!(res.backend().physical() <= 128 * MIB);
}

#[test]
fn a_first_mapping_takes_no_piece_longer_than_asked() {
    let res = reservation();
    bank_96_mib(&res);
    // The pool's first mapping (never trimmed) is new memory, its growth
    // then maps the piece.
    let pool = pool_in(&res);
    assert_eq!(res.stats().banked, 96 * MIB);
    assert_eq!(pool.stats().reserved, 32 * MIB);
    let stream = HostStream::new();
    let p = pool.alloc(48 * MIB, &stream).unwrap();
    assert_eq!(res.stats().banked, 0);
    assert_eq!(pool.stats().reserved, 128 * MIB);
    pool.free(p, &stream).unwrap();
    assert_eq!(pool.trim(0).unwrap(), 32 * MIB);
}

#[test]
fn a_step_in_pieces_gives_back_a_piece_at_a_time() {
    let res = reservation();
    let heap = heap_in(&res, 1 << 30);
    // The first step stays whole; the next maps 64 MiB as 8 MiB pieces
    // (a piece of 5 MiB rounds up to whole 2 MiB chunks: 6 MiB).
    assert_eq!(heap.grow_in_pieces(16 * MIB, usize::MAX).unwrap(), 16 * MIB);
    assert_eq!(heap.grow_in_pieces(80 * MIB, 8 * MIB).unwrap(), 80 * MIB);
    assert_eq!(heap.grow_in_pieces(92 * MIB, 5 * MIB).unwrap(), 92 * MIB);
    let l = heap.layout();
    let lens: Vec<usize> = l.mappings.iter().map(|m| m.1 / MIB).collect();
    assert_eq!(lens, [16, 8, 8, 8, 8, 8, 8, 8, 8, 6, 6]);
    assert_eq!(res.stats().created, 92 * MIB);
    fill_and_check(res.backend(), heap.base(), 92 * MIB, 7);
    // A piece in the middle goes alone, to the bank; its neighbours keep
    // their contents.
    // SAFETY: nothing uses host-backed test memory.
    unsafe { heap.release(40 * MIB, 8 * MIB) }.unwrap();
    assert_eq!(heap.holes(), [(40 * MIB, 8 * MIB)]);
    assert_eq!((heap.mapped(), heap.end()), (84 * MIB, 92 * MIB));
    assert_eq!(res.stats().banked, 8 * MIB);
    // A length that is not the mapping's is refused.
    // SAFETY: as above.
    assert!(unsafe { heap.release(48 * MIB, 16 * MIB) }.is_err());
    // Mapped again from the bank, no new memory.
    assert_eq!(heap.fill_hole(40 * MIB).unwrap(), 8 * MIB);
    fill_and_check(res.backend(), heap.base() + 40 * MIB as u64, 8 * MIB, 8);
    let s = res.stats();
    assert_eq!((s.created, s.reused, s.banked), (92 * MIB, 8 * MIB, 0));
    assert!(heap.holes().is_empty());
    // Whole steps again past that: one mapping.
    assert_eq!(heap.grow_at_once(160 * MIB).unwrap(), 160 * MIB);
    assert_eq!(heap.layout().mappings.last(), Some(&(92 * MIB, 68 * MIB)));
}

/// A driver that refuses to unmap: the pool's trim fails and says why;
/// the memory it could not give back stays mapped, counted and out of the
/// bank, and serves the next allocation with no growth (its pages are not
/// left fenced); once the driver allows it, the next trim gives it back.
#[test]
fn a_refused_unmap_fails_the_pools_trim_and_loses_nothing() {
    let res = reservation();
    let pool = pool_in(&res);
    let stream = HostStream::new();
    let a = pool.alloc(48 * MIB, &stream).unwrap();
    fill_and_check(res.backend(), a, 48 * MIB, 2);
    pool.free(a, &stream).unwrap();
    let (mapped, grows) = (pool.stats().reserved, pool.stats().grows);
    assert!(mapped > 32 * MIB, "{mapped} bytes mapped");
    res.backend().refuse_unmaps(true);
    let err = pool.trim(0).unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    let s = res.stats();
    assert_eq!(
        (pool.stats().reserved, s.pool_mapped, s.banked),
        (mapped, mapped, 0)
    );
    let b = pool.alloc(48 * MIB, &stream).unwrap();
    assert_eq!(pool.stats().grows, grows, "the trimmed pages serve again");
    fill_and_check(res.backend(), b, 48 * MIB, 3);
    pool.free(b, &stream).unwrap();
    res.backend().refuse_unmaps(false);
    assert_eq!(pool.trim(0).unwrap(), 32 * MIB);
    assert_eq!(res.stats().banked, mapped - 32 * MIB);
}

/// The same for a heap's range: a refused shrink or punch leaves every
/// mapping where it was, with its contents, counted and out of the bank.
#[test]
fn a_refused_unmap_leaves_a_regions_mappings_as_they_were() {
    let res = reservation();
    let heap = heap_in(&res, 1 << 30);
    heap.grow_at_once(32 * MIB).unwrap();
    heap.grow_at_once(64 * MIB).unwrap();
    fill_and_check(res.backend(), heap.base(), 64 * MIB, 4);
    let layout = heap.layout();
    res.backend().refuse_unmaps(true);
    // SAFETY: nothing uses host-backed test memory.
    assert!(unsafe { heap.shrink_to(0) }.is_err());
    // SAFETY: as above.
    assert!(unsafe { heap.punch(0) }.is_err());
    assert_eq!(heap.layout(), layout);
    assert_eq!(
        (heap.mapped(), res.stats().heap_mapped),
        (64 * MIB, 64 * MIB)
    );
    assert_eq!(res.stats().banked, 0);
    assert!(holds(res.backend(), heap.base(), 64 * MIB, 4));
    res.backend().refuse_unmaps(false);
    // SAFETY: as above.
    unsafe { heap.shrink_to(0) }.unwrap();
    assert_eq!((heap.mapped(), res.stats().banked), (0, 64 * MIB));
}

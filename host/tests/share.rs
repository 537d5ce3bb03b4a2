//! A pool's memory in another process, over [`HostBackend`]: a second
//! backend stands in for the other process and imports what the pool
//! exported. Both see the same bytes, a block over several mappings
//! included; the importer's unmap leaves the exporter's memory alone; bad
//! exports and imports are refused. No GPU needed.

use cuheap_host::{Error, Exported, HostBackend, HostStream, Imported, Pool, PoolConfig};

const MIB: usize = 1 << 20;

fn config() -> PoolConfig {
    PoolConfig {
        initial: 8 * MIB,
        chunk: 8 * MIB,
        shareable: true,
        ..PoolConfig::new(1 << 30)
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect()
}

fn read(b: &HostBackend, at: u64, len: usize) -> Vec<u8> {
    let mut got = vec![0u8; len];
    b.read(at, &mut got).unwrap();
    got
}

/// Imports `e` into a backend of its own (another process).
fn import(e: &Exported<HostBackend>) -> Imported<HostBackend> {
    Imported::map(HostBackend::new(2 * MIB, 1 << 30), e).unwrap()
}

#[test]
fn a_block_over_several_mappings_is_the_same_bytes_in_both() {
    let pool = Pool::with_backend(HostBackend::new(2 * MIB, 1 << 30), config()).unwrap();
    let s = HostStream::new();
    let small = pool.alloc(MIB, &s).unwrap();
    let large = pool.alloc(20 * MIB, &s).unwrap();
    let b = pool.backend();
    b.write(large, &pattern(20 * MIB, 1)).unwrap();

    let e = pool.export_block(large).unwrap();
    assert_eq!(e.len(), pool.size_of(large).unwrap());
    assert!(e.mappings() >= 2, "20 MiB over 8 MiB mappings");
    assert!(e.offset() + e.len() <= e.mapped());
    let there = import(&e);
    assert_eq!(there.len(), e.len());
    assert!(read(there.backend(), there.ptr(), 20 * MIB) == pattern(20 * MIB, 1));

    // Written there, read here; then the importer unmaps and the bytes stay.
    there
        .backend()
        .write(there.ptr(), &pattern(20 * MIB, 2))
        .unwrap();
    assert!(read(b, large, 20 * MIB) == pattern(20 * MIB, 2));
    drop(there);
    assert!(read(b, large, 20 * MIB) == pattern(20 * MIB, 2));

    // The small block alone: one mapping.
    b.write(small, &pattern(MIB, 3)).unwrap();
    let e = pool.export_block(small).unwrap();
    assert_eq!(e.mappings(), 1);
    let there = import(&e);
    assert!(read(there.backend(), there.ptr(), MIB) == pattern(MIB, 3));
    drop(there);
    pool.free(small, &s).unwrap();
    pool.free(large, &s).unwrap();
}

#[test]
fn the_whole_mapped_range_keeps_every_block_at_its_offset() {
    let pool = Pool::with_backend(HostBackend::new(2 * MIB, 1 << 30), config()).unwrap();
    let s = HostStream::new();
    let blocks: Vec<(u64, usize)> = [4096, 3 * MIB, 100_000, 12 * MIB]
        .iter()
        .map(|&n| (pool.alloc(n, &s).unwrap(), n))
        .collect();
    for (i, &(p, n)) in blocks.iter().enumerate() {
        pool.backend().write(p, &pattern(n, i as u8)).unwrap();
    }
    let e = pool.export_mapped().unwrap();
    assert_eq!((e.offset(), e.len()), (0, pool.stats().reserved));
    let there = import(&e);
    for (i, &(p, n)) in blocks.iter().enumerate() {
        let at = there.ptr() + (p - pool.base());
        assert!(
            read(there.backend(), at, n) == pattern(n, i as u8),
            "block {i}"
        );
    }
    for (p, _) in blocks {
        pool.free(p, &s).unwrap();
    }
}

#[test]
fn bad_exports_and_imports_are_refused() {
    // Memory that cannot be shared: refused at creation when asked for,
    // and at export otherwise.
    let plain = || HostBackend::new(2 * MIB, 1 << 30).without_sharing();
    let refused = Pool::with_backend(plain(), config());
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("shareable")),
        "{:?}",
        refused.err()
    );
    let pool = Pool::with_backend(
        plain(),
        PoolConfig {
            shareable: false,
            ..config()
        },
    )
    .unwrap();
    let s = HostStream::new();
    let p = pool.alloc(MIB, &s).unwrap();
    match pool.export_block(p) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("another process"), "{m}"),
        other => panic!("{:?}", other.map(|e| e.len())),
    }
    pool.free(p, &s).unwrap();

    // Pointers that are not live blocks.
    let pool = Pool::with_backend(HostBackend::new(2 * MIB, 1 << 30), config()).unwrap();
    let p = pool.alloc(MIB, &s).unwrap();
    let gone = pool.alloc(MIB, &s).unwrap();
    pool.free(gone, &s).unwrap();
    for bad in [gone, p + 256, 0x1234, u64::MAX] {
        match pool.export_block(bad) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("not a live block"), "{m}"),
            other => panic!("export of {bad:#x}: {:?}", other.map(|e| e.len())),
        }
    }

    // An importer whose granules do not divide the mappings.
    let e = pool.export_block(p).unwrap();
    let coarse = Imported::map(HostBackend::new(16 * MIB, 1 << 30), &e);
    assert!(
        matches!(&coarse, Err(Error::InvalidArgument(m)) if m.contains("granules")),
        "{:?}",
        coarse.err()
    );
    pool.free(p, &s).unwrap();
}

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
    // A backend that could share, in a pool not made shareable (whose
    // free memory may move): refused too.
    let unpinned = Pool::with_backend(
        HostBackend::new(2 * MIB, 1 << 30),
        PoolConfig {
            shareable: false,
            ..config()
        },
    )
    .unwrap();
    let p = unpinned.alloc(MIB, &s).unwrap();
    for e in [
        unpinned.export_block(p).err(),
        unpinned.export_mapped().err(),
    ] {
        assert!(
            matches!(&e, Some(Error::InvalidArgument(m)) if m.contains("shareable: true")),
            "{e:?}"
        );
    }
    unpinned.free(p, &s).unwrap();

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

/// A block that starts past the pool's first mappings is found at its
/// offset in the mappings shared; closing the import unmaps all it
/// mapped and gives its reservation back.
#[test]
fn a_block_in_a_later_mapping_lies_at_its_offset_and_closing_unmaps_it() {
    let pool = Pool::with_backend(HostBackend::new(2 * MIB, 1 << 30), config()).unwrap();
    let s = HostStream::new();
    let fillers: Vec<u64> = (0..3).map(|_| pool.alloc(6 * MIB, &s).unwrap()).collect();
    let block = pool.alloc(3 * MIB, &s).unwrap();
    let maps = pool.snapshot().mappings;
    let first = maps
        .iter()
        .position(|m| pool.base() + (m.offset + m.len) as u64 > block)
        .unwrap();
    assert!(first >= 1, "the block starts in mapping {first}");
    pool.backend().write(block, &pattern(3 * MIB, 9)).unwrap();
    let e = pool.export_block(block).unwrap();
    assert_eq!(
        e.offset(),
        (block - pool.base()) as usize - maps[first].offset,
        "the block's place in its first mapping"
    );
    let there = import(&e);
    assert!(read(there.backend(), there.ptr(), 3 * MIB) == pattern(3 * MIB, 9));
    let mapped = there.backend().mapped();
    assert_eq!(mapped, e.mapped());
    let b = there.close().unwrap();
    assert_eq!((b.mapped(), b.counts().unmaps), (0, e.mappings() as u64));
    assert_eq!(b.physical(), 0, "the imported memory was let go");
    for p in fillers.into_iter().chain([block]) {
        pool.free(p, &s).unwrap();
    }
}

/// An import that fails part-way (here, on a second mapping whose length
/// is wrong) leaves nothing mapped.
#[test]
fn an_import_that_fails_part_way_leaves_nothing_mapped() {
    let pool = Pool::with_backend(HostBackend::new(2 * MIB, 1 << 30), config()).unwrap();
    let s = HostStream::new();
    let a = pool.alloc(MIB, &s).unwrap();
    let b = pool.alloc(20 * MIB, &s).unwrap();
    let mut pieces = pool.export_block(a).unwrap().into_handles();
    let (len, second) = pool.export_block(b).unwrap().into_handles().pop().unwrap();
    pieces.push((len + 2 * MIB, second)); // not what was shared
    let total = pieces.iter().map(|p| p.0).sum();
    let e = Exported::from_handles(pieces, 0, total).unwrap();
    let backend = HostBackend::new(2 * MIB, 1 << 30);
    let unmaps = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = unmaps.clone();
    backend.on_unmap(move |_, _| {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    // The backend's unreserve panics if anything is still mapped.
    let err = Imported::map(backend, &e).err().unwrap();
    assert!(err.to_string().contains("import of"), "{err}");
    assert_eq!(
        unmaps.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the first mapping was unmapped again"
    );
    pool.free(a, &s).unwrap();
    pool.free(b, &s).unwrap();
}

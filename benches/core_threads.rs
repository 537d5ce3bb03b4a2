//! Host-thread throughput of `cuheap-core` (1 and 2 threads, single and
//! mixed sizes): alloc + free of a batch of 64 blocks per iteration.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cuheap::bench::workload::thread_size;
use cuheap_core::OwnedHeap;
use std::sync::Barrier;

const BATCH: usize = 64;

fn batch(heap: &OwnedHeap<u64>, slot: u32, size: u32, seed: &mut u32) {
    let h = heap.heap();
    let mut ptrs = [std::ptr::null_mut::<u8>(); BATCH];
    for p in ptrs.iter_mut() {
        *seed = seed.wrapping_add(1);
        *p = h
            .alloc(thread_size(*seed, size), slot)
            .expect("allocation failed: a failure is not work done");
    }
    for &p in ptrs.iter() {
        h.free(p, slot)
            .expect("free refused: a failure is not work done");
    }
}

fn bench(c: &mut Criterion) {
    let heap = OwnedHeap::<u64>::new(1024, 4).expect("host heap");
    let mut g = c.benchmark_group("core_alloc_free");
    g.throughput(Throughput::Elements(BATCH as u64));
    for &(size, name) in &[(16u32, "16B"), (256, "256B"), (0, "mixed")] {
        g.bench_with_input(BenchmarkId::new("1_thread", name), &size, |b, &size| {
            let mut seed = 0;
            b.iter(|| batch(&heap, 0, size, &mut seed));
        });
        g.bench_with_input(BenchmarkId::new("2_threads", name), &size, |b, &size| {
            b.iter_custom(|iters| {
                let barrier = Barrier::new(2);
                let start = std::time::Instant::now();
                std::thread::scope(|sc| {
                    for t in 0..2u32 {
                        let (heap, barrier) = (&heap, &barrier);
                        sc.spawn(move || {
                            barrier.wait();
                            let mut seed = t * 1_000_000;
                            for _ in 0..iters {
                                batch(heap, t, size, &mut seed);
                            }
                        });
                    }
                });
                start.elapsed() / 2
            });
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! [`Pool::snapshot`]: the pool's memory page by page.

use super::Pool;
use crate::backend::Backend;
use crate::snapshot::{Extent, Holder, PageRun, Snapshot, StreamHold};
use cuheap_core::page::{decode, decode_kind, Kind};
use cuheap_core::size_class::{class_size, PAGE_SIZE};
use std::collections::HashMap;
use std::sync::atomic::Ordering;

impl<B: Backend> Pool<B> {
    /// A picture of the pool's memory now: its mappings, every mapped page
    /// (free runs, size-class pages with their live and cached blocks,
    /// spans and who holds each), and what each stream caches. Taken
    /// without stopping the pool's other threads, so a snapshot taken
    /// during calls may be a moment off here and there. O(mapped pages +
    /// cached blocks). [`Snapshot::to_json`] and [`Snapshot::html`] write
    /// it out.
    pub fn snapshot(&self) -> Snapshot {
        let heap = self.heap();
        let base = self.region.base();
        // Who caches what: a block's stream, and cached blocks per page.
        let mut holder: HashMap<u64, u64> = HashMap::new();
        let mut cached_on_page: HashMap<u32, u32> = HashMap::new();
        let mut streams = Vec::new();
        for (id, sc) in self.caches.read().unwrap_or_else(|p| p.into_inner()).iter() {
            let (mut blocks, mut bytes) = (0, 0);
            let mut note = |ptr: u64| {
                blocks += 1;
                holder.insert(ptr, *id as u64);
                if let Ok(b) = heap.block_at(ptr as usize) {
                    *cached_on_page.entry(b.page).or_default() += 1;
                }
            };
            // The threads' caches of the stream, then its own.
            sc.each_local(|_, m| {
                m.blocks().for_each(&mut note);
                bytes += m.bytes;
            });
            let c = sc.lock();
            c.blocks().for_each(&mut note);
            bytes += c.bytes;
            streams.push(StreamHold {
                stream: *id as u64,
                blocks,
                bytes,
            });
        }
        streams.sort_by_key(|s| s.stream);
        let stats = self.stats();
        let layout = self.region.layout();
        let mapped = layout.mapped;
        let pages_mapped = (layout.end / PAGE_SIZE).min(heap.page_count() as usize);
        // Holes (whole free chunks moved to the end) have no pages.
        let holes: Vec<(usize, usize)> = (layout.holes.iter())
            .map(|&(at, len)| (at / PAGE_SIZE, (at + len) / PAGE_SIZE))
            .collect();
        let (descs, geo) = (heap.descs(), heap.geometry());
        let mut runs: Vec<PageRun> = Vec::new();
        let mut i = 0usize;
        while i < pages_mapped {
            if let Some(&(_, to)) = holes.iter().find(|&&(from, to)| (from..to).contains(&i)) {
                i = to;
                continue;
            }
            let d = &descs[i];
            let offset = i * PAGE_SIZE;
            let (run, len) = match decode_kind(d.kind.load(Ordering::Acquire)) {
                // A class page being retired (no longer live) is drawn
                // as free, as it is about to be.
                Kind::Class(c)
                    if (c as usize) < cuheap_core::CLASS_COUNT
                        && decode(d.avail.load(Ordering::Acquire)).live =>
                {
                    let capacity = geo.blocks_per_page(c);
                    let free = decode(d.avail.load(Ordering::Acquire)).free;
                    let used = (capacity as i64 - free.max(0)).max(0) as u32;
                    let units = geo.page_units(c);
                    // Read apart while calls run: kept consistent.
                    let live = self.live.count_page(i as u32, units).min(used);
                    let cached = cached_on_page.get(&(i as u32)).copied().unwrap_or(0);
                    let run = PageRun::Class {
                        offset,
                        pages: units,
                        block: class_size(c) as usize,
                        capacity,
                        used,
                        live,
                        cached: cached.min(used - live),
                    };
                    (run, units as usize)
                }
                Kind::SpanHead => {
                    let pages = d.span.load(Ordering::Acquire).max(1);
                    let ptr = base + offset as u64;
                    let live = heap
                        .block_at(ptr as usize)
                        .is_ok_and(|b| self.live.is_set(&heap, ptr, b.class.is_none()));
                    let holder = match (live, holder.get(&ptr)) {
                        (true, _) => Holder::Live,
                        (false, Some(&stream)) => Holder::Cached { stream },
                        (false, None) => Holder::Returning,
                    };
                    let run = PageRun::Span {
                        offset,
                        pages,
                        holder,
                    };
                    (run, pages as usize)
                }
                // Free, and (in a snapshot taken during a change) a tail
                // or a class page being made: drawn as free.
                _ => {
                    match runs.last_mut() {
                        Some(PageRun::Free { offset: at, pages })
                            if *at + *pages as usize * PAGE_SIZE == offset =>
                        {
                            *pages += 1
                        }
                        _ => runs.push(PageRun::Free { offset, pages: 1 }),
                    }
                    i += 1;
                    continue;
                }
            };
            runs.push(run);
            i += len.max(1);
        }
        Snapshot {
            device: self.backend().device(),
            base,
            page_size: PAGE_SIZE,
            reserved: self.region.reserved(),
            mapped,
            mappings: (layout.mappings.into_iter())
                .map(|(offset, len)| Extent { offset, len })
                .collect(),
            holes: (layout.holes.into_iter())
                .map(|(offset, len)| Extent { offset, len })
                .collect(),
            pages: runs,
            streams,
            in_use: stats.in_use,
            cached: stats.cached_per_stream.iter().map(|c| c.1).sum(),
            retired: stats.retired,
            peak_in_use: stats.peak_in_use,
        }
    }
}

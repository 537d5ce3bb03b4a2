//! Statistics. The hot paths update nothing shared: in-use figures are
//! read off the page descriptors (a scan), and only rare events (failures,
//! bad frees, page turnover) are counted in [`Counters`].

use crate::page::{decode, decode_kind, Kind, PageDesc};
use crate::size_class::{blocks_per_page, class_size, page_units, CLASS_COUNT, PAGE_SIZE};
use crate::sync::{AtomicU64, Ordering};

/// Event counters kept in the heap's metadata.
#[repr(C)]
pub struct Counters {
    /// Allocations (and reallocs) that returned null / an error (size 0,
    /// too large, a bad alignment, out of memory).
    pub failed_allocs: AtomicU64,
    /// Frees (and reallocs) of pointers that were not live blocks: foreign,
    /// interior, already free (double frees), or into a free page.
    pub bad_frees: AtomicU64,
    pub pages_activated: AtomicU64,
    pub pages_retired: AtomicU64,
    pub spans_allocated: AtomicU64,
    pub spans_freed: AtomicU64,
    /// Pages the heap may use, counted from the start (0: all of them). A
    /// pool raises it as it maps memory behind more of a reserved range.
    pub page_limit: AtomicU64,
    /// The page limit before the host's last growth step (0: none): the
    /// pages from it to `page_limit` are the new ones, where a heap that
    /// grows while kernels run looks for fresh pages first.
    pub grow_floor: AtomicU64,
    /// Bytes asked for by allocations that failed for want of memory (not
    /// size 0, not larger than the whole heap): the shortfall a growable
    /// heap grows by.
    pub failed_bytes: AtomicU64,
    /// Growth while kernels run (see [`GrowHost`](crate::heap::GrowHost)):
    /// the device address of the host's doorbell word; 0 while no host
    /// serves the heap.
    pub grow_bell: AtomicU64,
    /// The page limit that threads which found the heap short asked for
    /// (the largest ask). The host lowers it to the limit when it refuses.
    pub grow_want: AtomicU64,
    /// The largest ask rung on the doorbell so far: an ask above it still
    /// has to be rung.
    pub grow_rung: AtomicU64,
    /// Requests rung on the doorbell (the tickets handed out).
    pub grow_requests: AtomicU64,
    /// Times the host could not grow at all (written by the host).
    pub grow_refusals: AtomicU64,
    /// The page limit growth may still reach (0: the whole heap). A host
    /// that refuses sets it to the limit, so threads stop asking until the
    /// host grows the heap again and clears it.
    pub grow_cap: AtomicU64,
    /// Waits for growth that ended in the timeout (the host did not answer).
    pub grow_timeouts: AtomicU64,
    /// Times a thread (or a warp's group, as one) waited for growth.
    pub grow_waits: AtomicU64,
    /// How fresh pages are placed: [`Placement`](crate::heap::Placement)
    /// bits, set by the heap's owner (0, the default: first fit from each
    /// slot's own part of the heap, what thousands of GPU threads need).
    pub placement: AtomicU64,
}

impl Counters {
    pub fn new() -> Self {
        Self {
            failed_allocs: AtomicU64::new(0),
            bad_frees: AtomicU64::new(0),
            pages_activated: AtomicU64::new(0),
            pages_retired: AtomicU64::new(0),
            spans_allocated: AtomicU64::new(0),
            spans_freed: AtomicU64::new(0),
            page_limit: AtomicU64::new(0),
            grow_floor: AtomicU64::new(0),
            failed_bytes: AtomicU64::new(0),
            grow_bell: AtomicU64::new(0),
            grow_want: AtomicU64::new(0),
            grow_rung: AtomicU64::new(0),
            grow_requests: AtomicU64::new(0),
            grow_refusals: AtomicU64::new(0),
            grow_cap: AtomicU64::new(0),
            grow_timeouts: AtomicU64::new(0),
            grow_waits: AtomicU64::new(0),
            placement: AtomicU64::new(0),
        }
    }

    #[inline(always)]
    pub fn bump(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

impl Default for Counters {
    fn default() -> Self {
        Self::new()
    }
}

/// The statistics of the C API (`cuheap_stats_t` in `include/cuheap.h`):
/// what the device's `cuheap_get_stats` and the host's
/// `cuheap_device_heap_get_stats` fill, all `unsigned long long`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CStats {
    /// Bytes of the blocks handed out and not freed.
    pub bytes_in_use: u64,
    /// Bytes of the pages the heap has taken (its footprint).
    pub bytes_reserved: u64,
    /// Blocks handed out and not freed (spans included).
    pub blocks_in_use: u64,
    /// Allocations that returned null.
    pub failed_allocs: u64,
    /// Their bytes, for those that failed for want of memory.
    pub failed_bytes: u64,
    /// Double, interior and foreign frees refused.
    pub bad_frees: u64,
}

impl From<&Stats> for CStats {
    fn from(s: &Stats) -> CStats {
        CStats {
            bytes_in_use: s.bytes_in_use,
            bytes_reserved: s.bytes_reserved,
            blocks_in_use: s.blocks(),
            failed_allocs: s.failed_allocs,
            failed_bytes: s.failed_bytes,
            bad_frees: s.bad_frees,
        }
    }
}

/// A snapshot of a heap's use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    /// Blocks handed out (or reserved for a caller) per class.
    pub blocks_in_use: [u64; CLASS_COUNT],
    /// Pages serving each class.
    pub class_pages: [u64; CLASS_COUNT],
    /// 64 KiB units those pages cover.
    pub class_units: u64,
    /// Bytes of blocks handed out, by block size, plus span bytes.
    pub bytes_in_use: u64,
    /// Bytes of pages taken from the page map (class pages, cached empty
    /// ones included, and spans): the footprint.
    pub bytes_reserved: u64,
    /// Bytes of pages that hold at least one live block, plus spans.
    pub bytes_in_live_pages: u64,
    pub spans: u64,
    pub span_pages: u64,
    pub free_pages: u64,
    pub page_count: u64,
    pub failed_allocs: u64,
    /// Bytes of the allocations that failed for want of memory.
    pub failed_bytes: u64,
    pub bad_frees: u64,
    pub pages_activated: u64,
    pub pages_retired: u64,
    /// Requests for growth that threads of running kernels sent the host.
    pub grow_requests: u64,
    /// Requests the host could not serve at all.
    pub grow_refusals: u64,
    /// Waits for growth that timed out.
    pub grow_timeouts: u64,
    /// Times a thread, or a warp's group as one, waited for growth.
    pub grow_waits: u64,
}

impl Stats {
    /// Reads the statistics off descriptors and counters (a copy is fine:
    /// the host reads a device heap's metadata this way).
    pub fn collect(descs: &[PageDesc], counters: &Counters) -> Stats {
        let mut s = Stats {
            blocks_in_use: [0; CLASS_COUNT],
            class_pages: [0; CLASS_COUNT],
            class_units: 0,
            bytes_in_use: 0,
            bytes_reserved: 0,
            bytes_in_live_pages: 0,
            spans: 0,
            span_pages: 0,
            free_pages: 0,
            page_count: descs.len() as u64,
            failed_allocs: counters.failed_allocs.load(Ordering::Relaxed),
            failed_bytes: counters.failed_bytes.load(Ordering::Relaxed),
            bad_frees: counters.bad_frees.load(Ordering::Relaxed),
            pages_activated: counters.pages_activated.load(Ordering::Relaxed),
            pages_retired: counters.pages_retired.load(Ordering::Relaxed),
            grow_requests: counters.grow_requests.load(Ordering::Relaxed),
            grow_refusals: counters.grow_refusals.load(Ordering::Relaxed),
            grow_timeouts: counters.grow_timeouts.load(Ordering::Relaxed),
            grow_waits: counters.grow_waits.load(Ordering::Relaxed),
        };
        for d in descs {
            match decode_kind(d.kind.load(Ordering::Relaxed)) {
                Kind::Free => s.free_pages += 1,
                Kind::Class(c) if (c as usize) < CLASS_COUNT => {
                    let free = decode(d.avail.load(Ordering::Relaxed)).free;
                    let used = (blocks_per_page(c) as i64 - free.max(0)).max(0) as u64;
                    s.blocks_in_use[c as usize] += used;
                    s.class_pages[c as usize] += 1;
                    s.class_units += page_units(c) as u64;
                    s.bytes_in_use += used * class_size(c) as u64;
                    if used > 0 {
                        s.bytes_in_live_pages += page_units(c) as u64 * PAGE_SIZE as u64;
                    }
                }
                Kind::Class(_) => {}
                Kind::SpanHead => {
                    let n = d.span.load(Ordering::Relaxed) as u64;
                    s.spans += 1;
                    s.span_pages += n;
                    s.bytes_in_use += n * PAGE_SIZE as u64;
                    s.bytes_in_live_pages += n * PAGE_SIZE as u64;
                }
                Kind::SpanTail | Kind::ClassTail => {}
            }
        }
        s.bytes_reserved = (s.class_units + s.span_pages) * PAGE_SIZE as u64;
        s
    }

    /// Blocks in use over all classes.
    pub fn blocks(&self) -> u64 {
        self.blocks_in_use.iter().sum()
    }

    /// True when nothing is allocated: every block and span returned.
    pub fn is_empty(&self) -> bool {
        self.blocks() == 0 && self.spans == 0
    }
}

//! Statistics, two ways:
//!
//! - [`Counts`], from counters alone: allocations and frees ever (each
//!   slot counts its own on lines of its own, [`Tallies`], one relaxed
//!   add per warp and call), failures by cause, spans, and the
//!   bytes of pages taken now and at the peak (counted where pages change
//!   hands, which is rare). Reading them copies a few kilobytes;
//! - [`Stats`], from a scan of every page's descriptor: bytes and blocks
//!   in use per class, pages per class, free pages.

use crate::page::{decode, decode_kind, Kind, PageDesc};
use crate::size_class::{class_size, Geometry, CLASS_COUNT, PAGE_SIZE};
use crate::sync::{add_relaxed, AtomicU64, Ordering};

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
    /// One more than the page limit at which a wait for growth timed out
    /// (0: none): the host is held up, and threads that would wait at
    /// that limit give up at once instead of each waiting out the
    /// timeout. A higher limit ends it; the host clears it where it can
    /// bring the limit back down (a trim between launches) and on reset.
    pub grow_stalled: AtomicU64,
    /// How fresh pages are placed: [`Placement`](crate::heap::Placement)
    /// bits, set by the heap's owner (0, the default: first fit from each
    /// slot's own part of the heap, what thousands of GPU threads need).
    pub placement: AtomicU64,
    /// Failed allocations by cause (their sum is `failed_allocs`): size 0,
    /// larger than the whole heap, a bad alignment, out of memory.
    pub zero_size: AtomicU64,
    pub too_large: AtomicU64,
    pub bad_alignment: AtomicU64,
    pub out_of_memory: AtomicU64,
    /// 64 KiB units taken from the page map now (class pages and spans)
    /// and at most so far: the footprint and its peak.
    pub units_taken: AtomicU64,
    pub units_peak: AtomicU64,
    /// Pages of the spans in use.
    pub span_pages: AtomicU64,
    /// Frees of class blocks that were already free (double frees, also
    /// in `bad_frees`): the slots' tallies count every free of a class
    /// block's address as it is made, before the bitmap says whether the
    /// block was live, so a warp counts with no wait.
    pub double_frees: AtomicU64,
    /// Passes of the last-resort scan, past its first short ones, that
    /// yielded the CPU while pages were in transit (free blocks of the
    /// class between owners, pages between activation or retirement and
    /// the next step, releases not ended; on a host with `std` only: see
    /// `TRANSIT_WAIT` in the heap's allocation path).
    pub transit_waits: AtomicU64,
    /// Page releases begun ([`pages_retired`](Self::pages_retired) counts
    /// those that ended): a last-resort scan, or on a host a span's search
    /// of a heap without an index, that reads more begun than ended waits
    /// for the units on their way back to the page map. On a host counted
    /// before the retiring CAS (and taken back if it fails), in a kernel
    /// after it.
    pub releases_begun: AtomicU64,
    /// Class-page activations begun, counted before the claim of their
    /// units in the page map ([`pages_activated`](Self::pages_activated)
    /// counts those that ended; a claim that loses its units takes its
    /// count back): a last-resort scan that reads more begun than ended
    /// waits for the page to show its class. On a heap without an index
    /// of free runs, span claims count here too while they take their
    /// pages (taken back once they hold them or gave them back). On a
    /// host only: a kernel's heap leaves it at 0.
    pub activations_begun: AtomicU64,
    /// Claims counted in [`activations_begun`](Self::activations_begun)
    /// that collided with another claim after they took some units, and
    /// gave those back (counted before their begun count is taken back):
    /// a search that found the units taken searches again once it reads
    /// this count moved. On a host only.
    pub claims_given_back: AtomicU64,
}

impl Counters {
    /// The heap's class-page geometry, from its placement bits
    /// ([`Placement::SMALL_CLASS_PAGES`](crate::heap::Placement::SMALL_CLASS_PAGES)).
    /// On the GPU always the standard one, a constant.
    #[inline(always)]
    pub fn geometry(&self) -> Geometry {
        #[cfg(target_arch = "nvptx64")]
        {
            Geometry::STANDARD
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            let bits = self.placement.load(Ordering::Relaxed);
            if bits & crate::heap::Placement::SMALL_CLASS_PAGES != 0 {
                Geometry::SMALL
            } else {
                Geometry::STANDARD
            }
        }
    }

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
            grow_stalled: AtomicU64::new(0),
            placement: AtomicU64::new(0),
            zero_size: AtomicU64::new(0),
            too_large: AtomicU64::new(0),
            bad_alignment: AtomicU64::new(0),
            out_of_memory: AtomicU64::new(0),
            units_taken: AtomicU64::new(0),
            units_peak: AtomicU64::new(0),
            span_pages: AtomicU64::new(0),
            double_frees: AtomicU64::new(0),
            transit_waits: AtomicU64::new(0),
            releases_begun: AtomicU64::new(0),
            activations_begun: AtomicU64::new(0),
            claims_given_back: AtomicU64::new(0),
        }
    }

    #[inline(always)]
    pub fn bump(c: &AtomicU64, n: u64) {
        add_relaxed(c, n);
    }

    /// Counts `units` units taken from the page map, and the peak. Called
    /// before the page is published, so a release of it, in any thread,
    /// is counted after.
    ///
    /// Out of line, as the other rare counts: inlined, they grow the
    /// out-of-line allocation paths, and with them the registers that
    /// GPU allocation kernels spill around their calls.
    #[inline(never)]
    pub fn take_units(&self, units: u64) {
        let now = self.units_taken.fetch_add(units, Ordering::Relaxed) + units;
        if now > self.units_peak.load(Ordering::Relaxed) {
            self.units_peak.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// Counts `units` units given back to the page map.
    #[inline(never)]
    pub fn give_units(&self, units: u64) {
        self.units_taken.fetch_sub(units, Ordering::Relaxed);
    }

    /// Counts a claim (`claim`) or release of `units` page-map units of
    /// kind `what` with atomics: on a heap without an index of free runs
    /// (every kernel's heap), where claims and releases take no lock.
    /// Called before a claim's pages are published and before released
    /// pages return to the page map.
    #[inline(always)]
    pub fn tally(&self, what: Tally, units: u32, claim: bool) {
        let n = units as u64;
        if claim {
            self.take_units(n);
        }
        if what != Tally::ClassPage {
            match claim {
                true => self.span_pages.fetch_add(n, Ordering::Relaxed),
                false => self.span_pages.fetch_sub(n, Ordering::Relaxed),
            };
        }
        if !claim {
            self.give_units(n);
        }
        if what == Tally::Span {
            match claim {
                true => Self::bump(&self.spans_allocated, 1),
                false => Self::bump(&self.spans_freed, 1),
            }
        }
    }

    /// [`Counters::tally`] under an indexed page map's lock (see
    /// [`PageMap::tallying`](crate::page_map::PageMap::tallying)). On a
    /// heap with an index every change of these counters is made there,
    /// one holder at a time, so a load and a store make each change
    /// without a locked instruction (on x86 a full barrier, which also
    /// waits for the stores before it: the descriptors just written).
    /// Readers see each count change once, as before. The arithmetic
    /// wraps, as the atomics' does.
    pub fn tally_locked(&self, what: Tally, units: u32, claim: bool) {
        let change = |c: &AtomicU64, n: u64| {
            let v = c.load(Ordering::Relaxed);
            let now = match claim {
                true => v.wrapping_add(n),
                false => v.wrapping_sub(n),
            };
            c.store(now, Ordering::Relaxed);
            now
        };
        let taken = change(&self.units_taken, units as u64);
        if claim && taken > self.units_peak.load(Ordering::Relaxed) {
            self.units_peak.store(taken, Ordering::Relaxed);
        }
        if what != Tally::ClassPage {
            change(&self.span_pages, units as u64);
        }
        if what == Tally::Span {
            let spans = match claim {
                true => &self.spans_allocated,
                false => &self.spans_freed,
            };
            let n = spans.load(Ordering::Relaxed);
            spans.store(n.wrapping_add(1), Ordering::Relaxed);
        }
    }
}

/// What a claim or a release of page-map units is, for the counts an
/// indexed page map keeps under its lock ([`Counters::tally_locked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tally {
    /// A class page's units: the footprint.
    ClassPage,
    /// A whole span: the footprint, the span pages and one span allocated
    /// or freed.
    Span,
    /// The pages a span grows or shrinks by in place: the footprint and
    /// the span pages.
    SpanPart,
}

/// Bytes of one slot's tally line.
pub const TALLY_LINE: usize = 128;

/// The slots' counts of class blocks allocated and freed. Each slot has
/// [`Tallies::WAYS`] counters of each, each alone on its 128-byte line,
/// so the slots (a GPU's SMs) never share a line, and the warps of one
/// SM spread over several (adds to one address queue one behind the
/// other). They sit right after the [`Counters`] in the metadata (see
/// [`Layout`](crate::Layout)).
#[derive(Clone, Copy)]
pub struct Tallies<'a> {
    lines: &'a [AtomicU64],
}

/// `u64` words per tally line.
const TALLY_WORDS: usize = TALLY_LINE / 8;

/// Allocations, frees: the two kinds of tally.
const ALLOCATED: usize = 0;
const FREED: usize = 1;

impl<'a> Tallies<'a> {
    /// Counters of each kind per slot (a power of two).
    pub const WAYS: u32 = 8;

    /// Words of the tallies of `slots` slots.
    pub const fn words(slots: u32) -> usize {
        slots as usize * 2 * Self::WAYS as usize * TALLY_WORDS
    }

    /// The tallies over `words` ([`Tallies::words`] long).
    pub fn new(words: &'a [AtomicU64]) -> Tallies<'a> {
        Tallies { lines: words }
    }

    #[inline(always)]
    fn at(&self, slot: u32, kind: usize, way: u32) -> &'a AtomicU64 {
        let line =
            (slot as usize * 2 + kind) * Self::WAYS as usize + (way & (Self::WAYS - 1)) as usize;
        &self.lines[line * TALLY_WORDS]
    }

    /// Counts `n` class blocks allocated by slot `slot` (< the slots), on
    /// its counter `way` (any value; a GPU passes the warp's id).
    #[inline(always)]
    pub fn allocated(&self, slot: u32, way: u32, n: u32) {
        add_relaxed(self.at(slot, ALLOCATED, way), n as u64);
    }

    /// Counts `n` frees of class blocks by slot `slot`, as
    /// [`Tallies::allocated`] (double frees included: see
    /// [`Counters::double_frees`]).
    #[inline(always)]
    pub fn freed(&self, slot: u32, way: u32, n: u32) {
        add_relaxed(self.at(slot, FREED, way), n as u64);
    }

    /// Sums of every slot's allocations and frees.
    pub fn sums(&self) -> (u64, u64) {
        let per_slot = 2 * Self::WAYS as usize * TALLY_WORDS;
        let slots = (self.lines.len() / per_slot) as u32;
        let sum = |kind| {
            (0..slots)
                .flat_map(|s| (0..Self::WAYS).map(move |w| (s, w)))
                .map(|(s, w)| self.at(s, kind, w).load(Ordering::Relaxed))
                .sum::<u64>()
        };
        (sum(ALLOCATED), sum(FREED))
    }
}

/// A heap's counts, read from its counters without a scan of the page
/// table (see [`Heap::counts`](crate::Heap::counts)). `#[repr(C)]`: the
/// C API's `cuheap_counts_t`. Counts that several threads change are
/// exact once they are done (between kernels); read while kernels run,
/// each is a recent value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Blocks and spans handed out, ever (a realloc that moves a block
    /// counts as an allocation and a free; one that stays counts nothing).
    pub allocs: u64,
    /// Blocks and spans freed, ever.
    pub frees: u64,
    /// Spans (allocations over the largest class) handed out and freed,
    /// ever, and the bytes of those in use.
    pub spans_allocated: u64,
    pub spans_freed: u64,
    pub span_bytes: u64,
    /// Bytes of the pages the heap has taken (class pages and spans), now
    /// and at most so far.
    pub bytes_reserved: u64,
    pub peak_bytes_reserved: u64,
    /// Allocations that returned null, and by cause: size 0, larger than
    /// the whole heap, a bad alignment, out of memory (whose bytes are
    /// `failed_bytes`).
    pub failed_allocs: u64,
    pub zero_size: u64,
    pub too_large: u64,
    pub bad_alignment: u64,
    pub out_of_memory: u64,
    pub failed_bytes: u64,
    /// Frees (and reallocs) of pointers that were not live blocks.
    pub bad_frees: u64,
    pub pages_activated: u64,
    pub pages_retired: u64,
    /// Growth while kernels run: requests sent to the host, requests it
    /// could not serve, waits that timed out, and waits.
    pub grow_requests: u64,
    pub grow_refusals: u64,
    pub grow_timeouts: u64,
    pub grow_waits: u64,
}

impl Counts {
    /// The counts of `counters` and the slots' `tallies`.
    pub fn collect(counters: &Counters, tallies: Tallies<'_>) -> Counts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (blocks_allocated, blocks_freed) = tallies.sums();
        let c = counters;
        Counts {
            allocs: blocks_allocated + get(&c.spans_allocated),
            frees: (blocks_freed + get(&c.spans_freed)).saturating_sub(get(&c.double_frees)),
            spans_allocated: get(&c.spans_allocated),
            spans_freed: get(&c.spans_freed),
            span_bytes: get(&c.span_pages) * PAGE_SIZE as u64,
            bytes_reserved: get(&c.units_taken) * PAGE_SIZE as u64,
            peak_bytes_reserved: get(&c.units_peak) * PAGE_SIZE as u64,
            failed_allocs: get(&c.failed_allocs),
            zero_size: get(&c.zero_size),
            too_large: get(&c.too_large),
            bad_alignment: get(&c.bad_alignment),
            out_of_memory: get(&c.out_of_memory),
            failed_bytes: get(&c.failed_bytes),
            bad_frees: get(&c.bad_frees),
            pages_activated: get(&c.pages_activated),
            pages_retired: get(&c.pages_retired),
            grow_requests: get(&c.grow_requests),
            grow_refusals: get(&c.grow_refusals),
            grow_timeouts: get(&c.grow_timeouts),
            grow_waits: get(&c.grow_waits),
        }
    }

    /// Blocks and spans handed out and not freed.
    pub fn in_use(&self) -> u64 {
        self.allocs.saturating_sub(self.frees)
    }

    /// Spans handed out and not freed.
    pub fn spans_in_use(&self) -> u64 {
        self.spans_allocated.saturating_sub(self.spans_freed)
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
        let k = Counts::collect(counters, Tallies::new(&[]));
        let geo = counters.geometry();
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
            failed_allocs: k.failed_allocs,
            failed_bytes: k.failed_bytes,
            bad_frees: k.bad_frees,
            pages_activated: k.pages_activated,
            pages_retired: k.pages_retired,
            grow_requests: k.grow_requests,
            grow_refusals: k.grow_refusals,
            grow_timeouts: k.grow_timeouts,
            grow_waits: k.grow_waits,
        };
        for d in descs {
            match decode_kind(d.kind.load(Ordering::Relaxed)) {
                Kind::Free => s.free_pages += 1,
                Kind::Class(c) if (c as usize) < CLASS_COUNT => {
                    let a = decode(d.avail.load(Ordering::Relaxed));
                    if !a.live {
                        // Being retired or activated (its kind and count
                        // change apart): in transit, neither free nor
                        // holding blocks.
                        continue;
                    }
                    let free = a.free;
                    let used = (geo.blocks_per_page(c) as i64 - free.max(0)).max(0) as u64;
                    s.blocks_in_use[c as usize] += used;
                    s.class_pages[c as usize] += 1;
                    s.class_units += geo.page_units(c) as u64;
                    s.bytes_in_use += used * class_size(c) as u64;
                    if used > 0 {
                        s.bytes_in_live_pages += geo.page_units(c) as u64 * PAGE_SIZE as u64;
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A page whose kind still names a class while its count reads as
    /// retired (a retire or an activation under way) holds no blocks: the
    /// scan counted all of its blocks as in use.
    #[test]
    fn a_class_page_in_transit_holds_no_blocks() {
        let descs = [PageDesc::new(), PageDesc::new()];
        let cap = Geometry::STANDARD.blocks_per_page(0);
        descs[0].activate(0, cap);
        descs[0].take(3);
        descs[1].kind.store(1, Ordering::Relaxed); // class 0, count 0
        let s = Stats::collect(&descs, &Counters::new());
        assert_eq!(s.blocks_in_use[0], 3);
        assert_eq!(s.class_pages[0], 1);
        assert_eq!(s.bytes_in_use, 3 * class_size(0) as u64);
    }
}

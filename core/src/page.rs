//! One page's descriptor and the counter protocol that lets a whole warp
//! reserve blocks with a single `fetch_sub`.
//!
//! `avail` (64-bit) packs three things, all changed only by atomic
//! read-modify-writes, so every decision is made on the value one RMW
//! returned and no fences are needed:
//!
//! `avail = CLASS * (class + 1) + FLOAT * floating + LIVE * live + f`
//!
//! - `class`: the class a live page serves (0 on a retired page), so the
//!   read-modify-write that reserves blocks also says which class they are,
//!   with no load of `kind` after it.
//! - `f`: free blocks nobody has reserved. It may dip below zero while
//!   reservers that asked for too much add the excess back.
//! - `live`: the page serves a class (0 = retired, so zeroed memory holds
//!   retired pages).
//! - `floating`: no slot and no list holds the page; whoever next sees it
//!   floating with at least a quarter free lists it (`fetch_and` clears the
//!   flag: one winner), and with everything free retires it (CAS to 0).
//!
//! Invariant: `f + (blocks reserved, not yet claimed) <= set bits in the
//! bitmap`, so a reservation can always be claimed. The `state` field only
//! records where the page is for checks and statistics; it synchronises
//! nothing.

use crate::sync::{spin_hint, AtomicU32, AtomicU64, Ordering};

/// Live bias of `avail`.
pub const LIVE: u64 = 1 << 24;
/// Floating flag of `avail`.
pub const FLOAT: u64 = 1 << 40;
/// Unit of the class field of `avail` (its top 16 bits).
pub const CLASS: u64 = 1 << 48;

/// A decoded `avail` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avail {
    pub floating: bool,
    pub live: bool,
    pub free: i64,
    /// The class the page serves plus one; 0 unless `live`.
    pub class: u32,
}

/// Decodes `avail`; transients stay far inside each field's range. The
/// low 48 bits are a signed sum (`f` may dip below zero, and reservers
/// may take from a retired page, whose `avail` is 0, before they give it
/// back); on a live page that sum is positive, so the class field above
/// it is exact.
#[inline(always)]
pub const fn decode(v: u64) -> Avail {
    let low = ((v << 16) as i64) >> 16;
    let floating = low >= (FLOAT / 2) as i64;
    let r = if floating { low - FLOAT as i64 } else { low };
    let live = r >= (LIVE / 2) as i64;
    Avail {
        floating,
        live,
        free: if live { r - LIVE as i64 } else { r },
        class: if live { (v / CLASS) as u32 } else { 0 },
    }
}

pub const KIND_FREE: u32 = 0;
pub const KIND_SPAN_HEAD: u32 = 0xFFFF_0001;
pub const KIND_SPAN_TAIL: u32 = 0xFFFF_0002;
/// A later unit of a multi-unit class page; `span` holds the distance to
/// its head.
pub const KIND_CLASS_TAIL: u32 = 0xFFFF_0003;

pub const STATE_NONE: u32 = 0;
pub const STATE_ATTACHED: u32 = 1;
pub const STATE_FLOATING: u32 = 2;
pub const STATE_LISTED: u32 = 3;

/// What a page is used for, decoded from `kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Free,
    Class(u32),
    SpanHead,
    SpanTail,
    ClassTail,
}

/// Per-page metadata, 32 bytes, `#[repr(C)]` so host and device agree.
#[repr(C)]
pub struct PageDesc {
    /// See the module documentation.
    pub avail: AtomicU64,
    /// `KIND_FREE`, `class + 1` (a class page's first unit), `KIND_CLASS_TAIL`,
    /// `KIND_SPAN_HEAD` or `KIND_SPAN_TAIL`.
    pub kind: AtomicU32,
    /// One of the `STATE_*` values (class pages only; informational).
    pub state: AtomicU32,
    /// Link in a [`PageList`](crate::page_list::PageList), `index + 1`.
    pub next: AtomicU32,
    /// Units in the span (span heads), distance to the head (class tails).
    pub span: AtomicU32,
    /// The heap's owner's word: the heap never reads or writes it, and it
    /// is 0 in zeroed metadata. A host pool marks here which spans a caller
    /// holds (1 on a span's head page), so a free checks the line it
    /// already read to find the block instead of another.
    pub owner: AtomicU32,
    pad: u32,
}

// Host and device agree on the layout (`Layout` sizes the table by it).
// Loom's atomics are larger than the real ones.
#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<PageDesc>() == 32);

impl PageDesc {
    /// A retired, free page (what zeroed memory holds).
    pub fn new() -> Self {
        Self {
            avail: AtomicU64::new(0),
            kind: AtomicU32::new(KIND_FREE),
            state: AtomicU32::new(STATE_NONE),
            next: AtomicU32::new(0),
            span: AtomicU32::new(0),
            owner: AtomicU32::new(0),
            pad: 0,
        }
    }

    #[inline(always)]
    pub fn kind(&self) -> Kind {
        decode_kind(self.kind.load(Ordering::Acquire))
    }

    /// Takes `want` from the free count; returns the value before. The
    /// caller keeps `min(want, free)` if the page was live with `free > 0`
    /// and must give the rest back (through the heap, which settles it).
    ///
    /// Acquire, not AcqRel: it must see what the activation published
    /// (the kind and the filled bitmap, released by [`PageDesc::activate`]),
    /// but a reserver publishes nothing through it. On a GPU a release is a
    /// fence before the atomic (`MEMBAR.GPU` on sm_90), and this is the
    /// allocation's hot path.
    #[inline(always)]
    pub fn take(&self, want: u32) -> Avail {
        decode(self.avail.fetch_sub(want as u64, Ordering::Acquire))
    }

    /// Adds `n` free blocks; returns the value after.
    ///
    /// Release, not AcqRel: it publishes the freer's bitmap release (and
    /// the block's last writes before it) to whoever retires the page, so
    /// no late bitmap write lands on a page that has been reused; the
    /// freer reads nothing through it (settling a floating page acquires
    /// with its own read-modify-writes). On a GPU an acquire invalidates
    /// the SM's L1 after the atomic (`CCTL.IVALL` on sm_90), and this is
    /// the free's hot path.
    #[inline(always)]
    pub fn add(&self, n: u32) -> Avail {
        decode(
            self.avail
                .fetch_add(n as u64, Ordering::Release)
                .wrapping_add(n as u64),
        )
    }

    /// Marks the page floating; returns the value at that moment.
    pub fn float(&self) -> Avail {
        self.state.store(STATE_FLOATING, Ordering::Relaxed);
        decode(self.avail.fetch_or(FLOAT, Ordering::AcqRel) | FLOAT)
    }

    /// Clears the floating flag. For the one caller that cleared it, the
    /// class the page serves at that moment, which is the list to put it
    /// on; `None` for everyone else.
    ///
    /// The caller read the page's class (from an RMW or `kind`) a moment
    /// before, and meanwhile the page may have been retired, reactivated
    /// for another class and floated again: the class comes from the value
    /// this RMW cleared the flag on, never from the caller. On a retired
    /// page that a stale reserver's `fetch_sub` has taken below zero, bit
    /// 40 is part of that negative sum, not the flag: clearing it took
    /// `FLOAT` off the sum, and the add puts it back (adds commute with the
    /// reserver's, so the page is retired again once both are done; an
    /// activation in between waits for the add, see
    /// [`PageDesc::activate`]).
    ///
    /// One `fetch_and` in the common case, as before the class was checked:
    /// a compare-exchange loop in its place made the allocation kernels
    /// 1.4x-1.8x slower from 256 B up on an H100 80 GB (the assembler
    /// inlines this path into them, `docs/ab-unfloat-h100.txt`).
    pub fn unfloat(&self) -> Option<u32> {
        let raw = self.avail.fetch_and(!FLOAT, Ordering::AcqRel);
        if raw & FLOAT == 0 {
            return None; // someone else cleared it (or it was never set)
        }
        let a = decode(raw);
        if a.floating && a.live {
            return Some(a.class - 1);
        }
        self.avail.fetch_add(FLOAT, Ordering::Relaxed);
        None
    }

    /// Makes a retired page live with `cap` free blocks of `class`. The
    /// caller owns the page (claimed it from the page map) and has filled
    /// the bitmap; the `Release` publishes both.
    ///
    /// A settler's [`PageDesc::unfloat`] may have just cleared bit 40 of
    /// this page's count while it was retired and a stale reserver had
    /// taken it below zero; until that settler adds the bit back (its next
    /// atomic), the count reads as retired. Activation waits for it, so
    /// no installer acts on a page that reads as retired (it would detach
    /// it, and once the bit came back the page would be live with no slot
    /// and no list to find it).
    pub fn activate(&self, class: u32, cap: u32) {
        self.kind.store(class + 1, Ordering::Relaxed);
        self.state.store(STATE_ATTACHED, Ordering::Relaxed);
        let add = all_free(class, cap);
        let now = self
            .avail
            .fetch_add(add, Ordering::Release)
            .wrapping_add(add);
        if !decode(now).live {
            while !self.now().live {
                spin_hint();
            }
        }
    }

    /// Retires a page of `class` whose `cap` blocks are all free and
    /// unreserved, and whose floating flag is `floating`; fails if anything
    /// differs.
    pub fn try_retire(&self, class: u32, cap: u32, floating: bool) -> bool {
        self.avail
            .compare_exchange(
                retirable_at(class, cap, floating),
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Whether [`PageDesc::try_retire`] would retire the page now, read
    /// with a load: a caller that pays for every attempt (a count made
    /// before the CAS) tries only pages that read as retirable.
    pub fn retirable(&self, class: u32, cap: u32, floating: bool) -> bool {
        self.avail.load(Ordering::Relaxed) == retirable_at(class, cap, floating)
    }

    /// The current value (checks and statistics).
    pub fn now(&self) -> Avail {
        decode(self.avail.load(Ordering::Acquire))
    }
}

impl Default for PageDesc {
    fn default() -> Self {
        Self::new()
    }
}

/// `avail` of a live, unfloated page of `class` whose `cap` blocks are all
/// free and unreserved: what activation adds to a retired page's 0, and
/// what retiring expects to find.
#[inline(always)]
const fn all_free(class: u32, cap: u32) -> u64 {
    CLASS * (class as u64 + 1) + LIVE + cap as u64
}

/// `avail` of a page that retiring takes: [`all_free`], floating or not.
#[inline(always)]
const fn retirable_at(class: u32, cap: u32, floating: bool) -> u64 {
    all_free(class, cap) + if floating { FLOAT } else { 0 }
}

#[inline(always)]
pub const fn decode_kind(k: u32) -> Kind {
    match k {
        KIND_FREE => Kind::Free,
        KIND_SPAN_HEAD => Kind::SpanHead,
        KIND_SPAN_TAIL => Kind::SpanTail,
        KIND_CLASS_TAIL => Kind::ClassTail,
        c => Kind::Class(c - 1),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn decode_ranges_are_disjoint() {
        for floating in [false, true] {
            for live in [false, true] {
                for free in [-(1i64 << 22), -33, 0, 1, 4096] {
                    for class in [0u32, 1, 43] {
                        let c = if live { class + 1 } else { 0 };
                        let v = (c as i64 * CLASS as i64
                            + floating as i64 * FLOAT as i64
                            + live as i64 * LIVE as i64
                            + free) as u64;
                        assert_eq!(
                            decode(v),
                            Avail {
                                floating,
                                live,
                                free,
                                class: c,
                            }
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn reservation_protocol() {
        let d = PageDesc::new();
        let a = d.take(3);
        assert!(!a.live, "retired pages grant nothing");
        d.add(3);
        d.activate(2, 10);
        assert_eq!(d.kind(), Kind::Class(2));
        assert_eq!(d.take(4).free, 10);
        assert_eq!(d.take(8).free, 6);
        assert_eq!(d.add(2).free, 0);
        assert!(d.float().floating);
        assert!(!d.retirable(2, 10, true));
        assert!(!d.try_retire(2, 10, true));
        assert!(!d.try_retire(1, 10, true), "another class's page");
        assert_eq!(
            d.add(10),
            Avail {
                floating: true,
                live: true,
                free: 10,
                class: 3,
            }
        );
        assert!(!d.retirable(2, 10, false), "floating");
        assert!(!d.retirable(1, 10, true), "another class's page");
        assert!(d.retirable(2, 10, true));
        assert!(d.try_retire(2, 10, true));
        assert!(!d.retirable(2, 10, true), "retired");
        assert_eq!(
            d.now(),
            Avail {
                floating: false,
                live: false,
                free: 0,
                class: 0,
            }
        );
    }

    /// A settler read class 2 on a floating page; before it unfloats, the
    /// page is retired, reactivated for class 5 and floated again. Its
    /// unfloat must name class 5 (a blind clear listed the page under
    /// class 2), and only once.
    #[test]
    fn unfloat_names_the_class_the_page_serves_now() {
        let d = PageDesc::new();
        d.activate(2, 10);
        let seen = d.float();
        assert_eq!((seen.floating, seen.class), (true, 3));
        assert!(d.try_retire(2, 10, true));
        d.activate(5, 20);
        d.take(20);
        d.float();
        assert_eq!(d.unfloat(), Some(5));
        assert!(!d.now().floating);
        assert_eq!(d.unfloat(), None, "one winner");
    }

    /// A settler read class 2 on a floating page; before it unfloats, the
    /// page is retired and a stale reserver takes from its 0. The unfloat
    /// must leave that sum as it was: once the reserver gives back, the
    /// page is retired and can be reactivated (a blind clear of bit 40 left
    /// it at -2^40, never live again).
    #[test]
    fn unfloat_leaves_a_retired_page_alone() {
        let d = PageDesc::new();
        d.activate(2, 10);
        d.float();
        assert!(d.try_retire(2, 10, true));
        assert!(!d.take(3).live);
        assert_eq!(d.unfloat(), None);
        d.add(3);
        assert_eq!(d.avail.load(Ordering::Relaxed), 0);
        d.activate(2, 10);
        assert!(d.now().live);
    }
}

//! One page's descriptor and the counter protocol that lets a whole warp
//! reserve blocks with a single `fetch_sub`.
//!
//! `avail` holds `LIVE + f` while the page serves a class, where `f` is the
//! number of free blocks nobody has reserved, and `0` while the page is
//! retired (so zeroed memory describes retired pages). Every change is a
//! `fetch_add`/`fetch_sub`, never a store, which makes transient
//! over-subtraction harmless: a reserver that finds `f <= 0` (or a retired
//! page) adds back exactly what it took, whatever happened in between.
//! Invariant: `f + (blocks reserved but not yet claimed) <= set bits in the
//! bitmap`, so a reservation can always be claimed.
//!
//! `state` says who may act on a live page:
//! - `ATTACHED`: it is some slot's current page; only that slot detaches it.
//! - `FLOATING`: detached (it filled up); the thread that frees blocks into
//!   it, or the one that detached it, lists or retires it.
//! - `LISTED`: on its class's list of pages with free blocks.
//! - `RETIRING`: one thread is retiring it.
//!
//! A freer does `avail.fetch_add` then reads `state`; a detacher writes
//! `state = FLOATING` then reads `avail`. Both with `SeqCst`, so at least
//! one of them sees the other and an empty page is never stranded.

use crate::sync::{AtomicU32, Ordering};

/// Bias of a live page's `avail`.
pub const LIVE: u32 = 1 << 30;

pub const KIND_FREE: u32 = 0;
pub const KIND_SPAN_HEAD: u32 = 0xFFFF_0001;
pub const KIND_SPAN_TAIL: u32 = 0xFFFF_0002;

pub const STATE_NONE: u32 = 0;
pub const STATE_ATTACHED: u32 = 1;
pub const STATE_FLOATING: u32 = 2;
pub const STATE_LISTED: u32 = 3;
pub const STATE_RETIRING: u32 = 4;

/// What a page is used for, decoded from `kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Free,
    Class(u32),
    SpanHead,
    SpanTail,
}

/// Per-page metadata, 32 bytes, `#[repr(C)]` so host and device agree.
#[repr(C)]
pub struct PageDesc {
    /// `LIVE + unreserved free blocks` while live, 0 while retired.
    pub avail: AtomicU32,
    /// `KIND_FREE`, `class + 1`, `KIND_SPAN_HEAD` or `KIND_SPAN_TAIL`.
    pub kind: AtomicU32,
    /// One of the `STATE_*` values (class pages only).
    pub state: AtomicU32,
    /// Link in a [`PageList`](crate::page_list::PageList), `index + 1`.
    pub next: AtomicU32,
    /// Pages in the span (span heads only).
    pub span: AtomicU32,
    pad: [u32; 3],
}

impl PageDesc {
    /// A retired, free page (what zeroed memory holds).
    pub fn new() -> Self {
        Self {
            avail: AtomicU32::new(0),
            kind: AtomicU32::new(KIND_FREE),
            state: AtomicU32::new(STATE_NONE),
            next: AtomicU32::new(0),
            span: AtomicU32::new(0),
            pad: [0; 3],
        }
    }

    #[inline(always)]
    pub fn kind(&self) -> Kind {
        decode_kind(self.kind.load(Ordering::Acquire))
    }

    /// Reserves up to `want` blocks. Returns `(granted, free_before)`;
    /// `granted == 0` means the page is full or retired.
    #[inline(always)]
    pub fn reserve(&self, want: u32) -> (u32, u32) {
        let old = self.avail.fetch_sub(want, Ordering::AcqRel);
        let free = old.wrapping_sub(LIVE) as i32;
        if free <= 0 {
            self.avail.fetch_add(want, Ordering::AcqRel);
            (0, 0)
        } else if (free as u32) < want {
            self.avail.fetch_add(want - free as u32, Ordering::AcqRel);
            (free as u32, free as u32)
        } else {
            (want, free as u32)
        }
    }

    /// Returns `n` free blocks (freed or reserved and not claimed); the
    /// result is the page's unreserved free count afterwards.
    #[inline(always)]
    pub fn give_back(&self, n: u32) -> i32 {
        let old = self.avail.fetch_add(n, Ordering::SeqCst);
        old.wrapping_add(n).wrapping_sub(LIVE) as i32
    }

    /// Makes a retired page live with `cap` free blocks of `class`. The
    /// caller owns the page (claimed it from the page map) and has filled
    /// the bitmap; the `Release` publishes both.
    pub fn activate(&self, class: u32, cap: u32) {
        self.kind.store(class + 1, Ordering::Relaxed);
        self.state.store(STATE_ATTACHED, Ordering::Relaxed);
        self.avail.fetch_add(LIVE + cap, Ordering::Release);
    }

    /// Retires a page whose `cap` blocks are all free and unreserved; fails
    /// if anyone holds a reservation or block.
    pub fn try_retire(&self, cap: u32) -> bool {
        self.avail
            .compare_exchange(LIVE + cap, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Unreserved free blocks now (negative while reservers back off).
    pub fn free_now(&self) -> i32 {
        self.avail.load(Ordering::SeqCst).wrapping_sub(LIVE) as i32
    }
}

impl Default for PageDesc {
    fn default() -> Self {
        Self::new()
    }
}

#[inline(always)]
pub const fn decode_kind(k: u32) -> Kind {
    match k {
        KIND_FREE => Kind::Free,
        KIND_SPAN_HEAD => Kind::SpanHead,
        KIND_SPAN_TAIL => Kind::SpanTail,
        c => Kind::Class(c - 1),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn reservation_protocol() {
        let d = PageDesc::new();
        assert_eq!(d.reserve(3), (0, 0), "retired pages grant nothing");
        assert_eq!(d.avail.load(Ordering::Relaxed), 0);
        d.activate(2, 10);
        assert_eq!(d.kind(), Kind::Class(2));
        assert_eq!(d.reserve(4), (4, 10));
        assert_eq!(d.reserve(8), (6, 6));
        assert_eq!(d.reserve(1), (0, 0));
        assert!(!d.try_retire(10));
        assert_eq!(d.give_back(10), 10);
        assert!(d.try_retire(10));
        assert_eq!(d.free_now(), -(LIVE as i32));
    }
}

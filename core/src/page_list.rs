//! A lock-free stack of page indices (Treiber), one per size class, holding
//! pages with free blocks that no slot is using. The head packs a tag with
//! the index (`tag << 32 | index + 1`, 0 = empty); every push and pop bumps
//! the tag, which is how ABA is ruled out: a pop that read a stale `next`
//! fails its CAS because the tag moved on.

use crate::sync::{AtomicU32, AtomicU64, Ordering};

const INDEX_MASK: u64 = 0xFFFF_FFFF;

#[inline(always)]
fn pack(tag: u64, index_plus_one: u32) -> u64 {
    (tag << 32) | index_plus_one as u64
}

/// A view of one list head; `next` finds a page's link field.
pub struct PageList<'a> {
    head: &'a AtomicU64,
}

impl<'a> PageList<'a> {
    pub fn new(head: &'a AtomicU64) -> Self {
        Self { head }
    }

    pub fn push<'n>(&self, page: u32, next: impl Fn(u32) -> &'n AtomicU32) {
        let link = next(page);
        let mut h = self.head.load(Ordering::Relaxed);
        loop {
            link.store((h & INDEX_MASK) as u32, Ordering::Relaxed);
            let new = pack((h >> 32).wrapping_add(1), page + 1);
            match self
                .head
                .compare_exchange_weak(h, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(cur) => h = cur,
            }
        }
    }

    pub fn pop<'n>(&self, next: impl Fn(u32) -> &'n AtomicU32) -> Option<u32> {
        let mut h = self.head.load(Ordering::Acquire);
        loop {
            let top = (h & INDEX_MASK) as u32;
            if top == 0 {
                return None;
            }
            // May read a link that a concurrent pop/push rewrites: the tag
            // makes the CAS below fail in that case.
            let after = next(top - 1).load(Ordering::Relaxed);
            let new = pack((h >> 32).wrapping_add(1), after);
            match self
                .head
                .compare_exchange_weak(h, new, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return Some(top - 1),
                Err(cur) => h = cur,
            }
        }
    }

    /// True when the list holds no page (a snapshot).
    pub fn is_empty(&self) -> bool {
        self.head.load(Ordering::Relaxed) & INDEX_MASK == 0
    }

    /// The head's tag (a snapshot): it changes with every push and pop.
    pub fn tag(&self) -> u32 {
        (self.head.load(Ordering::Relaxed) >> 32) as u32
    }
}

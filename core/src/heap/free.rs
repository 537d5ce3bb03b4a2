//! Free and lookup: an address to its page, class and block in O(1), and
//! the bitmap release that frees it.

use super::span::SPAN_BATCH;
use super::{FreeError, Heap};
use crate::page::{decode_kind, Kind};
use crate::size_class::{class_size, CLASS_COUNT, PAGE_SHIFT, PAGE_SIZE};
use crate::stats::Counters;
use crate::sync::Ordering;
use crate::word::Word;

/// Result of freeing the blocks of one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeOutcome {
    /// Blocks returned to the heap.
    pub freed: u32,
    /// Blocks that were already free (double frees), counted as bad frees.
    pub already_free: u32,
}

impl<W: Word> Heap<'_, W> {
    /// Frees a block or span by address. Null is a no-op; anything that is
    /// not a live block's start is refused, counted, and changes nothing.
    pub fn free(&self, ptr: *mut u8, slot: u32) -> Result<FreeOutcome, FreeError> {
        if ptr.is_null() {
            return Ok(FreeOutcome {
                freed: 0,
                already_free: 0,
            });
        }
        match self.locate(ptr as usize)? {
            Located::Block { page, word, mask } => {
                let out = self.free_run(page, word, mask, slot);
                self.count_freed(slot, 0, mask.count_ones());
                if out.already_free > 0 {
                    return Err(FreeError::NotAllocated);
                }
                Ok(out)
            }
            Located::Span { page } => self.free_span(page),
        }
    }

    /// Frees every block and span of `ptrs`, as [`Heap::free`] frees
    /// each (null is skipped; anything that is not a live block's start is
    /// refused, counted, and changes nothing), with the spans given back
    /// [`SPAN_BATCH`] at a time: each span's head unmarked as it comes,
    /// then the batch's descriptors, then all its pages under one hold of
    /// the index's lock (on an indexed heap). For a caller that returns
    /// many blocks at once, as a pool that empties a cache. An iterator
    /// that panics leaves the spans of the batch under way unmarked and
    /// not given back (lost to the heap until it is rebuilt).
    pub fn free_all(&self, ptrs: impl IntoIterator<Item = *mut u8>, slot: u32) -> FreedAll {
        let mut out = FreedAll::default();
        let mut spans = [(0u32, 0u32); SPAN_BATCH];
        let mut n = 0;
        for ptr in ptrs {
            if ptr.is_null() {
                continue;
            }
            match self.locate(ptr as usize) {
                Ok(Located::Block { page, word, mask }) => {
                    let r = self.free_run(page, word, mask, slot);
                    self.count_freed(slot, 0, mask.count_ones());
                    out.freed += r.freed;
                    out.refused += r.already_free;
                }
                Ok(Located::Span { page }) => match self.unmark_span(page) {
                    Ok(len) => {
                        spans[n] = (page, len);
                        n += 1;
                        if n == SPAN_BATCH {
                            self.release_spans(&spans);
                            out.freed += n as u32;
                            n = 0;
                        }
                    }
                    Err(_) => out.refused += 1,
                },
                Err(_) => out.refused += 1,
            }
        }
        self.release_spans(&spans[..n]);
        out.freed += n as u32;
        out
    }

    /// Finds the block at `addr` in O(1): page from address arithmetic,
    /// class from the page's descriptor.
    #[inline(always)]
    pub fn locate(&self, addr: usize) -> Result<Located<W>, FreeError> {
        match self.block_at(addr) {
            Ok(BlockInfo {
                page,
                class: Some(_),
                index,
                ..
            }) => Ok(Located::Block {
                page,
                word: index / W::BITS,
                mask: W::bit(index % W::BITS),
            }),
            Ok(BlockInfo { page, .. }) => Ok(Located::Span { page }),
            Err(e) => Err(self.bad_free(e)),
        }
    }

    /// The block or span starting at `addr`, in O(1), without counting or
    /// changing anything: its page (a class page's first unit, or a span's
    /// head), its class (`None` for spans), index and size.
    #[inline(always)]
    pub fn block_at(&self, addr: usize) -> Result<BlockInfo, FreeError> {
        let off = addr.wrapping_sub(self.data);
        if addr < self.data || off >= self.page_count as usize * PAGE_SIZE {
            return Err(FreeError::Foreign);
        }
        // Relaxed: a caller asking about a block it owns already synchronised
        // with the allocation that published the page's kind.
        let kind_of = |p: u32| decode_kind(self.descs()[p as usize].kind.load(Ordering::Relaxed));
        let mut page = (off >> PAGE_SHIFT) as u32;
        let mut kind = kind_of(page);
        if kind == Kind::ClassTail {
            page -= self.descs()[page as usize]
                .span
                .load(Ordering::Relaxed)
                .min(page);
            kind = kind_of(page);
        }
        let in_page = off - page as usize * PAGE_SIZE;
        match kind {
            Kind::Class(class) if (class as usize) < CLASS_COUNT => {
                let size = class_size(class) as usize;
                let index = in_page / size;
                if !in_page.is_multiple_of(size)
                    || index >= self.geometry().blocks_per_page(class) as usize
                {
                    return Err(FreeError::Interior);
                }
                Ok(BlockInfo {
                    page,
                    class: Some(class),
                    index: index as u32,
                    size,
                })
            }
            Kind::SpanHead if in_page == 0 => {
                let pages = self.descs()[page as usize].span.load(Ordering::Relaxed) as usize;
                Ok(BlockInfo {
                    page,
                    class: None,
                    index: 0,
                    size: pages * PAGE_SIZE,
                })
            }
            Kind::SpanHead | Kind::SpanTail => Err(FreeError::Interior),
            Kind::Free | Kind::Class(_) | Kind::ClassTail => Err(FreeError::NotAllocated),
        }
    }

    /// Frees the blocks `mask` of word `word` of a class page (all located
    /// by [`Heap::locate`]): one `fetch_or`, one `fetch_add`. Blocks that
    /// were already free are counted as bad (double) frees and left alone.
    /// The caller counts the frees it made, double ones included
    /// ([`Heap::count_freed`]; a warp counts once for all its lanes).
    #[inline(always)]
    pub fn free_run(&self, page: u32, word: u32, mask: W, slot: u32) -> FreeOutcome {
        let dup = self.bitmap(page).release(word, mask);
        let fresh = (mask & !dup).count_ones();
        let already_free = dup.count_ones();
        if already_free > 0 {
            self.count_double_frees(already_free);
        }
        if fresh > 0 {
            self.return_blocks(page, fresh, slot);
        }
        FreeOutcome {
            freed: fresh,
            already_free,
        }
    }

    /// Counts `n` frees of class blocks by slot `slot`, double frees
    /// included (see [`Counters::double_frees`]), in its tally (as
    /// [`Heap::count_allocated`]).
    #[inline(always)]
    pub fn count_freed(&self, slot: u32, way: u32, n: u32) {
        if n > 0 {
            self.tallies().freed(self.slot_index(slot), way, n);
        }
    }

    /// Counts `n` frees of class blocks that were already free.
    #[cold]
    pub fn count_double_frees(&self, n: u32) {
        Counters::bump(&self.counters().bad_frees, n as u64);
        Counters::bump(&self.counters().double_frees, n as u64);
    }

    #[cold]
    pub(super) fn bad_free(&self, e: FreeError) -> FreeError {
        Counters::bump(&self.counters().bad_frees, 1);
        e
    }
}

/// What [`Heap::free_all`] did with its pointers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreedAll {
    /// Blocks and spans returned to the heap.
    pub freed: u32,
    /// Pointers refused (foreign, interior, already free), each counted
    /// as a bad free as [`Heap::free`] counts it.
    pub refused: u32,
}

/// A block or span as [`Heap::block_at`] finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// First page of the block's class page, or the span's head page.
    pub page: u32,
    /// The block's class; `None` for a span.
    pub class: Option<u32>,
    /// Block index in its page (0 for spans).
    pub index: u32,
    /// Bytes of the block (whole pages for spans).
    pub size: usize,
}

/// What [`Heap::locate`] found at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Located<W> {
    Block { page: u32, word: u32, mask: W },
    Span { page: u32 },
}
